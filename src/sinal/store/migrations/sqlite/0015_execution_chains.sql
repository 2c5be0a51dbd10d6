-- sinal 0015 (SQLite): how deep in a chain of automations an execution is (0 for an event
-- nothing automated caused; see the PostgreSQL migration of the same number).
ALTER TABLE executions ADD COLUMN chain_depth INTEGER NOT NULL DEFAULT 0;
