//! Signals against the real binary and a real server: SIGTERM and SIGHUP (as Kubernetes, CI
//! runners and a closed terminal send them) in the middle of a void batch, during the guard
//! window and during an online build stop the release cleanly with exit 1: the batch in
//! flight commits whole, the build is cancelled and its INVALID index dropped, the guard
//! trigger dropped, and stderr names the command that continues, which then reaches the end
//! state of an uninterrupted run. A clean-up that cannot finish within its time (an index
//! drop given up at 17 s, a batch cut off at 20 s), a second signal (130, 143, 129), a closed
//! stderr and `migrate apply` are each a test of their own.

mod common;

#[path = "common/held.rs"]
mod held;
#[allow(dead_code)]
#[path = "../examples/kill_campaign.rs"]
mod kill_campaign;

use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use held::*;
use kill_campaign::{end_state, EndState, CONFIRM};

/// The command every stop here must name.
const CONTINUE: &str = "pgmend apply --yes --confirm deploy-new-application";
const GUARD: &str = "pgmend guard: void-duplicate-coupons";

fn send(child: &Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal}");
}

fn guards(db: &TestDb) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM pg_trigger WHERE tgname = '{GUARD}'"
    ))
}

/// What every clean stop leaves: no guard trigger, no INVALID index, and a rerun that
/// reaches the uninterrupted run's end state.
fn assert_clean_and_rerun_completes(db: &TestDb, expected: &EndState) {
    assert_eq!(guards(db), 0, "the guard trigger was dropped");
    assert_eq!(db.invalid_indexes(), 0, "no INVALID index is left");
    rerun_completes(db, expected);
}

/// The release run again reaches the uninterrupted run's end state, leaving no guard and
/// no INVALID index; returns its stderr.
fn rerun_completes(db: &TestDb, expected: &EndState) -> String {
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_same(expected, &end_state(&exe(), &db.conninfo()).unwrap());
    assert_eq!(guards(db), 0);
    assert_eq!(db.invalid_indexes(), 0);
    r.stderr
}

fn assert_stopped_cleanly(r: &Run, signal: &str) {
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains(&format!("pgmend: SIG{signal}: stopping cleanly")),
        "stderr says the signal was received:\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(CONTINUE),
        "stderr names the command that continues:\n{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("left behind:"),
        "nothing is left behind:\n{}",
        r.stderr
    );
}

// ---------------------------------------------------------------------------------------
// (a) In the middle of a void batch.

/// A source at V1 with dirty data, the reference's end state, and a copy to signal.
fn legacy(members: i32) -> (TestDb, EndState, TestDb) {
    let source = fresh_db();
    source.make_legacy_baselined(members);
    let expected = reference(&source);
    let db = copy_of(&source);
    (source, expected, db)
}

fn signalled_in_the_middle_of_a_batch(signal: &str) {
    let (_source, expected, db) = legacy(1000);
    let (child, holder, _pid, run_id, checkpoint) = hold_in_the_middle_of_a_batch(&db.conninfo());
    send(&child, signal);
    // The batch in flight has written its coupons and waits on its checkpoint: once the
    // holder lets go it commits whole, and the run stops after it.
    thread::sleep(Duration::from_millis(500));
    drop(holder);
    let r = finish(child, Duration::from_secs(60), "apply");
    eprintln!("after {signal} in a batch:\n{}", r.stderr);
    assert_stopped_cleanly(&r, signal);
    assert!(
        r.stderr.contains("stopped after its current batch"),
        "{}",
        r.stderr
    );
    assert_whole_batches(&db.conninfo(), run_id, checkpoint, false);
    let now = db.scalar_i64(&format!(
        "SELECT checkpoint FROM pgmend.repair_runs WHERE run_id = {run_id}"
    ));
    assert!(
        now > checkpoint,
        "the batch in flight committed ({now} > {checkpoint})"
    );
    let targets = db.scalar_i64(&format!(
        "SELECT targets FROM pgmend.repair_runs WHERE run_id = {run_id}"
    ));
    assert!(
        now < targets,
        "the run stopped before its end ({now}/{targets})"
    );
    assert_clean_and_rerun_completes(&db, &expected);
}

#[test]
fn sigterm_in_the_middle_of_a_void_batch_commits_it_and_stops_with_exit_1() {
    signalled_in_the_middle_of_a_batch("TERM");
}

