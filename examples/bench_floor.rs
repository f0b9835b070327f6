//! Benchmark: the floor of a release that keeps pgmend's guarantees, against seed 000's
//! one-shot SQL, on identical copies of the same legacy data in one run (issue 16).
//!
//!     cargo run --release --example bench_floor -- 300000 1000000
//!
//! "The floor" is the least work a design that keeps the guarantees must do, each phase as ONE
//! set-based statement with no batching, no checkpoints, no frozen targets and no
//! reconciliation (all of which a real run adds on top): V2's columns and tables, V3's
//! supporting index built `CONCURRENTLY`, the void ranking the rows it has locked `FOR UPDATE`
//! (so a coupon redeemed meanwhile is the one kept) and writing one ledger record per changed
//! row, V4's census and its concurrent unique build, both counters filled with a ledger record
//! per created row, the two reconciliations after the gate (one aggregate each), and V5. It is
//! measured with today's ledger record (`jsonb` key, before and after, a reason string), with a
//! compact typed one (the key, the changed columns before and after, the rank and the kept
//! row), and as the cheapest form of each phase measured so far ([`cheapest`]: V3's index
//! after the void, the void by frozen keys in batches through the primary key, records as
//! typed arrays, the counters by plain inserts), and that cheapest floor on two sessions at once
//! ([`two_sessions`]: what two workers could reach on two cores). `PGMEND_FLOOR="cheapest two"`
//! runs only the floors named (jsonb, typed, cheapest, two; default all). The one-shot holds
//! an `ACCESS EXCLUSIVE` lock on the coupons throughout; none of the floor's statements would be acceptable in production as they are here (each
//! locks every row it changes until it commits): the floor bounds what batching can reach,
//! it is not a design.
//!
//! The cluster runs with `full_page_writes=on`, `max_wal_size=4GB` and `checkpoint_timeout=1h`
//! (a `CHECKPOINT` before each side, none inside), `fsync=off` and `synchronous_commit=off`.
//! Every floor's end state is compared with the one-shot's, row by row through a digest.

use std::time::Instant;

use anyhow::{Context, Result};
use pgmend::localpg::LocalPg;

mod support;

/// The ledgers the floor is measured with: today's, a compact typed record, and the cheapest
/// form of every phase measured so far (`Cheapest`, [`cheapest`]).
#[derive(Clone, Copy, PartialEq)]
enum Ledger {
    Jsonb,
    Typed,
    Cheapest,
    TwoSessions,
}

impl Ledger {
    /// Every floor, in the order they run and print.
    const ALL: [Ledger; 4] = [
        Ledger::Jsonb,
        Ledger::Typed,
        Ledger::Cheapest,
        Ledger::TwoSessions,
    ];

    /// The floor's name in `PGMEND_FLOOR` and its database's name after `floor_`.
    fn name(self) -> &'static str {
        match self {
            Ledger::Jsonb => "jsonb",
            Ledger::Typed => "typed",
            Ledger::Cheapest => "cheapest",
            Ledger::TwoSessions => "two",
        }
    }

    /// Its column in the table.
    fn title(self) -> &'static str {
        match self {
            Ledger::Jsonb => "floor, jsonb ledger",
            Ledger::Typed => "floor, typed ledger",
            Ledger::Cheapest => "cheapest floor",
            Ledger::TwoSessions => "cheapest floor, two sessions",
        }
    }
}

const LEDGER_JSONB: &str = "CREATE TABLE floor_ledger (
  ledger_id bigserial, run_id bigint NOT NULL, target_table text NOT NULL, row_key jsonb NOT NULL,
  action text NOT NULL, before jsonb, after jsonb, reason text NOT NULL,
  at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (run_id, ledger_id))";

const LEDGER_TYPED: &str = "CREATE TABLE floor_ledger (
  ledger_id bigserial, run_id bigint NOT NULL, row_key text[] NOT NULL,
  before text[], after text[], rank integer, kept text, PRIMARY KEY (run_id, ledger_id))";

