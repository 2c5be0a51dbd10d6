-- sinal 0031 (SQLite): a summary row counts a contact's events of one metric in one
-- currency, keyed (account_id, contact_id, metric_name, currency): a total never adds
-- values of two currencies (see the PostgreSQL migration). The table is rebuilt with the
-- new key (nothing refers to it). Rows whose events carry one currency are copied with it
-- (BRL for a row with no events behind it, drift left to `sinal rebuild-summaries`), their
-- figures as they were; keys whose events carry several are recounted from the events, a
-- row per currency (`decimal_sum`, the store's exact sum, as `rebuild-summaries` adds),
-- the id of the row that of its first event (as a writer's).

CREATE TABLE contact_metrics_summary_0031 (
    account_id     TEXT NOT NULL,
    contact_id     TEXT NOT NULL,
    metric_name    TEXT NOT NULL,
    currency       TEXT NOT NULL,
    id             TEXT NOT NULL,
    event_count    INTEGER NOT NULL,
    total_value    TEXT,
    first_event_at TEXT NOT NULL,
    last_event_at  TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    PRIMARY KEY (account_id, contact_id, metric_name, currency),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;

CREATE TEMPORARY TABLE sinal_0031_keys AS
SELECT account_id, contact_id, metric_name, min(currency) AS currency,
       min(currency) <> max(currency) AS is_mixed
FROM events GROUP BY account_id, contact_id, metric_name;

INSERT INTO contact_metrics_summary_0031 (account_id, contact_id, metric_name, currency, id,
    event_count, total_value, first_event_at, last_event_at, updated_at)
SELECT s.account_id, s.contact_id, s.metric_name, coalesce(k.currency, 'BRL'), s.id,
    s.event_count, s.total_value, s.first_event_at, s.last_event_at, s.updated_at
FROM contact_metrics_summary s
LEFT JOIN sinal_0031_keys k ON k.account_id = s.account_id AND k.contact_id = s.contact_id
    AND k.metric_name = s.metric_name
WHERE NOT coalesce(k.is_mixed, 0);

INSERT INTO contact_metrics_summary_0031 (account_id, contact_id, metric_name, currency, id,
    event_count, total_value, first_event_at, last_event_at, updated_at)
SELECT e.account_id, e.contact_id, e.metric_name, e.currency, min(e.id), count(*),
    decimal_sum(e.value), min(e.occurred_at), max(e.occurred_at),
    strftime('%Y-%m-%dT%H:%M:%S', 'now') || '.000000Z'
FROM events e JOIN sinal_0031_keys k ON k.is_mixed AND k.account_id = e.account_id
    AND k.contact_id = e.contact_id AND k.metric_name = e.metric_name
GROUP BY e.account_id, e.contact_id, e.metric_name, e.currency;

DROP TABLE sinal_0031_keys;
DROP TABLE contact_metrics_summary;
ALTER TABLE contact_metrics_summary_0031 RENAME TO contact_metrics_summary;
