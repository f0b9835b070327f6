//! `pgmend verify`: the invariants the release establishes (docs/verify.md), checked in one
//! read-only snapshot, and the anomalies worth a human look. Exit 1 names the first offending keys.
//!
//! `run` refuses a database without `campaigns` and `issued_coupons` (exit 2, `NO_COUPON_TABLES`,
//! the report's message too); a legacy database fails the one check `released_schema`. Otherwise
//! the invariants (`data_checks`: one live coupon per campaign and member, both counters equal to
//! the non-voided coupons; `unique_index`: the unique index unique, valid and with its predicate;
//! `budget_check`: the check present; `no_invalid_index`; `no_guard_trigger`: none left by an
//! interrupted release) and two `anomalies` (voided coupons redeemed anyway, counter rows without a
//! campaign), each one aggregate query with a sample of the first offending keys. The caller
//! (`commands/verify.rs`) gives it one REPEATABLE READ, READ ONLY snapshot, so it runs on a hot
//! standby. Tested in `tests/verify.rs` and `tests/hints.rs`.

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use crate::error::PgContext;
use crate::online::catalog;

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// How many keys (or objects) break it.
    pub violations: i64,
    /// The first offending keys, as JSON rows.
    pub sample: Vec<String>,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Verification {
    pub ok: bool,
    pub checks: Vec<Check>,
    /// Not invariants, but worth a look (they do not change the exit code).
    pub anomalies: Vec<Check>,
}

const SAMPLE: i64 = 5;

fn exists(client: &mut impl GenericClient, table: &str, column: &str) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
            &[&table, &column],
        )
        .doing("checking the schema")?
        .get(0))
}

/// Counts the rows of `violators` and samples the first few.
fn count(
    client: &mut impl GenericClient,
    name: &'static str,
    violators: &str,
    ok_detail: &str,
    bad_detail: &str,
) -> Result<Check> {
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM ({violators}) v"), &[])
        .doing(format!("checking {name}"))?
        .get(0);
    let sample = if n > 0 {
        client
            .query(
                &format!(
                    "SELECT row_to_json(v)::text FROM ({violators}) v ORDER BY 1 LIMIT {SAMPLE}"
                ),
                &[],
            )
            .doing(format!("sampling {name}"))?
            .iter()
            .map(|r| r.get(0))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Check {
        name,
        ok: n == 0,
        violations: n,
        sample,
        detail: if n == 0 {
            ok_detail.into()
        } else {
            bad_detail.into()
        },
    })
}

fn missing(name: &'static str, detail: String) -> Check {
    Check {
        name,
        ok: false,
        violations: 1,
        sample: Vec::new(),
        detail,
    }
}

/// Why there is nothing to verify or report on: the connection points at another database.
pub const NO_COUPON_TABLES: &str = "this database has no campaigns and issued_coupons tables; check --database-url (and the search_path) points at the coupon database";

pub fn run(client: &mut impl GenericClient) -> Result<Verification> {
    ensure_coupon_tables(client)?;
    if !released(client)? {
        return Ok(Verification {
            ok: false,
            checks: vec![missing(
                "released_schema",
                "the database is still in its legacy state (no legacy_duplicate column or counter tables); run `pgmend plan`, then `pgmend apply`".into(),
            )],
            anomalies: Vec::new(),
        });
    }
    let mut checks = data_checks(client)?;
    checks.push(unique_index(client)?);
    checks.push(budget_check(client)?);
    checks.push(no_invalid_index(client)?);
    checks.push(no_guard_trigger(client)?);
    let anomalies = anomalies(client)?;
    Ok(Verification {
        ok: checks.iter().all(|c| c.ok),
        checks,
        anomalies,
    })
}

/// Not a legacy database either: a wrong --database-url is an error (exit 2), as in the
/// report, not a check that failed.
fn ensure_coupon_tables(client: &mut impl GenericClient) -> Result<()> {
    let tables: bool = client
        .query_one(
            "SELECT to_regclass('campaigns') IS NOT NULL AND to_regclass('issued_coupons') IS NOT NULL",
            &[],
        )
        .doing("checking the schema")?
        .get(0);
    if !tables {
        anyhow::bail!(NO_COUPON_TABLES);
    }
    Ok(())
}

