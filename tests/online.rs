//! Online DDL against a real server: the unique index built CONCURRENTLY under traffic,
//! failed builds cleaned up, the NOT VALID check, VALIDATE, and two pgmends at once.

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// A database at V2 (through apply on an empty database) with clean coupon data: no
/// duplicates, counters not yet built.
fn at_v2() -> TestDb {
    let db = fresh_db();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    db.client()
        .batch_execute(
            "INSERT INTO campaigns VALUES ('SW-A', 1000, 2000, 0), ('SW-B', 1000, 5000, 0);
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), 'SW-B', 'm' || g, '2026-09', 1000 FROM generate_series(1, 4) g;
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), 'SW-A', 'm' || g, '2026-09', 1000 FROM generate_series(1, 3) g;",
        )
        .unwrap();
    db
}

fn index_is_valid(db: &TestDb) -> bool {
    db.client()
        .query_one(
            "SELECT coalesce((SELECT indisvalid AND indisready AND indisunique AND pg_get_expr(indpred, indrelid) = '(NOT legacy_duplicate)'
                                FROM pg_index WHERE indexrelid = to_regclass('one_coupon_per_member')), false)",
            &[],
        )
        .unwrap()
        .get(0)
}

fn wait_for(db: &TestDb, sql: &str, what: &str) {
    let started = Instant::now();
    let mut c = db.client();
    while !c.query_one(sql, &[]).unwrap().get::<_, bool>(0) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_unique_index_is_built_concurrently_under_writers_and_an_old_reader() {
    let db = at_v2();
    // Writers keep issuing (distinct) coupons all through the build.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU32::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        let mut c = db.client();
        thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                c.execute(
                    "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'SW-B', $1, '2026-09', 1000)",
                    &[&format!("w{n}")],
                )
                .unwrap();
                written.fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // A 5-second reader elsewhere in the database, holding a snapshot: the build must wait.
    let hold = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM campaigns";
    let (run, took, _) = run_while_held(
        &db,
        hold,
        Duration::from_secs(5),
        "SELECT 1",
        &["migrate", "apply", "--yes", "--target", "4"],
    );
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        took >= Duration::from_secs(4),
        "the build waited for the reader: {took:?}"
    );
    assert!(
        run.stderr.contains("waiting for pid"),
        "names what it waits for: {}",
        run.stderr
    );
    assert!(
        written.load(Ordering::SeqCst) > 50,
        "writers were not blocked"
    );
    assert!(index_is_valid(&db));
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
}

#[test]
fn a_build_broken_by_a_late_duplicate_is_dropped_and_the_release_stops() {
    let db = at_v2();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    // A writer's open transaction: the build waits for it before scanning the table.
    let mut writer = db.client();
    let mut tx = writer.transaction().unwrap();
    tx.execute("INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'SW-B', 'late1', '2026-09', 1000)", &[]).unwrap();
    let child = db
        .pgmend()
        .args(["migrate", "apply", "--yes", "--target", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(
        &db,
        "SELECT EXISTS (SELECT 1 FROM pg_stat_progress_create_index WHERE datname = current_database())",
        "the build to start",
    );
    // The old application double-taps: a duplicate of a live coupon lands mid-build.
    tx.execute("INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'SW-B', 'm1', '2026-09', 1000)", &[]).unwrap();
    tx.commit().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("23505"), "{stderr}");
    assert!(
        stderr.contains("1 groups of (campaign_id, member_id)"),
        "{stderr}"
    );
    assert!(
        !db.exists("one_coupon_per_member"),
        "the INVALID index was dropped"
    );
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(db.history().len(), 3);

    db.void_duplicates_by_sql();
    let r = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(index_is_valid(&db));
}

/// Counts, on a sequence (which no rollback undoes), every statement that starts to build
/// one_coupon_per_member: the server's own record of whether a build was attempted, however
/// it ended.
const COUNT_BUILDS: &str = "
    CREATE SEQUENCE unique_index_builds;
    CREATE FUNCTION count_unique_index_builds() RETURNS event_trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF current_query() ILIKE '%CREATE UNIQUE INDEX%one_coupon_per_member%' THEN
        PERFORM nextval('unique_index_builds');
      END IF;
    END $$;
    CREATE EVENT TRIGGER count_unique_index_builds ON ddl_command_start WHEN TAG IN ('CREATE INDEX')
      EXECUTE FUNCTION count_unique_index_builds();";

fn builds_started(db: &TestDb) -> i64 {
    db.scalar_i64("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM unique_index_builds")
}

/// While the census finds duplicates the unique index is not built at all (a build that
/// fails on them and is cleaned up ends with the same exit code and leaves the same
/// catalog, so only the server's count tells the two apart); once they are voided it is
/// built, once.
#[test]
fn the_unique_index_build_is_never_started_while_its_census_finds_duplicates() {
    let db = fresh_db();
    db.make_legacy();
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    db.client().batch_execute(COUNT_BUILDS).unwrap();
    let before = snapshot(&db);
    let r = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert_eq!(
        builds_started(&db),
        0,
        "a build was attempted:\n{}",
        r.stderr
    );
    assert_eq!(
        snapshot(&db),
        before,
        "the refused step changed the database"
    );

    db.void_duplicates_by_sql();
    let r = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(builds_started(&db), 1, "the trigger counts the build");
    assert!(index_is_valid(&db));
}

/// A database at V5 with seven coupons not redeemed, and a migrations directory whose V6 is
/// `statements` after a precondition that stops it while any coupon is not redeemed.
fn at_v5_with_a_precondition(statements: &str) -> (TestDb, tempfile::TempDir) {
    let db = at_v2();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "4"]).code,
        0
    );
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.run(&["migrate", "apply", "--yes"]).code, 0);
    let dir = migrations_dir(&[(
        "V6__online.sql",
        &format!(
            "/* pgmend:precondition
name: no_unredeemed_coupons
explain: coupons not redeemed yet
fix: redeem them first, then rerun
tables: issued_coupons
query:
SELECT coupon_id FROM issued_coupons WHERE redeemed_at IS NULL
*/
{statements}"
        ),
    )]);
    (db, dir)
}

