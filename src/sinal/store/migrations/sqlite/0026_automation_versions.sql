-- sinal 0026 (SQLite): an execution runs the definition its automation had when it was
-- made: automations' `version`, executions' `automation_version`, and the definitions
-- replaced by a change of steps kept in `automation_versions` while an execution that may
-- still run names them (see the PostgreSQL migration of the same number).
ALTER TABLE automations ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE executions ADD COLUMN automation_version INTEGER NOT NULL DEFAULT 1;

CREATE TABLE automation_versions (
    account_id    TEXT NOT NULL,
    id            TEXT NOT NULL,
    automation_id TEXT NOT NULL,
    version       INTEGER NOT NULL,
    spec          TEXT NOT NULL,
    created_at    TEXT NOT NULL,  -- when it was replaced
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, automation_id, version),
    FOREIGN KEY (account_id, automation_id) REFERENCES automations (account_id, id)
) STRICT, WITHOUT ROWID;
