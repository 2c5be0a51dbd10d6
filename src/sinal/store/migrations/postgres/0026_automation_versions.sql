-- sinal 0026: an execution runs the definition its automation had when it was made.
--
-- Steps are tracked by position: an execution waiting at step 2 that resumed on the
-- current definition, after an edit had put a step before it, sent again a message it
-- had sent. Now a change of an automation's steps makes a new version (`version`, 1 when
-- created); each execution names the version it was made with (`automation_version`),
-- and the definition a change replaces is kept in `automation_versions` (webhook secrets
-- sealed as in `automations.spec`, bound to the automation) while an execution that may
-- still run names it. Executions made before this migration run the current definition,
-- version 1, as they did.
--
-- Constant defaults: PostgreSQL adds the columns without rewriting the tables.
ALTER TABLE automations ADD COLUMN version integer NOT NULL DEFAULT 1;
ALTER TABLE executions ADD COLUMN automation_version integer NOT NULL DEFAULT 1;

CREATE TABLE automation_versions (
    account_id    uuid NOT NULL,
    id            uuid NOT NULL,
    automation_id uuid NOT NULL,
    version       integer NOT NULL,
    spec          jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),  -- when it was replaced
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, automation_id, version),
    FOREIGN KEY (account_id, automation_id) REFERENCES automations (account_id, id)
);
