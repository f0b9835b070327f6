//! `--jobs N`: several batch workers for one run. The same end state and the same ledger
//! records as one worker, an undo that restores what they changed, a run stopped with three
//! workers resumed with two, and a refusal before any change when the server's connection
//! slots cannot serve the workers.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{copy_of, fresh_db, snapshot, TestDb};

/// Each coupon's mark and voidedness by id, and every member-month counter.
fn end_state(db: &TestDb) -> (String, String) {
    let mut c = db.client();
    let row = c
        .query_one(
            "SELECT (SELECT md5(string_agg(coupon_id::text || legacy_duplicate::text || (voided_at IS NULL)::text, ',' ORDER BY coupon_id))
                       FROM issued_coupons),
                    (SELECT md5(coalesce(string_agg(member_id || month::text || used_yen::text, ',' ORDER BY member_id, month), ''))
                       FROM member_monthly_usage)",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// The ledger as a multiset of records (key, action, before, after, reason), with the time a
/// coupon was voided replaced by whether it was.
fn ledger(db: &TestDb) -> (i64, String) {
    let row = db
        .client()
        .query_one(
            "SELECT count(*), md5(coalesce(string_agg(x, '|' ORDER BY x), '')) FROM (
               SELECT concat_ws(' ', target_table, row_key::text, action, before::text,
                                (after - 'voided_at')::text, (after ->> 'voided_at') IS NULL, reason) AS x
                 FROM pgmend.ledger_records) l",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// How many workers committed a batch of run `run_id`.
fn workers_that_committed(db: &TestDb, run_id: i64) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(DISTINCT worker) FROM pgmend.run_slices WHERE run_id = {run_id} AND worker IS NOT NULL"
    ))
}

/// A database at V3 with the incident's data, the source of the copies.
fn source() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    db
}

fn repairs(db: &TestDb, extra: &[&str]) {
    for name in ["void-duplicate-coupons", "rebuild-member-monthly-usage"] {
        let mut args = vec!["repair", "apply", name, "--yes", "--batch-target", "5ms"];
        args.extend_from_slice(extra);
        let r = db.run(&args);
        assert_eq!(r.code, 0, "{name} {extra:?}: {}", r.both());
    }
}

