-- sinal 0012 (SQLite): nothing to change; kept so both backends number their migrations
-- alike. On PostgreSQL this migration drops the summaries' foreign key to contacts (each
-- check locked the contact's row) and has the one-event function look for the metric
-- only when it creates a summary row. SQLite has one writer at a time, checks a foreign
-- key with an index probe and no lock, and has no such function.
SELECT 1;
