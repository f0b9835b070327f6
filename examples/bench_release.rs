//! Benchmark: the one-shot SQL of seed 000 versus `pgmend apply`, on identical copies of the
//! same legacy data, in one run on one throwaway server (so the figures are ratios of the
//! same machine's moment).
//!
//!     cargo run --release --example bench_release -- 30000 300000
//!     cargo run --release --example bench_release -- --load 300000
//!     cargo run --release --example bench_release -- --after-gate 300000 1000000
//!
//! With `--load`, both run while threads play the legacy application (issuing coupons,
//! redeeming duplicates, and a two-second read of issued_coupons every few seconds), pgmend
//! up to the deploy gate, and the application's p99 and worst latency are reported. With
//! `--after-gate`, the passes after the gate run while the new application issues at full
//! speed (see `after_gate`).
//!
//! For each member count: wall time of each, their ratio, rows/s, pgmend's batch transaction
//! times (p50/p99/max per repair), pgmend's peak RSS (VmHWM, polled), and WAL bytes written.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pgmend::localpg::LocalPg;

mod support;

/// Where the next WAL record goes, as a `pg_lsn` literal (for `pg_walinspect`).
fn wal_lsn_text(c: &mut postgres::Client) -> Result<String> {
    Ok(
        c.query_one("SELECT pg_current_wal_insert_lsn()::text", &[])?
            .get(0),
    )
}

/// PGMEND_BENCH_WAL=1: the WAL between `from` and now by record kind, and the full-page
/// images by relation (`pg_walinspect`, PostgreSQL 15+; only the first block of each record
/// is attributed; another database's, such as an autovacuum's, by database), to tell what
/// writes it. `c` is connected to the database whose relations
/// the images are named by.
fn wal_breakdown(c: &mut postgres::Client, side: &str, from: &str) -> Result<()> {
    std::thread::sleep(Duration::from_millis(500));
    let to: String = c
        .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])?
        .get(0);
    for r in c.query(
        // The first column is "resource_manager/record_type" in 15, two columns from 16 on.
        "SELECT * FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn, true) s
          WHERE s.combined_size > 1000000 ORDER BY s.combined_size DESC",
        &[&from, &to],
    )? {
        let kind: String = (0..r.len())
            .take_while(|&i| r.columns()[i].type_() == &postgres::types::Type::TEXT)
            .map(|i| r.get::<_, String>(i))
            .collect::<Vec<_>>()
            .join("/");
        let (n, fpi, all): (i64, i64, i64) =
            (r.get("count"), r.get("fpi_size"), r.get("combined_size"));
        eprintln!(
            "  {side}: {kind:<28} {n:>10} records {:>8.1} MB (full-page images {:.1} MB)",
            all as f64 / 1e6,
            fpi as f64 / 1e6
        );
    }
    for r in c.query(
        "SELECT CASE WHEN w.db <> (SELECT oid FROM pg_database WHERE datname = current_database())
                     THEN coalesce('database ' || (SELECT datname FROM pg_database WHERE oid = w.db), 'a dropped database')
                     ELSE coalesce(c.relname, w.rel::text) END, w.images, w.bytes
           FROM (SELECT substring(block_ref from 'rel \\d+/(\\d+)/')::oid AS db,
                        substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid AS rel, count(*) AS images, sum(fpi_length) AS bytes
                   FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                  WHERE fpi_length > 0 GROUP BY 1, 2) w
           LEFT JOIN pg_class c ON c.relfilenode = w.rel
          ORDER BY w.bytes DESC LIMIT 12",
        &[&from, &to],
    )? {
        let (rel, n, bytes): (String, i64, i64) = (r.get(0), r.get(1), r.get::<_, Option<i64>>(2).unwrap_or(0));
        eprintln!(
            "  {side}: full-page images of {rel:<40} {n:>8} ({:.1} MB)",
            bytes as f64 / 1e6
        );
    }
    Ok(())
}

fn state(c: &mut postgres::Client) -> Result<String> {
    Ok(c.query_one(
        "SELECT format('%s coupons, %s legacy duplicates, %s voided, budgets %s, usage rows with yen %s',
                count(*), count(*) FILTER (WHERE legacy_duplicate), count(*) FILTER (WHERE voided_at IS NOT NULL),
                (SELECT string_agg(campaign_id || '=' || issued_yen, ' ' ORDER BY campaign_id) FROM campaign_budgets),
                (SELECT count(*) FILTER (WHERE used_yen > 0) FROM member_monthly_usage))
           FROM issued_coupons",
        &[],
    )?
    .get(0))
}