/// After a CTE `locked` of the coupons to rank: rank the locked versions, mark and void the
/// later ones (`changed`, with what the record needs).
const RANK_AND_MARK: &str = "ranked AS (SELECT l.coupon_id AS k, l.legacy_duplicate AS before_mark, l.voided_at AS before_void,
                       l.redeemed_at AS keep_value, row_number() OVER w AS rn, first_value(l.coupon_id) OVER w AS kept
                  FROM locked l
                WINDOW w AS (PARTITION BY l.campaign_id, l.member_id ORDER BY (l.redeemed_at IS NULL), l.issued_at, l.coupon_id)),
     changed AS (UPDATE issued_coupons t SET legacy_duplicate = true,
                        voided_at = CASE WHEN r.keep_value IS NULL THEN coalesce(t.voided_at, now()) ELSE t.voided_at END
                   FROM ranked r WHERE t.coupon_id = r.k AND r.rn > 1
                 RETURNING t.coupon_id AS k, r.before_mark, r.before_void, t.legacy_duplicate AS after_mark,
                           t.voided_at AS after_void, r.rn, r.kept, r.keep_value)";

/// Lock every unmarked coupon of a group with duplicates, rank the locked versions, mark and
/// void, one record per changed row.
fn void_sql(ledger: Ledger) -> String {
    let head = format!("WITH locked AS (SELECT t.* FROM issued_coupons t
                       JOIN (SELECT campaign_id, member_id FROM issued_coupons WHERE NOT legacy_duplicate
                              GROUP BY campaign_id, member_id HAVING count(*) > 1) g USING (campaign_id, member_id)
                      WHERE NOT t.legacy_duplicate ORDER BY t.coupon_id FOR UPDATE OF t),
     {RANK_AND_MARK}");
    let tail = match ledger {
        Ledger::Jsonb => "INSERT INTO floor_ledger (run_id, target_table, row_key, action, before, after, reason)
             SELECT 1, 'issued_coupons', jsonb_build_object('coupon_id', k), 'update',
                    jsonb_build_object('legacy_duplicate', before_mark, 'voided_at', before_void, 'redeemed_at', keep_value),
                    jsonb_build_object('legacy_duplicate', after_mark, 'voided_at', after_void, 'redeemed_at', keep_value),
                    format('rank %s in its group; %s %s is kept', rn, 'coupon_id', kept)
               FROM changed",
        Ledger::Typed | Ledger::Cheapest | Ledger::TwoSessions => "INSERT INTO floor_ledger (run_id, row_key, before, after, rank, kept)
             SELECT 1, ARRAY[k::text], ARRAY[before_mark::text, before_void::text, keep_value::text],
                    ARRAY[after_mark::text, after_void::text, keep_value::text], rn, kept::text
               FROM changed",
    };
    format!("{head}\n{tail}")
}

/// Fill a counter table from its source, one created row and one record per key.
fn counter_sql(ledger: Ledger, member_months: bool) -> String {
    let (insert, keys, key_text) = if member_months {
        (
            "INSERT INTO member_monthly_usage AS t (member_id, month, used_yen)
             SELECT member_id, month, coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0)
               FROM issued_coupons GROUP BY member_id, month
             ON CONFLICT (member_id, month) DO UPDATE SET used_yen = t.used_yen + excluded.used_yen
             RETURNING t.member_id, t.month, t.used_yen AS v",
            "'member_id', member_id, 'month', month",
            "ARRAY[member_id, month]",
        )
    } else {
        (
            "INSERT INTO campaign_budgets AS t (campaign_id, discount_yen, budget_yen, issued_yen)
             SELECT c.campaign_id, c.discount_yen, c.budget_yen,
                    coalesce(sum(i.amount_yen) FILTER (WHERE i.voided_at IS NULL), 0)
               FROM campaigns c LEFT JOIN issued_coupons i USING (campaign_id)
              GROUP BY c.campaign_id, c.discount_yen, c.budget_yen
             ON CONFLICT (campaign_id) DO UPDATE SET issued_yen = t.issued_yen + excluded.issued_yen
             RETURNING t.campaign_id, t.issued_yen AS v",
            "'campaign_id', campaign_id",
            "ARRAY[campaign_id]",
        )
    };
    let record = match ledger {
        Ledger::Jsonb => format!(
            "INSERT INTO floor_ledger (run_id, target_table, row_key, action, before, after, reason)
             SELECT 2, 'counter', jsonb_build_object({keys}), 'insert', NULL, jsonb_build_object('value', v),
                    'the key had no counter row; created with the sum of its source rows' FROM ins"
        ),
        Ledger::Typed | Ledger::Cheapest | Ledger::TwoSessions => format!(
            "INSERT INTO floor_ledger (run_id, row_key, before, after)
             SELECT 2, {key_text}, NULL, ARRAY[v::text] FROM ins"
        ),
    };
    format!("WITH ins AS ({insert}) {record}")
}

/// V4's census: the groups with more than one unmarked row.
const CENSUS: &str = "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
  GROUP BY campaign_id, member_id HAVING count(*) > 1) d";

