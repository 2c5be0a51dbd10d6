-- sinal 0027: the index of a tag's contacts (`GET /v1/contacts?tag=` lists them by
-- account_id and tag, in id order). The key (account_id, contact_id, tag) leads with the
-- contact, so the list walked every contact of the account to find those tagged. Ordered
-- as the list is, so a page is one range of it.
--
-- Built in the migration's transaction: writers of tags wait while it builds. On a large
-- database, build it beforehand with CREATE INDEX CONCURRENTLY (the same definition),
-- which writers need not wait for: the migration then finds it.
CREATE INDEX IF NOT EXISTS contact_tags_tag ON contact_tags (account_id, tag, contact_id);