/// The end states compared row for row (see docs/benchmark.md): each coupon's
/// `legacy_duplicate` and voided-or-not by id, every `campaign_budgets` row, and every
/// `member_monthly_usage` row above 0 yen; a side's rows at 0 yen must be none (the one-shot
/// creates no row for a member-month whose coupons are all voided) or exactly those member-months
/// (pgmend creates one). Returns a one-line summary, or the differences as the error.
fn compare_end_states(one: &mut postgres::Client, via: &mut postgres::Client) -> Result<String> {
    let tables: [(&str, &str, usize); 3] = [
        (
            "issued_coupons",
            "SELECT coupon_id::text, format('legacy_duplicate %s, voided %s', legacy_duplicate, voided_at IS NOT NULL)
               FROM issued_coupons ORDER BY coupon_id",
            1,
        ),
        (
            "campaign_budgets",
            "SELECT campaign_id, issued_yen::text FROM campaign_budgets ORDER BY campaign_id",
            1,
        ),
        (
            "member_monthly_usage (used_yen > 0)",
            "SELECT member_id, month, used_yen::text FROM member_monthly_usage WHERE used_yen > 0 ORDER BY member_id, month",
            2,
        ),
    ];
    let mut summary = Vec::new();
    let mut failures = Vec::new();
    for (table, sql, keys) in tables {
        let (rows, differing, shown) = support::compare_rows(one, via, sql, keys)?;
        summary.push(format!("{table} {rows} rows"));
        if differing > 0 {
            failures.push(format!(
                "{table}: {differing} rows differ, the first:\n    {}",
                shown.join("\n    ")
            ));
        }
    }
    let mut zeros = Vec::new();
    for (side, c) in [("one-shot", &mut *one), ("pgmend", &mut *via)] {
        let row = c.query_one(
            "WITH all_voided AS (
               SELECT member_id, month FROM issued_coupons GROUP BY 1, 2 HAVING bool_and(voided_at IS NOT NULL))
             SELECT (SELECT count(*) FROM member_monthly_usage WHERE used_yen = 0),
                    (SELECT count(*) FROM all_voided),
                    (SELECT count(*) FROM member_monthly_usage JOIN all_voided USING (member_id, month) WHERE used_yen = 0)",
            &[],
        )?;
        let (at_zero, all_voided, matching): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        zeros.push(format!(
            "{side} {at_zero} (member-months whose coupons are all voided: {all_voided})"
        ));
        if at_zero != 0 && !(at_zero == all_voided && matching == at_zero) {
            failures.push(format!(
                "member_monthly_usage on the {side} side: {at_zero} rows at 0 yen, of which {matching} are member-months whose {all_voided} coupons are all voided (expected none, or exactly those)"
            ));
        }
    }
    summary.push(format!("usage rows at 0 yen: {}", zeros.join(", ")));
    anyhow::ensure!(
        failures.is_empty(),
        "end states differ row for row:\n  {}",
        failures.join("\n  ")
    );
    Ok(summary.join("; "))
}

/// The release run again with `--jobs jobs` on a copy of `src` (baselined, after a
/// `CHECKPOINT`): its wall time, and its end state and ledger compared with `viapgmend`'s row
/// for row. The ledger is compared as a multiset of records (the run's repair, table, key,
/// action, before, after with a void's time reduced to whether it is set, reason), so that
/// the order in which workers wrote them does not matter.
fn jobs_too(
    pg: &LocalPg,
    exe: &std::path::Path,
    args: &[&str],
    jobs: &str,
    members: i32,
) -> Result<(Duration, String)> {
    let mut admin = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)?;
    support::execute_each(
        &mut admin,
        &[
            "DROP DATABASE IF EXISTS viajobs",
            "CREATE DATABASE viajobs TEMPLATE src",
        ],
    )?;
    let url = pg.url("viajobs");
    let status = Command::new(exe)
        .args(["migrate", "baseline", "--yes"])
        .env("DATABASE_URL", &url)
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "baseline failed");
    support::checkpoint(&mut admin)?;
    let t = Instant::now();
    let status = Command::new(exe)
        .args(args)
        .args(["--jobs", jobs])
        .env("DATABASE_URL", &url)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(format!(
            "/tmp/bench-pgmend-{members}-jobs-{jobs}.log"
        ))?)
        .status()?;
    let time = t.elapsed();
    anyhow::ensure!(status.success(), "pgmend apply --jobs {jobs} failed");
    let mut first = postgres::Client::connect(&pg.conninfo("viapgmend"), postgres::NoTls)?;
    let mut again = postgres::Client::connect(&pg.conninfo("viajobs"), postgres::NoTls)?;
    let rows = compare_end_states(&mut first, &mut again)?;
    let ledger = "SELECT x, lpad((row_number() OVER (PARTITION BY x))::text, 12, '0'), '' FROM (
                    SELECT concat_ws(' ', r.repair, l.target_table, l.row_key::text, l.action, l.before::text,
                                     (l.after - 'voided_at')::text, (l.after ->> 'voided_at') IS NULL, l.reason) AS x
                      FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id)) records
                  ORDER BY x COLLATE \"C\", 2";
    let (records, differing, shown) = support::compare_rows(&mut first, &mut again, ledger, 2)?;
    anyhow::ensure!(
        differing == 0,
        "--jobs {jobs}: {differing} of {records} ledger records differ from --jobs 1's, the first:\n  {}",
        shown.join("\n  ")
    );
    Ok((
        time,
        format!("equal to --jobs 1 row for row ({rows}) and ledger for ledger ({records} records)"),
    ))
}

/// "N label time" for each `step N done in X` line of pgmend's stderr, with the step's label
/// from its JSON report.
fn step_times(log: &str, doc: &serde_json::Value) -> Vec<String> {
    let re = regex::Regex::new(r"step (\d+) done in (\S+)").expect("valid regex");
    re.captures_iter(log)
        .map(|c| {
            let label = doc["steps"]
                .as_array()
                .and_then(|steps| {
                    steps.iter().find(|s| {
                        s["step"].as_u64().map(|n| n.to_string()).as_deref() == Some(&c[1])
                    })
                })
                .and_then(|s| s["label"].as_str())
                .unwrap_or("?");
            format!("{} {label} {}", &c[1], &c[2])
        })
        .collect()
}

