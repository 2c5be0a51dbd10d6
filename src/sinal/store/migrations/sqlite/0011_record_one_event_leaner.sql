-- sinal 0011 (SQLite): nothing to change; kept so both backends number their migrations
-- alike. On PostgreSQL this migration makes the one-event function leaner (its contact
-- check inside the event's insert, no sequential scans); SQLite has no such function.
SELECT 1;
