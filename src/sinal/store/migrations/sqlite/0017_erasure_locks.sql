-- sinal 0017 (SQLite): nothing to change. On PostgreSQL an event's contact is now checked
-- FOR KEY SHARE, so that erasing a contact excludes concurrent emits for it; on SQLite
-- every write, an erasure and an emit alike, holds the one write lock (`BEGIN IMMEDIATE`).
SELECT 1;