/// The application operations over 2 ms: when each began, how long it took, whether it issued a
/// coupon (else it redeemed one).
static SLOW: std::sync::Mutex<Vec<(Instant, Duration, bool)>> = std::sync::Mutex::new(Vec::new());

/// The legacy application under load: returns every operation's latency when `stop` is set.
fn legacy_load(
    conninfo: String,
    members: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<Duration>>> {
    use std::sync::atomic::Ordering;
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let (conninfo, stop) = (conninfo.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).expect("load connection");
            let mut lat = Vec::new();
            let mut x: u64 = 0x2545_f491_4f6c_dd1d ^ (t + 1);
            let targets: i64 = c.query_one("SELECT count(*) FROM redeem_targets", &[]).map(|r| r.get(0)).unwrap_or(1).max(1);
            while !stop.load(Ordering::SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let started = Instant::now();
                let result = if x.is_multiple_of(2) {
                    let member = format!("m{:07}", (x / 2) % members as u64 + 1);
                    let campaign = ["SW-A", "SW-B", "SW-C"][(x / 7 % 3) as usize];
                    c.batch_execute(&format!(
                        "BEGIN;
                         INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
                         VALUES (gen_random_uuid(), '{campaign}', '{member}', '2026-09', 1000) ON CONFLICT DO NOTHING;
                         UPDATE campaigns SET issued_yen = issued_yen + 1000 WHERE campaign_id = '{campaign}';
                         COMMIT;"
                    ))
                } else {
                    let n = (x / 2) as i64 % targets + 1;
                    c.execute(
                        "UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id = (SELECT coupon_id FROM redeem_targets WHERE n = $1) AND redeemed_at IS NULL",
                        &[&n],
                    )
                    .map(|_| ())
                };
                if result.is_ok() {
                    let took = started.elapsed();
                    if took > Duration::from_millis(2) {
                        SLOW.lock().unwrap().push((started, took, x.is_multiple_of(2)));
                    }
                    lat.push(took);
                } else {
                    let _ = c.batch_execute("ROLLBACK");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            lat
        }));
    }
    threads.push(std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).expect("load connection");
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = c.batch_execute(
                "SELECT count(*), pg_sleep(2) FROM (SELECT 1 FROM issued_coupons LIMIT 1) x",
            );
            std::thread::sleep(Duration::from_secs(3));
        }
        Vec::new()
    }));
    threads
}

/// Every 50 ms until `stop`: the application's statements active for over 100 ms (not its
/// two-second read, nor pgmend's), each as its wait event and the sessions blocking it
/// (application name and query), with when it was seen.
fn sample_waits(
    conninfo: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Instant, String)>> {
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).expect("sampler");
        let mut seen = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let at = Instant::now();
            if let Ok(rows) = c.query(
                "SELECT coalesce(a.wait_event_type || ':' || a.wait_event, 'CPU') || ' behind [' ||
                        coalesce((SELECT string_agg(DISTINCT b.application_name || ': ' ||
                                          left(regexp_replace(b.query, '\\s+', ' ', 'g'), 70), '; ')
                                    FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid))), '') || ']'
                   FROM pg_stat_activity a
                  WHERE a.datname = current_database() AND a.backend_type = 'client backend'
                    AND a.state = 'active' AND a.pid <> pg_backend_pid()
                    AND a.application_name NOT LIKE 'pgmend%' AND a.query NOT LIKE '%pg_sleep%'
                    AND clock_timestamp() - a.query_start > interval '100 ms'",
                &[],
            ) {
                seen.extend(rows.iter().map(|r| (at, r.get::<_, String>(0))));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    })
}

/// With `load`, the legacy application under load (see [`legacy_load`]), given a second to
/// get going; otherwise nothing. Set the flag to stop it.
#[allow(clippy::type_complexity)]
fn start_legacy_load(
    load: bool,
    conninfo: String,
    members: i32,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Vec<std::thread::JoinHandle<Vec<Duration>>>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if !load {
        return (stop, Vec::new());
    }
    let threads = legacy_load(conninfo, members, stop.clone());
    std::thread::sleep(Duration::from_millis(1000));
    (stop, threads)
}

