-- sinal 0009 (SQLite): nothing to change; kept so both backends number their migrations
-- alike. On PostgreSQL this migration drops the events table's foreign keys, whose row
-- by row checks took a lock on the parent rows shared by every concurrent writer, and
-- makes the outbox's NOTIFY conditional. SQLite has one writer at a time, checks a
-- foreign key with an index probe and no lock, and has no NOTIFY: nothing to gain.
SELECT 1;
