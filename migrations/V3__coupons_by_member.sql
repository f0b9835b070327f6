-- Online: a supporting index for the repairs. Voiding locks and ranks the coupons of a batch
-- of (campaign, member) groups, and the member-month rebuild sums a member's coupons; without
-- this index every batch would scan the whole table. Built CONCURRENTLY: writes go on.
CREATE INDEX CONCURRENTLY issued_coupons_by_member
  ON issued_coupons (member_id, campaign_id);