/// The new application at full speed (issue 14's load): 8 clients, 90% of them on campaign
/// SW-A, each coupon in one transaction with its member-month and campaign counters (seed 000's
/// corrected issuance; a coupon over the budget is refused, as the check then demands).
/// Returns every transaction's latency when `stop` is set.
fn new_app_load(
    conninfo: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<Duration>>> {
    use std::sync::atomic::Ordering;
    (0..8u64)
        .map(|t| {
            let (conninfo, stop) = (conninfo.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c =
                    postgres::Client::connect(&conninfo, postgres::NoTls).expect("load connection");
                let mut lat = Vec::new();
                let mut n: u64 = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let campaign = if n.is_multiple_of(10) { ["SW-B", "SW-C"][(n / 10 % 2) as usize] } else { "SW-A" };
                    let member = format!("new-{t}-{n}");
                    let started = Instant::now();
                    let result = (|| -> Result<(), postgres::Error> {
                        let mut tx = c.transaction()?;
                        tx.execute("INSERT INTO member_monthly_usage VALUES ($1, '2026-10', 0) ON CONFLICT DO NOTHING", &[&member])?;
                        let inserted = tx.execute(
                            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
                             VALUES (gen_random_uuid(), $1, $2, '2026-10', 1000)
                             ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate DO NOTHING",
                            &[&campaign, &member],
                        )?;
                        if inserted == 1 {
                            tx.execute("UPDATE member_monthly_usage SET used_yen = used_yen + 1000 WHERE member_id = $1 AND month = '2026-10'", &[&member])?;
                            let budget = tx.execute(
                                "UPDATE campaign_budgets SET issued_yen = issued_yen + 1000 WHERE campaign_id = $1 AND issued_yen + 1000 <= budget_yen",
                                &[&campaign],
                            )?;
                            if budget == 0 {
                                // Over budget: refused, nothing issued.
                                return tx.rollback();
                            }
                        }
                        tx.commit()
                    })();
                    if result.is_ok() {
                        lat.push(started.elapsed());
                        if started.elapsed() > Duration::from_millis(150) {
                            eprintln!(
                                "slow application transaction: {} ms, ended at {:.3} s (unix)",
                                started.elapsed().as_millis(),
                                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
                            );
                        }
                    }
                }
                lat
            })
        })
        .collect()
}

/// Seconds, the application's (operations, p99 ms, worst ms), and pgmend's JSON if it ran.
type Measured = (f64, Latencies, Option<serde_json::Value>);

/// Issue 14's measurement: pgmend's passes after the gate while the new application runs at
/// full speed. The release first goes to the gate, then the old application issues for three
/// seconds (the deploy window: its coupons reach the new counters only through pgmend), then
/// the new application alone (the baseline), then the same with
/// `apply --yes --confirm deploy-new-application`. Prints the application's throughput and
/// worst latency against the baseline, pgmend's batch transaction times, and `verify`.
fn after_gate(pg: &LocalPg, exe: &std::path::Path, members: i32) -> Result<()> {
    let url = pg.url("aftergate");
    let run = |args: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(exe)
            .args(args)
            .env("DATABASE_URL", &url)
            .stderr(Stdio::null())
            .output()?)
    };
    anyhow::ensure!(
        run(&["migrate", "baseline", "--yes"])?.status.success(),
        "baseline failed"
    );
    let t = Instant::now();
    anyhow::ensure!(
        run(&["apply", "--yes"])?.status.success(),
        "apply to the gate failed"
    );
    eprintln!(
        "{members}: release to the gate in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // SW-A is over its budget in the incident's data, and the new application refuses a
    // coupon past the budget without touching the row: raise the budgets so that it issues,
    // and every transaction updates the hottest row (the case this measures).
    postgres::Client::connect(&pg.conninfo("aftergate"), postgres::NoTls)?
        .batch_execute("UPDATE campaign_budgets SET budget_yen = 2000000000")?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let old = legacy_load(pg.conninfo("aftergate"), members, stop.clone());
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let old_ops = old
        .into_iter()
        .map(|h| h.join().unwrap().len())
        .sum::<usize>();
    let measure = |with_pgmend: bool| -> Result<Measured> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = new_app_load(pg.conninfo("aftergate"), stop.clone());
        let t = Instant::now();
        let doc = if with_pgmend {
            eprintln!(
                "pgmend after the gate starts at {:.3} s (unix); its stderr: /tmp/bench-aftergate-{members}.log",
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
            );
            let mut child = Command::new(exe)
                .args([
                    "apply",
                    "--yes",
                    "--confirm",
                    "deploy-new-application",
                    "--format",
                    "json",
                ])
                .env("DATABASE_URL", &url)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            // pgmend's stderr, each line stamped with when it arrived.
            let stderr = child.stderr.take().unwrap();
            let mut log = std::fs::File::create(format!("/tmp/bench-aftergate-{members}.log"))?;
            let stamper = std::thread::spawn(move || {
                use std::io::{BufRead, Write};
                for line in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    let _ = writeln!(log, "{:.3} {line}", now.as_secs_f64());
                }
            });
            let out = child.wait_with_output()?;
            let _ = stamper.join();
            anyhow::ensure!(
                out.status.success(),
                "apply after the gate failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            Some(serde_json::from_slice(&out.stdout)?)
        } else {
            std::thread::sleep(Duration::from_secs(5));
            None
        };
        let secs = t.elapsed().as_secs_f64();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let lat = percentiles(
            threads
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect(),
        );
        Ok((secs, lat, doc))
    };
    let (base_secs, base, _) = measure(false)?;
    let (secs, with, doc) = measure(true)?;
    let doc = doc.unwrap();
    let batches = support::batch_times(
        doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["outcome"] == "done")
            .filter_map(|s| s.get("run")),
    );
    let verify = run(&["verify"])?.status.code().unwrap_or(-1);
    println!(
        "| {members} after the gate | old app {old_ops} ops in 3 s | baseline: {:.0} tx/s, p99 {:.0} ms, worst {:.0} ms | with pgmend ({secs:.1}s): {:.0} tx/s ({:.0}%), p99 {:.0} ms, worst {:.0} ms | batches p50/p99/max ms: {} | verify exit {verify} |",
        base.0 as f64 / base_secs, base.1, base.2,
        with.0 as f64 / secs, 100.0 * (with.0 as f64 / secs) / (base.0 as f64 / base_secs), with.1, with.2,
        batches.join("; ")
    );
    Ok(())
}

