//! Versioned migrations against a real server: baseline, apply, refusals, the runner lock
//! and crashes. Each test counts what is in the catalog and the history afterwards.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn baseline_adopts_legacy_then_apply_reaches_newest_and_again_is_a_no_op() {
    let db = fresh_db();
    db.make_legacy();
    db.client().batch_execute("CREATE INDEX coupons_by_member ON issued_coupons (member_id); ALTER TABLE campaigns ADD COLUMN note text").unwrap();

    let r = db.run(&["migrate", "status"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        !db.exists("refinery_schema_history"),
        "status must create nothing"
    );

    let r = db.run(&["migrate", "baseline", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout.contains("index coupons_by_member") && r.stdout.contains("column note"),
        "extras are reported: {}",
        r.stdout
    );
    assert_eq!(db.history(), [(1, "legacy_baseline".to_string())]);

    // The duplicates stop the migrations at the unique index (exit 1), after V2 and V3.
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("V4__one_coupon_per_member was not attempted"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("void-duplicate-coupons"), "{}", r.stderr);
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    for table in [
        "campaign_budgets",
        "member_monthly_usage",
        "notification_outbox",
    ] {
        assert!(db.exists(table), "{table}");
    }
    assert!(!db.exists("one_coupon_per_member"));
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM issued_coupons WHERE voided_at IS NULL AND NOT legacy_duplicate"
        ),
        6
    );
    assert!(!r.both().contains("NOTICE"), "{}", r.both());

    // V5 waits for counters that equal the truth.
    db.void_duplicates_by_sql();
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("campaign_budgets_match_coupons: 2 campaigns"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(db.invalid_indexes(), 0);

    db.rebuild_budgets_by_sql();
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );

    let r = db.run(&["migrate", "apply", "--yes", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["applied"].as_array().unwrap().len(), 0);
    assert_eq!(doc["current_version"], 5);
    assert_eq!(db.history().len(), 5);
    let r = db.run(&["migrate", "baseline", "--yes"]);
    assert_eq!(r.code, 0, "a second baseline is a no-op: {}", r.both());
    assert_eq!(db.history().len(), 5);
}

#[test]
fn refinery_reads_the_history_pgmend_writes() {
    let db = fresh_db();
    assert_eq!(db.run(&["migrate", "apply", "--yes"]).code, 0);
    let migrations = refinery::load_sql_migrations(repo().join("migrations")).unwrap();
    let runner = refinery::Runner::new(&migrations);
    let mut client = db.client();
    let applied = runner.get_applied_migrations(&mut client).unwrap();
    assert_eq!(applied.len(), 5);
    for (a, m) in applied.iter().zip(&migrations) {
        assert_eq!(a.checksum(), m.checksum());
    }
}

#[test]
fn applying_v1_over_the_legacy_tables_points_to_baseline_and_changes_nothing() {
    let db = fresh_db();
    db.make_legacy();
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("pgmend migrate baseline"), "{}", r.stderr);
    assert!(!db.exists("refinery_schema_history"));
    assert!(!db.exists("campaign_budgets"));
}

