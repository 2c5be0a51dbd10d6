-- sinal 0005: webhook deliveries, kept raw (body bytes and headers) before processing.

-- Webhooks find their integration by the id in their URL, before any account is known.
CREATE INDEX integrations_id ON integrations (id);

CREATE TABLE webhook_deliveries (
    account_id     uuid NOT NULL,
    id             uuid NOT NULL,            -- UUIDv7: time-ordered
    integration_id uuid NOT NULL,
    provider       text NOT NULL,
    topic          text,
    delivery_id    text NOT NULL,            -- the provider's id, or a digest of the body
    headers        jsonb NOT NULL,
    body           bytea NOT NULL,           -- exactly the bytes received (signatures!)
    received_at    timestamptz NOT NULL DEFAULT now(),
    status         text NOT NULL DEFAULT 'received'
        CHECK (status IN ('received', 'processed', 'unmappable', 'failed')),
    reason         text,
    attempts       integer NOT NULL DEFAULT 0,
    processed_at   timestamptz,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, integration_id, delivery_id)
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (status, received_at)
    WHERE status <> 'processed';