#[test]
fn sighup_in_the_middle_of_a_void_batch_commits_it_and_stops_with_exit_1() {
    signalled_in_the_middle_of_a_batch("HUP");
}

// ---------------------------------------------------------------------------------------
// (b) During the guard window.

const LATE: &str = "00000000-0000-0000-0000-00000000fa7e";

/// A source whose release has run up to its void step (step 4) and into which the old
/// application then inserted one more duplicate (`LATE`): V4's census finds it, so the
/// release installs the guard and runs the void repair again before building the index.
fn late_duplicate() -> (TestDb, EndState, TestDb) {
    let source = fresh_db();
    source.make_legacy_baselined(500);
    assert_eq!(
        source
            .run(&["migrate", "apply", "--yes", "--target", "3"])
            .code,
        0
    );
    assert_eq!(
        source
            .run(&["repair", "apply", "void-duplicate-coupons", "--yes"])
            .code,
        0
    );
    source
        .client()
        .batch_execute(&format!(
            "INSERT INTO pgmend.release_steps (release, step, what, run_id)
               SELECT 'coupon-incident', 4, 'repair void-duplicate-coupons', max(run_id) FROM pgmend.repair_runs;
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
               SELECT '{LATE}', campaign_id, member_id, month, amount_yen FROM issued_coupons
                WHERE NOT legacy_duplicate ORDER BY coupon_id LIMIT 1"
        ))
        .unwrap();
    let expected = reference(&source);
    let db = copy_of(&source);
    (source, expected, db)
}

