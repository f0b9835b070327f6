//! Health signals under `--jobs auto` that need a cluster of their own (issue 36): a standby
//! whose replay is paused (`pg_wal_replay_pause()`) and an autovacuum kept busy on the repaired
//! table (a cost limit of 1 per page). Each run starts with two workers, loses one at the
//! controller's first window, pauses the last, goes on once the signal is gone and ends with
//! every coupon as the release's rule says, computed in SQL beside pgmend.
//!
//! Slow by design (each waits for a signal and a pause): skipped where `.ci/run` skips the slow
//! fault tests.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pgmend::localpg::LocalPg;

fn pgmend(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pgmend"));
    for var in pgmend::db::conninfo::environment_variables() {
        c.env_remove(var);
    }
    c.args(args).env("DATABASE_URL", url).stdin(Stdio::null());
    c
}

/// The incident's data at V3 on `pg`'s `postgres` database, and the void's expected end state
/// (from the release's rule, not pgmend's SQL) in `expected_coupons`.
fn at_v3(pg: &LocalPg) -> postgres::Client {
    let url = pg.url("postgres");
    let mut c = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls).unwrap();
    let v1 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/V1__legacy_baseline.sql"
    ))
    .unwrap();
    c.batch_execute(&v1).unwrap();
    pgmend::demo_data::generate_dirty_data(&mut c, 2000).unwrap();
    for args in [
        &["migrate", "baseline", "--yes"][..],
        &["migrate", "apply", "--yes", "--target", "3"],
    ] {
        let out = pgmend(&url, args).env("PGMEND_JOBS", "1").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    c.batch_execute(
        "CREATE TABLE expected_coupons AS
           SELECT coupon_id, rn > 1 AS dup, rn > 1 AND redeemed_at IS NULL AS voided
             FROM (SELECT coupon_id, redeemed_at, row_number() OVER (PARTITION BY campaign_id, member_id
                           ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn FROM issued_coupons) x",
    )
    .unwrap();
    c
}

fn scalar(c: &mut postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

fn marked(c: &mut postgres::Client) -> i64 {
    scalar(
        c,
        "SELECT count(*) FROM issued_coupons WHERE legacy_duplicate OR voided_at IS NOT NULL",
    )
}

fn differences(c: &mut postgres::Client) -> i64 {
    scalar(
        c,
        "SELECT count(*) FROM expected_coupons e JOIN issued_coupons i USING (coupon_id)
          WHERE (e.dup, e.voided) IS DISTINCT FROM (i.legacy_duplicate, i.voided_at IS NOT NULL)",
    )
}

/// The void with `--jobs auto` (the default: `PGMEND_JOBS` unset), three workers at most and a
/// pause after each batch, so that the run outlasts the controller's first window (2 s); its
/// stderr read as it comes.
struct Watched {
    child: Child,
    stderr: Arc<Mutex<String>>,
    reader: thread::JoinHandle<()>,
}

fn void_with_auto(url: &str, extra: &[&str]) -> Watched {
    let mut args = vec![
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--max-jobs",
        "3",
        "--pause",
        "500ms",
        // Two workers to start with: watched, the CPU would count the test's own session,
        // busy a moment before, as the application at work and start the run with one.
        "--max-cpu-slowdown",
        "off",
    ];
    args.extend_from_slice(extra);
    let mut child = pgmend(url, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let lines = BufReader::new(child.stderr.take().unwrap());
    let kept = stderr.clone();
    let reader = thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            let mut all = kept.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
        }
    });
    Watched {
        child,
        stderr,
        reader,
    }
}

/// Waits until the controller has taken a worker away and the last one pauses (its line),
/// then checks that no batch commits for two seconds.
fn nothing_commits_while_paused(c: &mut postgres::Client, run: &Watched) {
    let started = Instant::now();
    while !run.stderr.lock().unwrap().contains("pausing: ") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never paused: {}",
            run.stderr.lock().unwrap()
        );
        thread::sleep(Duration::from_millis(100));
    }
    // A batch the removed worker had under way commits before it stops.
    thread::sleep(Duration::from_secs(1));
    let during = marked(c);
    assert!(
        during < scalar(c, "SELECT count(*) FROM expected_coupons WHERE dup"),
        "the run finished before the signal could pause it"
    );
    thread::sleep(Duration::from_secs(2));
    assert_eq!(
        marked(c),
        during,
        "no batch commits while the last worker pauses"
    );
}

