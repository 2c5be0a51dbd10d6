-- sinal 0021: the change feed (`GET /v1/events?after=`, `Ledger.read_feed`). Each event
-- records the id of the transaction that wrote it (`tx`, filled by its default on every
-- path: the record statement, `sinal_record_event`, a streamed batch's COPY). A reader
-- hands out only the events of transactions older than the oldest one still running
-- (`pg_snapshot_xmin(pg_current_snapshot())`), in order of (tx, id): every transaction
-- below that horizon has ended, so no event can appear later behind a position already
-- handed out. Ordering by the events' ids (UUIDv7, made before the commit) or by a
-- sequence would not do: a transaction holding a smaller one can commit after a reader
-- has passed it.
--
-- `pg_current_xact_id()` is stable, not volatile: the column is added without rewriting
-- the table, and the events already stored all take this migration's transaction id,
-- older than any later one.
--
-- Built in the migration's transaction: writers of `events` wait while the index builds.
-- On a large database, build it beforehand with CREATE INDEX CONCURRENTLY (once the
-- column is there, the same definition): the migration then finds it.
ALTER TABLE events ADD COLUMN IF NOT EXISTS tx xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS events_feed ON events (account_id, tx, id);
