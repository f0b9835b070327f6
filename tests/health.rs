//! Health signals (issue 36): batches pause while the application's sessions wait for a lock
//! and go on to the exact end state once they stop; a pause past `--health-pause-limit` stops
//! with exit 1 naming the signal, nothing half-done; a threshold the user set that the role
//! cannot read is refused (exit 2) before any change, and one pgmend chose is a one-line note;
//! every signal reads on this server; checkpoints forced with `CHECKPOINT` do not pause the
//! batches, and those that WAL written faster than `max_wal_size` causes do.
//!
//! The tests that wait for a signal by design run on one server version (the version
//! matrix skips them: `slow_tests_skipped`); every signal is read on every version.
//!
//! The tests of this binary take turns: a checkpoint is the whole cluster's, and one test's
//! forced checkpoints would pause the others' runs.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{fresh_db, slow_tests_skipped, LoginRole, Run, TestDb};

fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A database at V3 with the incident's data, and the expected end state of the void
/// (computed from the release's rule, not pgmend's SQL) in `expected_coupons`.
fn at_v3(db: &TestDb) {
    db.make_legacy_baselined(2000);
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    db.client()
        .batch_execute(
            "CREATE TABLE expected_coupons AS
               SELECT coupon_id, rn > 1 AS dup, rn > 1 AND redeemed_at IS NULL AS voided
                 FROM (SELECT coupon_id, redeemed_at, row_number() OVER (PARTITION BY campaign_id, member_id
                               ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn FROM issued_coupons) x;
             CREATE TABLE app_jobs (id int PRIMARY KEY, state text);
             INSERT INTO app_jobs VALUES (1, 'new');",
        )
        .unwrap();
}

/// For a test that waits for a signal by design: None where the version matrix skips it
/// (`slow_tests_skipped`), else its turn and a database at V3 ([`at_v3`]).
fn waiting_test_at_v3(name: &str) -> Option<(MutexGuard<'static, ()>, TestDb)> {
    if slow_tests_skipped(name) {
        return None;
    }
    let turn = one_at_a_time();
    let db = fresh_db();
    at_v3(&db);
    Some((turn, db))
}

/// Coupons whose marks differ from the expected end state.
fn differences(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM expected_coupons e JOIN issued_coupons i USING (coupon_id)
          WHERE (e.dup, e.voided) IS DISTINCT FROM (i.legacy_duplicate, i.voided_at IS NOT NULL)",
    )
}

fn marked(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM issued_coupons WHERE legacy_duplicate OR voided_at IS NOT NULL",
    )
}

/// The application: one session holds a row of `app_jobs` (a table pgmend never touches)
/// while two others wait for it; dropping the holder's `release` sender commits it.
struct LockQueue {
    release: std::sync::mpsc::Sender<()>,
    threads: Vec<thread::JoinHandle<()>>,
}

fn lock_queue(db: &TestDb) -> LockQueue {
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let mut holder = db.client();
    holder
        .batch_execute("BEGIN; UPDATE app_jobs SET state = 'held' WHERE id = 1")
        .unwrap();
    let mut threads = vec![thread::spawn(move || {
        let _ = hold.recv();
        holder.batch_execute("COMMIT").unwrap();
    })];
    for _ in 0..2 {
        let mut waiter = db.client();
        threads.push(thread::spawn(move || {
            waiter
                .batch_execute("UPDATE app_jobs SET state = 'done' WHERE id = 1")
                .unwrap();
        }));
    }
    // Both waiters queue, and wait past the default --max-lock-wait of 1s.
    let started = Instant::now();
    while db.scalar_i64("SELECT count(*) FROM pg_locks WHERE NOT granted") < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiters never queued"
        );
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(1200));
    LockQueue { release, threads }
}

