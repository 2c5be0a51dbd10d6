-- sinal 0028 (SQLite): the executions that may still run, by the automation version they
-- were made with (see the PostgreSQL migration): `prune_versions` asks, every
-- housekeeping pass, whether such an execution names a kept version, without reading
-- every execution the automation ever made.
CREATE INDEX IF NOT EXISTS executions_live_version
    ON executions (account_id, automation_id, automation_version)
    WHERE status NOT IN ('completed', 'stopped');
