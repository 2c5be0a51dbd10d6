-- sinal 0022: the index of `GET /v1/automations/{id}/executions` (newest first, a page
-- at a time from its cursor: `id < cursor`). Without it a page read either every
-- execution of the automation through its unique key (account_id, automation_id,
-- event_id), to sort them by id, or the account's executions, newest first through the
-- primary key, until it found a page of the automation's: both grow with the history.
--
-- Built in the migration's transaction: writers of `executions` wait while it builds.
-- On a large database, build it beforehand with CREATE INDEX CONCURRENTLY (the same
-- definition), which writers need not wait for: the migration then finds it.
CREATE INDEX IF NOT EXISTS executions_automation ON executions (account_id, automation_id, id);
