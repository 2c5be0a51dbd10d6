-- sinal 0007 (SQLite): WhatsApp message statuses, WhatsApp user ids, tracked links.

CREATE TABLE message_statuses (
    account_id  TEXT NOT NULL,
    wamid       TEXT NOT NULL,
    contact_id  TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('sent', 'delivered', 'read', 'failed')),
    is_template INTEGER NOT NULL DEFAULT 0,
    error_code  INTEGER,
    error_title TEXT,
    status_at   TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (account_id, wamid),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE whatsapp_users (
    account_id  TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    contact_id  TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (account_id, user_id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE INDEX events_message_entity ON events (account_id, entity_id)
    WHERE entity_type = 'message';

CREATE INDEX conversations_contact ON conversations (account_id, contact_id, id DESC);

CREATE TABLE links (
    account_id  TEXT NOT NULL,
    id          TEXT NOT NULL,
    token       TEXT NOT NULL,
    url         TEXT NOT NULL,
    contact_id  TEXT,
    campaign    TEXT,
    automation_execution_id TEXT,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX links_token ON links (token);