fn apply_from(db: &TestDb, dir: &tempfile::TempDir) -> Run {
    db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--migrations-dir",
        &dir_arg(dir.path()),
    ])
}

#[test]
fn an_online_migration_that_builds_nothing_is_stopped_by_its_precondition() {
    // A DROP INDEX CONCURRENTLY migration with a precondition: before, only an index build
    // took an online migration's censuses, and this one dropped the index regardless.
    let (db, dir) = at_v5_with_a_precondition("DROP INDEX CONCURRENTLY issued_coupons_by_member;");
    let r = apply_from(&db, &dir);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("7 coupons not redeemed yet"),
        "{}",
        r.stderr
    );
    assert!(
        db.exists("issued_coupons_by_member"),
        "the index was dropped"
    );
    assert_eq!(
        db.scalar_i64("SELECT max(version)::bigint FROM refinery_schema_history"),
        5
    );
    db.client()
        .batch_execute("UPDATE issued_coupons SET redeemed_at = now()")
        .unwrap();
    let r = apply_from(&db, &dir);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(!db.exists("issued_coupons_by_member"));
    assert_eq!(
        db.scalar_i64("SELECT max(version)::bigint FROM refinery_schema_history"),
        6
    );
}

#[test]
fn a_drop_after_an_index_adopted_as_it_was_takes_the_censuses() {
    // The build of an index that exists, valid and as defined, is skipped with its census:
    // the drop after it took none, and ran regardless of the precondition.
    let (db, dir) = at_v5_with_a_precondition(
        "CREATE INDEX CONCURRENTLY by_month ON issued_coupons (month);
DROP INDEX CONCURRENTLY issued_coupons_by_member;",
    );
    db.client()
        .batch_execute("CREATE INDEX by_month ON issued_coupons (month)")
        .unwrap();
    let r = apply_from(&db, &dir);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("index by_month already exists, valid and as defined")
            && r.stderr.contains("7 coupons not redeemed yet"),
        "{}",
        r.stderr
    );
    assert!(
        db.exists("issued_coupons_by_member"),
        "the index was dropped"
    );
}

/// The old application's double tap after the void: a second live coupon for one member and
/// campaign.
fn late_duplicate(db: &TestDb) {
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), campaign_id, member_id, month, amount_yen FROM issued_coupons
              WHERE NOT legacy_duplicate ORDER BY coupon_id LIMIT 1",
        )
        .unwrap();
}

/// In the release, V4's census is taken on the main session while the index is built (the
/// void right before removed the duplicates). A duplicate that arrived after the void is found
/// by it: the build is cancelled and its INVALID index dropped, the void runs again, and the
/// index is built. `migrate apply` alone keeps its census first (the test above).
#[test]
fn in_the_release_the_census_during_the_build_cancels_it_on_a_late_duplicate() {
    let db = fresh_db();
    db.voided_before_the_release_reaches_v4(200);
    db.client().batch_execute(COUNT_BUILDS).unwrap();
    late_duplicate(&db);
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains(
            "was stopped by its census, taken while the index was being built: census one_coupon_per_member: 1 groups"
        ) && r.stderr.contains("nothing of this step remains"),
        "{}",
        r.stderr
    );
    assert_eq!(
        builds_started(&db),
        2,
        "the build the census cancelled, then the one after the second void:\n{}",
        r.stderr
    );
    assert!(index_is_valid(&db));
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                    GROUP BY campaign_id, member_id HAVING count(*) > 1) d"
        ),
        0
    );
}

