//! The incident's dirty legacy data (Silver Week), generated on a V1 schema: used by
//! `pgmend demo`, the tests and the examples, so that all of them start from the same rows.

use anyhow::{Context, Result};

/// Silver Week: three 1,000-yen campaigns (`Shape::discount_yen`), budgets of the seed (100,000 /
/// 300,000 / 300,000 yen for 300 members) scaled to the member count and the discount, double taps that left
/// duplicates (some redeemed), and a campaigns.issued_yen that lost updates. Deterministic:
/// the same --members gives the same rows (coupon ids aside).
const DIRTY_DATA_SQL: &str = "
INSERT INTO campaigns (campaign_id, discount_yen, budget_yen, issued_yen)
SELECT id, $2::int, (budget::bigint * $1::int / 300 * $2::int / 1000)::int, 0
  FROM (VALUES ('SW-A', 100000), ('SW-B', 300000), ('SW-C', 300000)) v(id, budget);
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at)
SELECT gen_random_uuid(), c.campaign_id, 'm' || lpad(m::text, 7, '0'), '2026-09', c.discount_yen,
       timestamptz '2026-09-19 09:00+09' + (h.r % 432000) * interval '1 second' + k * interval '180 milliseconds',
       CASE WHEN (h.r / 7 + k * 13) % 100 < 35 THEN timestamptz '2026-09-25 12:00+09' + (h.r % 1000) * interval '1 minute' END
  FROM generate_series(1, $1::int) m
 CROSS JOIN campaigns c
 CROSS JOIN LATERAL (SELECT hashtext(c.campaign_id || ':' || m)::bigint & 2147483647 AS r) h
 CROSS JOIN LATERAL generate_series(1, CASE WHEN h.r % 100 < $4::int THEN 3 WHEN h.r % 100 < $4::int + $5::int THEN 2 ELSE 1 END) k
 WHERE (h.r / 100) % 100 < CASE c.campaign_id WHEN 'SW-A' THEN $2::int ELSE $3::int END;
UPDATE campaigns c SET issued_yen = (s.total * 0.93)::int
  FROM (SELECT campaign_id, sum(amount_yen) AS total FROM issued_coupons GROUP BY 1) s
 WHERE s.campaign_id = c.campaign_id;
ANALYZE campaigns, issued_coupons;";

/// Fills a legacy (V1) schema with the Silver Week data for `members` members.
pub fn generate_dirty_data(client: &mut postgres::Client, members: i32) -> Result<()> {
    generate_dirty_data_shaped(client, members, &Shape::SEED)
}

/// How many members take each campaign and how many of their coupons are duplicated.
pub struct Shape {
    /// Percent of members with a coupon of SW-A, and of SW-B and SW-C.
    pub takes_a: i32,
    pub takes_b_c: i32,
    /// Percent of (campaign, member) groups with three coupons, and with two.
    pub triples: i32,
    pub doubles: i32,
    /// Each coupon's yen: the seed's 1,000. The legacy yen columns are `integer`, so above about
    /// 1.5 million members a campaign's total no longer fits at 1,000 yen a coupon.
    pub discount_yen: i32,
}

impl Shape {
    /// The demo's and the tests' data: about 2.5 coupons per member, one in six a duplicate.
    pub const SEED: Shape = Shape {
        takes_a: 55,
        takes_b_c: 75,
        triples: 5,
        doubles: 10,
        discount_yen: 1000,
    };
}

pub fn generate_dirty_data_shaped(
    client: &mut postgres::Client,
    members: i32,
    shape: &Shape,
) -> Result<()> {
    let campaigns: [&(dyn postgres::types::ToSql + Sync); 2] = [&members, &shape.discount_yen];
    let coupons: [&(dyn postgres::types::ToSql + Sync); 5] = [
        &members,
        &shape.takes_a,
        &shape.takes_b_c,
        &shape.triples,
        &shape.doubles,
    ];
    let statements = DIRTY_DATA_SQL.split(';').filter(|s| !s.trim().is_empty());
    for (n, statement) in statements.enumerate() {
        let params: &[&(dyn postgres::types::ToSql + Sync)] = match n {
            0 => &campaigns,
            1 => &coupons,
            _ => &[],
        };
        client
            .execute(statement, params)
            .context("generating the dirty data")?;
    }
    Ok(())
}

/// How many coupons there are, and how many of them duplicate a (campaign, member) pair.
pub fn coupons_and_duplicates(client: &mut postgres::Client) -> Result<(i64, i64)> {
    let row = client.query_one(
        "SELECT count(*), count(*) - count(DISTINCT (campaign_id, member_id)) FROM issued_coupons",
        &[],
    )?;
    Ok((row.get(0), row.get(1)))
}
