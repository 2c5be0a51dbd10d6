-- sinal 0016 (SQLite): indexes for data retention (`sinal.retention`), as on PostgreSQL
-- (see there). Each finds the rows past their period, oldest first, in the states nothing
-- processes again unasked (the same `status IN` as `sinal.store.retention` says: a query
-- uses a partial index only when its condition names the index's), so a batch of deletes
-- reads what it deletes, not a table.

CREATE INDEX IF NOT EXISTS rejections_created ON rejections (created_at);

CREATE INDEX IF NOT EXISTS webhook_deliveries_finished ON webhook_deliveries (received_at)
    WHERE status IN ('processed', 'unmappable', 'failed');

CREATE INDEX IF NOT EXISTS executions_finished ON executions (created_at)
    WHERE status IN ('completed', 'stopped', 'unknown', 'dead');
