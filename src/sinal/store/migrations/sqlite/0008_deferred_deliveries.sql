-- sinal 0008 (SQLite): deferred webhook deliveries (see the PostgreSQL migration).
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt (nothing refers
-- to it, so foreign keys stay untouched).

CREATE TABLE webhook_deliveries_0008 (
    account_id     TEXT NOT NULL,
    id             TEXT NOT NULL,
    integration_id TEXT NOT NULL,
    provider       TEXT NOT NULL,
    topic          TEXT,
    delivery_id    TEXT NOT NULL,
    headers        TEXT NOT NULL,
    body           BLOB NOT NULL,
    received_at    TEXT NOT NULL,
    status         TEXT NOT NULL DEFAULT 'received'
        CHECK (status IN ('received', 'processed', 'unmappable', 'failed', 'deferred')),
    reason         TEXT,
    attempts       INTEGER NOT NULL DEFAULT 0,
    processed_at   TEXT,
    due_at         TEXT,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, integration_id, delivery_id)
) STRICT, WITHOUT ROWID;

INSERT INTO webhook_deliveries_0008 (account_id, id, integration_id, provider, topic,
    delivery_id, headers, body, received_at, status, reason, attempts, processed_at)
SELECT account_id, id, integration_id, provider, topic, delivery_id, headers, body,
    received_at, status, reason, attempts, processed_at
FROM webhook_deliveries;

DROP TABLE webhook_deliveries;
ALTER TABLE webhook_deliveries_0008 RENAME TO webhook_deliveries;

CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (status, received_at);
CREATE INDEX webhook_deliveries_deferred ON webhook_deliveries (due_at)
    WHERE status = 'deferred';
