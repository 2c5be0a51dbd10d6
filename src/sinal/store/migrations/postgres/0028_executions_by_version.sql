-- sinal 0028: the executions that may still run, by the automation version they were
-- made with. A worker's housekeeping deletes an automation's kept version (0026) once no
-- such execution names it (`prune_versions`), every pass while one does: through the
-- index of 0022, (account_id, automation_id, id), that read every execution the
-- automation ever made, finished ones included, to find the one that needs it — or to
-- prove none does. Partial: only those not completed nor stopped (pending, waiting, dead,
-- unknown), a few among the millions an automation may have made.
--
-- Built in the migration's transaction: workers making executions wait while it builds.
-- On a large database, build it beforehand with CREATE INDEX CONCURRENTLY (the same
-- definition), which writers need not wait for: the migration then finds it.
CREATE INDEX IF NOT EXISTS executions_live_version
    ON executions (account_id, automation_id, automation_version)
    WHERE status NOT IN ('completed', 'stopped');
