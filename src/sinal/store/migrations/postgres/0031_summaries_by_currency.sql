-- sinal 0031: a summary row counts a contact's events of one metric in one currency.
--
-- The key becomes (account_id, contact_id, metric_name, currency), the events' own
-- currency (every event has one: BRL unless given, with a value or not). A total adds
-- values of one currency only: a contact's Order Paid of 100 BRL and of 50 USD were one
-- row whose total said 150, a sum no exchange rate makes. Now they are two rows, 100 in
-- BRL and 50 in USD, each with its count, first and last occurrence; a metric's count is
-- the sum of its rows'. Nothing converts between currencies (sinal keeps no rates, and
-- money stays exact).
--
-- 1. The column, BRL for the rows there (a constant default: no rewrite), then no default:
--    every writer names the currency.
-- 2. Rows whose events all carry one other currency take it; their figures stay as they
--    were (a row disagreeing with its events otherwise is drift, `sinal rebuild-summaries`'s).
-- 3. Keys whose events carry several currencies are recounted from their events, a row
--    per currency (their old row added currencies up). The UPDATE and the recount read the
--    events once each, grouped by key, in the migration's transaction: writers of
--    summaries wait for it.
-- 4. `sinal_record_event` (0030's, but for the two summary writes) adds an event to its
--    currency's row. The record statement and a streamed batch do the same in the code.
--
-- A sinal from before this migration still writing (a rolling deploy) fails on the new
-- key (its upsert names the old one): stop it before migrating.
ALTER TABLE contact_metrics_summary ADD COLUMN currency text NOT NULL DEFAULT 'BRL';
ALTER TABLE contact_metrics_summary ALTER COLUMN currency DROP DEFAULT;

CREATE TEMPORARY TABLE sinal_0031_keys ON COMMIT DROP AS
SELECT account_id, contact_id, metric_name, min(currency) AS currency,
       min(currency) <> max(currency) AS is_mixed
FROM events GROUP BY account_id, contact_id, metric_name
HAVING min(currency) <> 'BRL' OR max(currency) <> 'BRL';

UPDATE contact_metrics_summary s SET currency = k.currency
FROM sinal_0031_keys k
WHERE NOT k.is_mixed AND s.account_id = k.account_id AND s.contact_id = k.contact_id
  AND s.metric_name = k.metric_name;

DELETE FROM contact_metrics_summary s USING sinal_0031_keys k
WHERE k.is_mixed AND s.account_id = k.account_id AND s.contact_id = k.contact_id
  AND s.metric_name = k.metric_name;

ALTER TABLE contact_metrics_summary DROP CONSTRAINT contact_metrics_summary_pkey,
    ADD PRIMARY KEY (account_id, contact_id, metric_name, currency);

INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, currency,
                                     event_count, total_value, first_event_at, last_event_at)
SELECT e.account_id, e.contact_id, e.metric_name, e.currency, count(*), sum(e.value),
       min(e.occurred_at), max(e.occurred_at)
FROM events e JOIN sinal_0031_keys k
  ON k.is_mixed AND e.account_id = k.account_id AND e.contact_id = k.contact_id
 AND e.metric_name = k.metric_name
GROUP BY e.account_id, e.contact_id, e.metric_name, e.currency;

CREATE OR REPLACE FUNCTION sinal_record_event(
    p_id uuid, p_account_id uuid, p_contact_id uuid, p_metric_name text, p_properties text,
    p_value numeric, p_currency text, p_source text, p_source_id text,
    p_integration_id uuid, p_unique_event_id text, p_entity_type text, p_entity_id text,
    p_execution_id uuid, p_occurred_at timestamptz, p_received_at timestamptz,
    p_metric_id uuid, p_display_name text, p_category text, p_is_system boolean,
    p_schema_version integer,
    OUT created boolean, OUT known boolean, OUT stored_id uuid, OUT stored_metric_name text,
    OUT stored_properties jsonb, OUT stored_value numeric, OUT stored_currency text,
    OUT stored_occurred_at timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    created := false;
    INSERT INTO events (account_id, id, contact_id, metric_id, metric_name, properties, value,
                        currency, source, source_id, integration_id, unique_event_id,
                        entity_type, entity_id, automation_execution_id, occurred_at,
                        received_at, schema_version)
    SELECT p_account_id, p_id, p_contact_id, p_metric_id, p_metric_name, p_properties::jsonb,
            p_value, p_currency, p_source, p_source_id, p_integration_id, p_unique_event_id,
            p_entity_type, p_entity_id, p_execution_id, p_occurred_at, p_received_at,
            p_schema_version
    WHERE EXISTS (SELECT FROM contacts WHERE account_id = p_account_id AND id = p_contact_id)
    ON CONFLICT (account_id, unique_event_id) DO NOTHING;
    IF NOT FOUND THEN
        known := EXISTS (SELECT FROM contacts WHERE account_id = p_account_id AND id = p_contact_id);
        IF NOT known THEN
            RETURN;
        END IF;
        SELECT e.id, e.metric_name, e.properties, e.value, e.currency, e.occurred_at
        INTO stored_id, stored_metric_name, stored_properties, stored_value, stored_currency,
             stored_occurred_at
        FROM events e
        WHERE e.account_id = p_account_id AND e.unique_event_id = p_unique_event_id;
        RETURN;
    END IF;
    known := true;
    created := true;
    IF p_execution_id IS NULL THEN
        INSERT INTO outbox (account_id, event_id, metric_name)
        VALUES (p_account_id, p_id, p_metric_name);
    END IF;
    -- The summary row usually exists: update it; create it when it does not, and should
    -- another transaction create it first, update that one. A summary row is only ever
    -- written with its metric, so the metric is looked for only when the row is created
    -- (a contact's first event of a metric in another currency looks for it too).
    LOOP
        UPDATE contact_metrics_summary SET
            event_count = event_count + 1,
            total_value = coalesce(coalesce(total_value, 0) + p_value, total_value),
            first_event_at = least(first_event_at, p_occurred_at),
            last_event_at = greatest(last_event_at, p_occurred_at),
            updated_at = now()
        WHERE account_id = p_account_id AND contact_id = p_contact_id
          AND metric_name = p_metric_name AND currency = p_currency;
        EXIT WHEN FOUND;
        INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, currency, id,
                                             event_count, total_value, first_event_at,
                                             last_event_at)
        VALUES (p_account_id, p_contact_id, p_metric_name, p_currency, p_id, 1, p_value,
                p_occurred_at, p_occurred_at)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            -- The contact's first event of this metric (in this currency): the metric may
            -- be new as well. Read it, and insert it only when it is missing.
            IF NOT EXISTS (SELECT FROM metrics
                           WHERE account_id = p_account_id AND name = p_metric_name) THEN
                INSERT INTO metrics (account_id, id, name, display_name, category, source,
                                     is_system)
                VALUES (p_account_id, p_metric_id, p_metric_name, p_display_name, p_category,
                        p_source, p_is_system)
                ON CONFLICT DO NOTHING;
            END IF;
            EXIT;
        END IF;
    END LOOP;
END $$;
