//! The network between pgmend and the server: a path that goes silent (the forwarder in
//! `tests/common/forwarder.rs` stops passing bytes and closes nothing) in the middle of a batch,
//! with workers, and during a concurrent build; the lease of the runner lock and its fence; a
//! failover with a real streaming standby behind one multi-host URL. Each compares the end state
//! with an uninterrupted run's, and counts what the server still holds.
//!
//! The silent-path tests wait by design (pgmend's own bounds: 90 s, 60 s): they run on one
//! PostgreSQL version only (`common::slow_tests_skipped`).

mod common;

#[path = "common/held.rs"]
mod held;
#[allow(dead_code)]
#[path = "../examples/kill_campaign.rs"]
mod kill_campaign;

use std::thread;
use std::time::{Duration, Instant};

use common::forwarder::Forwarder;
use common::*;
use held::*;
use kill_campaign::{end_state, CONFIRM};

/// Rows of `pg_locks` granted to pgmend's sessions in `db` other than the runner lock:
/// row, table and transaction locks of a transaction still open on the server.
fn pgmend_locks(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
          WHERE a.datname = current_database() AND a.application_name = 'pgmend'
            AND l.granted AND l.locktype <> 'advisory' AND l.locktype <> 'virtualxid'
            AND a.pid <> pg_backend_pid()",
    )
}

/// Whether some session holds pgmend's runner lock in `db`.
fn runner_lock_held(db: &TestDb) -> bool {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND classid::bigint = ({key}::bigint >> 32) AND objid::bigint = ({key}::bigint & 4294967295)",
        key = pgmend::db::runner_lock::RUNNER_LOCK_KEY
    )) > 0
}

/// Polls `f` every 250 ms until it holds; returns how long that took, or panics after `limit`.
fn within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if f() {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        thread::sleep(Duration::from_millis(250));
    }
}

/// A baselined database of `members` members migrated to `target`, and the end state an
/// uninterrupted release reaches from the same data.
fn at_version(members: i32, target: &str) -> (TestDb, kill_campaign::EndState) {
    let source = fresh_db();
    source.make_legacy_baselined(members);
    let expected = reference(&source);
    let db = copy_of(&source);
    let out = db.run(&["migrate", "apply", "--yes", "--target", target]);
    assert_eq!(out.code, 0, "{}", out.both());
    (db, expected)
}

/// The run's committed checkpoint of the void, 0 before it starts.
fn void_checkpoint(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT coalesce(max(checkpoint), 0) FROM pgmend.repair_runs WHERE repair = 'void-duplicate-coupons'",
    )
}