impl LockQueue {
    fn end(self) {
        drop(self.release);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

/// pgmend started with `args`, its output collected: under `--jobs auto`, the default, when
/// `auto` (the controller's tests), else on one stream of batches as the tests' runs are.
fn started(db: &TestDb, auto: bool, args: &[&str]) -> std::process::Child {
    let mut command = db.pgmend();
    if auto {
        command.env_remove("PGMEND_JOBS");
    }
    command
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_count(db: &TestDb) -> (i64, i64) {
    let mut c = db.client();
    let row = c
        .query_one(
            "SELECT count(*), coalesce(sum(checkpoint), 0)::bigint FROM pgmend.repair_runs",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn batches_pause_while_application_sessions_wait_for_a_lock_and_end_exact_once_they_stop() {
    // It waits for the signal by design: one server version is enough.
    let Some((_turn, db)) = waiting_test_at_v3(
        "batches_pause_while_application_sessions_wait_for_a_lock_and_end_exact_once_they_stop",
    ) else {
        return;
    };
    let queue = lock_queue(&db);
    let child = started(
        &db,
        false,
        &["repair", "apply", "void-duplicate-coupons", "--yes"],
    );
    thread::sleep(Duration::from_secs(3));
    assert_eq!(
        marked(&db),
        0,
        "no batch may commit while the application waits"
    );
    queue.end();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let pausing: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pausing:"))
        .collect();
    assert_eq!(pausing.len(), 1, "announced once:\n{stderr}");
    assert!(
        pausing[0].starts_with(
            "pausing: 2 sessions of the application wait for a lock, the longest for "
        ) && pausing[0].ends_with("(--max-lock-wait 1s)"),
        "{stderr}"
    );
    assert!(stderr.contains("resuming after a pause of"), "{stderr}");
    assert!(marked(&db) > 0);
    assert_eq!(differences(&db), 0, "{stderr}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM app_jobs WHERE state = 'done'"),
        1,
        "the application's waiters went first"
    );
}

#[test]
fn a_pause_past_the_limit_stops_with_exit_1_naming_the_signal_and_the_rerun_ends_exact() {
    // It waits for the signal by design: one server version is enough.
    let Some((_turn, db)) = waiting_test_at_v3(
        "a_pause_past_the_limit_stops_with_exit_1_naming_the_signal_and_the_rerun_ends_exact",
    ) else {
        return;
    };
    let queue = lock_queue(&db);
    let started = Instant::now();
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--health-pause-limit",
        "2s",
    ]);
    let took = started.elapsed();
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("pgmend: stopped:")
            && r.stderr.contains("on the application's lock waits, the limit (--health-pause-limit 2s): 2 sessions of the application wait for a lock")
            && r.stderr.contains("--max-lock-wait"),
        "{}",
        r.both()
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Nothing half-done: the run is frozen, no batch committed, no coupon marked.
    assert_eq!(run_count(&db), (1, 0));
    assert_eq!(marked(&db), 0);
    queue.end();
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.contains("resuming run"), "{}", r.both());
    assert_eq!(differences(&db), 0);
}

/// The tables' owner, not a member of pg_read_all_stats: other sessions' rows of
/// pg_stat_replication and pg_stat_progress_vacuum show it NULLs.
fn owner(db: &TestDb) -> LoginRole {
    LoginRole::create(
        db,
        "owner",
        "Owner-Pass-36",
        "GRANT CONNECT, CREATE ON DATABASE {db} TO {role};
         GRANT CREATE ON SCHEMA public TO {role};
         ALTER TABLE campaigns OWNER TO {role};
         ALTER TABLE issued_coupons OWNER TO {role};
         ALTER TABLE refinery_schema_history OWNER TO {role};",
    )
}

fn notes(r: &Run) -> Vec<&str> {
    r.stderr
        .lines()
        .filter(|l| l.starts_with("note:") && l.contains("is not watched"))
        .collect()
}

#[test]
fn a_threshold_set_that_the_role_cannot_read_is_refused_before_any_change_and_a_default_is_a_note()
{
    let _turn = one_at_a_time();
    let db = fresh_db();
    db.make_legacy_baselined(2000);
    let owner = owner(&db);
    let r = owner.run(&db, &["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let before = common::snapshot(&db);
    for (args, option) in [
        (["--max-replica-lag", "10s"], "--max-replica-lag 10s"),
        (["--autovacuum-pause", "any"], "--autovacuum-pause any"),
    ] {
        let mut all = vec!["repair", "apply", "void-duplicate-coupons", "--yes"];
        all.extend(args);
        let r = owner.run(&db, &all);
        assert_eq!(r.code, 2, "{}", r.both());
        assert!(
            r.stderr
                .contains(&format!("pgmend: error: {option}: the role {}", owner.name))
                && r.stderr.contains("pg_read_all_stats")
                && r.stderr
                    .contains(&format!("GRANT pg_monitor TO {}", owner.name))
                && r.stderr.contains("nothing was changed"),
            "{}",
            r.both()
        );
        assert_eq!(common::snapshot(&db), before, "{option} changed something");
    }

    // pgmend's own choice: autovacuum is a note, once; replica lag none (no replica is
    // connected); the run goes on to the exact end state.
    let r = owner.run(&db, &["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let said = notes(&r);
    assert_eq!(said.len(), 1, "{}", r.both());
    assert!(
        said[0].starts_with("note: autovacuum on a repaired table is not watched: the role ")
            && said[0].ends_with("or --autovacuum-pause off to silence this note"),
        "{}",
        r.both()
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                    GROUP BY campaign_id, member_id HAVING count(*) > 1) g"
        ),
        0
    );
    // Switched off, no note.
    let r = owner.run(
        &db,
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--autovacuum-pause",
            "off",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(notes(&r).is_empty(), "{}", r.both());

    // The rest of the release, four repair steps: the note once, not at every step.
    let r = owner.run(
        &db,
        &["apply", "--yes", "--confirm", "deploy-new-application"],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.matches("\n== step ").count() >= 4, "{}", r.both());
    assert_eq!(notes(&r).len(), 1, "{}", r.both());
}

/// The server's requested-checkpoints counter.
fn requested_checkpoints(db: &TestDb) -> i64 {
    if db.scalar_i64("SELECT current_setting('server_version_num')::bigint") >= 170_000 {
        db.scalar_i64("SELECT num_requested FROM pg_stat_checkpointer")
    } else {
        db.scalar_i64("SELECT checkpoints_req FROM pg_stat_bgwriter")
    }
}

/// `max_wal_size` at its least (two segments) while it lives: the server requests a
/// checkpoint every 17 MB or so of WAL. The tests of this binary take turns.
struct SmallMaxWalSize(postgres::Client);

impl SmallMaxWalSize {
    fn set(db: &TestDb) -> SmallMaxWalSize {
        let mut c = db.client();
        c.batch_execute("ALTER SYSTEM SET max_wal_size = '32MB'")
            .unwrap();
        c.batch_execute("SELECT pg_reload_conf()").unwrap();
        SmallMaxWalSize(c)
    }
}

impl Drop for SmallMaxWalSize {
    fn drop(&mut self) {
        let _ = self.0.batch_execute("ALTER SYSTEM RESET max_wal_size");
        let _ = self.0.batch_execute("SELECT pg_reload_conf()");
    }
}

#[test]
fn every_signal_reads_on_this_server_and_only_checkpoints_the_wal_causes_pause_the_batches() {
    let _turn = one_at_a_time();
    let db = fresh_db();
    at_v3(&db);
    // Every signal set explicitly, loose enough never to pause: each must read (as the
    // admin) without an error or a note, on every server version of the suite.
    let loose = [
        "--max-replica-lag",
        "1h",
        "--max-archive-backlog",
        "100000",
        "--autovacuum-pause",
        "any",
        "--max-requested-checkpoints",
        "1000",
        "--max-lock-wait",
        "1h",
    ];
    let copy = common::copy_of(&db);
    let mut args = vec!["repair", "apply", "void-duplicate-coupons", "--yes"];
    args.extend(loose);
    let r = copy.run(&args);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        !r.stderr.contains("note:") && !r.stderr.contains("pausing:"),
        "{}",
        r.both()
    );
    assert_eq!(differences(&copy), 0);

    // Checkpoints asked for with CHECKPOINT (as CREATE and DROP DATABASE ask for them: the
    // other tests' databases) say nothing of the WAL the batches write: they never pause.
    let storm = |sql: &'static str| {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mut c = db.client();
        let handle = thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                c.batch_execute(sql).unwrap();
                thread::sleep(Duration::from_millis(100));
            }
        });
        move || {
            stop.store(true, Ordering::SeqCst);
            handle.join().unwrap();
        }
    };
    let watched = [
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--batch-target",
        "5ms",
        "--pause",
        "300ms",
        "--max-requested-checkpoints",
        "1",
        "--health-pause-limit",
        "2s",
    ];
    let commanded = common::copy_of(&db);
    let requested_before = requested_checkpoints(&db);
    let stop = storm("CHECKPOINT");
    let r = commanded.run(&watched);
    stop();
    assert!(
        requested_checkpoints(&db) - requested_before > 1,
        "the storm requested checkpoints"
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(!r.stderr.contains("pausing:"), "{}", r.both());
    assert_eq!(differences(&commanded), 0);

    // Checkpoints the WAL makes the server request do: a small max_wal_size, and a segment
    // switched every 100 ms, pause the batches past --max-requested-checkpoints 1, and the
    // limit stops the run.
    let small = SmallMaxWalSize::set(&db);
    db.client()
        .batch_execute("CREATE TABLE wal_storm (n int)")
        .unwrap();
    let stop = storm("INSERT INTO wal_storm VALUES (1); SELECT pg_switch_wal()");
    let r = db.run(&watched);
    stop();
    drop(small);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("pausing: the server requested ")
            && r.stderr
                .contains("on requested checkpoints, the limit (--health-pause-limit 2s)"),
        "{}",
        r.both()
    );
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(differences(&db), 0);
}

