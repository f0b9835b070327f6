//! Bounded lock waits: while another session holds a transaction on issued_coupons, apply
//! waits for it to end without queueing (or, past half its budget, in short bounded attempts),
//! and the application's queries keep answering.

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

/// A baselined legacy database with two oddly named tables (a blank, a capital, a dot inside a
/// name), and a migrations directory: V1 as recorded, then a V2 that takes ACCESS EXCLUSIVE on
/// both tables (it adds a column `y` to each).
fn odd_tables_migration() -> (TestDb, tempfile::TempDir) {
    let db = legacy_baselined();
    db.client()
        .batch_execute(
            r#"CREATE SCHEMA "Odd S"; CREATE TABLE "Odd S"."My T" (x int); CREATE TABLE "odd.t" (x int);"#,
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let v1 = "V1__legacy_baseline.sql";
    std::fs::copy(repo().join("migrations").join(v1), dir.path().join(v1)).unwrap();
    std::fs::write(
        dir.path().join("V2__odd_names.sql"),
        r#"ALTER TABLE "Odd S"."My T" ADD COLUMN y int; ALTER TABLE "odd.t" ADD COLUMN y int;"#,
    )
    .unwrap();
    (db, dir)
}

/// `migrate apply --target 2` (V2) with 500 ms lock waits retried for `retry_for`, while a
/// transaction that ran `hold` stays open for `held_for`, and another session runs `probe`
/// every 20 ms ([`run_while_held`]).
fn v2_while_held(
    db: &TestDb,
    hold: &str,
    held_for: Duration,
    probe: &str,
    retry_for: &str,
) -> (Run, Duration, Duration) {
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
    run_while_held(db, hold, held_for, probe, &args)
}

/// V2 said it waited for the holder (`said`: the end of the holder's query and what follows),
/// and asked for its locks only once the holder was gone: no attempt queued and timed out, so
/// the application's statements never queued behind the request (they did for up to
/// --lock-timeout, 500 ms, an attempt).
fn v2_waited_in_a_gap(run: &Run, said: &str) {
    assert!(
        run.stderr
            .contains("applying V2__expand_for_repair: waiting for pid")
            && run.stderr.contains("transaction open")
            && run.stderr.contains(said),
        "the wait is said, with its holder: {}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("retrying in"),
        "no attempt waited in the queue: {}",
        run.stderr
    );
}

/// [`v2_while_held`] while a transaction that has read issued_coupons stays open for 10 s.
fn v2_while_held_for_10s(db: &TestDb, retry_for: &str) -> (Run, Duration, Duration) {
    v2_while_held(db, HOLD, Duration::from_secs(10), PROBE, retry_for)
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
    v2_waited_in_a_gap(
        &run,
        "SELECT count(*) FROM issued_coupons) to end before asking for ACCESS EXCLUSIVE on issued_coupons",
    );
    assert!(longest < Duration::from_secs(1), "probe waited {longest:?}");
    assert!(db.exists("campaign_budgets"));
    assert_eq!(db.history().len(), 2);
}

/// V2 takes `SHARE ROW EXCLUSIVE` on campaigns (a new table's foreign key): a request queued
/// behind a long writer there would hold up every write on campaigns, the legacy counter's
/// updates included. It waits for that writer to end first, as for its `ACCESS EXCLUSIVE`
/// tables, and the application's writes on campaigns keep going.
#[test]
fn apply_waits_for_a_long_writer_on_a_table_it_locks_against_writes() {
    if slow_tests_skipped("apply_waits_for_a_long_writer_on_a_table_it_locks_against_writes") {
        return;
    }
    let db = legacy_baselined();
    let (run, took, longest) = v2_while_held(
        &db,
        "UPDATE campaigns SET issued_yen = issued_yen + 1000 WHERE campaign_id = 'SW-A'",
        Duration::from_secs(4),
        "UPDATE campaigns SET issued_yen = issued_yen WHERE campaign_id = 'SW-B'",
        "60s",
    );
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        took >= Duration::from_secs(3),
        "V2 waited for the writer to commit: {took:?}"
    );
    v2_waited_in_a_gap(
        &run,
        "WHERE campaign_id = 'SW-A') to end before asking for SHARE ROW EXCLUSIVE on campaigns: a request queued behind it would hold up every write on the table",
    );
    // Without the wait each attempt held the writes for --lock-timeout: 501 ms.
    assert!(
        longest < Duration::from_millis(300),
        "probe waited {longest:?}"
    );
    assert!(db.exists("campaign_budgets"));
    assert_eq!(
        db.scalar_i64("SELECT issued_yen::bigint FROM campaigns WHERE campaign_id = 'SW-A'"),
        4000,
        "the writer's update committed"
    );
}

