-- sinal 0018 (SQLite): indexes for erasing a contact (`sinal.store.erasure`), as on
-- PostgreSQL (see there): its deletes find a contact's rows by (account_id, contact_id),
-- which these tables' keys do not lead with, so each read every row of the account while
-- the erasure held the write lock.

CREATE INDEX IF NOT EXISTS executions_contact ON executions (account_id, contact_id);
CREATE INDEX IF NOT EXISTS contact_identities_contact ON contact_identities (account_id, contact_id);
CREATE INDEX IF NOT EXISTS message_statuses_contact ON message_statuses (account_id, contact_id);
CREATE INDEX IF NOT EXISTS whatsapp_users_contact ON whatsapp_users (account_id, contact_id);
CREATE INDEX IF NOT EXISTS links_contact ON links (account_id, contact_id);
CREATE INDEX IF NOT EXISTS checkouts_contact ON checkouts (account_id, contact_id);
