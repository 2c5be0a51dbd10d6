-- sinal 0029: when an order was placed (the provider's created_at, `OrderRef.placed_at`),
-- kept on its row. A Yampi cart.reminder (the abandonment itself) that reaches sinal after
-- its cart's order tells by it whether the cart was abandoned before the order was placed
-- (then recovered by it, `sinal.store.commerce.late_reminder`) or never was.
--
-- No default: PostgreSQL adds the column without rewriting the table.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS placed_at timestamptz;

-- The Yampi orders kept before, that a late reminder may still name (those with a cart
-- token): their Order Placed is dated when they were placed. An order whose Order Placed
-- never came keeps none, and a late reminder of its cart records nothing, as before.
UPDATE orders o SET placed_at = e.occurred_at
FROM events e
WHERE o.provider = 'yampi' AND o.cart_token IS NOT NULL AND o.placed_at IS NULL
  AND e.account_id = o.account_id
  AND e.unique_event_id = 'yampi:order_placed:' || o.external_id;