/// Whether the release's columns and counter tables exist.
fn released(client: &mut impl GenericClient) -> Result<bool> {
    Ok(exists(client, "issued_coupons", "legacy_duplicate")?
        && exists(client, "campaign_budgets", "issued_yen")?
        && exists(client, "member_monthly_usage", "used_yen")?)
}

/// The invariants of the data: one live coupon per member and campaign, and both counters
/// equal to the sum of their non-voided coupons.
fn data_checks(client: &mut impl GenericClient) -> Result<Vec<Check>> {
    Ok(vec![
        count(
            client,
            "one_live_coupon_per_member",
            "SELECT campaign_id, member_id, count(*) FILTER (WHERE NOT legacy_duplicate) AS live
               FROM issued_coupons GROUP BY 1, 2 HAVING count(*) FILTER (WHERE NOT legacy_duplicate) <> 1",
            "every (campaign, member) has exactly one coupon that is not a legacy duplicate",
            "(campaign, member) pairs with zero or several live coupons: run `pgmend repair apply void-duplicate-coupons`",
        )?,
        count(
            client,
            "campaign_budgets_match_coupons",
            "SELECT c.campaign_id, b.issued_yen AS counter_yen, coalesce(s.yen, 0) AS real_yen
               FROM campaigns c
               LEFT JOIN campaign_budgets b USING (campaign_id)
               LEFT JOIN (SELECT campaign_id, sum(amount_yen)::bigint AS yen FROM issued_coupons
                           WHERE voided_at IS NULL GROUP BY 1) s USING (campaign_id)
              WHERE b.issued_yen IS DISTINCT FROM coalesce(s.yen, 0)",
            "every campaign's issued_yen equals the sum of its non-voided coupons",
            "campaigns whose counter is missing or differs from its coupons: run `pgmend repair apply rebuild-campaign-budgets`",
        )?,
        count(
            client,
            "member_monthly_usage_matches_coupons",
            "SELECT coalesce(s.member_id, u.member_id) AS member_id, coalesce(s.month, u.month) AS month,
                    coalesce(u.used_yen, 0) AS counter_yen, coalesce(s.yen, 0) AS real_yen
               FROM (SELECT member_id, month, sum(amount_yen)::bigint AS yen FROM issued_coupons
                      WHERE voided_at IS NULL GROUP BY 1, 2) s
               FULL JOIN member_monthly_usage u ON u.member_id = s.member_id AND u.month = s.month
              WHERE coalesce(u.used_yen, 0) <> coalesce(s.yen, 0)",
            "every member-month's used_yen equals the sum of its non-voided coupons (a missing row counts as 0)",
            "member-months whose usage differs from their coupons: run `pgmend repair apply rebuild-member-monthly-usage`",
        )?,
    ])
}