/// The silent path in the middle of the void, with `extra` options: pgmend exits 2 within its
/// bound, the server lets go of its transaction and of the runner lock, and the rerun through
/// the restored path ends as an uninterrupted run.
fn silent_in_the_middle_of_the_void(
    extra: &[&str],
    hold_a_batch: bool,
    exit_within: Duration,
    says: &str,
) {
    let (db, expected) = at_version(2000, "3");
    let forwarder = Forwarder::to(&db.params);
    let through = forwarder.conninfo(&db.params);

    // Optionally hold a coupon of the middle duplicate group, so that a batch waits for it
    // inside its transaction: the silence then falls in the middle of that batch.
    let mut coupon = db.client();
    if hold_a_batch {
        coupon.batch_execute(HOLD_THE_MIDDLE_GROUP).unwrap();
    }
    // The forwarder stands between pgmend and the server as a session pooler would.
    let args: Vec<String> = confirm_with(&["--batch-target", "5ms", "--pooler", "session"])
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
    let child = spawn(
        &exe(),
        &through,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    if hold_a_batch {
        within(
            "a void batch waiting for the held coupon",
            Duration::from_secs(60),
            || {
                db.scalar_i64(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                    AND application_name = 'pgmend' AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'",
            ) > 0
            },
        );
    } else {
        within("a committed void batch", Duration::from_secs(60), || {
            db.exists("pgmend.repair_runs") && void_checkpoint(&db) > 0
        });
    }
    forwarder.silence();
    let silent_at = Instant::now();
    if hold_a_batch {
        // The batch goes on on the server, and its answers go nowhere.
        coupon.batch_execute("COMMIT").unwrap();
    }
    let checkpoint = void_checkpoint(&db);

    // The server ends pgmend's transaction and its locks within 60 s of the silence.
    let locks_gone = within(
        "pgmend's transaction ended on the server",
        Duration::from_secs(60),
        || pgmend_locks(&db) == 0,
    );
    eprintln!("pgmend's locks gone {locks_gone:?} after the silence");
    // pgmend gives up within its statement timeout plus the margin: 90 s with the defaults.
    let r = finish(
        child,
        Duration::from_secs(100),
        "apply through a silent path",
    );
    let exited = silent_at.elapsed();
    eprintln!("pgmend exited {exited:?} after the silence:\n{}", r.stderr);
    assert!(exited < exit_within, "pgmend exited after {exited:?}");
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("went silent"), "{}", r.stderr);
    assert!(r.stderr.contains(says), "{}", r.stderr);
    assert!(
        r.stderr.contains("idle_in_transaction_session_timeout"),
        "{}",
        r.stderr
    );
    assert!(!r.both().contains(&db.password()), "the password leaked");
    // The runner lock is free within 180 s, with nobody terminating anything.
    let lock_free = within("the runner lock free", Duration::from_secs(180), || {
        !runner_lock_held(&db)
    });
    eprintln!(
        "runner lock free {:?} after the silence",
        silent_at.elapsed()
    );
    let _ = lock_free;
    // Nothing half-done: every committed batch whole.
    let (ledger, marked) = (
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records"),
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate"),
    );
    assert_eq!(ledger, marked, "every committed batch is whole");
    assert!(void_checkpoint(&db) >= checkpoint);

    forwarder.restore();
    let r = kill_campaign::run_pgmend(
        &exe(),
        &through,
        &confirm_with(&["--pooler", "session"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("resuming run"), "{}", r.stderr);
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
}

#[test]
fn a_silent_path_in_the_middle_of_a_batch_ends_pgmend_and_its_locks_and_the_rerun_resumes() {
    if slow_tests_skipped("a_silent_path_in_the_middle_of_a_batch") {
        return;
    }
    // The lease's heartbeat finds the path silent within 30 s and pgmend exits 20 s later,
    // before the batch's own bound (1m + 30 s) would end it.
    silent_in_the_middle_of_the_void(&[], true, Duration::from_secs(90), "lost its lease");
}

/// With a short --statement-timeout the batch's own bound (5 s + 30 s) ends pgmend first, with
/// the connection's error: the bound follows what the wait is for.
#[test]
fn a_silent_path_ends_a_batch_at_its_statement_timeout_plus_the_margin() {
    if slow_tests_skipped("a_silent_path_ends_a_batch_at_its_statement_timeout") {
        return;
    }
    silent_in_the_middle_of_the_void(
        &["--statement-timeout", "5s"],
        true,
        Duration::from_secs(40),
        "the bound of this wait: 35s",
    );
}

#[test]
fn a_silent_path_with_three_workers_ends_pgmend_and_its_locks_and_the_rerun_resumes() {
    if slow_tests_skipped("a_silent_path_with_three_workers") {
        return;
    }
    // Pauses between batches, so that the void is still running when the path goes silent.
    silent_in_the_middle_of_the_void(
        &["--jobs", "3", "--pause", "300ms"],
        false,
        Duration::from_secs(90),
        "lost its lease",
    );
}

/// The path goes silent while pgmend waits for a concurrent build (a reader makes it wait):
/// pgmend exits within a minute and a half, the runner lock is free within 180 s, and the
/// next run finds the build still running on the server, cancels it, says so, and ends as an
/// uninterrupted run.
#[test]
fn a_silent_path_during_a_concurrent_build_frees_the_lock_and_the_next_run_cancels_the_orphan() {
    if slow_tests_skipped("a_silent_path_during_a_concurrent_build") {
        return;
    }
    let (db, expected) = at_version(500, "2");
    let forwarder = Forwarder::to(&db.params);
    let through = forwarder.conninfo(&db.params);
    let mut reader = db.client();
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM campaigns")
        .unwrap();
    let args = confirm_with(&["--build-wait", "10m", "--pooler", "session"]);
    let child = spawn(
        &exe(),
        &through,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    within(
        "the concurrent build waiting for the reader",
        Duration::from_secs(60),
        || {
            db.scalar_i64(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                AND application_name = 'pgmend' AND query ILIKE 'CREATE%INDEX CONCURRENTLY%'
                AND wait_event_type IS NOT NULL",
            ) > 0
        },
    );
    forwarder.silence();
    let silent_at = Instant::now();
    let r = finish(
        child,
        Duration::from_secs(100),
        "apply through a silent path",
    );
    let exited = silent_at.elapsed();
    eprintln!("pgmend exited {exited:?} after the silence:\n{}", r.stderr);
    assert!(
        exited < Duration::from_secs(95),
        "pgmend exited after {exited:?}"
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("went silent"), "{}", r.stderr);
    within("the runner lock free", Duration::from_secs(180), || {
        !runner_lock_held(&db)
    });
    // The orphaned build is still running on the server, waiting for the reader.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pg_stat_progress_create_index WHERE datname = current_database()"
        ),
        1,
        "the build goes on on the server after pgmend is gone"
    );
    // The next run connects directly while the old path stays silent (were it restored, the
    // server would see the gone pgmend's connection close and end the build itself). The
    // reader ends only after the next run has begun: until then the orphan keeps waiting.
    let next = spawn(&exe(), &db.conninfo(), &CONFIRM);
    thread::sleep(Duration::from_secs(3));
    reader.batch_execute("COMMIT").unwrap();
    let r = finish(next, Duration::from_secs(300), "the next run");
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains("is still running on the server") && r.stderr.contains("cancelling it"),
        "the next run says it cancels the orphaned build:\n{}",
        r.stderr
    );
    assert_eq!(db.invalid_indexes(), 0);
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
    drop(forwarder);
}

