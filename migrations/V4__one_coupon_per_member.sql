-- Online: one live coupon per member and campaign. Built CONCURRENTLY (reads and writes go
-- on), only after a census finds no (campaign_id, member_id) with two rows that are not
-- legacy duplicates; the void-duplicate-coupons repair makes that so.
-- The application's upsert names it by inference:
--   ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate
CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member
  ON issued_coupons (campaign_id, member_id)
  WHERE NOT legacy_duplicate;
