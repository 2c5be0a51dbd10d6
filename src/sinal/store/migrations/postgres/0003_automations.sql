-- sinal 0003: integrations (connections to providers), automations, their executions.
-- Every primary and unique key starts with account_id, as everywhere else.

CREATE TABLE integrations (
    account_id  uuid NOT NULL REFERENCES accounts (id),
    id          uuid NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('whatsapp', 'ai', 'shopify', 'yampi')),
    name        text,
    settings    jsonb NOT NULL DEFAULT '{}',  -- shown to users
    secrets     jsonb NOT NULL DEFAULT '{}',  -- never returned by the API
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz,
    PRIMARY KEY (account_id, id)
);

CREATE TABLE automations (
    account_id     uuid NOT NULL REFERENCES accounts (id),
    id             uuid NOT NULL,
    name           text NOT NULL,
    status         text NOT NULL CHECK (status IN ('active', 'paused')),
    trigger_metric text NOT NULL,  -- trigger_type resolved through TRIGGER_TO_METRIC
    spec           jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    deleted_at     timestamptz,
    PRIMARY KEY (account_id, id)
);
CREATE INDEX automations_trigger ON automations (account_id, trigger_metric)
    WHERE deleted_at IS NULL;

-- One execution per (automation, event): the unique key is what makes dispatch
-- effectively-once however many times an outbox row is delivered.
CREATE TABLE executions (
    account_id    uuid NOT NULL,
    id            uuid NOT NULL,
    automation_id uuid NOT NULL,
    event_id      uuid NOT NULL,
    contact_id    uuid NOT NULL,
    status        text NOT NULL
        CHECK (status IN ('pending', 'waiting', 'completed', 'stopped', 'unknown', 'dead')),
    next_step     integer NOT NULL DEFAULT 0,
    attempts      integer NOT NULL DEFAULT 0,
    run_at        timestamptz NOT NULL DEFAULT now(),
    claimed_by    text,
    claimed_until timestamptz,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, automation_id, event_id),
    FOREIGN KEY (account_id, automation_id) REFERENCES automations (account_id, id)
);
CREATE INDEX executions_due ON executions (run_at) WHERE status IN ('pending', 'waiting');

-- A step's record: 'started' is written (and committed) before an external call, so a
-- crash mid-call leaves evidence; a resumed execution never repeats a 'completed' step
-- and never blindly resends a 'started' one (it becomes 'unknown').
CREATE TABLE execution_steps (
    account_id   uuid NOT NULL,
    execution_id uuid NOT NULL,
    step_index   integer NOT NULL,
    step_type    text NOT NULL,
    status       text NOT NULL CHECK (status IN ('started', 'completed', 'failed', 'unknown')),
    attempts     integer NOT NULL DEFAULT 1,
    result       jsonb,
    error        text,
    event_id     uuid,  -- the event the step emitted
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (account_id, execution_id, step_index)
);

-- A minimal conversation per contact: at most one open at a time.
CREATE TABLE conversations (
    account_id  uuid NOT NULL,
    id          uuid NOT NULL,
    contact_id  uuid NOT NULL,
    status      text NOT NULL CHECK (status IN ('open', 'closed')),
    assigned_to text,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    closed_at   timestamptz,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);
CREATE UNIQUE INDEX conversations_one_open ON conversations (account_id, contact_id)
    WHERE status = 'open';

-- Wake listening workers once per statement that fills the outbox (not once per row).
CREATE FUNCTION sinal_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sinal_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION sinal_notify_outbox();