/// A void run with `jobs` workers, started in the background and returned once `slices` of its
/// slices have committed a batch, with a client to watch it.
fn void_run_under_way(
    db: &TestDb,
    jobs: &str,
    slices: i64,
) -> (std::process::Child, postgres::Client) {
    let child = db
        .pgmend()
        .args([
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--batch-target",
            "1ms",
            "--jobs",
            jobs,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut watch = db.client();
    while watch
        .query_one(
            "SELECT coalesce((SELECT count(*) FROM pgmend.run_slices WHERE checkpoint > lo), 0)",
            &[],
        )
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0)
        < slices
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no batch committed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    (child, watch)
}

#[test]
fn four_workers_end_as_one_does_row_for_row_and_ledger_for_ledger_and_undo_restores_it() {
    let src = source();
    let one = copy_of(&src);
    let four = copy_of(&src);
    let coupons_before = end_state(&four).0;
    repairs(&one, &[]);
    repairs(&four, &["--jobs", "4"]);
    assert_eq!(end_state(&one), end_state(&four));
    let (records, digest) = ledger(&one);
    assert!(
        records > 1000,
        "the runs changed rows: {records} ledger records"
    );
    assert_eq!((records, digest), ledger(&four));
    // The one-worker runs have no slices; the four-worker ones were walked by several workers,
    // and ended with every target done.
    assert_eq!(one.scalar_i64("SELECT count(*) FROM pgmend.run_slices"), 0);
    for run in [1, 2] {
        assert!(workers_that_committed(&four, run) > 1, "run {run}");
    }
    assert_eq!(
        four.scalar_i64(
            "SELECT count(*) FROM pgmend.repair_runs WHERE state <> 'finished' OR checkpoint <> targets"
        ),
        0
    );
    // Undo of the void run made with four workers puts back every coupon as it was.
    let r = four.run(&["repair", "undo", "1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(end_state(&four).0, coupons_before);
}

#[test]
fn a_run_stopped_with_three_workers_resumes_with_two_and_ends_as_one_worker_does() {
    let src = source();
    let reference = copy_of(&src);
    let db = copy_of(&src);
    repairs(&reference, &[]);
    let (child, _watch) = void_run_under_way(&db, "3", 2);
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let left = db
        .scalar_i64("SELECT count(*) FROM pgmend.run_slices WHERE run_id = 1 AND checkpoint < hi");
    assert!(left > 0, "the run stopped before its end: {stderr}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'running'"),
        1
    );
    // repair status shows each slice's checkpoint and worker, in both formats.
    let status = db.run(&["repair", "status"]);
    assert!(
        status.stdout.contains("run 1 slice 1: targets 0..") && status.stdout.contains("(worker "),
        "{}",
        status.stdout
    );
    let json: serde_json::Value =
        serde_json::from_str(&db.run(&["repair", "status", "--format", "json"]).stdout).unwrap();
    let slices = json[0]["slices"].as_array().expect("the run's slices");
    assert!(slices.len() >= 3, "{json}");
    assert!(slices
        .iter()
        .any(|s| s["checkpoint"].as_i64() > s["lo"].as_i64()));
    // Resumed with two workers, from the slices' checkpoints.
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--batch-target",
        "5ms",
        "--jobs",
        "2",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.contains("resuming run 1"), "{}", r.stderr);
    let r = db.run(&["repair", "apply", "rebuild-member-monthly-usage", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(end_state(&reference), end_state(&db));
    assert_eq!(ledger(&reference), ledger(&db));
}

#[test]
fn jobs_that_the_connection_limit_cannot_serve_are_refused_before_any_change_and_plan_says_so() {
    let db = source();
    db.client()
        .batch_execute(&format!("ALTER DATABASE {} CONNECTION LIMIT 5", db.name))
        .unwrap();
    let before = snapshot(&db);
    // The plan says so first: a blocker, exit 2; with two workers, how many connections.
    let r = db.run(&["plan", "--jobs", "4"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.both()
            .contains("apply would be refused: --jobs 4 needs 7 connections"),
        "{}",
        r.both()
    );
    let r = db.run(&["plan", "--jobs", "2"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("--jobs 2: 5 connections"), "{}", r.stdout);
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--jobs",
        "4",
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("--jobs 4 needs 7 connections")
            && r.stderr.contains("CONNECTION LIMIT 5"),
        "{}",
        r.stderr
    );
    assert_eq!(snapshot(&db), before);
    // Two workers fit: 5 connections in all (the lease among them).
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--jobs",
        "2",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
}

#[test]
fn the_workers_stop_when_the_session_holding_the_runner_lock_is_gone() {
    let src = source();
    let reference = copy_of(&src);
    let db = copy_of(&src);
    repairs(&reference, &[]);
    let (child, mut watch) = void_run_under_way(&db, "2", 1);
    // The main session is the backend that holds the runner lock in this database (pg_locks
    // shows the whole cluster's, and the other tests' run beside this one).
    let terminated: bool = watch
        .query_one(
            "SELECT pg_terminate_backend(pid) FROM pg_locks
              WHERE locktype = 'advisory' AND granted AND objid = 1835363940 AND classid = 28775
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(terminated);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("runner lock") && stderr.contains("is gone"),
        "{stderr}"
    );
    assert!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.run_slices WHERE run_id = 1 AND checkpoint < hi"
        ) > 0,
        "the workers stopped before the end"
    );
    // Rerun: the run resumes from its slices and ends as one worker's does.
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let r = db.run(&["repair", "apply", "rebuild-member-monthly-usage", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(end_state(&reference), end_state(&db));
    assert_eq!(ledger(&reference), ledger(&db));
}

/// On a table the statistics call large, a run in ranges cuts its ranges on a 10% sample of
/// the column (`store::runs::RangeSample`): the cuts then fall anywhere, far apart or close
/// together, and the ranges still cover every value. Here the statistics are told that the
/// 11,000 coupons are 1,000,000, so the sample is small and the cuts uneven: the void and the
/// member-months end in the same state, with the same ledger, as runs that read every row,
/// with one worker and with three.
#[test]
fn ranges_cut_on_a_sample_cover_every_value() {
    let source = source();
    let full = copy_of(&source);
    repairs(&full, &[]);
    for jobs in ["1", "3"] {
        let db = copy_of(&source);
        db.client()
            .batch_execute(
                "UPDATE pg_class SET reltuples = 1000000 WHERE oid = 'issued_coupons'::regclass",
            )
            .unwrap();
        let mut logs = String::new();
        for name in ["void-duplicate-coupons", "rebuild-member-monthly-usage"] {
            let r = db.run(&[
                "repair",
                "apply",
                name,
                "--yes",
                "--batch-target",
                "5ms",
                "--jobs",
                jobs,
            ]);
            assert_eq!(r.code, 0, "{name} --jobs {jobs}: {}", r.both());
            logs.push_str(&r.stderr);
        }
        assert_eq!(
            logs.matches("rows of issued_coupons each (cut on a 10% sample)")
                .count(),
            2,
            "{logs}"
        );
        assert_eq!(end_state(&db), end_state(&full), "--jobs {jobs}: {logs}");
        assert_eq!(ledger(&db), ledger(&full), "--jobs {jobs}");
        assert_eq!(
            db.scalar_i64(
                "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                        GROUP BY campaign_id, member_id HAVING count(*) > 1) d"
            ),
            0
        );
    }
}

#[test]
fn the_default_jobs_auto_ends_as_one_worker_does_and_says_what_it_may_use() {
    let src = source();
    let one = copy_of(&src);
    let auto = copy_of(&src);
    repairs(&one, &[]);
    // The default, as a user gets it: the harness's PGMEND_JOBS=1 taken away.
    for name in ["void-duplicate-coupons", "rebuild-member-monthly-usage"] {
        let r = common::run(
            auto.pgmend().env_remove("PGMEND_JOBS").args([
                "repair",
                "apply",
                name,
                "--yes",
                "--batch-target",
                "5ms",
                "--max-jobs",
                "3",
            ]),
            &auto.password(),
        );
        assert_eq!(r.code, 0, "{name}: {}", r.both());
        assert!(
            r.stderr.contains("--jobs auto: up to 3 batch workers")
                && r.stderr.contains("(--jobs auto: between 1 and 3)"),
            "{name}: {}",
            r.stderr
        );
    }
    assert_eq!(end_state(&one), end_state(&auto));
    assert_eq!(ledger(&one), ledger(&auto));
    for run in [1, 2] {
        assert!(workers_that_committed(&auto, run) > 1, "run {run}");
    }
    // plan --jobs (auto) says how many workers apply's default may use here.
    let r = auto.run(&["plan", "--jobs", "--max-jobs", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.both().contains("--jobs auto: up to 3 batch workers"),
        "{}",
        r.both()
    );
}

#[test]
fn after_the_gate_with_workers_the_freeze_compares_in_ranges_and_freezes_exactly_the_keys_that_differ(
) {
    let db = fresh_db();
    // Over 10,000 coupons, the size from which the freeze is split.
    db.make_legacy_baselined(5000);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // Drift all over the key set: every seventh member-month one coupon off, a row whose member
    // has no coupon, a member-month without its row; the keys that differ, by the release's rule.
    db.client()
        .batch_execute(
            "UPDATE member_monthly_usage SET used_yen = used_yen + 1000
              WHERE (hashtext(member_id || month::text) % 7) = 0;
             INSERT INTO member_monthly_usage SELECT 'zz-nobody', month, 500 FROM member_monthly_usage LIMIT 1;
             DELETE FROM member_monthly_usage WHERE (member_id, month) = (SELECT member_id, month FROM member_monthly_usage WHERE used_yen > 0 ORDER BY member_id DESC, month LIMIT 1 OFFSET 3);
             CREATE TABLE expected_keys AS
               SELECT ARRAY[k.member_id::text, k.month::text] AS key, k.member_id, k.month
                 FROM (SELECT member_id, month, sum(amount_yen) FILTER (WHERE voided_at IS NULL) AS truth
                         FROM issued_coupons GROUP BY 1, 2) t
                 FULL JOIN member_monthly_usage u USING (member_id, month)
                 CROSS JOIN LATERAL (SELECT coalesce(t.member_id, u.member_id) AS member_id, coalesce(t.month, u.month) AS month) k
                WHERE u.used_yen IS DISTINCT FROM coalesce(t.truth, 0);
             ANALYZE issued_coupons;",
        )
        .unwrap();
    let expected = db.scalar_i64("SELECT count(*) FROM expected_keys");
    assert!(expected > 100, "{expected}");

    let r = db.run(&[
        "repair",
        "apply",
        "rebuild-member-monthly-usage",
        "--yes",
        "--jobs",
        "3",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains("(compared in 3 ranges on as many sessions, "),
        "{}",
        r.stderr
    );
    let run_id = db.scalar_i64(
        "SELECT max(run_id) FROM pgmend.repair_runs WHERE repair = 'rebuild-member-monthly-usage'",
    );
    // Frozen: exactly those keys, numbered 1..n in key order.
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.repair_targets WHERE run_id = {run_id}"
        )),
        expected
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM (SELECT t.seq, e.key AS expected, t.key AS frozen
                 FROM (SELECT key, row_number() OVER (ORDER BY member_id, month) AS seq FROM expected_keys) e
                 FULL JOIN (SELECT seq, key FROM pgmend.repair_targets WHERE run_id = {run_id}) t USING (seq)
                WHERE e.key IS DISTINCT FROM t.key) d"
        )),
        0,
        "the frozen keys, in order, are the keys that differ"
    );
    // Corrected: every counter equals its coupons, and one record per key changed.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM member_monthly_usage u
              WHERE used_yen <> (SELECT coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0)
                                   FROM issued_coupons i WHERE i.member_id = u.member_id AND i.month = u.month)"
        ),
        0
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT member_id, month FROM issued_coupons EXCEPT SELECT member_id, month FROM member_monthly_usage) m"
        ),
        0
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(DISTINCT row_key) FROM pgmend.ledger_records WHERE run_id = {run_id}"
        )),
        expected
    );
    assert_eq!(db.run(&["verify"]).code, 0);
}
