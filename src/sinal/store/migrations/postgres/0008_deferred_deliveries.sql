-- sinal 0008: deferred webhook deliveries.
-- A delivery part of which waits for a record that may still be committing (a WhatsApp
-- status that outran the record of its message's send) is kept as 'deferred' and
-- processed again at due_at; the rest of it was recorded at once.

ALTER TABLE webhook_deliveries ADD COLUMN due_at timestamptz;

ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_status_check
    CHECK (status IN ('received', 'processed', 'unmappable', 'failed', 'deferred'));

-- What `sinal.webhooks.process_deferred` claims: the deferred ones that are due.
CREATE INDEX webhook_deliveries_deferred ON webhook_deliveries (due_at)
    WHERE status = 'deferred';
