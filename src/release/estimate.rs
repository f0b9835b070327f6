//! How long each pending step of the plan should take, and where that figure comes from.
//!
//! A repair step that changes rows is estimated from the rate of the newest finished run of the
//! same repair on this server (`store::records::recorded_rates`: rows changed between its freeze
//! and its end), so "from run 12 on this server: 31,000 rows/s". Without one, and for every
//! migration step (pgmend records no time per migration), from the calibration constants below,
//! scaled by the rows of the tables the step reads (`pg_class.reltuples`, read by [`table_rows`]
//! in the plan's transaction). The repairs are matched by name, not by kind: the two counter
//! rebuilds share a kind and cost per key 100,000 times apart (a campaign's sum scans every
//! coupon, a member-month's reads four). The estimate is pure arithmetic over plain values.
//!
//! The rates come from docs/benchmark.md (300,000 members, 1.1 M coupons, release build); the
//! fixed costs and the precondition rate from debug runs at 30,000 and 100,000 members (the
//! ignored test `estimates_are_within_a_factor_of_two_of_the_measured_step_times`). docs/release.md
//! lists each with its source and how far off the estimates were.

use std::collections::BTreeMap;

use anyhow::Result;
use postgres::GenericClient;
use serde::{Deserialize, Serialize};

use crate::error::PgContext;
use crate::human;
use crate::migrate::plan::PlannedMigration;
use crate::online::census::Guard;
use crate::repair::definition::{Repair, Spec};
use crate::store::records::RecordedRate;

/// A step's estimated duration and the source of the figure. Whole milliseconds: a plan file's
/// digest is taken over its JSON text, and floats need not survive a parse exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub milliseconds: u64,
    pub from: String,
}

impl Estimate {
    pub fn new(seconds: f64, from: String) -> Estimate {
        Estimate {
            milliseconds: (seconds * 1000.0).ceil() as u64,
            from,
        }
    }

    /// The duration, as people read it (`human::duration`).
    pub fn shown(&self) -> String {
        human::millis(self.milliseconds)
    }
}

/// Calibration: rows per second, from docs/benchmark.md at 300,000 members (1.1 M coupons),
/// release build, and from debug runs here.
/// void-duplicate-coupons: between the benchmark's 32,132/s (298,826 coupons marked in 9.3 s)
/// and the 15,000/s of a debug build at 100,000 members (40,963 in 2.5 to 2.9 s), their
/// geometric mean: both stay within a factor of two.
pub const VOID_ROWS_PER_S: f64 = 22_000.0;
/// rebuild-member-monthly-usage: between the benchmark's 54,493/s (299,711 keys in 5.5 s) and
/// the 24,000/s of a debug build at 100,000 members (97,222 keys in 2.9 to 3.8 s).
pub const COUNTER_KEYS_PER_S: f64 = 36_000.0;
/// rebuild-campaign-budgets: its 3 keys in one range read the 1.1 M coupons once, 0.3 s in all
/// with the run's fixed cost (release build, 300,000 members, 2026-12-02).
pub const COUNTER_SOURCE_ROWS_PER_S: f64 = 1_100_000.0 / 0.3;
/// After the gate, both rebuilds finding nothing: one aggregate each, 1.1 s for the two.
pub const COUNTER_CHECK_ROWS_PER_S: f64 = 1_100_000.0 / 0.55;
/// An index built CONCURRENTLY: V3's 0.6 s and V4's 0.8 s per 1.1 M coupons.
pub const INDEX_ROWS_PER_S: f64 = 1_100_000.0 / 0.7;
/// A census: V4's 0.6 s over 1.1 M coupons.
pub const CENSUS_ROWS_PER_S: f64 = 1_100_000.0 / 0.6;
/// A precondition (a query written by hand: V5's joins the campaigns with a sum of the coupons):
/// measured here rather than in the benchmark, whose 0.2 s for V5 at 1.1 M coupons the debug
/// runs at 30,000 and 100,000 members did not come near (124 ms for 73,614 coupons, 405 ms for
/// 245,641).
pub const PRECONDITION_ROWS_PER_S: f64 = 245_641.0 / 0.405;
/// What a step costs whatever its size, from a debug build at 30,000 members (73,614 coupons;
/// `estimates_are_within_a_factor_of_two_of_the_measured_step_times` in tests/plan_ticket.rs),
/// where the rates above left V3's build at 47 ms of 236 and the void at 381 ms of 1.0 s: a
/// repair run's freeze, reconciliation and batches ramping up from one target, 0.2 s ...
pub const REPAIR_RUN_S: f64 = 0.2;
/// ... an online statement's own connection and polls, 0.2 s ...
pub const ONLINE_STATEMENT_S: f64 = 0.2;
/// ... and a migration of catalog-only statements (V2: 42 ms).
pub const CATALOG_ONLY_S: f64 = 0.05;