/// The legacy application alone for five seconds: its operations, p99 and worst in ms.
fn app_alone(conninfo: String, members: i32) -> Latencies {
    let (stop, threads) = start_legacy_load(true, conninfo, members);
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    percentiles(
        threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect(),
    )
}

/// The application's operations, p99 and worst in ms.
type Latencies = (usize, f64, f64);

/// PGMEND_BENCH_BESIDE=1 under load: the application for five seconds beside one session that
/// does work no design of the repair can do without, holding no lock the application waits
/// for: `cpu` burns a core on the server (a count over a series), `scan` reads `issued_coupons`
/// whole again and again on its backend alone (`parallel scan` with the server's parallel
/// workers), `wal` inserts 10,000 rows into a table of its own per transaction.
/// What these do to the application's p99 is a floor for any repair that works while the
/// application does, on this machine.
fn app_beside_work(conninfo: String, members: i32) -> Result<Vec<(&'static str, Latencies)>> {
    let mut measured = Vec::new();
    for (what, setup, statement) in [
        (
            "cpu",
            "",
            "SELECT count(*) FROM generate_series(1, 20000000)",
        ),
        (
            "scan",
            "SET max_parallel_workers_per_gather = 0",
            "SELECT count(*), sum(amount_yen) FROM issued_coupons",
        ),
        (
            "parallel scan",
            "",
            "SELECT count(*), sum(amount_yen) FROM issued_coupons",
        ),
        (
            "wal",
            "CREATE TABLE IF NOT EXISTS bench_scratch (n int, t text)",
            "INSERT INTO bench_scratch SELECT g, md5(g::text) FROM generate_series(1, 10000) g",
        ),
    ] {
        let mut c = postgres::Client::connect(&conninfo, postgres::NoTls)?;
        if !setup.is_empty() {
            c.batch_execute(setup)?;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut statements = 0u32;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    c.batch_execute(statement)
                        .expect("the work beside the application");
                    statements += 1;
                }
                statements
            })
        };
        let app = app_alone(conninfo.clone(), members);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let statements = worker.join().unwrap();
        eprintln!("beside {what}: {statements} statements");
        measured.push((what, app));
    }
    let mut c = postgres::Client::connect(&conninfo, postgres::NoTls)?;
    c.batch_execute("DROP TABLE IF EXISTS bench_scratch; CHECKPOINT")?;
    Ok(measured)
}

fn percentiles(mut lat: Vec<Duration>) -> Latencies {
    lat.sort_unstable();
    let p99 = lat
        .get(((lat.len() as f64 - 1.0) * 0.99).round() as usize)
        .copied()
        .unwrap_or_default();
    (
        lat.len(),
        p99.as_secs_f64() * 1000.0,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
    )
}

