-- sinal 0019 (SQLite): nothing. PostgreSQL's record function reads the contact without
-- locking it again; this file keeps the two backends' versions alike.
SELECT 1;