/// The unique index `one_coupon_per_member`: unique, valid, on its columns, with its predicate.
fn unique_index(client: &mut impl GenericClient) -> Result<Check> {
    let index = client
        .query_opt(
            "SELECT i.indisunique, i.indisvalid, i.indisready, coalesce(pg_get_expr(i.indpred, i.indrelid), ''),
                    (SELECT string_agg(a.attname, ', ' ORDER BY k.n) FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum),
                    i.indrelid::regclass::text
               FROM pg_index i WHERE i.indexrelid = to_regclass('one_coupon_per_member')",
            &[],
        )
        .doing("reading the unique index")?;
    Ok(match index {
        None => missing(
            "unique_index_one_coupon_per_member",
            "the index one_coupon_per_member does not exist: run `pgmend apply`".into(),
        ),
        Some(r) => {
            let (unique, valid, ready, predicate, columns, table): (
                bool,
                bool,
                bool,
                String,
                String,
                String,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            let right = unique
                && valid
                && ready
                && predicate == "(NOT legacy_duplicate)"
                && columns == "campaign_id, member_id"
                && table == "issued_coupons";
            Check {
                name: "unique_index_one_coupon_per_member",
                ok: right,
                violations: i64::from(!right),
                sample: Vec::new(),
                detail: if right {
                    "unique, valid, on issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate".into()
                } else {
                    format!(
                        "one_coupon_per_member is {}{}on {table} ({columns}) WHERE {predicate}: drop it concurrently and rebuild it (runbooks/failed-concurrent-index-build.md)",
                        if unique { "" } else { "not unique, " },
                        if valid && ready { "" } else { "INVALID, " }
                    )
                },
            }
        }
    })
}

/// The NOT VALID check `issued_within_budget` exists. Its detail says whether it is validated
/// and, while it is NOT VALID, how many existing rows break it (accepted: the check still
/// refuses new violations, so it holds).
fn budget_check(client: &mut impl GenericClient) -> Result<Check> {
    let check = client
        .query_opt(
            "SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint
              WHERE conname = 'issued_within_budget' AND contype = 'c'
                AND conrelid = to_regclass('campaign_budgets')",
            &[],
        )
        .doing("reading the check")?;
    Ok(if let Some(row) = check {
        let (validated, definition): (bool, String) = (row.get(0), row.get(1));
        let detail = if validated {
            "present on campaign_budgets, validated".to_string()
        } else {
            let expression = definition
                .strip_prefix("CHECK ")
                .and_then(|d| d.strip_suffix(" NOT VALID"))
                .unwrap_or(&definition);
            // The server's own rendering of the check, read back from the catalog.
            let breaking: i64 = client
                .query_one(
                    &format!("SELECT count(*) FROM campaign_budgets WHERE NOT {expression}"),
                    &[],
                )
                .doing("counting the rows that break issued_within_budget")?
                .get(0);
            match breaking {
                0 => "present on campaign_budgets, NOT VALID, and no row breaks it: `pgmend migrate validate issued_within_budget` validates it".to_string(),
                n => format!(
                    "present on campaign_budgets, NOT VALID: {} {} it (overruns from before the check, accepted; new ones are refused). Once none is left, `pgmend migrate validate issued_within_budget`",
                    crate::human::count(n, "row"),
                    if n == 1 { "breaks" } else { "break" }
                ),
            }
        };
        Check {
            name: "check_issued_within_budget",
            ok: true,
            violations: 0,
            sample: Vec::new(),
            detail,
        }
    } else {
        missing(
            "check_issued_within_budget",
            "the check issued_within_budget is missing on campaign_budgets: run `pgmend apply`"
                .into(),
        )
    })
}

/// No INVALID index anywhere in the database.
fn no_invalid_index(client: &mut impl GenericClient) -> Result<Check> {
    let invalid = catalog::invalid_indexes(client)?;
    let sample = invalid
        .iter()
        .map(|i| format!("{}.{} on {}", i.schema, i.index, i.table))
        .collect();
    Ok(listed(
        "no_invalid_index",
        sample,
        "no INVALID index in the database",
        || invalid[0].describe(),
    ))
}

/// No guard trigger left behind by an interrupted release.
fn no_guard_trigger(client: &mut impl GenericClient) -> Result<Check> {
    let guards = crate::repair::guard::installed(client)?;
    let sample = guards
        .iter()
        .map(|(table, trigger)| format!("{trigger:?} on {table}"))
        .collect();
    Ok(listed(
        "no_guard_trigger",
        sample,
        "no pgmend guard trigger left on a table",
        || {
            "pgmend guard triggers left by an interrupted release: they mark the new application's rows as duplicates; `pgmend apply --yes` drops them".into()
        },
    ))
}

/// A check that holds when `offenders` is empty; the sample is the first few of them.
fn listed(
    name: &'static str,
    mut offenders: Vec<String>,
    ok_detail: &str,
    bad_detail: impl FnOnce() -> String,
) -> Check {
    let violations = offenders.len() as i64;
    offenders.truncate(SAMPLE as usize);
    Check {
        name,
        ok: violations == 0,
        violations,
        sample: offenders,
        detail: if violations == 0 {
            ok_detail.into()
        } else {
            bad_detail()
        },
    }
}

/// What is worth a human look without breaking an invariant.
fn anomalies(client: &mut impl GenericClient) -> Result<Vec<Check>> {
    Ok(vec![
        count(
            client,
            "voided_then_redeemed",
            "SELECT coupon_id, campaign_id, member_id, voided_at, redeemed_at FROM issued_coupons
              WHERE voided_at IS NOT NULL AND redeemed_at IS NOT NULL",
            "no voided coupon was redeemed",
            "voided coupons that were redeemed anyway (the old cart ignores voided_at): change the cart, and tell finance (the report counts them apart)",
        )?,
        count(
            client,
            "counter_without_campaign",
            "SELECT b.campaign_id FROM campaign_budgets b LEFT JOIN campaigns c USING (campaign_id) WHERE c.campaign_id IS NULL",
            "every campaign_budgets row has its campaign",
            "campaign_budgets rows with no campaign",
        )?,
    ])
}
