-- sinal 0016: indexes for data retention (`sinal.retention`). Each finds the rows past
-- their period, oldest first, in the states nothing processes again unasked (the same
-- `status IN` as `sinal.store.retention` says: a query uses a partial index only when its
-- condition is the index's), so a batch of deletes reads what it deletes, not a table.
--
-- Built in the migration's transaction: writers of these tables wait while they build.
-- On a large database, build them beforehand with CREATE INDEX CONCURRENTLY (the same
-- definitions), which writers need not wait for: the migration then finds them.

CREATE INDEX IF NOT EXISTS rejections_created ON rejections (created_at);

-- `webhook_deliveries_pending` leaves the processed ones out: most of them.
CREATE INDEX IF NOT EXISTS webhook_deliveries_finished ON webhook_deliveries (received_at)
    WHERE status IN ('processed', 'unmappable', 'failed');

-- By creation, not by updated_at: an execution finishes after it was created, so those
-- that finished before an instant are among those created before it, and created_at
-- never changes. Every claim changes updated_at: indexed, it would make each claim a
-- non-HOT update, writing every index of the table.
CREATE INDEX IF NOT EXISTS executions_finished ON executions (created_at)
    WHERE status IN ('completed', 'stopped', 'unknown', 'dead');
