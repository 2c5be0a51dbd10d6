-- sinal 0002: what the HTTP service needs: API keys and contact tags.
-- As in 0001, every primary and unique key starts with account_id.

-- Only the SHA-256 of a key is stored; the key text embeds its account, so a request is
-- authenticated by (account_id, key_hash) without a cross-tenant lookup.
CREATE TABLE api_keys (
    account_id  uuid NOT NULL REFERENCES accounts (id),
    id          uuid NOT NULL,
    key_hash    text NOT NULL,   -- SHA-256 of the whole key, lowercase hex
    hint        text NOT NULL,   -- the key's last characters, to tell keys apart in listings
    name        text,
    scopes      text[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, key_hash)
);
-- `sinal keys revoke KEY_ID` names a key by id alone (an operator's command): not unique.
CREATE INDEX api_keys_id ON api_keys (id);

CREATE TABLE contact_tags (
    account_id  uuid NOT NULL,
    contact_id  uuid NOT NULL,
    tag         text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, contact_id, tag),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
);
