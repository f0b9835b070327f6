-- The NOT NULL pattern, step 1: a CHECK added NOT VALID (a brief lock, no scan). V6 validates
-- it without blocking writes; V7 then sets NOT NULL, which PostgreSQL 12 and later do without a
-- scan once this check is valid.
ALTER TABLE order_lines ADD CONSTRAINT order_lines_total_cents_not_null
  CHECK (total_cents IS NOT NULL) NOT VALID;