/// A worker of a pgmend whose lease has expired cannot commit a batch: once the lease's
/// session is gone (terminated here, as the server does after 60 s without a heartbeat), the
/// next batch fails its fence, nothing more is committed, and the rerun ends exact.
#[test]
fn a_worker_whose_lease_expired_cannot_commit_a_batch() {
    lease_expires_in_the_middle_of_the_void("3");
}

/// The same with one worker: the main session's own batches are fenced too.
#[test]
fn a_batch_of_a_pgmend_whose_lease_expired_cannot_commit() {
    lease_expires_in_the_middle_of_the_void("1");
}

fn lease_expires_in_the_middle_of_the_void(jobs: &str) {
    let (db, expected) = at_version(2000, "3");
    let args = confirm_with(&["--jobs", jobs, "--batch-target", "5ms", "--pause", "200ms"]);
    let mut child = spawn(
        &exe(),
        &db.conninfo(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // The lease, the session that holds the runner lock in this database (the other tests'
    // pgmends hold the same key in theirs), read as soon as pgmend holds it; a pgmend that
    // ends before a void batch committed is a finding, said with its output.
    let lease_sql = format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND classid::bigint = ({key}::bigint >> 32) AND objid::bigint = ({key}::bigint & 4294967295)",
        key = pgmend::db::runner_lock::RUNNER_LOCK_KEY
    );
    let mut lease: Option<i32> = None;
    let mut ended = false;
    within("a committed void batch", Duration::from_secs(60), || {
        ended = child.try_wait().unwrap().is_some();
        lease = lease.or_else(|| {
            db.client()
                .query_opt(&lease_sql, &[])
                .unwrap()
                .map(|r| r.get(0))
        });
        ended || (lease.is_some() && db.exists("pgmend.repair_runs") && void_checkpoint(&db) > 0)
    });
    if ended {
        let r = finish(child, Duration::from_secs(10), "apply");
        panic!("pgmend ended before its lease could be ended: {}", r.both());
    }
    let lease = lease.expect("read above");
    let mut admin = db.client();
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&lease])
        .unwrap()
        .get(0);
    assert!(terminated);
    within("the lease's session gone", Duration::from_secs(10), || {
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {lease}"
        )) == 0
    });
    // Every ledger record carries its transaction's start (`now()`): a batch whose fence
    // passed before the lease ended may still commit, none that started after it does.
    let gone_at: String = admin
        .query_one("SELECT clock_timestamp()::text", &[])
        .unwrap()
        .get(0);
    let r = finish(
        child,
        Duration::from_secs(60),
        "apply after its lease expired",
    );
    eprintln!("{}", r.stderr);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("lease"), "{}", r.stderr);
    let late: i64 = admin
        .query_one(
            "SELECT count(DISTINCT at) FROM pgmend.ledger_records WHERE at > $1::text::timestamptz",
            &[&gone_at],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        late, 0,
        "batches that started after the lease expired committed"
    );
    rerun_resumes(&db.conninfo(), &expected, &db.password());
}

