-- sinal 0029 (SQLite): when an order was placed, kept on its row, for a Yampi cart.reminder
-- that comes after its cart's order (see the PostgreSQL migration of the same number); the
-- Yampi orders kept before take their Order Placed's time.
ALTER TABLE orders ADD COLUMN placed_at TEXT;

UPDATE orders SET placed_at = (
    SELECT e.occurred_at FROM events e
    WHERE e.account_id = orders.account_id
      AND e.unique_event_id = 'yampi:order_placed:' || orders.external_id
)
WHERE provider = 'yampi' AND cart_token IS NOT NULL AND placed_at IS NULL;
