-- sinal 0024 (PostgreSQL): nothing to change; kept so both backends number their
-- migrations alike. On SQLite this migration numbers the events a writer stores without
-- `seq` (a sinal from before 0021, in a rolling deploy), which the change feed missed.
-- Here the feed's `tx` is filled by its default (0021) whoever writes the event, and an
-- INSERT from before 0021 names no `tx`: it takes its transaction's id like any other.
SELECT 1;
