-- sinal 0023 (SQLite): the index of an event's executions (`GET /v1/events/{id}/trace`: which
-- automations it triggered). The unique key (account_id, automation_id, event_id) leads
-- with the automation, so the trace read every execution of the account.
CREATE INDEX IF NOT EXISTS executions_event ON executions (account_id, event_id);