/// The estimated rows of every table of the current schema (`reltuples`; 0 when never analyzed).
pub fn table_rows(tx: &mut impl GenericClient) -> Result<BTreeMap<String, i64>> {
    Ok(tx
        .query(
            "SELECT relname::text, greatest(reltuples, 0)::int8 FROM pg_class
              WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')",
            &[],
        )
        .doing("reading the estimated rows of the target schema's tables (pg_class.reltuples)")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

fn rows_of(rows: &BTreeMap<String, i64>, table: &str) -> i64 {
    let bare = table.rsplit('.').next().unwrap_or(table).trim_matches('"');
    rows.get(bare).copied().unwrap_or(0)
}

fn calibrated(seconds: f64, how: String) -> Estimate {
    Estimate::new(
        seconds,
        format!("calibration (docs/release.md, estimates): {how}"),
    )
}

/// A pending repair step that changes `changes` rows.
pub fn repair(
    repair: &Repair,
    changes: i64,
    recorded: &[RecordedRate],
    rows: &BTreeMap<String, i64>,
) -> Estimate {
    let run = recorded.iter().find(|r| r.repair == repair.name);
    if let (Some(run), true) = (run, changes > 0) {
        let rate = run.changed as f64 / run.seconds;
        return Estimate::new(
            changes as f64 / rate,
            format!(
                "from run {} on this server: {} rows changed in {}, {}",
                run.run_id,
                human::int(run.changed),
                human::duration(std::time::Duration::from_secs_f64(run.seconds)),
                human::rate(rate)
            ),
        );
    }
    match &repair.spec {
        Spec::VoidDuplicates(_) | Spec::Backfill(_) | Spec::Orphans(_) => calibrated(
            REPAIR_RUN_S + changes as f64 / VOID_ROWS_PER_S,
            format!(
                "{} per run, and {} rows at {}",
                human::millis((REPAIR_RUN_S * 1000.0) as u64),
                human::int(changes),
                human::rate(VOID_ROWS_PER_S)
            ),
        ),
        Spec::RebuildCounter(c) => {
            let source = rows_of(rows, c.source_table.as_str());
            if changes == 0 {
                return calibrated(
                    source as f64 / COUNTER_CHECK_ROWS_PER_S,
                    format!(
                        "nothing to change: one aggregate over {} source rows at {}",
                        human::int(source),
                        human::rate(COUNTER_CHECK_ROWS_PER_S)
                    ),
                );
            }
            let by_keys = changes as f64 / COUNTER_KEYS_PER_S;
            let by_source = source as f64 / COUNTER_SOURCE_ROWS_PER_S;
            calibrated(
                REPAIR_RUN_S + by_keys.max(by_source),
                format!(
                    "{} per run, and the longer of {} keys at {} and {} source rows at {}",
                    human::millis((REPAIR_RUN_S * 1000.0) as u64),
                    human::int(changes),
                    human::rate(COUNTER_KEYS_PER_S),
                    human::int(source),
                    human::rate(COUNTER_SOURCE_ROWS_PER_S)
                ),
            )
        }
    }
}

/// A pending migration step: its concurrent index builds and its censuses, scaled by the rows
/// of their tables, or the catalog-only constant. `census_during_build`: the release's step
/// with a `retry_with` repair, whose first build attempt takes the censuses while it builds
/// (`online::index::OnlineMigration::census_alongside`), so the longer of the two counts.
pub fn migration(
    m: &PlannedMigration,
    rows: &BTreeMap<String, i64>,
    census_during_build: bool,
) -> Estimate {
    let mut build_seconds = 0.0;
    let mut census_seconds = 0.0;
    let mut parts = Vec::new();
    for s in m.statements.iter().filter(|s| s.online) {
        let n = s.locks.iter().map(|l| rows_of(rows, &l.relation)).max();
        let n = n.unwrap_or(0);
        build_seconds += ONLINE_STATEMENT_S + n as f64 / INDEX_ROWS_PER_S;
        parts.push(format!(
            "a concurrent build: {}, and {} rows at {}",
            human::millis((ONLINE_STATEMENT_S * 1000.0) as u64),
            human::int(n),
            human::rate(INDEX_ROWS_PER_S)
        ));
    }
    for f in &m.censuses {
        let n = f.census.tables.iter().map(|t| rows_of(rows, t)).max();
        let n = n.unwrap_or(0);
        let rate = match f.census.guard {
            Guard::Precondition => PRECONDITION_ROWS_PER_S,
            _ => CENSUS_ROWS_PER_S,
        };
        census_seconds += n as f64 / rate;
        parts.push(format!(
            "census {} over {} rows at {}",
            f.census.name,
            human::int(n),
            human::rate(rate)
        ));
    }
    let seconds = if census_during_build && build_seconds > 0.0 {
        parts.push("the census taken during the build: the longer of the two".to_string());
        build_seconds.max(census_seconds)
    } else {
        build_seconds + census_seconds
    };
    if parts.is_empty() {
        return calibrated(
            CATALOG_ONLY_S,
            format!(
                "catalog-only statements, {} (V2)",
                human::duration(std::time::Duration::from_secs_f64(CATALOG_ONLY_S))
            ),
        );
    }
    calibrated(seconds, parts.join("; "))
}
