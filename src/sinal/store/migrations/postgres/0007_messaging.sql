-- sinal 0007: WhatsApp message statuses, WhatsApp user ids, tracked links.
-- As everywhere, every primary and unique key starts with account_id.

-- The current status of each message we sent: it only moves forward (sent < delivered <
-- read; failed stays, with Meta's error). The status events themselves are in `events`.
CREATE TABLE message_statuses (
    account_id  uuid NOT NULL,
    wamid       text NOT NULL,
    contact_id  uuid NOT NULL,
    status      text NOT NULL CHECK (status IN ('sent', 'delivered', 'read', 'failed')),
    is_template boolean NOT NULL DEFAULT false,
    error_code  integer,
    error_title text,
    status_at   timestamptz NOT NULL,    -- when Meta says the current status happened
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, wamid),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);

-- Meta's business-scoped user id (BSUID) -> the contact: a user who hides their phone
-- number later is still the same person.
CREATE TABLE whatsapp_users (
    account_id  uuid NOT NULL,
    user_id     text NOT NULL,
    contact_id  uuid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, user_id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);

-- A status names only the message (wamid): find the step's Message Sent / Template Sent.
CREATE INDEX events_message_entity ON events (account_id, entity_id)
    WHERE entity_type = 'message';

-- Conversations are listed per contact and per account, newest first.
CREATE INDEX conversations_contact ON conversations (account_id, contact_id, id DESC);

CREATE TABLE links (
    account_id  uuid NOT NULL,
    id          uuid NOT NULL,
    token       text NOT NULL,           -- random, unguessable: the short URL's last segment
    url         text NOT NULL,           -- the only place a click is ever sent
    contact_id  uuid,
    campaign    text,
    automation_execution_id uuid,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);
-- A click names the token alone, before any account is known. Not unique (keys start with
-- account_id); the creator checks the token is free, and a lookup finding two refuses both.
CREATE INDEX links_token ON links (token);
