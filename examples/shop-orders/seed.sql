-- Broken legacy data for the shop-orders example, on V1 (run after V1, before the release):
-- 500 products and 4,000 orders, then 20,000 order lines, of which
--   every 37th product is deleted (its lines become orphans: product_id set to NULL),
--   every 53rd order is deleted (its lines become orphans: quarantined),
--   every 29th line has a quantity of 0 or -1, and every 97th line has no product at all.
INSERT INTO products (product_id, name, unit_cents)
SELECT p, 'product ' || p, 100 + (p * 37) % 9900 FROM generate_series(1, 500) p;

INSERT INTO orders (order_id, placed_at)
SELECT o, timestamptz '2026-01-01 00:00+09' + o * interval '17 minutes' FROM generate_series(1, 4000) o;

INSERT INTO order_lines (line_id, order_id, product_id, quantity, unit_cents)
SELECT l,
       1 + (l * 7) % 4000,
       CASE WHEN l % 97 = 0 THEN NULL ELSE 1 + (l * 13) % 500 END,
       CASE WHEN l % 29 = 0 THEN -(l % 2) ELSE 1 + l % 5 END,
       100 + (l * 31) % 5000
  FROM generate_series(1, 20000) l;

DELETE FROM products WHERE product_id % 37 = 0;
DELETE FROM orders WHERE order_id % 53 = 0;
ANALYZE products, orders, order_lines;