/// `wait_for_long_holders` for ACCESS EXCLUSIVE on `name`, called right after another session
/// began a read of `issued_coupons` (`read`) that holds its lock for one second: asserts that
/// the wait ended with the read's commit and said once whom it waited for.
fn gap_wait_beside_a_read_just_begun(name: &str, read: &'static str) {
    use pgmend::db::retry::{wait_for_long_holders, Asking};
    use std::time::Instant;

    let db = legacy_baselined();
    let (mut reader, mut waiter) = (db.client(), db.client());
    let (began, read_began) = std::sync::mpsc::channel();
    let read = std::thread::spawn(move || {
        let mut tx = reader.transaction().unwrap();
        tx.batch_execute(read).unwrap();
        began.send(Instant::now()).unwrap();
        tx.batch_execute("SELECT pg_sleep(1)").unwrap();
        tx.commit().unwrap();
        Instant::now()
    });
    let began = read_began.recv().unwrap();
    let mut said = Vec::new();
    let gaps = [(Asking::AccessExclusive, vec![name.to_string()])];
    wait_for_long_holders(
        &mut waiter,
        &gaps,
        Instant::now() + Duration::from_secs(10),
        "a test",
        false,
        &mut |line| said.push(line.to_string()),
    )
    .unwrap();
    let ended = Instant::now();
    let committed = read.join().unwrap();
    assert!(
        ended + Duration::from_millis(100) >= committed
            && ended - began >= Duration::from_millis(800),
        "the wait ended {:?} after the read began, the read committed {:?} after",
        ended - began,
        committed - began
    );
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("a test: waiting for pid ")
            && said[0].contains(&format!(
                "SELECT pg_sleep(1)) to end before asking for ACCESS EXCLUSIVE on {name}"
            )),
        "{said:?}"
    );
}

/// A read whose transaction began a moment before the wait looks like a short one, but holds
/// its lock for a second: a request asked for then queues behind it for its whole
/// --lock-timeout (under `bench_release --load`, the guard's drop: 499 ms). The wait takes
/// every holder it first finds, of any age, and says so once it has waited 100 ms.
#[test]
fn the_gap_wait_waits_for_a_read_that_has_just_begun() {
    gap_wait_beside_a_read_just_begun("issued_coupons", "SELECT count(*) FROM issued_coupons");
}

#[test]
fn the_gap_wait_for_a_dropped_index_waits_for_its_tables_readers() {
    // `DROP INDEX issued_coupons_pkey`'s ACCESS EXCLUSIVE is on the index and its table: the
    // wait finds the table from the index's name. A read planned afresh locks every index of
    // the table too; one whose plan was cached (a prepared statement's generic plan of a
    // sequential scan) locks the table alone, as this one does.
    gap_wait_beside_a_read_just_begun(
        "issued_coupons_pkey",
        "LOCK TABLE issued_coupons IN ACCESS SHARE MODE",
    );
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

/// When the lock budget runs out, the message names the sessions that hold locks on the
/// migration's tables, odd names too: a blank, a capital, a dot inside a name (a lookup by
/// `to_regclass` failed on the first and missed the others, saying "could not list them").
#[test]
fn a_lock_budget_spent_names_the_holders_of_oddly_named_tables() {
    if slow_tests_skipped("a_lock_budget_spent_names_the_holders_of_oddly_named_tables") {
        return;
    }
    let (db, dir) = odd_tables_migration();
    let m = dir_arg(dir.path());
    let args = [
        "migrate",
        "apply",
        "--yes",
        "--migrations-dir",
        &m,
        "--lock-timeout",
        "200ms",
        "--lock-retry-for",
        "2s",
    ];
    // Held past the budget, by a transaction that read the table with the blank in its name.
    let hold = r#"SELECT count(*) FROM "Odd S"."My T""#;
    let (run, _, _) = run_while_held(&db, hold, Duration::from_secs(5), "SELECT 1", &args);
    assert_eq!(run.code, 1, "{}", run.both());
    assert!(
        run.stderr
            .contains("Sessions holding locks on Odd S.My T, odd.t: pid ")
            && run.stderr.contains(&format!("query: {hold}"))
            && run.stderr.contains("holds AccessShareLock"),
        "{}",
        run.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM information_schema.columns WHERE column_name = 'y'"),
        0
    );
}

#[test]
fn a_migration_waits_out_the_long_holders_of_oddly_named_tables_too() {
    let (db, dir) = odd_tables_migration();
    let m = dir_arg(dir.path());
    let args = [
        "migrate",
        "apply",
        "--yes",
        "--migrations-dir",
        &m,
        "--lock-timeout",
        "500ms",
    ];
    let probe = r#"SELECT count(*) FROM "Odd S"."My T""#;
    let (run, took, _) = run_while_held(&db, probe, Duration::from_secs(3), probe, &args);
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        run.stderr
            .contains("to end before asking for ACCESS EXCLUSIVE on Odd S.My T, odd.t")
            && !run.stderr.contains("retrying in"),
        "{}",
        run.stderr
    );
    assert!(took >= Duration::from_millis(2500), "{took:?}");
    assert_eq!(
        db.scalar_i64(
            r#"SELECT count(*) FROM information_schema.columns WHERE column_name = 'y' AND table_name IN ('My T', 'odd.t')"#
        ),
        2
    );
}
