-- SHARE UPDATE EXCLUSIVE: the application keeps reading and writing the lines meanwhile.
ALTER TABLE order_lines VALIDATE CONSTRAINT order_lines_product_fk;
