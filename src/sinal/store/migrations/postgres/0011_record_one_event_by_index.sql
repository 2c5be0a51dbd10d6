-- sinal 0011: the one-event function finds its rows by index whatever the statistics say.
--
-- PL/pgSQL plans each statement of `sinal_record_event` once per session and keeps the
-- plan. Planned while `contact_metrics_summary` or `metrics` looked tiny to the planner
-- (a new install, a new account's first minutes: one page, a handful of rows, no ANALYZE
-- yet), the summary's UPDATE and the metric's lookup became sequential scans, and stayed
-- so while the table grew: each call then read every row of the table. Every row the
-- function reads is found by a whole key of an index, so sequential scans are priced out
-- for the function's duration (the setting is restored when it returns).
--
-- Measured with the bench's emit_event on fresh tables (4 interleaved rounds of 2,000
-- calls, 05:20 UTC 2026-11-30): backend CPU 348 → 311 µs a call, wall time 682 → 641 µs.
ALTER FUNCTION sinal_record_event(
    uuid, uuid, uuid, text, text, numeric, text, text, text, uuid, text, text, text, uuid,
    timestamptz, timestamptz, uuid, text, text, boolean, integer
) SET enable_seqscan = off;
