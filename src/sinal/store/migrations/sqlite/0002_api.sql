-- sinal 0002 (SQLite): the same tables as PostgreSQL's 0002.
-- scopes are a JSON array of strings; key_hash is the SHA-256 digest as lowercase hex.

CREATE TABLE api_keys (
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    id          TEXT NOT NULL,
    key_hash    TEXT NOT NULL,
    hint        TEXT NOT NULL,
    name        TEXT,
    scopes      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, key_hash)
) STRICT, WITHOUT ROWID;
CREATE INDEX api_keys_id ON api_keys (id);

CREATE TABLE contact_tags (
    account_id  TEXT NOT NULL,
    contact_id  TEXT NOT NULL,
    tag         TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (account_id, contact_id, tag),
    FOREIGN KEY (account_id, contact_id) REFERENCES contacts (account_id, id)
) STRICT, WITHOUT ROWID;
