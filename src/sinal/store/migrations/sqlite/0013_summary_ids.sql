-- sinal 0013 (SQLite): nothing to change; kept so both backends number their migrations
-- alike. A summary row's id is now the id of an event that created it, on both backends
-- (the code writes it; SQLite's upsert already named its id, a new one per row). On
-- PostgreSQL this migration has the one-event function write that id as well.
SELECT 1;