fn finished(run: Watched) -> String {
    let Watched {
        mut child,
        stderr,
        reader,
    } = run;
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let stderr = stderr.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "{stderr}");
    stderr
}

#[test]
fn with_jobs_auto_a_lagging_standby_removes_workers_then_pauses_the_last_and_the_run_ends_exact() {
    if common::slow_tests_skipped(
        "with_jobs_auto_a_lagging_standby_removes_workers_then_pauses_the_last_and_the_run_ends_exact",
    ) {
        return;
    }
    let primary = LocalPg::start(false).unwrap();
    let url = primary.url("postgres");
    let mut c = at_v3(&primary);
    let standby = primary.start_standby().unwrap();
    let mut s = postgres::Client::connect(&standby.conninfo("postgres"), postgres::NoTls).unwrap();
    s.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
    for _ in 0..3 {
        c.batch_execute("CREATE TABLE IF NOT EXISTS filler (x int); INSERT INTO filler SELECT generate_series(1, 10000)").unwrap();
        thread::sleep(Duration::from_millis(700));
    }

    let run = void_with_auto(&url, &["--max-replica-lag", "1s"]);
    nothing_commits_while_paused(&mut c, &run);
    s.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
    let stderr = finished(run);
    assert!(
        stderr.contains("void-duplicate-coupons: workers 2 -> 1: a replica is"),
        "{stderr}"
    );
    assert!(stderr.contains("pausing: a replica is"), "{stderr}");
    assert!(stderr.contains("resuming after a pause of"), "{stderr}");
    assert_eq!(differences(&mut c), 0, "{stderr}");
}

#[test]
fn with_jobs_auto_a_busy_autovacuum_on_the_table_removes_workers_then_pauses_and_the_run_ends_exact(
) {
    if common::slow_tests_skipped(
        "with_jobs_auto_a_busy_autovacuum_on_the_table_removes_workers_then_pauses_and_the_run_ends_exact",
    ) {
        return;
    }
    let pg = LocalPg::start_with(false, &[], &[("autovacuum_naptime", "1")]).unwrap();
    let url = pg.url("postgres");
    let mut c = at_v3(&pg);
    // Autovacuum on issued_coupons at one page per 100 ms: dead rows made by rewriting an eighth of
    // the table (no value changes), any dead row enough to start it.
    c.batch_execute(
        "ALTER TABLE issued_coupons SET (autovacuum_vacuum_threshold = 0,
             autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_cost_delay = 100,
             autovacuum_vacuum_cost_limit = 1, autovacuum_enabled = true);
         UPDATE issued_coupons SET issued_at = issued_at WHERE right(coupon_id::text, 1) IN ('0', '1')",
    )
    .unwrap();
    let busy = "SELECT count(*) FROM pg_stat_progress_vacuum p JOIN pg_stat_activity a USING (pid)
                 WHERE a.backend_type = 'autovacuum worker' AND p.relid = 'issued_coupons'::regclass";
    let started = Instant::now();
    while scalar(&mut c, busy) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "autovacuum never started on issued_coupons"
        );
        thread::sleep(Duration::from_millis(100));
    }

    let run = void_with_auto(&url, &["--autovacuum-pause", "any"]);
    nothing_commits_while_paused(&mut c, &run);
    // Autovacuum gives way to the lock this needs (after deadlock_timeout) and cannot start on
    // the table again.
    c.batch_execute("ALTER TABLE issued_coupons SET (autovacuum_enabled = false)")
        .unwrap();
    let stderr = finished(run);
    assert!(
        stderr.contains(
            "void-duplicate-coupons: workers 2 -> 1: an autovacuum works on issued_coupons"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("pausing: an autovacuum works on issued_coupons"),
        "{stderr}"
    );
    assert!(stderr.contains("resuming after a pause of"), "{stderr}");
    assert_eq!(differences(&mut c), 0, "{stderr}");
}
