-- sinal 0014 (SQLite): nothing to change; kept so both backends number their migrations
-- alike. On PostgreSQL, writers stop sending a NOTIFY per transaction (see there);
-- SQLite has no NOTIFY and one worker.
SELECT 1;
