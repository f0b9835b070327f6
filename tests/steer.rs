//! Steering a running run from another session (`repair pause`, `resume`, `throttle`): the
//! workers stop between batches with no transaction open and no lock on the repaired table,
//! the pause outlives a SIGTERM of the running pgmend, and the resumed release ends exactly as
//! an uninterrupted one.

mod common;

#[path = "common/held.rs"]
mod held;
#[allow(dead_code)]
#[path = "../examples/kill_campaign.rs"]
mod kill_campaign;

use std::thread;
use std::time::Duration;

use common::*;
use held::*;
use kill_campaign::{end_state, CONFIRM};

fn ledger(db: &TestDb) -> i64 {
    db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records")
}

/// pgmend's sessions that hold a lock on the coupons or are inside a transaction.
fn pgmend_in_transaction_or_locking(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM pg_stat_activity a
          WHERE a.datname = current_database() AND a.application_name = 'pgmend'
            AND (a.state LIKE 'idle in transaction%'
                 OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid
                              AND l.relation = 'issued_coupons'::regclass))",
    )
}

#[test]
fn a_paused_run_with_two_workers_commits_nothing_outlives_sigterm_and_ends_exact_once_resumed() {
    let source = fresh_db();
    source.make_legacy_baselined(3000);
    let expected = reference(&source);
    let db = copy_of(&source);
    // Up to V3: the void then walks ranges of its index, which two workers share.
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let child = spawn(
        &exe(),
        &db.conninfo(),
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--jobs",
            "2",
            "--batch-target",
            "20ms",
            "--pause",
            "300ms",
        ],
    );
    let run_id = poll("the void's first batches", Duration::from_secs(60), || {
        (db.scalar_i64("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgmend'") > 0
            && db.scalar_i64("SELECT count(*) FROM pgmend.run_slices") > 0
            && ledger(&db) > 0)
            .then(|| db.scalar_i64("SELECT max(run_id) FROM pgmend.repair_runs"))
    });
    let run = run_id.to_string();

    // A throttle and a pause, recorded without --yes while the runner lock is held.
    let t = db.run(&["repair", "throttle", &run, "--duty-cycle", "50"]);
    assert_eq!(t.code, 0, "{}", t.both());
    let p = db.run(&["repair", "pause", &run]);
    assert_eq!(p.code, 0, "{}", p.both());
    assert!(p.stdout.contains("is paused"), "{}", p.stdout);
    // The batches in flight commit; then nothing commits, and no pgmend session holds a
    // transaction or a lock on the coupons.
    thread::sleep(Duration::from_millis(1500));
    let paused_at = ledger(&db);
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(500));
        assert_eq!(ledger(&db), paused_at, "a batch committed while paused");
        assert_eq!(pgmend_in_transaction_or_locking(&db), 0);
    }
    let s = db.run(&["repair", "status"]);
    assert!(s.stdout.contains("PAUSED by"), "{}", s.stdout);
    let s = db.run(&["repair", "status", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&s.stdout).unwrap();
    let steering = &runs[0]["steering"];
    assert!(steering["paused"].is_array(), "{steering}");
    assert_eq!(steering["duty_cycle"], 50, "{steering}");
    // The run a live pgmend walks cannot be abandoned from here.
    let a = db.run(&["repair", "abandon", &run, "--yes"]);
    assert_ne!(a.code, 0, "{}", a.both());
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.repair_runs WHERE run_id = {run_id} AND state = 'running'"
        )),
        1
    );

    // SIGTERM while paused: it stops cleanly (exit 1); the pause outlives it.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let r = finish(child, Duration::from_secs(60), "the paused repair");
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stderr.contains("paused by"), "{}", r.stderr);
    assert_eq!(ledger(&db), paused_at);
    let before = snapshot(&db);
    let again = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(again.code, 1, "{}", again.both());
    assert!(
        again
            .stderr
            .contains(&format!("pgmend repair resume {run_id}")),
        "{}",
        again.stderr
    );
    assert_eq!(
        snapshot(&db),
        before,
        "a paused run's rerun changes nothing"
    );
    let release = db.run(&CONFIRM);
    assert_eq!(release.code, 1, "{}", release.both());
    assert!(release.stderr.contains("is paused"), "{}", release.stderr);
    assert_eq!(ledger(&db), paused_at);

    // Resumed: the release ends exactly where an uninterrupted one does.
    let r = db.run(&["repair", "resume", &run]);
    assert_eq!(r.code, 0, "{}", r.both());
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
}

#[test]
fn steering_a_run_that_is_not_running_or_a_throttle_without_options_is_refused() {
    let db = fresh_db();
    db.make_legacy_baselined(100);
    let r = db.run(&["repair", "pause", "1"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("there is no repair run 1"),
        "{}",
        r.stderr
    );
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    let r = db.run(&["repair", "pause", "1"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("only a running run can be paused"),
        "{}",
        r.stderr
    );
    let r = db.run(&["repair", "throttle", "1"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("--pause DURATION, --duty-cycle PERCENT"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE paused_at IS NOT NULL OR throttle_duty_cycle IS NOT NULL"),
        0
    );
}