#[test]
fn with_jobs_auto_a_signal_removes_workers_then_pauses_the_last_and_the_run_ends_exact() {
    // It waits for the signal by design: one server version is enough.
    let Some((_turn, db)) = waiting_test_at_v3(
        "with_jobs_auto_a_signal_removes_workers_then_pauses_the_last_and_the_run_ends_exact",
    ) else {
        return;
    };
    let queue = lock_queue(&db);
    // Slow batches (a pause after each), so that the run outlasts the controller's first
    // window; two workers to start with (the CPU unwatched: watched, the waiting application
    // would start the run with one).
    let child = started(
        &db,
        true,
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--max-jobs",
            "3",
            "--pause",
            "500ms",
            "--max-cpu-slowdown",
            "off",
        ],
    );
    let started = Instant::now();
    // The controller's first window ends at 2 s and takes a worker away; the last one pauses.
    thread::sleep(Duration::from_secs(5));
    let during = marked(&db);
    thread::sleep(Duration::from_secs(2));
    assert_eq!(
        marked(&db),
        during,
        "no batch commits while the last worker pauses"
    );
    queue.end();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(started.elapsed() > Duration::from_secs(7));
    assert!(
        stderr.contains(
            "void-duplicate-coupons: workers 2 -> 1: 2 sessions of the application wait for a lock"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("pausing: 2 sessions of the application wait for a lock"),
        "{stderr}"
    );
    assert!(stderr.contains("resuming after a pause of"), "{stderr}");
    assert_eq!(differences(&db), 0, "{stderr}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM app_jobs WHERE state = 'done'"),
        1
    );
}