#[test]
fn baseline_refuses_a_different_schema_and_an_empty_database() {
    let db = fresh_db();
    db.client()
        .batch_execute("CREATE TABLE campaigns (campaign_id text PRIMARY KEY, discount_yen integer NOT NULL, budget_yen bigint NOT NULL, issued_yen integer NOT NULL DEFAULT 0)")
        .unwrap();
    let r = db.run(&["migrate", "baseline", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("missing: table issued_coupons"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("column budget_yen"), "{}", r.stderr);
    assert!(!db.exists("refinery_schema_history"));

    let empty = fresh_db();
    let r = empty.run(&["migrate", "baseline", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("none of the legacy tables"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("pgmend migrate apply"), "{}", r.stderr);
    assert!(!empty.exists("refinery_schema_history"));
}

#[test]
fn an_edited_applied_migration_is_refused_and_nothing_changes() {
    let db = fresh_db();
    let dir = migrations_dir(&[]);
    let d = dir_arg(dir.path());
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--migrations-dir", &d])
            .code,
        0
    );
    let v2 = dir.path().join("V2__expand_for_repair.sql");
    let text = std::fs::read_to_string(&v2).unwrap();
    std::fs::write(
        &v2,
        text.replace("voided_at timestamptz", "voided_at timestamp"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("V90__more.sql"),
        "CREATE TABLE more_things (x int);",
    )
    .unwrap();

    let r = db.run(&["migrate", "apply", "--yes", "--migrations-dir", &d]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("V2__expand_for_repair.sql was edited"),
        "{}",
        r.stderr
    );
    assert!(!db.exists("more_things"));
    assert_eq!(db.history().len(), 5);

    let r = db.run(&[
        "migrate",
        "status",
        "--migrations-dir",
        &d,
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["migrations"][1]["state"], "edited");
    assert_eq!(doc["migrations"][5]["state"], "pending");
}

#[test]
fn a_missing_applied_migration_is_refused() {
    let db = fresh_db();
    let dir = migrations_dir(&[("V90__more.sql", "CREATE TABLE more_things (x int);")]);
    let d = dir_arg(dir.path());
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--migrations-dir", &d])
            .code,
        0
    );
    std::fs::remove_file(dir.path().join("V90__more.sql")).unwrap();
    std::fs::write(
        dir.path().join("V91__later.sql"),
        "CREATE TABLE later (x int);",
    )
    .unwrap();
    let r = db.run(&["migrate", "apply", "--yes", "--migrations-dir", &d]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("no migration file has version 90"),
        "{}",
        r.stderr
    );
    assert!(!db.exists("later"));
    let r = db.run(&["migrate", "status", "--migrations-dir", &d]);
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("missing from disk"), "{}", r.stdout);
}

#[test]
fn duplicate_versions_and_bad_files_are_refused_before_connecting() {
    let db = fresh_db();
    for (extra, expect) in [
        (
            vec![("V2__again.sql", "SELECT 1;")],
            "two migrations have version 2",
        ),
        (
            vec![("V90_oops.sql", "SELECT 1;")],
            "V<version>__<name>.sql",
        ),
        (
            vec![("V90__empty.sql", "-- nothing yet\n")],
            "no SQL statement",
        ),
        (
            vec![("V90__tx.sql", "BEGIN; CREATE TABLE x (i int); COMMIT;")],
            "remove the transaction control",
        ),
        (
            vec![(
                "V90__detach.sql",
                "ALTER TABLE campaigns DETACH PARTITION campaigns_2020 CONCURRENTLY;",
            )],
            "V90__detach.sql, line 1: ALTER TABLE campaigns — DETACH PARTITION ... CONCURRENTLY commits a first transaction",
        ),
    ] {
        let dir = migrations_dir(&extra);
        let r = db.run(&[
            "migrate",
            "apply",
            "--yes",
            "--migrations-dir",
            &dir_arg(dir.path()),
        ]);
        assert_eq!(r.code, 2, "{}", r.both());
        assert!(
            r.stderr.contains(expect),
            "expected {expect:?} in {}",
            r.stderr
        );
        assert!(!db.exists("refinery_schema_history"), "nothing may change");
    }
    let dir = migrations_dir(&[]);
    std::fs::write(dir.path().join("V90__latin1.sql"), b"SELECT 'caf\xe9';").unwrap();
    let r = db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--migrations-dir",
        &dir_arg(dir.path()),
    ]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("V90__latin1.sql: not valid UTF-8"),
        "{}",
        r.stderr
    );
}

#[test]
fn plan_is_read_only_and_names_the_locks() {
    let db = fresh_db();
    db.make_legacy();
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    let r = db.run(&["migrate", "plan", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["current_version"], 1);
    assert_eq!(doc["pending"][0]["version"], 2);
    assert_eq!(doc["pending"][0]["in_transaction"], true);
    assert_eq!(doc["pending"][0]["strongest_lock"], "ACCESS_EXCLUSIVE");
    assert!(doc["pending"][0]["sql"]
        .as_str()
        .unwrap()
        .contains("legacy_duplicate"));
    assert!(!db.exists("campaign_budgets"));
    assert_eq!(db.history().len(), 1);
    let r = db.run(&["plan"]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.contains("ACCESS EXCLUSIVE on issued_coupons"),
        "{}",
        r.stdout
    );
}

#[test]
fn apply_without_yes_and_without_a_terminal_refuses() {
    let db = fresh_db();
    let r = db.run(&["migrate", "apply"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--yes"), "{}", r.stderr);
    assert!(!db.exists("campaigns"));
}

#[test]
fn a_read_only_database_is_refused_for_writes() {
    let db = fresh_db();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .unwrap();
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("default_transaction_read_only"),
        "{}",
        r.stderr
    );
    let r = db.run(&["migrate", "status"]);
    assert_eq!(r.code, 0, "reads still work: {}", r.both());
}

const SLOW_V3: &str = "CREATE TABLE made_by_v90 (x int);
SELECT pg_sleep(CASE WHEN current_setting('application_name') = 'slow' THEN 30 ELSE 1 END);";

#[test]
fn two_applies_at_once_apply_each_migration_exactly_once() {
    let db = fresh_db();
    let dir = migrations_dir(&[("V90__slow.sql", SLOW_V3)]);
    let d = dir_arg(dir.path());
    for runner_wait in ["0s", "1m"] {
        let spawn = || {
            db.pgmend()
                .args([
                    "migrate",
                    "apply",
                    "--yes",
                    "--runner-wait",
                    runner_wait,
                    "--migrations-dir",
                    &d,
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        let mut codes: Vec<i32> = outs.iter().map(|o| o.status.code().unwrap()).collect();
        codes.sort();
        let stderr: String = outs
            .iter()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .collect();
        if runner_wait == "0s" {
            assert!(codes == [0, 1] || codes == [0, 0], "{codes:?} {stderr}");
            if codes == [0, 1] {
                assert!(
                    stderr.contains("another pgmend is working on this database"),
                    "{stderr}"
                );
            }
        } else {
            assert_eq!(codes, [0, 0], "{stderr}");
        }
        let counts =
            db.scalar_i64("SELECT count(*) - count(DISTINCT version) FROM refinery_schema_history");
        assert_eq!(counts, 0);
        assert_eq!(
            db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 90]
        );
        assert!(db.exists("made_by_v90"));
        db.client().batch_execute("DROP TABLE made_by_v90, notification_outbox, member_monthly_usage, campaign_budgets, issued_coupons, campaigns, refinery_schema_history").unwrap();
    }
}

#[test]
fn commands_run_back_to_back_never_find_the_previous_ones_runner_lock() {
    // A session's locks go when its backend exits, which the server does after the client
    // has gone: without an explicit unlock, the next command (--runner-wait 0s) could find
    // the lock still held for a moment and refuse.
    let db = fresh_db();
    db.make_legacy_baselined(50);
    for i in 0..40 {
        let args: &[&str] = if i % 2 == 0 {
            &["migrate", "apply", "--yes", "--target", "1"]
        } else {
            &["repair", "apply", "rebuild-campaign-budgets", "--yes"]
        };
        let r = db.run(args);
        let expected = if i == 1 { 2 } else { 0 };
        if i == 1 {
            // The counter table does not exist before V2: an error, not a lock refusal.
            assert_eq!(r.code, expected, "{}", r.both());
            assert_eq!(
                db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
                0
            );
            continue;
        }
        assert_eq!(r.code, expected, "run {i}: {}", r.both());
        assert!(
            !r.stderr.contains("another pgmend"),
            "run {i}: {}",
            r.stderr
        );
    }
}

#[test]
fn killed_in_the_middle_of_a_migration_the_rerun_completes() {
    let db = fresh_db();
    let dir = migrations_dir(&[("V90__slow.sql", SLOW_V3)]);
    let d = dir_arg(dir.path());
    let mut child = db
        .pgmend()
        .env("PGAPPNAME", "slow")
        .args(["migrate", "apply", "--yes", "--migrations-dir", &d])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut watcher = db.client();
    loop {
        let sleeping: i64 = watcher
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slow' AND query LIKE '%pg_sleep%' AND state = 'active'", &[])
            .unwrap()
            .get(0);
        if sleeping > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "V3 never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // The server notices the dead client (client_connection_check_interval) and rolls back.
    let started = Instant::now();
    while watcher
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slow'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the killed backend lingered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5],
        "V2 committed, V3 did not"
    );
    assert!(
        !db.exists("made_by_v90"),
        "schema and history agree: no half-applied V3"
    );

    let r = db.run(&["migrate", "apply", "--yes", "--migrations-dir", &d]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 90]
    );
    assert!(db.exists("made_by_v90"));
}
