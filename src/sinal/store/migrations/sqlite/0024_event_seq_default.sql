-- sinal 0024 (SQLite): an event written without a `seq` gets one. A sinal from before
-- 0021 still running beside this one (a rolling deploy) names no `seq` in its INSERT:
-- its events kept a NULL, which the change feed (`seq > ?`) never returned. The trigger
-- gives such an event the counter's next number in the transaction that writes it, as
-- this code does for its own (one writer at a time: commit order), so no writer can make
-- an event invisible to the feed. A trigger: a column's default cannot read a table. This
-- code names `seq` in every insert, so it fires for none of them.
CREATE TRIGGER IF NOT EXISTS events_seq_default AFTER INSERT ON events
WHEN NEW.seq IS NULL
BEGIN
    UPDATE event_sequence SET last = last + 1;
    UPDATE events SET seq = (SELECT last FROM event_sequence)
    WHERE account_id = NEW.account_id AND id = NEW.id;
END;
-- The events such a writer stored since 0021, numbered after every number given, by
-- arrival (`received_at`, then id): a poller reads them next.
UPDATE events SET seq = (SELECT last FROM event_sequence) + o.n
FROM (
    SELECT account_id, id, row_number() OVER (ORDER BY received_at, id) AS n
    FROM events WHERE seq IS NULL
) AS o
WHERE events.account_id = o.account_id AND events.id = o.id;
UPDATE event_sequence SET last = max(last, coalesce((SELECT max(seq) FROM events), 0));
