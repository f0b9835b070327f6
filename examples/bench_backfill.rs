//! Benchmark: the backfill kind (`pgmend repair apply` of a `kind = "backfill"` definition)
//! versus the one-shot `UPDATE ... SET col = expr`, on identical copies of the same data, in one
//! run on one throwaway server, so the figures are ratios of the same machine's moment (issue 35).
//!
//!     cargo build --release --bins --examples && ./target/release/examples/bench_backfill 300000 1000000
//!
//! For each member count: the coupon benchmark's legacy data (`support::make_legacy`: about
//! 3.7 million coupons at 1,000,000 members) with a new nullable column,
//! `issued_coupons.amount_cents bigint`, vacuumed and analyzed, then copied three times with
//! `CREATE DATABASE ... TEMPLATE`. After a `CHECKPOINT` each, the first copy gets the one-shot
//! `UPDATE` ([`ONE_SHOT`]), the second `pgmend repair apply` of [`DEFINITION`] with pgmend's
//! defaults (`--jobs auto`, the default since issue 36), the third the same with `--jobs 2`. Printed: each side's wall time, the ratio
//! one-shot/pgmend, rows/s, WAL bytes (the insert position's advance) and full-page images
//! (`pg_stat_wal`), pgmend's peak RSS (VmHWM, polled) and batch times. The three end states
//! must be equal (a digest of every row's key and new value; on a difference, the differing
//! rows), and each pgmend run's ledger must hold exactly one record per changed row, NULL
//! before and the row's value after.
//!
//! `PGMEND_BENCH_ARGS`: more options for both pgmend runs, split at blanks
//! (`--batch-target 1s`). `PGMEND_BENCH_PROFILE=1`: the cluster loads `pg_stat_statements`,
//! and the 10 statements of each pgmend run with the most server time are printed.
//! `PGMEND_BENCH_SETTINGS`: server settings for pgmend's two databases (`ALTER DATABASE ... SET`),
//! split at blanks (`enable_hashjoin=off enable_mergejoin=off`). `PGMEND_BENCH_EXPLAIN=1`: `auto_explain` logs the plan, with actual times and buffers, of
//! one statement in 20 of pgmend's (the one-shot's database is left alone), copied to
//! /tmp/pgmend-bench-backfill-explain.log at the end.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pgmend::localpg::LocalPg;

mod support;

/// The repair's name: its definition's file name in the temporary `--repairs-dir`.
const NAME: &str = "backfill-amount-cents";

/// The new column, filled from an existing one; `where` chooses the rows whose value differs,
/// as the shop example's backfill does.
const DEFINITION: &str = r#"kind = "backfill"
description = "fill amount_cents from amount_yen (issue 35's benchmark)"
table = "issued_coupons"
row_key = "coupon_id"
set = { amount_cents = "amount_yen::bigint * 100" }
where = "amount_cents IS DISTINCT FROM amount_yen::bigint * 100"
"#;

/// What one would type instead: one statement, every row locked until it commits.
const ONE_SHOT: &str = "UPDATE issued_coupons SET amount_cents = amount_yen::bigint * 100
                         WHERE amount_cents IS DISTINCT FROM amount_yen::bigint * 100";

/// Every row's key and new value, in key order, as one digest, with the row count and the rows
/// whose value is not the expression's.
const DIGEST: &str = "SELECT md5(string_agg(coupon_id::text || ' ' || coalesce(amount_cents::text, 'NULL'), ',' ORDER BY coupon_id)),
                             count(*), count(*) FILTER (WHERE amount_cents IS DISTINCT FROM amount_yen::bigint * 100)
                        FROM issued_coupons";

/// One side's measurement.
struct Side {
    time: Duration,
    wal: i64,
    fpi: i64,
    checkpoints: i64,
    autovacuums: Vec<String>,
}

/// A pgmend run's measurement and report.
struct Run {
    side: Side,
    peak_kb: u64,
    report: serde_json::Value,
}

/// Runs `work` on `c`'s database after a `CHECKPOINT`, measuring its wall time, WAL bytes (the
/// insert position, read on `c`) and full-page images (`pg_stat_wal`, the whole cluster's:
/// `work` must leave its backends' statistics flushed).
fn measure(
    admin: &mut postgres::Client,
    c: &mut postgres::Client,
    work: impl FnOnce(&mut postgres::Client) -> Result<()>,
) -> Result<Side> {
    support::flush_stats(c)?;
    let ckpt0 = support::checkpoint(admin)?;
    let wal0 = support::wal_lsn(c)?;
    let stats0 = support::wal_stats(admin)?;
    let t = Instant::now();
    work(c)?;
    let time = t.elapsed();
    let wal = support::wal_lsn(c)? - wal0;
    support::flush_stats(c)?;
    let stats1 = support::wal_stats(admin)?;
    Ok(Side {
        time,
        wal,
        fpi: stats1.0 - stats0.0,
        checkpoints: support::checkpoints(admin)? - ckpt0,
        autovacuums: support::autovacuums(c)?,
    })
}

