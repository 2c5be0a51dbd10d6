-- sinal 0001 (SQLite): the same tables as PostgreSQL's 0001.
-- uuids are TEXT (canonical form); timestamps are TEXT 'YYYY-MM-DDTHH:MM:SS.ffffffZ'
-- (fixed width, so text order is time order); decimals are TEXT (exact), summed in Python.

CREATE TABLE accounts (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    timezone    TEXT NOT NULL DEFAULT 'America/Sao_Paulo',
    created_at  TEXT NOT NULL
) STRICT;

CREATE TABLE contacts (
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    id          TEXT NOT NULL,
    name        TEXT,
    phone       TEXT,
    email       TEXT,
    external_id TEXT,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE contact_identities (
    account_id  TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('phone', 'email', 'external_id')),
    value       TEXT NOT NULL,
    contact_id  TEXT NOT NULL,
    PRIMARY KEY (account_id, kind, value),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE metrics (
    account_id   TEXT NOT NULL REFERENCES accounts (id),
    id           TEXT NOT NULL,
    name         TEXT NOT NULL,
    display_name TEXT NOT NULL,
    category     TEXT NOT NULL
        CHECK (category IN ('ecommerce', 'messaging', 'tracking', 'engagement', 'contact', 'custom')),
    source       TEXT NOT NULL,
    is_system    INTEGER NOT NULL,
    created_at   TEXT NOT NULL,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, name)
) STRICT, WITHOUT ROWID;

CREATE TABLE events (
    account_id      TEXT NOT NULL,
    id              TEXT NOT NULL,
    contact_id      TEXT NOT NULL,
    metric_id       TEXT NOT NULL,
    metric_name     TEXT NOT NULL,
    properties      TEXT NOT NULL DEFAULT '{}',
    value           TEXT,
    currency        TEXT NOT NULL DEFAULT 'BRL',
    source          TEXT NOT NULL,
    source_id       TEXT,
    integration_id  TEXT,
    unique_event_id TEXT,
    entity_type     TEXT,
    entity_id       TEXT,
    automation_execution_id TEXT,
    occurred_at     TEXT NOT NULL,
    received_at     TEXT NOT NULL,
    schema_version  INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, unique_event_id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id),
    FOREIGN KEY (account_id, metric_id) REFERENCES metrics (account_id, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX events_contact_time ON events (account_id, contact_id, occurred_at DESC, id DESC);
CREATE INDEX events_metric_time ON events (account_id, metric_name, occurred_at DESC, id DESC);

CREATE TABLE contact_metrics_summary (
    account_id     TEXT NOT NULL,
    contact_id     TEXT NOT NULL,
    metric_name    TEXT NOT NULL,
    id             TEXT NOT NULL,
    event_count    INTEGER NOT NULL,
    total_value    TEXT NOT NULL DEFAULT '0',
    first_event_at TEXT NOT NULL,
    last_event_at  TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    PRIMARY KEY (account_id, contact_id, metric_name),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE outbox (
    account_id    TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    metric_name   TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    available_at  TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    claimed_by    TEXT,
    claimed_until TEXT,
    PRIMARY KEY (account_id, event_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX outbox_due ON outbox (available_at);

CREATE TABLE rejections (
    account_id        TEXT NOT NULL,
    id                TEXT NOT NULL,
    reason            TEXT NOT NULL,
    message           TEXT NOT NULL,
    source            TEXT NOT NULL,
    payload           TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    replayed_at       TEXT,
    replayed_event_id TEXT,
    PRIMARY KEY (account_id, id)
) STRICT, WITHOUT ROWID;
