-- sinal 0003 (SQLite): integrations, automations, executions — as PostgreSQL's 0003.

CREATE TABLE integrations (
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    id          TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('whatsapp', 'ai', 'shopify', 'yampi')),
    name        TEXT,
    settings    TEXT NOT NULL DEFAULT '{}',
    secrets     TEXT NOT NULL DEFAULT '{}',
    created_at  TEXT NOT NULL,
    deleted_at  TEXT,
    PRIMARY KEY (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE automations (
    account_id     TEXT NOT NULL REFERENCES accounts (id),
    id             TEXT NOT NULL,
    name           TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('active', 'paused')),
    trigger_metric TEXT NOT NULL,
    spec           TEXT NOT NULL,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    deleted_at     TEXT,
    PRIMARY KEY (account_id, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX automations_trigger ON automations (account_id, trigger_metric);

CREATE TABLE executions (
    account_id    TEXT NOT NULL,
    id            TEXT NOT NULL,
    automation_id TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    contact_id    TEXT NOT NULL,
    status        TEXT NOT NULL
        CHECK (status IN ('pending', 'waiting', 'completed', 'stopped', 'unknown', 'dead')),
    next_step     INTEGER NOT NULL DEFAULT 0,
    attempts      INTEGER NOT NULL DEFAULT 0,
    run_at        TEXT NOT NULL,
    claimed_by    TEXT,
    claimed_until TEXT,
    last_error    TEXT,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, automation_id, event_id),
    FOREIGN KEY (account_id, automation_id) REFERENCES automations (account_id, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX executions_due ON executions (status, run_at);

CREATE TABLE execution_steps (
    account_id   TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    step_index   INTEGER NOT NULL,
    step_type    TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed', 'unknown')),
    attempts     INTEGER NOT NULL DEFAULT 1,
    result       TEXT,
    error        TEXT,
    event_id     TEXT,
    started_at   TEXT NOT NULL,
    finished_at  TEXT,
    PRIMARY KEY (account_id, execution_id, step_index)
) STRICT, WITHOUT ROWID;

CREATE TABLE conversations (
    account_id  TEXT NOT NULL,
    id          TEXT NOT NULL,
    contact_id  TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    assigned_to TEXT,
    opened_at   TEXT NOT NULL,
    closed_at   TEXT,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX conversations_one_open ON conversations (account_id, contact_id)
    WHERE status = 'open';
