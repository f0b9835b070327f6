-- The legacy production schema (version 1), exactly as it runs today.
-- Production already has it: adopt it with `pgmend migrate baseline`, never apply it there.
CREATE TABLE campaigns (
  campaign_id  text PRIMARY KEY,
  discount_yen integer NOT NULL,
  budget_yen   integer NOT NULL,
  issued_yen   integer NOT NULL DEFAULT 0
);

CREATE TABLE issued_coupons (
  coupon_id   uuid PRIMARY KEY,
  campaign_id text NOT NULL REFERENCES campaigns,
  member_id   text NOT NULL,
  month       text NOT NULL,
  amount_yen  integer NOT NULL,
  issued_at   timestamptz NOT NULL DEFAULT now(),
  redeemed_at timestamptz
);
