-- sinal 0014: writers wake the workers only when a worker waits for them.
--
-- Every transaction that added outbox rows sent a NOTIFY. PostgreSQL commits the
-- transactions that notify one at a time: each takes one lock for the whole server at
-- commit and holds it through its WAL flush, so concurrent writers could not share a
-- flush. Eight processes calling `emit_event` stored 1,936 events/s with the NOTIFY and
-- 3,462 without (2026-12-01, 4 rounds of 3 s alternated, this machine).
--
-- Now a worker arms `outbox_wake` before a look at the outbox after which it may wait
-- (not while it works through a backlog), and the worker that a NOTIFY wakes disarms it
-- (unless another is arming it right then). A writer notifies only when the flag is
-- armed, or when it cannot take the barrier lock below in shared mode. No wake-up is
-- lost:
--
-- - `sinal_outbox_arm()` sets the flag and, in the same transaction, waits for the
--   barrier lock in exclusive mode: for every writer that already took it in shared mode
--   to end. The worker reads the outbox only after the flag is committed, so it sees the
--   rows of every writer that took the lock before its own.
-- - A writer that tries for the lock while the worker holds it or waits for it fails,
--   and notifies.
-- - A writer that takes the lock after the worker released it reads the flag after it
--   was committed, and notifies unless a NOTIFY already woke the workers (whoever
--   disarmed was woken; it arms again before its next look at the outbox).
--
-- The flag starts armed: writers notify, as before, until a worker disarms it. It is the
-- server's, not an account's (like the migrations table): one row, no account_id.
CREATE TABLE outbox_wake (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),  -- one row
    armed boolean NOT NULL DEFAULT true
);
INSERT INTO outbox_wake DEFAULT VALUES;

-- The barrier lock: advisory key (1936289388, 14), "sina" and this migration's number.
CREATE FUNCTION sinal_outbox_arm() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox_wake SET armed = true WHERE id AND NOT armed;
    IF FOUND THEN  -- it was down: wait for the writers that saw it so
        PERFORM pg_advisory_xact_lock(1936289388, 14);
    END IF;  -- up already: raised by a worker that waited for them then
END $$;

-- The flag is read by primary key: `sinal_record_event` runs with enable_seqscan off,
-- which its triggers inherit, and a disabled sequential scan's cost makes PostgreSQL
-- compile the query with JIT on every call (~20 ms).
CREATE OR REPLACE FUNCTION sinal_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted)
       AND (NOT pg_try_advisory_xact_lock_shared(1936289388, 14)
            OR coalesce((SELECT armed FROM outbox_wake WHERE id), true)) THEN
        PERFORM pg_notify('sinal_outbox', '');
    END IF;
    RETURN NULL;
END $$;