/// [`COUNT_BUILDS`], and each build of one_coupon_per_member is held at its start for as long
/// as a session holds advisory lock 41 (this database's): a build that cannot read a row, let
/// alone fail on a duplicate or finish, until the test lets it go.
const HOLD_BUILDS: &str = "
    CREATE SEQUENCE unique_index_builds;
    CREATE FUNCTION hold_unique_index_builds() RETURNS event_trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF current_query() ILIKE '%CREATE UNIQUE INDEX%one_coupon_per_member%' THEN
        PERFORM nextval('unique_index_builds');
        PERFORM pg_advisory_lock_shared(41);
        PERFORM pg_advisory_unlock_shared(41);
      END IF;
    END $$;
    CREATE EVENT TRIGGER hold_unique_index_builds ON ddl_command_start WHEN TAG IN ('CREATE INDEX')
      EXECUTE FUNCTION hold_unique_index_builds();";

/// The census taken alongside the build cancels it as soon as it finds the late duplicate,
/// not once the build has run to its end: the first build is held at its start, and the
/// second starts (after the void's next pass) while it still would be. A build left to run
/// would end the same way, failing with 23505 and sent back by the next census, at the cost of
/// a whole build; only the server's count of builds started under the hold tells the two
/// apart (issue 41).
#[test]
fn in_the_release_the_census_cancels_a_build_held_at_its_start_before_it_reads_a_row() {
    let db = fresh_db();
    db.voided_before_the_release_reaches_v4(200);
    db.client().batch_execute(HOLD_BUILDS).unwrap();
    late_duplicate(&db);
    // A session-level lock, outside any transaction: pgmend's pre-flight sees no open
    // transaction, so V4's census runs alongside the build.
    let mut hold = db.client();
    hold.batch_execute("SELECT pg_advisory_lock(41)").unwrap();
    // A --build-wait far past the wait below: only the census can end the held build.
    let child = db
        .pgmend()
        .args(["apply", "--yes", "--build-wait", "10m"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while builds_started(&db) < 2 && started.elapsed() < Duration::from_secs(60) {
        thread::sleep(Duration::from_millis(50));
    }
    let under_hold = builds_started(&db);
    hold.batch_execute("SELECT pg_advisory_unlock(41)").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        under_hold, 2,
        "the first build was not cancelled while it was held at its start (it would have run to its end); builds started under the hold:\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(builds_started(&db), 2, "{stderr}");
    assert!(
        stderr.contains(
            "was stopped by its census, taken while the index was being built: census one_coupon_per_member: 1 groups"
        ) && stderr.contains("the cancelled build left no index")
            && !stderr.contains("23505"),
        "{stderr}"
    );
    assert!(index_is_valid(&db));
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                    GROUP BY campaign_id, member_id HAVING count(*) > 1) d"
        ),
        0
    );
}

