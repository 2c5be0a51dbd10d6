-- sinal 0011 (SQLite): nothing to change; kept so both backends number their migrations
-- alike. On PostgreSQL this migration makes the one-event function find its rows by
-- index even when its plans were made on a table the planner thought tiny; SQLite has no
-- such function.
SELECT 1;
