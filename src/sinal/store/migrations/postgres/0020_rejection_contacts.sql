-- sinal 0020: a kept rejection names its contact in a column of its own, indexed, so that
-- erasing a contact (`sinal.store.erasure`) finds the rejections of it by (account_id,
-- contact_id) instead of reading the input of every rejection of the account. The record
-- statement (`sinal.store.postgres`) fills it from the event's contact; the rows kept
-- before this migration get it from their input's contact_id (NULL for a rejection that
-- named none, `contact_required`).
--
-- The backfill writes every rejection once, and the index is built in the migration's
-- transaction: writers of rejections wait meanwhile. On a large database, prune old
-- rejections first (`SINAL_REJECTIONS_RETENTION_DAYS`) or migrate in quiet hours.

ALTER TABLE rejections ADD COLUMN IF NOT EXISTS contact_id uuid;
UPDATE rejections SET contact_id = (payload ->> 'contact_id')::uuid
WHERE contact_id IS NULL
  AND payload ->> 'contact_id' ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
CREATE INDEX IF NOT EXISTS rejections_contact ON rejections (account_id, contact_id);