/// `pgmend repair apply NAME --yes` on database `db`, with `--jobs jobs` and
/// `PGMEND_BENCH_ARGS`, from a directory without a release: its measurement, peak RSS and JSON
/// report. Its time runs until its server processes have exited too (milliseconds after it).
/// Its stderr goes to /tmp/bench-backfill-MEMBERS-jobs-JOBS.log.
fn pgmend_run(
    pg: &LocalPg,
    admin: &mut postgres::Client,
    exe: &Path,
    repairs: &Path,
    db: &str,
    jobs: &str,
    members: i32,
) -> Result<Run> {
    let mut c = postgres::Client::connect(&pg.conninfo(db), postgres::NoTls)?;
    let own_pid: i32 = c.query_one("SELECT pg_backend_pid()", &[])?.get(0);
    let extra = std::env::var("PGMEND_BENCH_ARGS").unwrap_or_default();
    let log = format!("/tmp/bench-backfill-{members}-jobs-{jobs}.log");
    let mut out = None;
    let mut peak_kb = 0;
    let side = measure(admin, &mut c, |_| {
        let mut child = Command::new(exe)
            .args(["repair", "apply", NAME, "--yes", "--repairs-dir"])
            .arg(repairs)
            .args(["--jobs", jobs, "--format", "json"])
            .args(extra.split_whitespace())
            .current_dir(repairs)
            .env_remove("PGMEND_RELEASE")
            .env_remove("PGMEND_MIGRATIONS_DIR")
            .env_remove("PGMEND_REPAIRS_DIR")
            .env("DATABASE_URL", pg.url(db))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || std::io::read_to_string(stdout));
        peak_kb = support::wait_with_peak_rss(&mut child)?;
        let status = child.wait()?;
        out = Some(reader.join().unwrap()?);
        anyhow::ensure!(
            status.success(),
            "pgmend repair apply --jobs {jobs} failed ({status}); see {log}"
        );
        // Its backends flush their statistics (the full-page images) as they exit.
        anyhow::ensure!(
            support::wait_for_backends_to_exit(
                &pg.data_dir(),
                db,
                &[own_pid as u32],
                Duration::from_secs(30)
            )?,
            "pgmend's backends did not exit within 30 s of pgmend"
        );
        Ok(())
    })?;
    let report: serde_json::Value =
        serde_json::from_str(out.as_deref().unwrap_or_default()).context("pgmend's JSON")?;
    Ok(Run {
        side,
        peak_kb,
        report,
    })
}

