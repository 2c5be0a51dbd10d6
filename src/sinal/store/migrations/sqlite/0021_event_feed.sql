-- sinal 0021 (SQLite): the change feed (`GET /v1/events?after=`, `Ledger.read_feed`).
-- Each event gets a number, `seq`, from one counter (`event_sequence`) that the
-- transaction recording it advances. SQLite has one writer at a time (`BEGIN IMMEDIATE`
-- holds the write lock from before the first number is taken until the commit), so the
-- numbers are given in commit order, and a reader that has seen a number has seen every
-- smaller one: ordering by `seq` is enough, without PostgreSQL's horizon. A counter
-- rather than `max(seq) + 1`: erasing a contact deletes events, and the next event must
-- not take the number of one a reader has passed. The events already stored are
-- numbered by arrival (`received_at`, then id).
ALTER TABLE events ADD COLUMN seq INTEGER;
UPDATE events SET seq = o.n
FROM (SELECT account_id, id, row_number() OVER (ORDER BY received_at, id) AS n FROM events) AS o
WHERE events.account_id = o.account_id AND events.id = o.id;
CREATE TABLE event_sequence (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
) STRICT;
INSERT INTO event_sequence (id, last) SELECT 1, coalesce(max(seq), 0) FROM events;
CREATE INDEX events_feed ON events (account_id, seq);
