ALTER TABLE order_lines VALIDATE CONSTRAINT order_lines_order_fk;

ALTER TABLE order_lines VALIDATE CONSTRAINT order_lines_quantity_positive;
