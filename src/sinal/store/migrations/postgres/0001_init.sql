-- sinal 0001: accounts, contacts, metrics, events, summaries, outbox, rejections.
-- Every primary and unique key starts with account_id, so the schema shards by account.

CREATE TABLE accounts (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    timezone    text NOT NULL DEFAULT 'America/Sao_Paulo',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE contacts (
    account_id  uuid NOT NULL REFERENCES accounts (id),
    id          uuid NOT NULL,
    name        text,
    phone       text,            -- E.164, canonical (Brazilian mobiles with the ninth digit)
    email       text,
    external_id text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id)
);

-- How a contact is found: one row per (kind, value); a value names one contact.
CREATE TABLE contact_identities (
    account_id  uuid NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('phone', 'email', 'external_id')),
    value       text NOT NULL,
    contact_id  uuid NOT NULL,
    PRIMARY KEY (account_id, kind, value),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);

CREATE TABLE metrics (
    account_id   uuid NOT NULL REFERENCES accounts (id),
    id           uuid NOT NULL,  -- uuid5 of (account, name): known before the row exists
    name         text NOT NULL,
    display_name text NOT NULL,
    category     text NOT NULL
        CHECK (category IN ('ecommerce', 'messaging', 'tracking', 'engagement', 'contact', 'custom')),
    source       text NOT NULL,
    is_system    boolean NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, name)
);

CREATE TABLE events (
    account_id      uuid NOT NULL,
    id              uuid NOT NULL,  -- UUIDv7: time-ordered
    contact_id      uuid NOT NULL,
    metric_id       uuid NOT NULL,
    metric_name     text NOT NULL,
    properties      jsonb NOT NULL DEFAULT '{}',
    value           numeric(18, 4),
    currency        text NOT NULL DEFAULT 'BRL' CHECK (currency ~ '^[A-Z]{3}$'),
    source          text NOT NULL,
    source_id       text,
    integration_id  uuid,
    unique_event_id text,
    entity_type     text,
    entity_id       text,
    automation_execution_id uuid,  -- set when an automation step emitted it
    occurred_at     timestamptz NOT NULL,
    received_at     timestamptz NOT NULL,
    schema_version  integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, unique_event_id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id),
    FOREIGN KEY (account_id, metric_id) REFERENCES metrics (account_id, id)
);
CREATE INDEX events_contact_time ON events (account_id, contact_id, occurred_at DESC, id DESC);
CREATE INDEX events_metric_time ON events (account_id, metric_name, occurred_at DESC, id DESC);

CREATE TABLE contact_metrics_summary (
    account_id     uuid NOT NULL,
    contact_id     uuid NOT NULL,
    metric_name    text NOT NULL,
    id             uuid NOT NULL DEFAULT gen_random_uuid(),
    event_count    bigint NOT NULL,
    total_value    numeric NOT NULL DEFAULT 0,
    first_event_at timestamptz NOT NULL,
    last_event_at  timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, contact_id, metric_name),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);

-- Dispatch intent, written in the event's transaction; consumed by the dispatcher.
CREATE TABLE outbox (
    account_id    uuid NOT NULL,
    event_id      uuid NOT NULL,
    metric_name   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    available_at  timestamptz NOT NULL DEFAULT now(),
    attempts      integer NOT NULL DEFAULT 0,
    claimed_by    text,
    claimed_until timestamptz,
    PRIMARY KEY (account_id, event_id)
);
CREATE INDEX outbox_due ON outbox (available_at);

-- Valid inputs that could not be recorded (unknown contact, ...), kept for replay.
-- No foreign key to accounts: an emit naming an unknown account is kept too.
CREATE TABLE rejections (
    account_id        uuid NOT NULL,
    id                uuid NOT NULL,
    reason            text NOT NULL,
    message           text NOT NULL,
    source            text NOT NULL,
    payload           jsonb NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    replayed_at       timestamptz,
    replayed_event_id uuid,
    PRIMARY KEY (account_id, id)
);