fn main() -> Result<()> {
    let load = std::env::args().any(|a| a == "--load");
    let gate = std::env::args().any(|a| a == "--after-gate");
    let sizes: Vec<i32> = std::env::args()
        .skip(1)
        .filter(|a| a != "--load" && a != "--after-gate")
        .map(|a| a.parse().context("member counts"))
        .collect::<Result<_>>()?;
    let sizes = if sizes.is_empty() {
        vec![30_000, 300_000]
    } else {
        sizes
    };
    let exe = support::release_binary()?;
    // PGMEND_BENCH_PROFILE=1: load pg_stat_statements and print where pgmend's server time
    // went, statement by statement (for finding what to make faster, not for the figures).
    let profile = std::env::var_os("PGMEND_BENCH_PROFILE").is_some();
    let wal_kinds = std::env::var_os("PGMEND_BENCH_WAL").is_some();
    // PGMEND_BENCH_EXPLAIN=1: the plans, with actual times, of statements over 150 ms, from
    // the server log (auto_explain), copied to /tmp/pgmend-bench-explain.log at the end.
    let explain = std::env::var_os("PGMEND_BENCH_EXPLAIN").is_some();
    let pg = if gate {
        // Lock waits and slow statements in the server log, to tell what held the hot row.
        let pg = LocalPg::start_with(
            false,
            &[],
            &[
                ("log_lock_waits", "on"),
                ("deadlock_timeout", "100ms"),
                ("log_min_duration_statement", "100ms"),
                ("log_line_prefix", "'%m [%p] %a '"),
            ],
        )?;
        eprintln!(
            "server log: {}",
            pg.data_dir().join("../server.log").display()
        );
        pg
    } else if load {
        LocalPg::start(false)?
    } else {
        let mut settings = support::SPEED_SETTINGS.to_vec();
        match (profile, explain) {
            (true, true) => settings.push((
                "shared_preload_libraries",
                "pg_stat_statements,auto_explain",
            )),
            (true, false) => settings.push(("shared_preload_libraries", "pg_stat_statements")),
            (false, true) => settings.push(("shared_preload_libraries", "auto_explain")),
            (false, false) => {}
        }
        if explain {
            settings.extend([
                ("auto_explain.log_min_duration", "150ms"),
                ("auto_explain.log_analyze", "on"),
                ("auto_explain.log_buffers", "on"),
            ]);
        }
        LocalPg::start_with(false, &[], &settings)?
    };
    let mut admin = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)?;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])?
        .get(0);
    anyhow::ensure!(
        version >= 150000,
        "PostgreSQL 15 or later needed (pg_stat_wal's figures, flushed on demand); this is {version}"
    );
    if !load && !gate {
        println!("| members | coupons | duplicates changed | one-shot | pgmend | ratio (one-shot/pgmend) | pgmend rows/s | batches p50/p99/max ms | peak RSS | WAL one-shot | WAL pgmend | FPI one-shot | FPI pgmend |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    // Printed after the table: pgmend's time per step, and checkpoints inside a timed run.
    let mut after_table = Vec::new();
    for members in sizes {
        support::execute_each(
            &mut admin,
            &[
                "DROP DATABASE IF EXISTS src",
                "DROP DATABASE IF EXISTS oneshot",
                "DROP DATABASE IF EXISTS viapgmend",
                "CREATE DATABASE src",
            ],
        )?;
        {
            let mut c = postgres::Client::connect(&pg.conninfo("src"), postgres::NoTls)?;
            support::make_legacy(&mut c, members)?;
            // Coupons the load redeems: the duplicates first, whose rows the repair changes.
            c.batch_execute(
                "CREATE TABLE redeem_targets AS
                   SELECT row_number() OVER () AS n, coupon_id
                     FROM (SELECT coupon_id, redeemed_at, count(*) OVER (PARTITION BY campaign_id, member_id) AS copies
                             FROM issued_coupons) x
                    WHERE copies > 1 AND redeemed_at IS NULL;
                 CREATE UNIQUE INDEX ON redeem_targets (n);",
            )?;
        }
        if gate {
            support::execute_each(
                &mut admin,
                &[
                    "DROP DATABASE IF EXISTS aftergate",
                    "CREATE DATABASE aftergate TEMPLATE src",
                    "CHECKPOINT",
                ],
            )?;
            after_gate(&pg, &exe, members)?;
            continue;
        }
        support::execute_each(
            &mut admin,
            &[
                "CREATE DATABASE oneshot TEMPLATE src",
                "CREATE DATABASE viapgmend TEMPLATE src",
            ],
        )?;

        let mut one = postgres::Client::connect(&pg.conninfo("oneshot"), postgres::NoTls)?;
        let coupons: i64 = one
            .query_one("SELECT count(*) FROM issued_coupons", &[])?
            .get(0);
        if wal_kinds {
            one.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")?;
        }
        // The count may have pruned pages: its WAL goes before the window, in figures and in time.
        support::flush_stats(&mut one)?;
        let ckpt0 = support::checkpoint(&mut admin)?;
        let wal0 = support::wal_lsn(&mut one)?;
        let lsn0 = wal_lsn_text(&mut one)?;
        let stats0 = support::wal_stats(&mut admin)?;
        let (stop, load_threads) = start_legacy_load(load, pg.conninfo("oneshot"), members);
        let t = Instant::now();
        one.batch_execute(support::ONE_SHOT)
            .map_err(|e| anyhow::anyhow!("one-shot SQL: {}", pgmend::error::describe(&e)))?;
        let one_time = t.elapsed();
        support::flush_stats(&mut one)?;
        let stats1 = support::wal_stats(&mut admin)?;
        let one_ckpts = support::checkpoints(&mut admin)? - ckpt0;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let one_load = percentiles(
            load_threads
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect(),
        );
        let one_wal = support::wal_lsn(&mut one)? - wal0;
        if wal_kinds {
            wal_breakdown(&mut one, "one-shot", &lsn0)?;
        }
        let one_autovacuums = support::autovacuums(&mut one)?;
        let one_state = state(&mut one)?;
        // The one-shot left a dead version of every row it changed. Vacuumed here, between the
        // two timed runs: otherwise autovacuum does it during pgmend's, and pgmend's WAL
        // counts it (440 MB, most of it full-page images, at 1,000,000 members).
        one.batch_execute("VACUUM")?;

        let url = pg.url("viapgmend");
        let status = Command::new(&exe)
            .args(["migrate", "baseline", "--yes"])
            .env("DATABASE_URL", &url)
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "baseline failed");
        let mut via = postgres::Client::connect(&pg.conninfo("viapgmend"), postgres::NoTls)?;
        // PGMEND_BENCH_DBSET="name=value ...": settings of pgmend's database (its sessions').
        for set in std::env::var("PGMEND_BENCH_DBSET")
            .unwrap_or_default()
            .split_whitespace()
        {
            let (name, value) = set
                .split_once('=')
                .context("PGMEND_BENCH_DBSET: name=value")?;
            via.batch_execute(&format!("ALTER DATABASE viapgmend SET {name} = '{value}'"))?;
        }
        let via_pid: i32 = via.query_one("SELECT pg_backend_pid()", &[])?.get(0);
        let backends_gone = || {
            support::wait_for_backends_to_exit(
                &pg.data_dir(),
                "viapgmend",
                &[via_pid as u32],
                Duration::from_secs(30),
            )
        };
        // The baseline's backend flushes its statistics as it exits.
        anyhow::ensure!(backends_gone()?, "the baseline's backend did not exit");
        if profile {
            via.batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
            )?;
        }
        if wal_kinds {
            via.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")?;
        }
        support::flush_stats(&mut via)?;
        let ckpt0 = support::checkpoint(&mut admin)?;
        let wal0 = support::wal_lsn(&mut via)?;
        let lsn0_via = wal_lsn_text(&mut via)?;
        let stats0_via = support::wal_stats(&mut admin)?;
        // Under load, the application alone for five seconds first: the baseline its p99 and
        // worst wait while pgmend runs are compared with.
        let baseline = if load {
            app_alone(pg.conninfo("viapgmend"), members)
        } else {
            (0, 0.0, 0.0)
        };
        if load && std::env::var_os("PGMEND_BENCH_BESIDE").is_some() {
            for (what, (ops, p99, worst)) in app_beside_work(pg.conninfo("viapgmend"), members)? {
                println!(
                    "| {members} | app beside {what} | {ops} ops, p99 {p99:.1} ms ({:.1}x the baseline's {:.1} ms), max {worst:.0} ms |",
                    p99 / baseline.1.max(1e-3),
                    baseline.1
                );
            }
        }
        if !load {
            // The example's own sessions on pgmend's database (`via`) finished a statement a
            // moment ago: a second idle, so that pgmend does not count them as the application
            // at work (`db::crowding`: done with a statement less than a second ago).
            std::thread::sleep(Duration::from_millis(1100));
        }
        let (stop, load_threads) = start_legacy_load(load, pg.conninfo("viapgmend"), members);
        SLOW.lock().unwrap().clear();
        let t = Instant::now();
        // PGMEND_BENCH_SLOW=1 under load: what the application's statements wait on.
        let waits = (load && std::env::var("PGMEND_BENCH_SLOW").is_ok())
            .then(|| sample_waits(pg.conninfo("viapgmend"), stop.clone()));
        // Under load the legacy application runs, so pgmend goes up to the deploy gate only.
        let args: &[&str] = if load {
            &["apply", "--yes", "--format", "json"]
        } else {
            &[
                "apply",
                "--yes",
                "--confirm",
                "deploy-new-application",
                "--format",
                "json",
            ]
        };
        // PGMEND_BENCH_JOBS=N: pgmend's batch workers (`--jobs N`; default 1).
        let jobs = std::env::var("PGMEND_BENCH_JOBS").unwrap_or_else(|_| "1".into());
        // PGMEND_BENCH_ARGS: more options for pgmend apply, split at blanks (`--duty-cycle 50`).
        let extra = std::env::var("PGMEND_BENCH_ARGS").unwrap_or_default();
        let mut child = Command::new(&exe)
            .args(args)
            .args(["--jobs", &jobs])
            .args(extra.split_whitespace())
            .env("DATABASE_URL", &url)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(format!(
                "/tmp/bench-pgmend-{members}.log"
            ))?)
            .spawn()?;
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || std::io::read_to_string(stdout));
        let peak_kb = support::wait_with_peak_rss(&mut child)?;
        let via_time = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let via_load = percentiles(
            load_threads
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect(),
        );
        let out = reader.join().unwrap()?;
        if load {
            // Batches an application session waited for (the throttle's count), over every run.
            let blocking: u64 = serde_json::from_str::<serde_json::Value>(&out)
                .ok()
                .and_then(|doc| {
                    doc["steps"].as_array().map(|steps| {
                        steps
                            .iter()
                            .filter_map(|s| s["run"]["batches_blocking"].as_u64())
                            .sum()
                    })
                })
                .unwrap_or(0);
            // The application alone again on the schema pgmend left at the gate (V3's index
            // and V4's unique index to maintain): what its operations cost without pgmend.
            let after = app_alone(pg.conninfo("viapgmend"), members);
            println!(
                "| {members} under load | app alone 5 s: {} ops, p99 {:.1} ms, max {:.0} ms | one-shot {:.1}s: {} app ops, p99 {:.0} ms, max {:.0} ms | pgmend to the gate {:.1}s: {} app ops, p99 {:.1} ms ({:.1}x the baseline's), max {:.0} ms, {blocking} batches waited for | app alone after, 5 s: {} ops, p99 {:.1} ms, max {:.0} ms |",
                baseline.0, baseline.1, baseline.2,
                one_time.as_secs_f64(), one_load.0, one_load.1, one_load.2, via_time.as_secs_f64(), via_load.0, via_load.1,
                via_load.1 / baseline.1.max(1e-3), via_load.2, after.0, after.1, after.2
            );
            // PGMEND_BENCH_SLOW=1: the operations over 2 ms, by half second of pgmend's run.
            if std::env::var("PGMEND_BENCH_SLOW").is_ok() {
                let mut buckets = std::collections::BTreeMap::<u64, (u32, u32, f64)>::new();
                for (at, took, issue) in SLOW.lock().unwrap().iter() {
                    let Some(since) = at.checked_duration_since(t) else {
                        continue;
                    };
                    let b = buckets.entry(since.as_millis() as u64 / 500).or_default();
                    if *issue {
                        b.0 += 1
                    } else {
                        b.1 += 1
                    }
                    b.2 = b.2.max(took.as_secs_f64() * 1000.0);
                }
                for (b, (issues, redeems, worst)) in buckets {
                    eprintln!("slow ops at {:>5.1}s: {issues} issues, {redeems} redeems, worst {worst:.1} ms", b as f64 / 2.0);
                }
                // Each wait seen (an application statement active over 100 ms), by half second.
                let mut seen = std::collections::BTreeMap::<(u64, String), u32>::new();
                for (at, what) in waits.map(|h| h.join().unwrap()).unwrap_or_default() {
                    if let Some(since) = at.checked_duration_since(t) {
                        *seen
                            .entry((since.as_millis() as u64 / 500, what))
                            .or_default() += 1;
                    }
                }
                for ((b, what), n) in seen {
                    eprintln!("waits at {:>5.1}s: {n} x {what}", b as f64 / 2.0);
                }
            }
            continue;
        }
        let via_wal = support::wal_lsn(&mut via)? - wal0;
        anyhow::ensure!(
            backends_gone()?,
            "pgmend's backends did not exit within 30 s of pgmend"
        );
        let stats1_via = support::wal_stats(&mut admin)?;
        let via_ckpts = support::checkpoints(&mut admin)? - ckpt0;
        let (one_fpi, one_stat_bytes) = (stats1.0 - stats0.0, stats1.1 - stats0.1);
        let (via_fpi, via_stat_bytes) = (stats1_via.0 - stats0_via.0, stats1_via.1 - stats0_via.1);
        eprintln!(
            "{members}: pg_stat_wal: one-shot {one_fpi} full-page images, {one_stat_bytes} bytes (LSN: {one_wal}); pgmend {via_fpi}, {via_stat_bytes} bytes (LSN: {via_wal})"
        );
        for (side, tables) in [
            ("the one-shot", one_autovacuums),
            ("pgmend", support::autovacuums(&mut via)?),
        ] {
            if !tables.is_empty() {
                after_table.push(format!(
                    "{members} members: autovacuum ran during or right after {side}'s run (it shares the cores): {}",
                    tables.join(", ")
                ));
            }
        }
        for (side, n) in [("the one-shot", one_ckpts), ("pgmend", via_ckpts)] {
            if n > 0 {
                after_table.push(format!(
                    "{members} members: {n} checkpoint(s) began during {side}'s run: its WAL and FPI include the full-page images that follow"
                ));
            }
        }
        if wal_kinds {
            wal_breakdown(&mut via, "pgmend", &lsn0_via)?;
        }
        let via_state = state(&mut via)?;
        let rows = compare_end_states(&mut one, &mut via);
        anyhow::ensure!(
            one_state == via_state,
            "end states differ:\n one-shot: {one_state}\n pgmend:   {via_state}{}",
            rows.err().map(|e| format!("\n{e}")).unwrap_or_default()
        );
        let rows = rows?;
        let doc: serde_json::Value = serde_json::from_str(&out).context("pgmend's JSON")?;
        let runs: Vec<&serde_json::Value> = doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s.get("run"))
            .collect();
        let changed: i64 = runs
            .iter()
            .map(|r| r["run"]["changed"].as_i64().unwrap_or(0))
            .sum();
        let void_changed = runs
            .first()
            .map(|r| r["run"]["changed"].as_i64().unwrap_or(0))
            .unwrap_or(0);
        let batches = support::batch_times(runs.iter().copied());
        println!(
            "| {members} | {coupons} | {void_changed} | {:.1}s | {:.1}s | {:.2}x | {:.0} | {} | {:.1} MB | {:.1} MB | {:.1} MB | {one_fpi} | {via_fpi} |",
            one_time.as_secs_f64(),
            via_time.as_secs_f64(),
            one_time.as_secs_f64() / via_time.as_secs_f64(),
            changed as f64 / via_time.as_secs_f64(),
            batches.join("; "),
            peak_kb as f64 / 1024.0,
            one_wal as f64 / 1e6,
            via_wal as f64 / 1e6,
        );
        eprintln!("end state (both): {via_state}");
        eprintln!("row for row, equal: {rows}");
        let log = std::fs::read_to_string(format!("/tmp/bench-pgmend-{members}.log"))?;
        after_table.push(format!(
            "{members} members, pgmend's steps: {}",
            step_times(&log, &doc).join("; ")
        ));
        // PGMEND_BENCH_JOBS_TOO=N: the release again on a third copy with `--jobs N`, its end
        // state and its ledger compared with the first pgmend run's (issue 19).
        if let Ok(too) = std::env::var("PGMEND_BENCH_JOBS_TOO") {
            drop(via);
            let (time, compared) = jobs_too(&pg, &exe, args, &too, members)?;
            println!(
                "| {members} | --jobs {too} | {:.1}s | {:.2}x | {compared} |",
                time.as_secs_f64(),
                one_time.as_secs_f64() / time.as_secs_f64()
            );
            continue;
        }
        if profile {
            for r in via.query(
                "SELECT round(total_exec_time)::bigint, calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
                   FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                  ORDER BY total_exec_time DESC LIMIT 25",
                &[],
            )? {
                eprintln!("{:>7} ms {:>6} calls  {}", r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, String>(2));
            }
        }
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
            "/tmp/pgmend-bench-explain.log",
        )?;
    }
    Ok(())
}
