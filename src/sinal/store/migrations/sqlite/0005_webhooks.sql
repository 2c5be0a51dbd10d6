-- sinal 0005 (SQLite): webhook deliveries, kept raw before processing.

CREATE INDEX integrations_id ON integrations (id);

CREATE TABLE webhook_deliveries (
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
        CHECK (status IN ('received', 'processed', 'unmappable', 'failed')),
    reason         TEXT,
    attempts       INTEGER NOT NULL DEFAULT 0,
    processed_at   TEXT,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, integration_id, delivery_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (status, received_at);