#[test]
fn with_workers_a_run_paused_by_request_is_not_stopped_by_the_health_pause_limit() {
    // It waits for the signal by design: one server version is enough.
    let Some((_turn, db)) = waiting_test_at_v3(
        "with_workers_a_run_paused_by_request_is_not_stopped_by_the_health_pause_limit",
    ) else {
        return;
    };
    let mut child = started(
        &db,
        false,
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--jobs",
            "2",
            "--pause",
            "300ms",
            "--health-pause-limit",
            "3s",
        ],
    );
    let started = Instant::now();
    let run_id = loop {
        // pgmend's schema may not exist yet.
        let id: Option<i64> = db
            .client()
            .query_one(
                "SELECT max(run_id) FROM pgmend.repair_runs WHERE state = 'running'",
                &[],
            )
            .ok()
            .and_then(|r| r.get(0));
        if let Some(id) = id {
            break id;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        thread::sleep(Duration::from_millis(20));
    };
    let r = db.run(&["repair", "pause", &run_id.to_string()]);
    assert_eq!(r.code, 0, "{}", r.both());
    // The application waits on a lock meanwhile, longer than the limit: the run was paused by
    // a person, so that pause is not the server's and is not cut off.
    let queue = lock_queue(&db);
    thread::sleep(Duration::from_secs(5));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the paused run is still there"
    );
    queue.end();
    let r = db.run(&["repair", "resume", &run_id.to_string()]);
    assert_eq!(r.code, 0, "{}", r.both());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(differences(&db), 0, "{stderr}");
}

