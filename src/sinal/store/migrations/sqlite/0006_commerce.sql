-- sinal 0006 (SQLite): orders and checkouts, as PostgreSQL's 0006.

CREATE TABLE orders (
    account_id        TEXT NOT NULL,
    id                TEXT NOT NULL,
    provider          TEXT NOT NULL,
    integration_id    TEXT NOT NULL,
    external_id       TEXT NOT NULL,
    number            TEXT,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'fulfilled',
        'delivered', 'partially_refunded', 'refunded', 'cancelled')),
    provider_status   TEXT,
    total             TEXT,
    refunded          TEXT NOT NULL DEFAULT '0',
    currency          TEXT,
    checkout_token    TEXT,
    cart_token        TEXT,
    contact_id        TEXT,
    source_updated_at TEXT,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, integration_id, external_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX orders_checkout_token ON orders (account_id, integration_id, checkout_token)
    WHERE checkout_token IS NOT NULL;
CREATE INDEX orders_cart_token ON orders (account_id, integration_id, cart_token)
    WHERE cart_token IS NOT NULL;
CREATE INDEX orders_contact ON orders (account_id, contact_id);

CREATE TABLE checkouts (
    account_id     TEXT NOT NULL,
    integration_id TEXT NOT NULL,
    token          TEXT NOT NULL,
    provider       TEXT NOT NULL,
    contact_id     TEXT,
    recovery_url   TEXT,
    total          TEXT,
    currency       TEXT,
    details        TEXT NOT NULL DEFAULT '{}',
    updated_at     TEXT NOT NULL,
    due_at         TEXT,
    completed_at   TEXT,
    abandoned_at   TEXT,
    recovered_at   TEXT,
    PRIMARY KEY (account_id, integration_id, token)
) STRICT, WITHOUT ROWID;
CREATE INDEX checkouts_due ON checkouts (due_at)
    WHERE due_at IS NOT NULL AND abandoned_at IS NULL AND completed_at IS NULL;
