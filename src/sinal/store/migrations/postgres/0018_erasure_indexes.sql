-- sinal 0018: indexes for erasing a contact (`sinal.store.erasure`). Its deletes find a
-- contact's rows by (account_id, contact_id); these tables had no index leading with it
-- (their keys lead with the message, the user id, the link, the checkout token), so each
-- delete read every row of the account while the contact's row lock was held, and so did
-- the foreign key checks of the contact's own delete. Events, summaries, tags,
-- conversations and orders have such an index already.
--
-- Built in the migration's transaction: writers of these tables wait while they build.
-- On a large database, build them beforehand with CREATE INDEX CONCURRENTLY (the same
-- definitions), which writers need not wait for: the migration then finds them.

CREATE INDEX IF NOT EXISTS executions_contact ON executions (account_id, contact_id);
CREATE INDEX IF NOT EXISTS contact_identities_contact ON contact_identities (account_id, contact_id);
CREATE INDEX IF NOT EXISTS message_statuses_contact ON message_statuses (account_id, contact_id);
CREATE INDEX IF NOT EXISTS whatsapp_users_contact ON whatsapp_users (account_id, contact_id);
CREATE INDEX IF NOT EXISTS links_contact ON links (account_id, contact_id);
CREATE INDEX IF NOT EXISTS checkouts_contact ON checkouts (account_id, contact_id);
