-- Stop new overruns without denying the old ones: NOT VALID skips the existing rows (some
-- campaigns are already over budget), but every later INSERT and UPDATE is checked.
-- Only once the counters hold the truth; otherwise the check would guard wrong numbers.
/* pgmend:precondition
name: campaign_budgets_match_coupons
explain: campaigns whose campaign_budgets row is missing or differs from the sum of their non-voided coupons
fix: rebuild the counters (pgmend repair apply rebuild-campaign-budgets --yes), then rerun
tables: campaigns, campaign_budgets, issued_coupons
query:
SELECT c.campaign_id, b.issued_yen AS counter_yen, coalesce(s.total, 0) AS real_yen
  FROM campaigns c
  LEFT JOIN campaign_budgets b USING (campaign_id)
  LEFT JOIN (SELECT campaign_id, sum(amount_yen) AS total
               FROM issued_coupons WHERE voided_at IS NULL GROUP BY campaign_id) s USING (campaign_id)
 WHERE b.campaign_id IS NULL OR b.issued_yen <> coalesce(s.total, 0)
*/
ALTER TABLE campaign_budgets
  ADD CONSTRAINT issued_within_budget CHECK (issued_yen BETWEEN 0 AND budget_yen) NOT VALID;