/// After the gate: how many keys of each counter differ from the source (one aggregate each).
const RECONCILE: [&str; 2] = [
    "SELECT count(*) FROM (SELECT campaign_id, coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0) AS truth
                             FROM issued_coupons GROUP BY campaign_id) s
       FULL JOIN campaign_budgets b USING (campaign_id) WHERE b.issued_yen IS DISTINCT FROM s.truth",
    "SELECT count(*) FROM (SELECT member_id, month, coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0) AS truth
                             FROM issued_coupons GROUP BY member_id, month) s
       FULL JOIN member_monthly_usage u USING (member_id, month) WHERE u.used_yen IS DISTINCT FROM s.truth",
];

/// The end state, row by row: a digest over every coupon's (id, mark, voided or not), every
/// budget and every member-month with yen above 0 (the one-shot creates no row for a month
/// whose coupons were all voided), plus the number of zero rows.
const DIGEST: &str = "SELECT format('coupons %s, budgets %s, usage %s (%s rows of 0)',
  (SELECT md5(string_agg(coupon_id::text || legacy_duplicate::text || (voided_at IS NULL)::text, ',' ORDER BY coupon_id)) FROM issued_coupons),
  (SELECT string_agg(campaign_id || '=' || issued_yen, ' ' ORDER BY campaign_id) FROM campaign_budgets),
  (SELECT md5(string_agg(member_id || '/' || month || '=' || used_yen, ',' ORDER BY member_id, month)) FROM member_monthly_usage WHERE used_yen > 0),
  (SELECT count(*) FROM member_monthly_usage WHERE used_yen = 0))";

fn migration(version: &str) -> Result<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with(&format!("{version}__")) {
            return Ok(std::fs::read_to_string(path)?);
        }
    }
    anyhow::bail!("no migration {version} in {dir}")
}

/// WAL bytes (by LSN) and full-page images, cluster-wide.
fn wal(c: &mut postgres::Client) -> Result<(i64, i64)> {
    let r = c.query_one(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, (SELECT wal_fpi FROM pg_stat_wal)",
        &[],
    )?;
    Ok((r.get(0), r.get(1)))
}