#[test]
fn an_invalid_or_different_index_of_the_same_name_is_rebuilt_and_a_valid_one_adopted() {
    let db = at_v2();
    let mut c = db.client();
    c.batch_execute(
        "CREATE UNIQUE INDEX one_coupon_per_member ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate;
         UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'one_coupon_per_member'::regclass;",
    )
    .unwrap();
    let r = db.run(&["migrate", "status", "--format", "json"]);
    assert_eq!(r.code, 1, "status reports the INVALID index: {}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["invalid_indexes"][0]["index"], "one_coupon_per_member");
    // The plan says what apply will do about it, in both formats.
    let r = db.run(&["migrate", "plan", "--target", "4"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout.contains("index one_coupon_per_member exists but is INVALID (a failed earlier build): apply drops it CONCURRENTLY, then builds it again"),
        "{}",
        r.stdout
    );
    let r = db.run(&["migrate", "plan", "--target", "4", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let v4 = doc["pending"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["version"] == 4)
        .unwrap();
    assert_eq!(v4["existing_indexes"].as_array().unwrap().len(), 1, "{v4}");
    assert_eq!(
        db.invalid_indexes(),
        1,
        "the plan changed nothing: the index is still there"
    );

    let r = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.contains("INVALID"), "{}", r.stderr);
    assert!(index_is_valid(&db));
    assert_eq!(db.invalid_indexes(), 0);

    // A valid index with the same definition (say, built by hand during an incident) is adopted.
    let db = at_v2();
    db.client()
        .batch_execute("CREATE UNIQUE INDEX one_coupon_per_member ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate")
        .unwrap();
    let oid = db.scalar_i64("SELECT 'one_coupon_per_member'::regclass::oid::bigint");
    let r = db.run(&["migrate", "plan", "--target", "4"]);
    assert!(
        r.stdout.contains("index one_coupon_per_member already exists, valid and as defined: apply skips this build"),
        "{}",
        r.stdout
    );
    let r = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT 'one_coupon_per_member'::regclass::oid::bigint"),
        oid,
        "not rebuilt"
    );
    assert_eq!(db.history().len(), 4);

    // Same name, different definition (not unique): dropped and rebuilt as defined.
    let db = at_v2();
    db.client()
        .batch_execute(
            "CREATE INDEX one_coupon_per_member ON issued_coupons (campaign_id, member_id)",
        )
        .unwrap();
    let r = db.run(&["migrate", "plan", "--target", "4"]);
    assert!(
        r.stdout.contains("index one_coupon_per_member exists but is defined differently (CREATE INDEX one_coupon_per_member ON public.issued_coupons USING btree (campaign_id, member_id)): apply drops it CONCURRENTLY, then builds it as this file says"),
        "{}",
        r.stdout
    );
    let r = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(index_is_valid(&db), "rebuilt unique, with its predicate");
}

#[test]
fn the_not_valid_check_keeps_old_overruns_and_refuses_new_ones() {
    let db = at_v2();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "4"]).code,
        0
    );
    // Counters must equal the truth first: the precondition stops the step until then.
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("campaign_budgets_match_coupons: 2 campaigns"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("rebuild-campaign-budgets"),
        "{}",
        r.stderr
    );

    db.rebuild_budgets_by_sql(); // SW-A: 3,000 yen issued against a 2,000 yen budget.
    let r = db.run(&["migrate", "plan"]);
    assert!(
        r.stdout
            .contains("census issued_within_budget: 1 rows of campaign_budgets"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("VALIDATE CONSTRAINT would fail"),
        "{}",
        r.stdout
    );
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.history().len(), 5);

    let mut c = db.client();
    let err = c
        .execute(
            "UPDATE campaign_budgets SET issued_yen = 6000 WHERE campaign_id = 'SW-B'",
            &[],
        )
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23514");
    assert_eq!(
        db.scalar_i64("SELECT issued_yen::bigint FROM campaign_budgets WHERE campaign_id = 'SW-A'"),
        3000
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_constraint WHERE conname = 'issued_within_budget' AND NOT convalidated"),
        1
    );

    // VALIDATE only once nothing breaks the check.
    let r = db.run(&["migrate", "validate", "issued_within_budget", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("\"campaign_id\":\"SW-A\""),
        "names the row: {}",
        r.stderr
    );
    c.batch_execute("UPDATE campaign_budgets SET budget_yen = 3000 WHERE campaign_id = 'SW-A'")
        .unwrap();
    let r = db.run(&["migrate", "validate", "issued_within_budget", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_constraint WHERE conname = 'issued_within_budget' AND convalidated"),
        1
    );
    let r = db.run(&["migrate", "validate", "no_such_thing", "--yes"]);
    assert_eq!(r.code, 2);
}

#[test]
fn a_second_pgmend_waiting_during_the_build_does_not_deadlock_it() {
    let db = at_v2();
    let hold = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM campaigns";
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute(hold).unwrap();
    let spawn = || {
        db.pgmend()
            .args([
                "migrate",
                "apply",
                "--yes",
                "--target",
                "4",
                "--runner-wait",
                "1m",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn();
    wait_for(
        &db,
        "SELECT EXISTS (SELECT 1 FROM pg_stat_progress_create_index WHERE datname = current_database())",
        "the build to start",
    );
    let second = spawn();
    thread::sleep(Duration::from_secs(2)); // the second polls the runner lock meanwhile
    tx.commit().unwrap();
    let started = Instant::now();
    let (a, b) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(
        a.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(
        b.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&b.stderr)
    );
    assert!(String::from_utf8_lossy(&b.stderr).contains("waiting up to 1m for another pgmend"));
    assert!(index_is_valid(&db));
    assert_eq!(
        db.history().iter().map(|h| h.0).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
}

#[test]
fn the_check_waits_in_bounded_attempts_while_the_application_keeps_answering() {
    let db = at_v2();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "4"]).code,
        0
    );
    db.rebuild_budgets_by_sql();
    let args = [
        "migrate",
        "apply",
        "--yes",
        "--lock-timeout",
        "500ms",
        "--lock-retry-for",
        "60s",
    ];
    let (run, took, longest) = run_while_held(
        &db,
        "SELECT count(*) FROM campaign_budgets",
        Duration::from_secs(10),
        "SELECT count(*) FROM campaign_budgets",
        &args,
    );
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(took >= Duration::from_secs(8), "{took:?}");
    assert!(longest < Duration::from_secs(2), "probe waited {longest:?}");
    assert_eq!(db.history().len(), 5);
}

#[test]
fn a_build_that_waits_past_build_wait_is_cancelled_and_leaves_no_invalid_index() {
    let db = at_v2();
    let hold = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM campaigns";
    let (run, _, _) = run_while_held(
        &db,
        hold,
        Duration::from_secs(8),
        "SELECT 1",
        &[
            "migrate",
            "apply",
            "--yes",
            "--target",
            "3",
            "--build-wait",
            "2s",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.both());
    assert!(run.stderr.contains("--build-wait 2s"), "{}", run.stderr);
    // The reader holds up the first online build, V3's supporting index.
    assert!(!db.exists("issued_coupons_by_member"));
    assert!(!db.exists("one_coupon_per_member"));
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(db.history().len(), 2);
}

#[test]
fn a_build_asks_for_half_the_free_worker_processes_and_for_none_when_none_are_free() {
    // None free for this database's sessions: the build runs on its leader alone.
    let db = at_v2();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET max_parallel_workers = 0",
            db.name
        ))
        .unwrap();
    let run = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        run.stderr.contains(
            "building one_coupon_per_member concurrently (attempt 1 of 3) with no parallel maintenance worker (0 worker processes free)"
        ),
        "{}",
        run.stderr
    );
    assert!(index_is_valid(&db));

    // The server's defaults (8 worker processes): some free, half of them asked for, and
    // maintenance_work_mem raised to 32 MB for each participant where it is below. (Other
    // tests' parallel queries on this cluster may hold workers: then fewer, or none.)
    let db = at_v2();
    let run = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    assert_eq!(run.code, 0, "{}", run.both());
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("building one_coupon_per_member concurrently"))
        .unwrap_or_else(|| panic!("{}", run.stderr));
    let processes = db.scalar_i64("SELECT current_setting('max_worker_processes')::bigint");
    let server_mb =
        db.scalar_i64("SELECT pg_size_bytes(current_setting('maintenance_work_mem')) / 1048576");
    let asked = regex::Regex::new(
        r"with up to (\d+) parallel maintenance workers? \(half of the (\d+) worker processes free\), maintenance_work_mem (\d+) MB",
    )
    .unwrap();
    match asked.captures(line) {
        Some(asked) => {
            let (workers, free, memory): (i64, i64, i64) = (
                asked[1].parse().unwrap(),
                asked[2].parse().unwrap(),
                asked[3].parse().unwrap(),
            );
            assert!(free >= 2 && free <= processes, "{line}");
            assert_eq!(workers, (free / 2).min(8), "{line}");
            assert_eq!(memory, server_mb.max(32 * (workers + 1)), "{line}");
        }
        None => {
            let none = regex::Regex::new(
                r"with no parallel maintenance worker \(([01]) worker processes free\)",
            )
            .unwrap();
            assert!(none.is_match(line), "{line}");
        }
    }
    assert!(index_is_valid(&db));
    assert_eq!(db.invalid_indexes(), 0);

    // The application at work (a session running a statement, here one that sleeps): nothing
    // spare is taken from it, the server's own settings build the index.
    let db = at_v2();
    let mut app = db.client();
    let sleeping = thread::spawn(move || app.batch_execute("SELECT pg_sleep(3)").unwrap());
    let started = Instant::now();
    while db.scalar_i64(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'SELECT pg_sleep(3)' AND state = 'active'",
    ) == 0
    {
        assert!(started.elapsed() < Duration::from_secs(5), "the application never started");
        thread::sleep(Duration::from_millis(20));
    }
    let run = db.run(&["migrate", "apply", "--yes", "--target", "4"]);
    sleeping.join().unwrap();
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        run.stderr.contains(
            "building one_coupon_per_member concurrently (attempt 1 of 3) with the server's own parallel settings: the application is at work (1 session of it seen), so no spare worker process is taken from it"
        ),
        "{}",
        run.stderr
    );
    assert!(index_is_valid(&db));
    assert_eq!(db.invalid_indexes(), 0);
}
