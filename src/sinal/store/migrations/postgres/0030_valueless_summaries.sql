-- sinal 0030: a summary's total_value is NULL while none of the contact's events of its
-- metric carried a value, as SUM(value) over those events is; 0 is values that added up
-- to 0. It was 0 for both: a contact's Message Read "worth 0.00", told apart from orders
-- that summed to 0.00 by nothing the summary held.
--
-- 1. The column takes NULL, and no default: a summary row is written with its total.
-- 2. The rows written as 0 for want of a value become NULL. Only those whose total is 0:
--    a row disagreeing with its events otherwise is drift, `sinal rebuild-summaries`'s.
-- 3. `sinal_record_event` (0019's, but for the two summary writes) keeps a NULL total
--    until an event with a value comes. The record statement and a streamed batch do the
--    same in the code (`_SUMMARY_CONFLICT`).
--
-- The UPDATE reads the events of the summaries whose total is 0 (an anti join, as the
-- planner sees fit), in the migration's transaction: writers of summaries wait for it.
-- A sinal from before this migration still writing (a rolling deploy) writes 0 for a
-- total of no value, and keeps NULL once added to one: run `sinal rebuild-summaries`
-- when the last of them has stopped.
ALTER TABLE contact_metrics_summary
    ALTER COLUMN total_value DROP NOT NULL,
    ALTER COLUMN total_value DROP DEFAULT;

UPDATE contact_metrics_summary s SET total_value = NULL
WHERE s.total_value = 0
  AND NOT EXISTS (SELECT FROM events e
                  WHERE e.account_id = s.account_id AND e.contact_id = s.contact_id
                    AND e.metric_name = s.metric_name AND e.value IS NOT NULL);

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
    -- written with its metric, so the metric is looked for only when the row is created.
    LOOP
        UPDATE contact_metrics_summary SET
            event_count = event_count + 1,
            total_value = coalesce(coalesce(total_value, 0) + p_value, total_value),
            first_event_at = least(first_event_at, p_occurred_at),
            last_event_at = greatest(last_event_at, p_occurred_at),
            updated_at = now()
        WHERE account_id = p_account_id AND contact_id = p_contact_id
          AND metric_name = p_metric_name;
        EXIT WHEN FOUND;
        INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, id,
                                             event_count, total_value, first_event_at,
                                             last_event_at)
        VALUES (p_account_id, p_contact_id, p_metric_name, p_id, 1, p_value,
                p_occurred_at, p_occurred_at)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            -- The contact's first event of this metric: the metric may be new as well.
            -- Read it, and insert it only when it is missing.
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