/// Failover with a real streaming standby behind one URL that lists both servers with
/// `target_session_attrs=read-write`: the primary stopped (immediate) in the middle of the
/// void, the standby promoted; pgmend exits 2, and the rerun with the same URL finds the new
/// primary by itself, redoes what the old one lost, and ends as an uninterrupted run.
#[test]
fn after_a_failover_the_rerun_with_a_multi_host_url_finds_the_new_primary_and_ends_exact() {
    let (primary, expected) = durable_server_with_faulty_copy();
    let exe = exe();

    let standby = primary.start_standby().unwrap();
    let both = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user={} password={} dbname=faulty sslmode=disable target_session_attrs=read-write",
        primary.port, standby.port, primary.superuser, primary.password
    );
    let (child, holder, _pid, _run_id, checkpoint) = hold_in_the_middle_of_a_batch(&both);
    assert!(checkpoint > 0);
    pg_ctl(&primary, &["stop", "-m", "immediate", "-w", "-t", "60"]);
    drop(holder);
    let r = finish(child, Duration::from_secs(60), "apply");
    eprintln!("after the primary stopped:\n{}", r.stderr);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(!r.both().contains(&primary.password), "the password leaked");
    pg_ctl(&standby, &["promote", "-w", "-t", "60"]);

    let r = kill_campaign::run_pgmend(&exe, &both, &CONFIRM).unwrap();
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("resuming run"), "{}", r.stderr);
    assert!(
        !r.stdout.contains(&primary.password) && !r.stderr.contains(&primary.password),
        "the password leaked"
    );
    assert_same(
        &expected,
        &end_state(&exe, &standby.conninfo("faulty")).unwrap(),
    );
}

/// The bound itself, fast: through a silenced forwarder a query fails once the thread's bound
/// has passed (here 2 s), as a lost connection, and not before; a live path is unaffected.
#[test]
fn a_query_through_a_silent_path_fails_after_its_bound() {
    let db = fresh_db();
    let forwarder = Forwarder::to(&db.params);
    let params =
        pgmend::db::conninfo::resolve(Some(&forwarder.conninfo(&db.params)), &|_| None).unwrap();
    let mut session = pgmend::db::connect(&params).unwrap();
    let _bound = pgmend::db::deadline::at_most(Duration::from_secs(2));
    // Idle longer than the bound first: a wait starts when pgmend waits, not before.
    thread::sleep(Duration::from_secs(3));
    session.client.batch_execute("SELECT 1").unwrap();
    forwarder.silence();
    let started = Instant::now();
    let error = session.client.batch_execute("SELECT 1").unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert!(pgmend::db::deadline::is_silent_path(&error), "{error:?}");
    let described = pgmend::error::describe(&error).to_string();
    assert!(described.contains("went silent"), "{described}");
    assert!(session.client.is_closed());
}
