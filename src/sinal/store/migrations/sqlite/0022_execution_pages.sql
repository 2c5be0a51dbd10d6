-- sinal 0022 (SQLite): the index of `GET /v1/automations/{id}/executions`, as
-- PostgreSQL's 0022: an automation's executions newest first, from a page's cursor on,
-- without reading (and sorting) all of them.
CREATE INDEX IF NOT EXISTS executions_automation ON executions (account_id, automation_id, id);
