-- sinal 0020 (SQLite): a kept rejection names its contact in a column of its own, indexed,
-- as on PostgreSQL (see there): an erasure finds the rejections of a contact by (account_id,
-- contact_id), not by reading the input of every rejection of the account. The rows kept
-- before this migration get it from their input's contact_id (NULL when it named none).

ALTER TABLE rejections ADD COLUMN contact_id TEXT;
UPDATE rejections SET contact_id = lower(payload ->> '$.contact_id')
WHERE json_valid(payload) AND json_type(payload, '$.contact_id') = 'text'
  AND length(payload ->> '$.contact_id') = 36;
CREATE INDEX IF NOT EXISTS rejections_contact ON rejections (account_id, contact_id);