/// Starts the release and holds it inside the guard window: a session holds the late
/// duplicate FOR SHARE, so the second void pass waits in its `FOR UPDATE` with the guard
/// installed. Returns the child and the holder (its transaction open).
fn hold_in_the_guard_window(db: &TestDb, close_stderr: bool) -> (Child, postgres::Client) {
    let mut holder = db.client();
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM issued_coupons WHERE coupon_id = '{LATE}' FOR SHARE"
        ))
        .unwrap();
    let mut child = kill_campaign::pgmend(&exe(), &db.conninfo())
        .args(confirm_with(&["--lock-timeout", "60s"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if close_stderr {
        // What a closed terminal leaves: every write to stderr fails.
        drop(child.stderr.take());
    }
    let mut watch = db.client();
    poll(
        "the second void pass waiting for the held coupon, the guard installed",
        Duration::from_secs(60),
        || {
            let waiting = watch
                .query_opt(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgmend'
                        AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'",
                    &[],
                )
                .unwrap()
                .is_some();
            (waiting && guards(db) == 1).then_some(())
        },
    );
    (child, holder)
}

fn signalled_in_the_guard_window(signal: &str) {
    let (_source, expected, db) = late_duplicate();
    let (child, holder) = hold_in_the_guard_window(&db, false);
    send(&child, signal);
    thread::sleep(Duration::from_millis(500));
    drop(holder);
    let r = finish(child, Duration::from_secs(60), "apply");
    eprintln!("after {signal} in the guard window:\n{}", r.stderr);
    assert_stopped_cleanly(&r, signal);
    assert!(
        r.stderr.contains("dropped the guard trigger"),
        "{}",
        r.stderr
    );
    assert!(
        !db.exists("one_coupon_per_member"),
        "the release stopped before building the unique index"
    );
    // The void pass's batch committed whole: the late duplicate is marked, with its record.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records"),
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate")
    );
    assert_clean_and_rerun_completes(&db, &expected);
}

#[test]
fn sigterm_during_the_guard_window_drops_the_guard_and_stops_with_exit_1() {
    signalled_in_the_guard_window("TERM");
}

#[test]
fn sighup_during_the_guard_window_drops_the_guard_and_stops_with_exit_1() {
    signalled_in_the_guard_window("HUP");
}

/// SIGHUP from a terminal that has gone: stderr is closed, and the stop still cleans up.
#[test]
fn sighup_with_a_closed_stderr_still_drops_the_guard_and_stops_with_exit_1() {
    let (_source, expected, db) = late_duplicate();
    let (child, holder) = hold_in_the_guard_window(&db, true);
    send(&child, "HUP");
    thread::sleep(Duration::from_millis(500));
    drop(holder);
    let r = finish(child, Duration::from_secs(60), "apply");
    assert_eq!(
        r.code, 1,
        "a write to the closed stderr did not end the stop"
    );
    assert!(!db.exists("one_coupon_per_member"));
    assert_clean_and_rerun_completes(&db, &expected);
}

// ---------------------------------------------------------------------------------------
// (c) During an online build.

fn signalled_during_a_build(signal: &str) {
    let (_source, expected, db) = legacy(500);
    let (child, mut reader, _pid) = hold_the_concurrent_build(&db, &CONFIRM);
    send(&child, signal);
    // The build is cancelled at once; its DROP INDEX CONCURRENTLY waits for the reader too,
    // which goes after a moment, as a report's transaction would.
    thread::sleep(Duration::from_millis(1500));
    reader.batch_execute("COMMIT").unwrap();
    let r = finish(child, Duration::from_secs(60), "apply");
    eprintln!("after {signal} during the build:\n{}", r.stderr);
    assert_stopped_cleanly(&r, signal);
    assert!(
        r.stderr.contains("the online statement was cancelled")
            && r.stderr
                .contains("dropped the INVALID index issued_coupons_by_member"),
        "{}",
        r.stderr
    );
    assert!(!db.exists("issued_coupons_by_member"));
    assert_clean_and_rerun_completes(&db, &expected);
}

#[test]
fn sigterm_during_an_online_build_cancels_it_drops_the_index_and_stops_with_exit_1() {
    signalled_during_a_build("TERM");
}

#[test]
fn sighup_during_an_online_build_cancels_it_drops_the_index_and_stops_with_exit_1() {
    signalled_during_a_build("HUP");
}

/// The old reader never goes: the DROP INDEX CONCURRENTLY of the cancelled build cannot end.
/// pgmend gives up within the clean-up limit, names the INVALID index it leaves and the
/// command that drops it, and exits 1; that command then does.
#[test]
fn a_clean_up_past_its_time_limit_stops_naming_what_is_left_and_the_rerun_removes_it() {
    let (_source, expected, db) = legacy(500);
    let (child, mut reader, _pid) =
        hold_the_concurrent_build_reading(&db, &CONFIRM, "issued_coupons");
    let signalled = Instant::now();
    send(&child, "TERM");
    let r = finish(child, Duration::from_secs(60), "apply");
    let took = signalled.elapsed();
    eprintln!("after SIGTERM, the reader held:\n{}", r.stderr);
    assert_eq!(r.code, 1, "{}", r.both());
    // The limit is 20 s; the rest is the test's own scheduling on a loaded machine.
    assert!(
        took < Duration::from_secs(22),
        "stopped within the 20 s limit ({took:?})"
    );
    assert!(
        r.stderr
            .contains("its INVALID index issued_coupons_by_member could not be dropped")
            && r.stderr
                .contains(&format!("`{CONTINUE}` drops it and builds it again")),
        "stderr names what is left and the command that cleans it:\n{}",
        r.stderr
    );
    assert_eq!(
        db.invalid_indexes(),
        1,
        "the INVALID index is left, as reported"
    );
    reader.batch_execute("COMMIT").unwrap();
    let rerun = rerun_completes(&db, &expected);
    assert!(
        rerun.contains("index issued_coupons_by_member exists but is INVALID"),
        "{rerun}"
    );
}

/// The batch in flight waits on a lock that is never let go (under `--lock-timeout 60s`):
/// 20 s after the signal pgmend stops waiting, says so, and exits 1; the server rolls the
/// batch back, and the rerun resumes from the last committed one.
#[test]
fn a_batch_that_cannot_end_is_cut_off_at_the_limit_and_rolled_back() {
    let (_source, expected, db) = legacy(1000);
    let (child, holder, _pid, run_id, checkpoint) = hold_in_the_middle_of_a_batch(&db.conninfo());
    let signalled = Instant::now();
    send(&child, "TERM");
    let r = finish(child, Duration::from_secs(60), "apply");
    let took = signalled.elapsed();
    drop(holder);
    eprintln!("after SIGTERM, the batch held:\n{}", r.stderr);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        took >= Duration::from_secs(19) && took < Duration::from_secs(22),
        "cut off at the 20 s limit ({took:?})"
    );
    assert!(
        r.stderr.contains(
            "pgmend: stopped: the clean-up after SIGTERM did not end within 20 s; stopping now"
        ) && r.stderr.contains(&format!("Continue with: {CONTINUE}")),
        "{}",
        r.stderr
    );
    assert_whole_batches(&db.conninfo(), run_id, checkpoint, true);
    assert_clean_and_rerun_completes(&db, &expected);
}

