-- Expand: everything the repairs and the new application need, added without touching a row.
-- Each ALTER is metadata-only on PostgreSQL 11+ (a constant default needs no table rewrite),
-- so the ACCESS EXCLUSIVE lock is held for milliseconds; pgmend bounds the wait for it.
ALTER TABLE issued_coupons ADD COLUMN voided_at timestamptz;
ALTER TABLE issued_coupons ADD COLUMN legacy_duplicate boolean NOT NULL DEFAULT false;

-- Empty until the rebuild repairs fill it. The issued_within_budget check comes later,
-- NOT VALID, once the counters hold the truth.
CREATE TABLE campaign_budgets (
  campaign_id  text PRIMARY KEY REFERENCES campaigns,
  discount_yen integer NOT NULL CHECK (discount_yen >= 0),
  budget_yen   integer NOT NULL CHECK (budget_yen >= 0),
  issued_yen   integer NOT NULL DEFAULT 0
);

CREATE TABLE member_monthly_usage (
  member_id text NOT NULL,
  month     text NOT NULL,
  used_yen  integer NOT NULL DEFAULT 0 CHECK (used_yen >= 0),
  PRIMARY KEY (member_id, month)
);

CREATE TABLE notification_outbox (
  coupon_id  uuid PRIMARY KEY REFERENCES issued_coupons,
  member_id  text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  sent_at    timestamptz
);
-- A new, empty table that no other session can see until this transaction commits: a plain
-- index build here blocks nobody, and CONCURRENTLY is impossible inside a transaction.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX notification_outbox_unsent ON notification_outbox (created_at) WHERE sent_at IS NULL;
