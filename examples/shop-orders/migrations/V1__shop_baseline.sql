-- The legacy schema of the shop, as production has it before the release. No foreign keys:
-- lines outlive their product or their order, and quantities are not checked.
CREATE TABLE products (
  product_id bigint PRIMARY KEY,
  name       text NOT NULL,
  unit_cents integer NOT NULL
);

CREATE TABLE orders (
  order_id  bigint PRIMARY KEY,
  placed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE order_lines (
  line_id    bigint PRIMARY KEY,
  order_id   bigint NOT NULL,
  product_id bigint,
  quantity   integer NOT NULL,
  unit_cents integer NOT NULL
);
