//! Bounded lock waits: while another session holds a transaction on issued_coupons, apply
//! waits in short, bounded attempts, and the application's queries keep answering.

mod common;

use std::time::Duration;

use common::*;

const HOLD: &str = "SELECT count(*) FROM issued_coupons";
const PROBE: &str = "SELECT count(*) FROM issued_coupons";

fn legacy_baselined() -> TestDb {
    let db = fresh_db();
    db.make_legacy();
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    db
}

/// `migrate apply --target 2` (V2's ALTER TABLEs) with 500 ms lock waits retried for
/// `retry_for`, while a transaction that has read issued_coupons stays open for 10 s.
fn v2_while_held_for_10s(db: &TestDb, retry_for: &str) -> (Run, Duration, Duration) {
    let args = [
        "migrate",
        "apply",
        "--yes",
        "--target",
        "2",
        "--lock-timeout",
        "500ms",
        "--lock-retry-for",
        retry_for,
    ];
    run_while_held(db, HOLD, Duration::from_secs(10), PROBE, &args)
}

#[test]
fn apply_waits_for_the_blocking_transaction_to_end_and_the_application_keeps_answering() {
    let db = legacy_baselined();
    let (run, took, longest) = v2_while_held_for_10s(&db, "60s");
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        took >= Duration::from_secs(8),
        "apply cannot finish before the holder commits: {took:?}"
    );
    assert!(
        run.stderr.contains("applying V2__expand_for_repair: waiting for pid")
            && run.stderr.contains("transaction open")
            && run.stderr.contains("SELECT count(*) FROM issued_coupons) to end before asking for ACCESS EXCLUSIVE on issued_coupons"),
        "the wait is said, with its holder: {}",
        run.stderr
    );
    // V2 asks for its lock only once the holder is gone, so the application's queries never
    // queue behind the request (they did for up to --lock-timeout, 500 ms, an attempt).
    assert!(
        longest < Duration::from_millis(400),
        "probe waited {longest:?}"
    );
    assert!(db.exists("campaign_budgets"));
    assert_eq!(db.history().len(), 2);
}

#[test]
fn apply_stops_with_exit_1_when_the_retry_budget_is_shorter_than_the_blocker() {
    let db = legacy_baselined();
    let (run, took, longest) = v2_while_held_for_10s(&db, "3s");
    assert_eq!(run.code, 1, "{}", run.both());
    assert!(
        took < Duration::from_secs(9),
        "gave up within its budget: {took:?}"
    );
    assert!(run.stderr.contains("--lock-retry-for 3s"), "{}", run.stderr);
    assert!(
        run.stderr.contains("SELECT count(*) FROM issued_coupons"),
        "names the blocker: {}",
        run.stderr
    );
    assert!(longest < Duration::from_secs(2), "probe waited {longest:?}");
    assert!(!db.exists("campaign_budgets"), "nothing of V2 was applied");
    assert_eq!(db.history().len(), 1);
}
