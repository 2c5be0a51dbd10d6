-- sinal 0027 (SQLite): the index of a tag's contacts (`GET /v1/contacts?tag=` lists them
-- by account_id and tag, in id order). The key (account_id, contact_id, tag) leads with
-- the contact, so the list walked every contact of the account to find those tagged.
CREATE INDEX IF NOT EXISTS contact_tags_tag ON contact_tags (account_id, tag, contact_id);
