-- sinal 0025: the index of the events an execution emitted (`GET /v1/executions/{id}`
-- lists them by account_id and automation_execution_id, newest first). Without it the
-- read walked every event of the account. Partial: only events an automation step
-- emitted name an execution, so an ordinary event (most of them, from sources) adds no
-- entry and its write does not maintain this index. Ordered as the read is, so its
-- LIMIT takes the newest without a sort.
--
-- Built in the migration's transaction: writers of events wait while it builds (for the
-- rows that name an execution only, but the whole table is read). On a large database,
-- build it beforehand with CREATE INDEX CONCURRENTLY (the same definition), which writers
-- need not wait for: the migration then finds it.
CREATE INDEX IF NOT EXISTS events_execution
    ON events (account_id, automation_execution_id, occurred_at DESC, id DESC)
    WHERE automation_execution_id IS NOT NULL;
