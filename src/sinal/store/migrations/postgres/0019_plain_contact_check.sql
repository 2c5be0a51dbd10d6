-- sinal 0019: an event's contact is read, not locked, again (0013's function, as before
-- 0017). 0017's FOR KEY SHARE wrote a lock into the contact's row for every event: it cost
-- `emit_event` ~80 µs of PostgreSQL's CPU per event (bench/ingest.py, session 38), a tenth
-- of its time. An erasure (`sinal.store.postgres_erasure`) now locks `events` SHARE ROW
-- EXCLUSIVE before it reads the contact, and this function's INSERT holds ROW EXCLUSIVE on
-- `events` from the start of the statement, before the snapshot its EXISTS reads: an emit
-- that found the contact commits before the erasure deletes, and one that comes during it
-- waits, then finds no contact.
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
            total_value = total_value + coalesce(p_value, 0),
            first_event_at = least(first_event_at, p_occurred_at),
            last_event_at = greatest(last_event_at, p_occurred_at),
            updated_at = now()
        WHERE account_id = p_account_id AND contact_id = p_contact_id
          AND metric_name = p_metric_name;
        EXIT WHEN FOUND;
        INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, id,
                                             event_count, total_value, first_event_at,
                                             last_event_at)
        VALUES (p_account_id, p_contact_id, p_metric_name, p_id, 1, coalesce(p_value, 0),
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
