-- Expand: the line total (filled by the backfill-line-totals repair), and the constraints
-- added NOT VALID: from now on they check the rows written, while the old rows are repaired.
ALTER TABLE order_lines ADD COLUMN total_cents bigint;

ALTER TABLE order_lines ADD CONSTRAINT order_lines_product_fk
  FOREIGN KEY (product_id) REFERENCES products (product_id) NOT VALID;

ALTER TABLE order_lines ADD CONSTRAINT order_lines_order_fk
  FOREIGN KEY (order_id) REFERENCES orders (order_id) NOT VALID;

ALTER TABLE order_lines ADD CONSTRAINT order_lines_quantity_positive
  CHECK (quantity > 0) NOT VALID;
