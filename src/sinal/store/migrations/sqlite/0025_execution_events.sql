-- sinal 0025 (SQLite): the index of the events an execution emitted (`GET
-- /v1/executions/{id}` lists them by account_id and automation_execution_id, newest
-- first). Without it the read walked every event of the account. Partial: only events an
-- automation step emitted name an execution, so an ordinary event adds no entry and its
-- write does not maintain this index. Ordered as the read is: its LIMIT takes the newest
-- without a sort.
CREATE INDEX IF NOT EXISTS events_execution
    ON events (account_id, automation_execution_id, occurred_at DESC, id DESC)
    WHERE automation_execution_id IS NOT NULL;
