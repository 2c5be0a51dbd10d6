-- sinal 0030 (SQLite): a summary's total_value is NULL while none of the contact's events
-- of its metric carried a value, as SUM(value) over those events is; 0 is values that
-- added up to 0 (see the PostgreSQL migration). SQLite cannot drop a NOT NULL in place:
-- the table is rebuilt (nothing refers to it), its rows copied, those written as 0 for
-- want of a value (a total of 0 and no event of theirs with one) as NULL.

CREATE TABLE contact_metrics_summary_0030 (
    account_id     TEXT NOT NULL,
    contact_id     TEXT NOT NULL,
    metric_name    TEXT NOT NULL,
    id             TEXT NOT NULL,
    event_count    INTEGER NOT NULL,
    total_value    TEXT,
    first_event_at TEXT NOT NULL,
    last_event_at  TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    PRIMARY KEY (account_id, contact_id, metric_name),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;

INSERT INTO contact_metrics_summary_0030 (account_id, contact_id, metric_name, id,
    event_count, total_value, first_event_at, last_event_at, updated_at)
SELECT account_id, contact_id, metric_name, id, event_count,
    CASE WHEN CAST(total_value AS REAL) = 0 AND NOT EXISTS (
             SELECT 1 FROM events e
             WHERE e.account_id = s.account_id AND e.contact_id = s.contact_id
               AND e.metric_name = s.metric_name AND e.value IS NOT NULL)
         THEN NULL ELSE total_value END,
    first_event_at, last_event_at, updated_at
FROM contact_metrics_summary s;

DROP TABLE contact_metrics_summary;
ALTER TABLE contact_metrics_summary_0030 RENAME TO contact_metrics_summary;