// ---------------------------------------------------------------------------------------
// A second signal: at once, with the shell's code, saying what is left.

#[test]
fn a_second_sigterm_in_the_guard_window_exits_143_naming_the_guard_and_the_rerun_drops_it() {
    let (_source, expected, db) = late_duplicate();
    let (child, holder) = hold_in_the_guard_window(&db, false);
    send(&child, "TERM");
    thread::sleep(Duration::from_millis(300));
    send(&child, "TERM");
    let r = finish(child, Duration::from_secs(30), "apply");
    drop(holder);
    eprintln!("after two SIGTERMs in the guard window:\n{}", r.stderr);
    assert_eq!(r.code, 143, "{}", r.both());
    assert!(
        r.stderr.contains(&format!(
            "the guard trigger \"{GUARD}\" may remain on public.issued_coupons"
        )) && r.stderr.contains("`pgmend apply --yes` drops it")
            && r.stderr.contains(CONTINUE),
        "stderr names the guard left and how it goes:\n{}",
        r.stderr
    );
    assert_eq!(guards(&db), 1, "the guard is still there, as reported");
    // The batch in flight was rolled back by the server: the late duplicate is not marked.
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM issued_coupons WHERE coupon_id = '{LATE}' AND legacy_duplicate"
        )),
        0
    );
    let rerun = rerun_completes(&db, &expected);
    assert!(
        rerun.contains(&format!(
            "dropped the guard trigger \"{GUARD}\" on issued_coupons, left by an interrupted release"
        )),
        "{rerun}"
    );
}

#[test]
fn a_second_sigint_in_a_batch_exits_130_and_the_rerun_resumes() {
    let (_source, expected, db) = legacy(1000);
    let (child, holder, _pid, run_id, checkpoint) = hold_in_the_middle_of_a_batch(&db.conninfo());
    send(&child, "INT");
    thread::sleep(Duration::from_millis(300));
    send(&child, "INT");
    let r = finish(child, Duration::from_secs(30), "apply");
    drop(holder);
    assert_eq!(r.code, 130, "{}", r.both());
    assert!(
        r.stderr.contains("SIGINT again: stopping at once")
            && r.stderr.contains("Nothing else is left behind")
            && r.stderr.contains(CONTINUE),
        "{}",
        r.stderr
    );
    assert_whole_batches(&db.conninfo(), run_id, checkpoint, true);
    assert_clean_and_rerun_completes(&db, &expected);
}

#[test]
fn a_second_sighup_during_a_build_exits_129_naming_the_index() {
    let (_source, expected, db) = legacy(500);
    let (child, mut reader, _pid) = hold_the_concurrent_build(&db, &CONFIRM);
    send(&child, "HUP");
    thread::sleep(Duration::from_millis(300));
    send(&child, "HUP");
    let r = finish(child, Duration::from_secs(30), "apply");
    eprintln!("after two SIGHUPs during the build:\n{}", r.stderr);
    assert_eq!(r.code, 129, "{}", r.both());
    assert!(
        r.stderr.contains(&format!(
            "the index issued_coupons_by_member of V3__coupons_by_member, whose CONCURRENTLY build was under way, may remain INVALID; `{CONTINUE}` drops it and builds it again"
        )),
        "{}",
        r.stderr
    );
    reader.batch_execute("COMMIT").unwrap();
    // Whatever the server did with the cut-off build (an INVALID index, or none), the rerun
    // ends where an uninterrupted run does.
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
    assert_eq!(db.invalid_indexes(), 0);
}

/// `migrate apply` stops the same way, naming its own command.
#[test]
fn sigterm_during_migrate_apply_cancels_the_build_and_names_migrate_apply() {
    let db = fresh_db();
    db.make_legacy_baselined(500);
    let (child, mut reader, _pid) = hold_the_concurrent_build(&db, &["migrate", "apply", "--yes"]);
    send(&child, "TERM");
    thread::sleep(Duration::from_millis(1500));
    reader.batch_execute("COMMIT").unwrap();
    let r = finish(child, Duration::from_secs(60), "migrate apply");
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("Continue with: pgmend migrate apply --yes"),
        "{}",
        r.stderr
    );
    assert_eq!(db.invalid_indexes(), 0);
    assert!(!db.exists("issued_coupons_by_member"));
    assert_eq!(db.history().len(), 2, "V3 was not recorded");
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(db.exists("issued_coupons_by_member"));
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(db.history().len(), 3);
}
