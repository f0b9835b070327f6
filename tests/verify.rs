//! `pgmend verify` as the daily reconciliation: 0 when the invariants hold, 1 naming what
//! broke, 0 again after the repair that fixes it.

mod common;

use common::*;

fn released() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(600);
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 1, "a legacy database does not verify: {}", r.both());
    assert!(r.stdout.contains("legacy state"), "{}", r.stdout);
    assert_eq!(
        db.run(&["apply", "--yes", "--confirm", "deploy-new-application"])
            .code,
        0
    );
    db
}

/// What a pgmend killed while V4 was being built leaves: the guard trigger on issued_coupons.
fn leave_a_guard(db: &TestDb) {
    db.client()
        .batch_execute(
            "CREATE FUNCTION pgmend.\"pgmend guard: void-duplicate-coupons\"() RETURNS trigger
               LANGUAGE plpgsql AS 'BEGIN NEW.legacy_duplicate := true; RETURN NEW; END';
             CREATE TRIGGER \"pgmend guard: void-duplicate-coupons\" BEFORE INSERT ON issued_coupons
               FOR EACH ROW EXECUTE FUNCTION pgmend.\"pgmend guard: void-duplicate-coupons\"();",
        )
        .unwrap();
}

/// Runs `verify --format json`, expects exit 1, and returns the check `name`.
fn failed_check(db: &TestDb, name: &str) -> serde_json::Value {
    let r = db.run(&["verify", "--format", "json"]);
    assert_eq!(r.code, 1, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let check = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {doc}"))
        .clone();
    assert_eq!(check["ok"], false, "{check}");
    check
}

#[test]
fn verify_holds_after_the_release_and_names_a_counter_changed_by_hand() {
    let db = released();
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("Every invariant holds."), "{}", r.stdout);

    db.client().batch_execute("UPDATE member_monthly_usage SET used_yen = used_yen + 1000 WHERE member_id = 'm0000007'").unwrap();
    let check = failed_check(&db, "member_monthly_usage_matches_coupons");
    assert_eq!(check["ok"], false);
    assert_eq!(check["violations"], 1);
    assert!(
        check["sample"][0].as_str().unwrap().contains("m0000007"),
        "{check}"
    );

    assert_eq!(
        db.run(&["repair", "apply", "rebuild-member-monthly-usage", "--yes"])
            .code,
        0
    );
    assert_eq!(db.run(&["verify"]).code, 0);
}

#[test]
fn verify_fails_on_an_invalid_unique_index_and_reports_voided_coupons_redeemed_anyway() {
    let db = released();
    db.client()
        .batch_execute(
            "UPDATE issued_coupons SET redeemed_at = now()
              WHERE coupon_id = (SELECT coupon_id FROM issued_coupons WHERE voided_at IS NOT NULL AND redeemed_at IS NULL ORDER BY coupon_id LIMIT 1)",
        )
        .unwrap();
    let r = db.run(&["verify", "--format", "json"]);
    assert_eq!(
        r.code,
        0,
        "an anomaly alone does not fail the reconciliation: {}",
        r.both()
    );
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["anomalies"][0]["name"], "voided_then_redeemed");
    assert_eq!(doc["anomalies"][0]["violations"], 1);

    db.client()
        .batch_execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'one_coupon_per_member'::regclass")
        .unwrap();
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stdout.contains("INVALID"), "{}", r.stdout);
}

#[test]
fn verify_runs_on_a_read_only_connection() {
    let db = released();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .unwrap();
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 0, "{}", r.both());
}

/// Dropping a guard asks for ACCESS EXCLUSIVE on the table: queued behind the application's
/// long read, it would hold up every later query for up to --lock-timeout an attempt. It
/// waits, queued nowhere, for the read to end, and the application's queries keep answering.
#[test]
fn a_guard_is_dropped_in_a_gap_between_the_applications_long_reads() {
    if slow_tests_skipped("a_guard_is_dropped_in_a_gap_between_the_applications_long_reads") {
        return;
    }
    let db = released();
    leave_a_guard(&db);
    let read = "SELECT count(*) FROM issued_coupons";
    // Open for 300 ms before pgmend starts: a long holder (over 100 ms) at its first reading.
    let (r, _, longest) = run_while_held(
        &db,
        &format!("{read}; SELECT pg_sleep(0.3)"),
        std::time::Duration::from_secs(3),
        read,
        &["apply", "--yes", "--lock-timeout", "500ms"],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains("dropping the guard on issued_coupons: waiting for pid ")
            && r.stderr
                .contains("to end before asking for ACCESS EXCLUSIVE on public.issued_coupons")
            && !r.stderr.contains("retrying in"),
        "{}",
        r.stderr
    );
    assert!(
        longest < std::time::Duration::from_millis(400),
        "the application's read waited {longest:?}"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgmend guard%'"),
        0
    );
}

#[test]
fn a_guard_trigger_left_behind_fails_verify_and_the_next_apply_drops_it() {
    let db = released();
    leave_a_guard(&db);
    let check = failed_check(&db, "no_guard_trigger");
    assert_eq!(check["violations"], 1, "{check}");
    assert!(
        check["sample"][0]
            .as_str()
            .unwrap()
            .contains("pgmend guard: void-duplicate-coupons"),
        "{check}"
    );

    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains("left by an interrupted release"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgmend guard%'"),
        0
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_proc WHERE proname LIKE 'pgmend guard%'"),
        0
    );
    assert_eq!(db.run(&["verify"]).code, 0);
}