/// The phases of a floor as they run: (phase, seconds), in order.
#[derive(Default)]
struct Phases(Vec<(&'static str, f64)>);

impl Phases {
    /// Runs `sqls` on `c` as the phase `name`, timed.
    fn time(&mut self, name: &'static str, sqls: &[&str], c: &mut postgres::Client) -> Result<()> {
        let t = Instant::now();
        for sql in sqls {
            c.batch_execute(sql)
                .with_context(|| format!("floor, {name}"))?;
        }
        self.0.push((name, t.elapsed().as_secs_f64()));
        Ok(())
    }

    /// Runs the first statements on their session and the second on theirs at once, as the
    /// phase `name`, timed until both are done.
    fn both(
        &mut self,
        name: &'static str,
        first: (&[&str], &mut postgres::Client),
        second: (&[&str], &mut postgres::Client),
    ) -> Result<()> {
        fn run(sqls: &[&str], c: &mut postgres::Client) -> Result<()> {
            for sql in sqls {
                c.batch_execute(sql)?;
            }
            Ok(())
        }
        let t = Instant::now();
        std::thread::scope(|s| {
            let other = s.spawn(|| run(second.0, second.1));
            let mine = run(first.0, first.1);
            let other = other.join().expect("the second session's thread panicked");
            mine.and(other)
        })
        .with_context(|| format!("floor, {name}"))?;
        self.0.push((name, t.elapsed().as_secs_f64()));
        Ok(())
    }
}

/// Runs the floor's phases on `c`; returns (phase, seconds) in order.
fn floor(c: &mut postgres::Client, ledger: Ledger) -> Result<Vec<(&'static str, f64)>> {
    let mut phases = Phases::default();
    let mut time = |name, sqls: &[&str], c: &mut postgres::Client| phases.time(name, sqls, c);
    c.batch_execute("SET work_mem = '64MB'")?;
    c.batch_execute(match ledger {
        Ledger::Jsonb => LEDGER_JSONB,
        Ledger::Typed | Ledger::Cheapest | Ledger::TwoSessions => LEDGER_TYPED,
    })?;
    time("V2", &[&migration("V2")?], c)?;
    time("V3 index", &[&migration("V3")?], c)?;
    time("void", &[&void_sql(ledger)], c)?;
    time("V4 census+build", &[CENSUS, &migration("V4")?], c)?;
    time(
        "counters",
        &[&counter_sql(ledger, false), &counter_sql(ledger, true)],
        c,
    )?;
    time("after the gate", &RECONCILE, c)?;
    time("V5", &[&migration("V5")?], c)?;
    Ok(phases.0)
}

/// The table of the void's batch records in the cheapest floors.
const VOID_BATCHES: &str = "
CREATE TABLE floor_void_batches (batch bigint PRIMARY KEY, row_key uuid[], before_mark boolean[],
  before_void timestamptz[], after_mark boolean[], after_void timestamptz[], keep_value timestamptz[],
  rank integer[], kept uuid[])";

/// The void of the cheapest floor, before its batches: the coupons of every group with more
/// than one unmarked row whose member matches `members` (an SQL condition), frozen by key in
/// `table` (one scan, before V3's index exists, so no update inserts into it).
fn cheapest_freeze(table: &str, members: &str) -> String {
    format!(
        "
CREATE TABLE {table} AS
  SELECT row_number() OVER (ORDER BY campaign_id, member_id) AS seq, array_agg(coupon_id) AS ids
    FROM issued_coupons WHERE NOT legacy_duplicate AND {members}
   GROUP BY campaign_id, member_id HAVING count(*) > 1;
CREATE INDEX ON {table} (seq)"
    )
}

/// The void of the cheapest floor over the groups frozen in `table`: batches of 5,000 groups
/// that lock their coupons through the primary key, rank the locked versions, mark and void,
/// and write one row per batch holding a record per changed coupon as typed arrays (key, mark
/// and void before and after, the redeemed_at that decided, rank, kept coupon), numbered from
/// `first_batch`. All in one transaction: the floor has no commits.
fn cheapest_void_batches(table: &str, first_batch: i64) -> String {
    format!("
DO $do$ DECLARE lo bigint := 0; n bigint := (SELECT count(*) FROM {table}); BEGIN
  WHILE lo < n LOOP
    WITH locked AS (SELECT t.* FROM issued_coupons t
                     WHERE t.coupon_id IN (SELECT unnest(f.ids) FROM {table} f WHERE f.seq > lo AND f.seq <= lo + 5000)
                       AND NOT t.legacy_duplicate ORDER BY t.coupon_id FOR UPDATE OF t),
     {RANK_AND_MARK}
    INSERT INTO floor_void_batches
    SELECT {first_batch} + lo, array_agg(k), array_agg(before_mark), array_agg(before_void), array_agg(after_mark),
           array_agg(after_void), array_agg(keep_value), array_agg(rn::integer), array_agg(kept)
      FROM changed;
    lo := lo + 5000;
  END LOOP;
END $do$")
}

/// The table of the cheapest floor's counter records, 10,000 to a row as typed arrays.
const COUNTER_BATCHES: &str = "CREATE TABLE floor_counter_batches (counter text, batch bigint,
  k1 text[], k2 text[], value bigint[], PRIMARY KEY (counter, batch))";

/// The campaign budgets of the cheapest floor: a plain `INSERT ... SELECT` into V2's table (no
/// row exists yet), the records in one row.
const CHEAPEST_BUDGETS: &str = "
WITH ins AS (
  INSERT INTO campaign_budgets (campaign_id, discount_yen, budget_yen, issued_yen)
  SELECT c.campaign_id, c.discount_yen, c.budget_yen, coalesce(sum(i.amount_yen) FILTER (WHERE i.voided_at IS NULL), 0)
    FROM campaigns c LEFT JOIN issued_coupons i USING (campaign_id)
   GROUP BY c.campaign_id, c.discount_yen, c.budget_yen
  RETURNING campaign_id, issued_yen)
INSERT INTO floor_counter_batches SELECT 'campaign_budgets', 0, array_agg(campaign_id), NULL, array_agg(issued_yen) FROM ins";

/// The member-months of the cheapest floor whose member matches `members` (an SQL condition),
/// the same way; their record rows numbered from `first_batch`.
fn cheapest_member_months(members: &str, first_batch: i64) -> String {
    format!("
WITH ins AS (
  INSERT INTO member_monthly_usage (member_id, month, used_yen)
  SELECT member_id, month, coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0)
    FROM issued_coupons WHERE {members} GROUP BY member_id, month
  RETURNING member_id, month, used_yen)
INSERT INTO floor_counter_batches
SELECT 'member_monthly_usage', {first_batch} + n / 10000, array_agg(member_id), array_agg(month), array_agg(used_yen)
  FROM (SELECT ins.*, row_number() OVER () AS n FROM ins) x GROUP BY n / 10000")
}

/// After the gate: how many member-months of the members matching `members` differ from the
/// source (one aggregate).
fn reconcile_member_months(members: &str) -> String {
    format!("SELECT count(*) FROM (SELECT member_id, month, coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0) AS truth
                             FROM issued_coupons WHERE {members} GROUP BY member_id, month) s
       FULL JOIN (SELECT * FROM member_monthly_usage WHERE {members}) u USING (member_id, month)
      WHERE u.used_yen IS DISTINCT FROM s.truth")
}

/// The cheapest floor measured so far: V3's index built after the void, the void as
/// [`cheapest_void_batches`], V4's census and build, the counters as [`CHEAPEST_BUDGETS`] and
/// [`cheapest_member_months`], the after-gate reconciliations and V5. Returns (phase, seconds) in order.
fn cheapest(c: &mut postgres::Client) -> Result<Vec<(&'static str, f64)>> {
    let mut phases = Phases::default();
    let mut time = |name, sqls: &[&str], c: &mut postgres::Client| phases.time(name, sqls, c);
    c.batch_execute("SET work_mem = '64MB'")?;
    time("V2", &[&migration("V2")?], c)?;
    time(
        "void",
        &[
            VOID_BATCHES,
            &cheapest_freeze("floor_frozen", "true"),
            &cheapest_void_batches("floor_frozen", 0),
        ],
        c,
    )?;
    time("V3 index", &[&migration("V3")?], c)?;
    time("V4 census+build", &[CENSUS, &migration("V4")?], c)?;
    time(
        "counters",
        &[
            COUNTER_BATCHES,
            CHEAPEST_BUDGETS,
            &cheapest_member_months("true", 0),
        ],
        c,
    )?;
    time("after the gate", &RECONCILE, c)?;
    time("V5", &[&migration("V5")?], c)?;
    Ok(phases.0)
}

/// The cheapest floor on two sessions, as two workers would share two cores: V2, V3's build
/// (with the server's parallel maintenance workers) and V5 on one; the void's freeze and
/// batches for the members below the middle one beside those of the rest; V4's census beside its build; the
/// budgets and the first half of the members' months beside the second half; after the gate,
/// the budgets' reconciliation and the first half of the member-months beside the second
/// half. Returns (phase, seconds) in order.
fn two_sessions(
    a: &mut postgres::Client,
    b: &mut postgres::Client,
) -> Result<Vec<(&'static str, f64)>> {
    let mut phases = Phases::default();
    for c in [&mut *a, &mut *b] {
        c.batch_execute("SET work_mem = '64MB'")?;
    }
    phases.time("V2", &[&migration("V2")?], a)?;
    let middle: String = a
        .query_one(
            "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY member_id) FROM issued_coupons TABLESAMPLE SYSTEM (1)",
            &[],
        )?
        .get(0);
    let low = format!("member_id < '{}'", middle.replace('\'', "''"));
    let high = format!("member_id >= '{}'", middle.replace('\'', "''"));
    phases.time("void's records table", &[VOID_BATCHES], a)?;
    phases.both(
        "void",
        (
            &[
                &cheapest_freeze("floor_frozen_low", &low),
                &cheapest_void_batches("floor_frozen_low", 0),
            ],
            a,
        ),
        (
            &[
                &cheapest_freeze("floor_frozen_high", &high),
                &cheapest_void_batches("floor_frozen_high", 1_000_000_000),
            ],
            b,
        ),
    )?;
    phases.time("V3 index", &[&migration("V3")?], a)?;
    phases.both("V4 census+build", (&[CENSUS], a), (&[&migration("V4")?], b))?;
    phases.time("counters' records table", &[COUNTER_BATCHES], a)?;
    phases.both(
        "counters",
        (&[CHEAPEST_BUDGETS, &cheapest_member_months(&low, 0)], a),
        (&[&cheapest_member_months(&high, 1_000_000)], b),
    )?;
    phases.both(
        "after the gate",
        (&[RECONCILE[0], &reconcile_member_months(&low)], a),
        (&[&reconcile_member_months(&high)], b),
    )?;
    phases.time("V5", &[&migration("V5")?], a)?;
    Ok(phases.0)
}

fn main() -> Result<()> {
    let sizes: Vec<i32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().context("member counts"))
        .collect::<Result<_>>()?;
    let sizes = if sizes.is_empty() {
        vec![300_000]
    } else {
        sizes
    };
    let pg = LocalPg::start_with(
        false,
        &[],
        &[
            ("full_page_writes", "on"),
            ("max_wal_size", "4GB"),
            ("checkpoint_timeout", "1h"),
        ],
    )?;
    let floors: Vec<Ledger> = match std::env::var("PGMEND_FLOOR") {
        Ok(names) => names
            .split([',', ' '])
            .filter(|n| !n.is_empty())
            .map(|n| {
                Ledger::ALL
                    .into_iter()
                    .find(|l| l.name() == n)
                    .with_context(|| format!("PGMEND_FLOOR: no floor {n:?}; the floors are jsonb, typed, cheapest and two"))
            })
            .collect::<Result<_>>()?,
        Err(_) => Ledger::ALL.to_vec(),
    };
    let mut admin = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)?;
    let mut head = "| members | coupons | one-shot |".to_string();
    let mut rule = "|---|---|---|".to_string();
    for floor in &floors {
        head += &format!(" {} | ratio |", floor.title());
        rule += "---|---|";
    }
    head += " WAL MB / FPI one-shot |";
    rule += "---|";
    for floor in &floors {
        head += &format!(" {} |", floor.title());
        rule += "---|";
    }
    println!("{head}\n{rule}");
    for members in sizes {
        let dbs: Vec<String> = floors
            .iter()
            .map(|f| format!("floor_{}", f.name()))
            .collect();
        for db in ["src", "oneshot"]
            .into_iter()
            .chain(dbs.iter().map(String::as_str))
        {
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))?;
        }
        admin.batch_execute("CREATE DATABASE src")?;
        {
            let mut c = postgres::Client::connect(&pg.conninfo("src"), postgres::NoTls)?;
            support::make_legacy(&mut c, members)?;
            c.batch_execute("VACUUM ANALYZE")?;
        }
        for db in std::iter::once("oneshot").chain(dbs.iter().map(String::as_str)) {
            admin.batch_execute(&format!("CREATE DATABASE {db} TEMPLATE src"))?;
        }
        let mut one = postgres::Client::connect(&pg.conninfo("oneshot"), postgres::NoTls)?;
        let coupons: i64 = one
            .query_one("SELECT count(*) FROM issued_coupons", &[])?
            .get(0);
        admin.batch_execute("CHECKPOINT")?;
        let w0 = wal(&mut one)?;
        let t = Instant::now();
        one.batch_execute(support::ONE_SHOT)?;
        let one_time = t.elapsed().as_secs_f64();
        let w1 = wal(&mut one)?;
        let reference: String = one.query_one(DIGEST, &[])?.get(0);

        let mut row = Vec::new();
        for (&ledger, db) in floors.iter().zip(&dbs) {
            let mut c = postgres::Client::connect(&pg.conninfo(db), postgres::NoTls)?;
            admin.batch_execute("CHECKPOINT")?;
            let w0 = wal(&mut c)?;
            let t = Instant::now();
            let phases = match ledger {
                Ledger::Cheapest => cheapest(&mut c)?,
                Ledger::TwoSessions => {
                    let mut second = postgres::Client::connect(&pg.conninfo(db), postgres::NoTls)?;
                    two_sessions(&mut c, &mut second)?
                }
                _ => floor(&mut c, ledger)?,
            };
            let took = t.elapsed().as_secs_f64();
            let w1 = wal(&mut c)?;
            let digest: String = c.query_one(DIGEST, &[])?.get(0);
            anyhow::ensure!(
                digest == reference,
                "{db}: end state differs from the one-shot's\n one-shot: {reference}\n {db}: {digest}"
            );
            eprintln!(
                "{members} members, {db}: {}",
                phases
                    .iter()
                    .map(|(n, s)| format!("{n} {s:.1}s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            row.push((took, w1.0 - w0.0, w1.1 - w0.1));
        }
        eprintln!("{members} members, end state (one-shot and every floor): {reference}");
        let mut line = format!("| {members} | {coupons} | {one_time:.1}s |");
        for (took, _, _) in &row {
            line += &format!(" {took:.1}s | {:.2}x |", one_time / took);
        }
        line += &format!(" {:.0} / {} |", (w1.0 - w0.0) as f64 / 1e6, w1.1 - w0.1);
        for (_, bytes, fpi) in &row {
            line += &format!(" {:.0} / {fpi} |", *bytes as f64 / 1e6);
        }
        println!("{line}");
    }
    Ok(())
}
