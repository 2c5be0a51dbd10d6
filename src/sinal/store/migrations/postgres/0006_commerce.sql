-- sinal 0006: commerce rows beside the events. Orders (status only moves forward, see
-- sinal.store.commerce.merge_order) and checkouts (abandoned carts are derived from them).

CREATE TABLE orders (
    account_id        uuid NOT NULL,
    id                uuid NOT NULL,
    provider          text NOT NULL,
    integration_id    uuid NOT NULL,
    external_id       text NOT NULL,             -- the provider's order id
    number            text,                      -- what the customer sees ("#1042")
    status            text NOT NULL CHECK (status IN ('pending', 'paid', 'fulfilled',
        'delivered', 'partially_refunded', 'refunded', 'cancelled')),
    provider_status   text,                      -- the provider's own word
    total             numeric(18, 4),
    refunded          numeric(18, 4) NOT NULL DEFAULT 0,
    currency          text,
    checkout_token    text,
    cart_token        text,
    contact_id        uuid,
    source_updated_at timestamptz,               -- the provider's updated_at of the snapshot
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, id),
    UNIQUE (account_id, integration_id, external_id)
);
-- An order completes the checkout whose token it carries (abandonment and recovery).
CREATE INDEX orders_checkout_token ON orders (account_id, integration_id, checkout_token)
    WHERE checkout_token IS NOT NULL;
CREATE INDEX orders_cart_token ON orders (account_id, integration_id, cart_token)
    WHERE cart_token IS NOT NULL;
CREATE INDEX orders_contact ON orders (account_id, contact_id);

CREATE TABLE checkouts (
    account_id     uuid NOT NULL,
    integration_id uuid NOT NULL,
    token          text NOT NULL,
    provider       text NOT NULL,
    contact_id     uuid,                         -- NULL while anonymous: never abandoned
    recovery_url   text,
    total          numeric(18, 4),
    currency       text,
    details        jsonb NOT NULL DEFAULT '{}',  -- contact identities, items, discount codes
    updated_at     timestamptz NOT NULL,         -- the provider's: abandonment counts from it
    due_at         timestamptz,                  -- when it counts as abandoned
    completed_at   timestamptz,
    abandoned_at   timestamptz,
    recovered_at   timestamptz,
    PRIMARY KEY (account_id, integration_id, token)
);
-- Scanned by the worker across accounts, like executions_due.
CREATE INDEX checkouts_due ON checkouts (due_at)
    WHERE due_at IS NOT NULL AND abandoned_at IS NULL AND completed_at IS NULL;