/// The digest of `c`'s end state: (digest, rows, rows whose value is not the expression's).
fn digest(c: &mut postgres::Client) -> Result<(String, i64, i64)> {
    let row = c.query_one(DIGEST, &[])?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// Checks that `via`'s end state equals the one-shot's (`reference`: its digest), naming the
/// differing rows otherwise, and that run `run_id`'s ledger holds one record per changed row,
/// `changed` in all, each NULL before and the row's value after.
fn check(
    one: &mut postgres::Client,
    via: &mut postgres::Client,
    reference: &(String, i64, i64),
    run_id: i64,
    changed: u64,
    side: &str,
) -> Result<()> {
    let got = digest(via)?;
    if got != *reference {
        let (rows, differing, shown) = support::compare_rows(
            one,
            via,
            "SELECT coupon_id::text, amount_cents::text FROM issued_coupons ORDER BY coupon_id",
            1,
        )?;
        anyhow::bail!(
            "{side}: end state differs from the one-shot's ({reference:?} against {got:?}): {differing} of {rows} rows, the first:\n  {}",
            shown.join("\n  ")
        );
    }
    let row = via.query_one(
        "SELECT (SELECT count(*) FROM pgmend.ledger_compact WHERE run_id = $1),
                (SELECT count(*) FROM pgmend.ledger_records WHERE run_id = $1),
                count(DISTINCT l.row_key),
                count(*) FILTER (WHERE l.before = '[null]' AND l.after = jsonb_build_array(c.amount_cents))
           FROM pgmend.ledger_compact l JOIN issued_coupons c ON c.coupon_id = (l.row_key ->> 0)::uuid
          WHERE l.run_id = $1",
        &[&run_id],
    )?;
    let counts: Vec<i64> = (0..4).map(|i| row.get(i)).collect();
    anyhow::ensure!(
        counts.iter().all(|&n| n == changed as i64),
        "{side}: the ledger of run {run_id} does not hold one record per changed row ({changed} rows changed): \
         {} compact records, {} in ledger_records, {} distinct keys, {} with NULL before and the row's value after",
        counts[0],
        counts[1],
        counts[2],
        counts[3]
    );
    Ok(())
}

/// PGMEND_BENCH_PROFILE: the 10 statements of database `db` with the most server time since
/// the last reset, on stderr, then a reset.
fn profile(c: &mut postgres::Client, side: &str) -> Result<()> {
    for r in c.query(
        "SELECT round(total_exec_time)::bigint, calls, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 200)
           FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          ORDER BY total_exec_time DESC LIMIT 10",
        &[],
    )? {
        eprintln!(
            "  {side}: {:>7} ms {:>6} calls {:>8} rows  {}",
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, String>(3)
        );
    }
    c.batch_execute("SELECT pg_stat_statements_reset()")?;
    Ok(())
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
    let exe = support::release_binary()?;
    let repairs = tempfile::tempdir()?;
    std::fs::write(repairs.path().join(format!("{NAME}.toml")), DEFINITION)?;
    let profiling = std::env::var_os("PGMEND_BENCH_PROFILE").is_some();
    let explain = std::env::var_os("PGMEND_BENCH_EXPLAIN").is_some();
    let mut settings = support::SPEED_SETTINGS.to_vec();
    match (profiling, explain) {
        (true, true) => settings.push((
            "shared_preload_libraries",
            "pg_stat_statements,auto_explain",
        )),
        (true, false) => settings.push(("shared_preload_libraries", "pg_stat_statements")),
        (false, true) => settings.push(("shared_preload_libraries", "auto_explain")),
        (false, false) => {}
    }
    if explain {
        // Off but in pgmend's two databases (below): the one-shot is not instrumented.
        settings.extend([
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
        ]);
    }
    let pg = LocalPg::start_with(false, &[], &settings)?;
    let mut admin = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)?;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])?
        .get(0);
    anyhow::ensure!(
        version >= 150000,
        "PostgreSQL 15 or later needed (pg_stat_wal's figures, flushed on demand); this is {version}"
    );
    println!("| members | rows changed | one-shot | pgmend (defaults: `--jobs auto`) | ratio | rows/s | pgmend `--jobs 2` | ratio | rows/s | WAL one-shot / pgmend / `--jobs 2` | FPI one-shot / pgmend / `--jobs 2` | peak RSS pgmend / `--jobs 2` | batches p50/p99/max ms, count |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut after_table = Vec::new();
    for members in sizes {
        support::execute_each(
            &mut admin,
            &[
                "DROP DATABASE IF EXISTS src",
                "DROP DATABASE IF EXISTS oneshot",
                "DROP DATABASE IF EXISTS viapgmend",
                "DROP DATABASE IF EXISTS viajobs",
                "CREATE DATABASE src",
            ],
        )?;
        {
            let mut c = postgres::Client::connect(&pg.conninfo("src"), postgres::NoTls)?;
            support::make_legacy(&mut c, members)?;
            c.batch_execute("ALTER TABLE issued_coupons ADD COLUMN amount_cents bigint")?;
            c.batch_execute("VACUUM ANALYZE")?;
        }
        support::execute_each(
            &mut admin,
            &[
                "CREATE DATABASE oneshot TEMPLATE src",
                "CREATE DATABASE viapgmend TEMPLATE src",
                "CREATE DATABASE viajobs TEMPLATE src",
            ],
        )?;

        // PGMEND_BENCH_SETTINGS: server settings for pgmend's two databases, split at blanks
        // (`enable_hashjoin=off enable_mergejoin=off`), to try what a batch would gain by one.
        for setting in std::env::var("PGMEND_BENCH_SETTINGS")
            .unwrap_or_default()
            .split_whitespace()
        {
            let (name, value) = setting
                .split_once('=')
                .context("PGMEND_BENCH_SETTINGS: name=value")?;
            for db in ["viapgmend", "viajobs"] {
                admin.batch_execute(&format!("ALTER DATABASE {db} SET {name} = '{value}'"))?;
            }
        }
        if explain {
            for db in ["viapgmend", "viajobs"] {
                admin.batch_execute(&format!(
                    "ALTER DATABASE {db} SET auto_explain.log_min_duration = 0;
                     ALTER DATABASE {db} SET auto_explain.sample_rate = 0.05"
                ))?;
            }
        }
        let mut one = postgres::Client::connect(&pg.conninfo("oneshot"), postgres::NoTls)?;
        if profiling {
            for db in ["oneshot", "viapgmend", "viajobs"] {
                postgres::Client::connect(&pg.conninfo(db), postgres::NoTls)?
                    .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")?;
            }
        }
        let mut changed = 0;
        let one_side = measure(&mut admin, &mut one, |c| {
            changed = c
                .execute(ONE_SHOT, &[])
                .map_err(|e| anyhow::anyhow!("one-shot: {}", pgmend::error::describe(&e)))?;
            Ok(())
        })?;
        let reference = digest(&mut one)?;
        anyhow::ensure!(
            reference.2 == 0 && changed as i64 == reference.1,
            "the one-shot changed {changed} rows of {}, {} left differing",
            reference.1,
            reference.2
        );
        // The dead version of every row, vacuumed here, between the timed runs: otherwise
        // autovacuum does it during the next one, which would pay for it.
        one.batch_execute("VACUUM issued_coupons")?;

        let mut runs = Vec::new();
        for (db, jobs) in [("viapgmend", "auto"), ("viajobs", "2")] {
            let run = pgmend_run(&pg, &mut admin, &exe, repairs.path(), db, jobs, members)?;
            let mut via = postgres::Client::connect(&pg.conninfo(db), postgres::NoTls)?;
            if profiling {
                profile(&mut via, &format!("{members} --jobs {jobs}"))?;
            }
            let run_id = run.report["run"]["run_id"]
                .as_i64()
                .context("the report's run_id")?;
            let run_changed = run.report["run"]["changed"].as_u64().unwrap_or(0);
            anyhow::ensure!(
                run_changed == changed,
                "--jobs {jobs}: pgmend reports {run_changed} rows changed, the one-shot {changed}"
            );
            check(
                &mut one,
                &mut via,
                &reference,
                run_id,
                changed,
                &format!("--jobs {jobs}"),
            )?;
            via.batch_execute("VACUUM issued_coupons")?;
            let log =
                std::fs::read_to_string(format!("/tmp/bench-backfill-{members}-jobs-{jobs}.log"))?;
            if let Some(last) = log.lines().rev().find(|l| !l.trim().is_empty()) {
                after_table.push(format!(
                    "{members} members, --jobs {jobs}, pgmend's last line on stderr: {last}"
                ));
            }
            runs.push(run);
        }

        for (side, s) in [
            ("the one-shot", &one_side),
            ("pgmend", &runs[0].side),
            ("pgmend --jobs 2", &runs[1].side),
        ] {
            if !s.autovacuums.is_empty() {
                after_table.push(format!(
                    "{members} members: autovacuum ran during or right after {side}'s run (it shares the cores): {}",
                    s.autovacuums.join(", ")
                ));
            }
            if s.checkpoints > 0 {
                after_table.push(format!(
                    "{members} members: {} checkpoint(s) began during {side}'s run: its WAL and FPI include the full-page images that follow",
                    s.checkpoints
                ));
            }
        }
        let secs = |s: &Side| s.time.as_secs_f64();
        let (a, b, c) = (&one_side, &runs[0], &runs[1]);
        let batches = runs
            .iter()
            .map(|r| {
                format!(
                    "{}/{}/{}, {}",
                    r.report["batch_ms_p50"],
                    r.report["batch_ms_p99"],
                    r.report["batch_ms_max"],
                    r.report["batches"]
                )
            })
            .collect::<Vec<_>>();
        println!(
            "| {members} | {changed} | {:.1} s | {:.1} s | {:.2}× | {:.0} | {:.1} s | {:.2}× | {:.0} | {:.0} / {:.0} / {:.0} MB ({:.2}×, {:.2}×) | {} / {} / {} | {:.1} / {:.1} MB | {} |",
            secs(a),
            secs(&b.side),
            secs(a) / secs(&b.side),
            changed as f64 / secs(&b.side),
            secs(&c.side),
            secs(a) / secs(&c.side),
            changed as f64 / secs(&c.side),
            a.wal as f64 / 1e6,
            b.side.wal as f64 / 1e6,
            c.side.wal as f64 / 1e6,
            b.side.wal as f64 / a.wal as f64,
            c.side.wal as f64 / a.wal as f64,
            a.fpi,
            b.side.fpi,
            c.side.fpi,
            b.peak_kb as f64 / 1024.0,
            c.peak_kb as f64 / 1024.0,
            batches.join("; "),
        );
        eprintln!(
            "{members} members: end states equal (digest {}, {} rows), one ledger record per changed row in both pgmend runs",
            reference.0, reference.1
        );
    }
    if !after_table.is_empty() {
        println!();
        for line in after_table {
            println!("{line}");
        }
    }
    if explain {
        std::fs::copy(
            pg.data_dir().join("../server.log"),
            "/tmp/pgmend-bench-backfill-explain.log",
        )?;
    }
    Ok(())
}