#[test]
fn with_jobs_auto_and_the_application_at_work_a_run_starts_with_one_worker() {
    let Some((_turn, db)) = waiting_test_at_v3(
        "with_jobs_auto_and_the_application_at_work_a_run_starts_with_one_worker",
    ) else {
        return;
    };
    // The application: a session running a statement nearly all the time.
    let stop = Arc::new(AtomicBool::new(false));
    let app = {
        let (mut c, stop) = (db.client(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                c.batch_execute("SELECT pg_sleep(0.05)").unwrap();
            }
        })
    };
    thread::sleep(Duration::from_millis(200));
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--jobs",
        "auto",
        "--max-jobs",
        "2",
    ]);
    stop.store(true, Ordering::Relaxed);
    app.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains(
            "void-duplicate-coupons: 1 worker, each on its own connection, over ranges of the run's targets (--jobs auto: between 1 and 2), one to start with and batches of about 100ms while the application is at work"
        ),
        "{}",
        r.stderr
    );
    assert_eq!(differences(&db), 0, "{}", r.stderr);
}

#[test]
fn with_jobs_auto_an_application_crowded_out_of_the_cpus_gets_a_worker_back_for_good() {
    // It waits for the signal by design: one server version is enough.
    let Some((_turn, db)) = waiting_test_at_v3(
        "with_jobs_auto_an_application_crowded_out_of_the_cpus_gets_a_worker_back_for_good",
    ) else {
        return;
    };
    // Slow batches (one target each, a pause after each), so that the run outlasts the
    // controller's first windows; two workers to start with, and no third. The threshold is
    // low so that a machine whose scheduler lets most probes through still shows the crowd.
    let child = started(
        &db,
        true,
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--max-jobs",
            "2",
            "--batch-target",
            "1ms",
            "--pause",
            "1s",
            "--max-cpu-slowdown",
            "1.2",
        ],
    );
    // Watched from another database: a session of the run's database busy a moment ago would
    // be the application at work as the run starts, which starts it with one worker.
    let mut watcher =
        postgres::Client::connect(&common::conninfo_for("postgres"), postgres::NoTls).unwrap();
    let started = Instant::now();
    while watcher
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'pgmend' AND backend_type = 'client backend'",
            &[&db.name],
        )
        .unwrap()
        .get::<_, i64>(0)
        < 3
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the workers never connected"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // The probe's baseline is taken before the workers connect. Then the application fills
    // the CPUs: three sessions a core adding numbers in a loop (pure CPU, no temporary files).
    let stop = Arc::new(AtomicBool::new(false));
    let cores = thread::available_parallelism().map_or(2, |n| n.get());
    let burners: Vec<_> = (0..3 * cores)
        .map(|_| {
            let (mut c, stop) = (db.client(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    c.batch_execute(
                        "DO $$ DECLARE x bigint := 0; BEGIN FOR i IN 1..3000000 LOOP x := x + i; END LOOP; END $$",
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    let out = child.wait_with_output().unwrap();
    stop.store(true, Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "void-duplicate-coupons: workers 2 -> 1: the application is at work and the server's CPUs are full (half of the last probes ran"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("workers 1 -> 2"), "{stderr}");
    assert_eq!(differences(&db), 0, "{stderr}");
}
