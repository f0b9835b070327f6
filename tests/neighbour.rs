//! A good neighbour (issue 16): a batch that made an application session wait for its locks
//! is counted in the run's report (and followed by a smaller batch and a pause), also when the
//! waiting session is another role's whose wait pgmend's role cannot read in
//! `pg_stat_activity`; without such a session none is counted; `--pause` spaces out every
//! stream's batches, the workers' of `--jobs` too.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{copy_of, fresh_db, LoginRole, TestDb};

/// A database at V3 with the incident's data.
fn source() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    db
}

/// Groups of coupons that still hold more than one unmarked coupon.
fn duplicate_groups(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                GROUP BY campaign_id, member_id, month HAVING count(*) > 1) g",
    )
}

fn report(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// As the admin, over and over until `stop`: a transaction that takes a SHARE lock on
/// `issued_coupons` (what a report wanting a still table does), which waits while a batch
/// that changed coupons is open. Returns how many it committed.
fn application(conninfo: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            c.batch_execute("BEGIN; LOCK TABLE issued_coupons IN SHARE MODE; COMMIT")
                .unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        n
    })
}

#[test]
fn batches_that_make_another_roles_session_wait_are_counted_and_the_run_still_ends_exact() {
    let db = source();
    // pgmend as the tables' owner, not a superuser: the admin's sessions show it no
    // wait_event_type, only pg_blocking_pids tells.
    let owner = LoginRole::create(
        &db,
        "owner",
        "Owner-Pass-3",
        "GRANT CONNECT, CREATE ON DATABASE {db} TO {role};
         GRANT CREATE ON SCHEMA public TO {role};
         ALTER TABLE campaigns OWNER TO {role};
         ALTER TABLE issued_coupons OWNER TO {role};
         ALTER TABLE refinery_schema_history OWNER TO {role};",
    );
    let r = owner.run(&db, &["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(duplicate_groups(&db) > 0);

    let stop = Arc::new(AtomicBool::new(false));
    let apps: Vec<_> = (0..2)
        .map(|_| application(db.conninfo(), stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let r = owner.run(
        &db,
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--batch-target",
            "50ms",
            "--format",
            "json",
        ],
    );
    stop.store(true, Ordering::SeqCst);
    let committed: u64 = apps.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(r.code, 0, "{}", r.both());
    let report = report(&r.stdout);
    let blocking = report["batches_blocking"]
        .as_u64()
        .expect("batches_blocking");
    let batches = report["batches"].as_u64().unwrap();
    assert!(
        blocking > 0 && blocking <= batches,
        "{blocking} of {batches} batches counted as blocking while the application ({committed} transactions) waited on them:\n{}",
        r.both()
    );
    assert!(committed > 0);
    assert_eq!(duplicate_groups(&db), 0, "{}", r.both());
}

#[test]
fn pause_spaces_out_each_streams_batches_and_nothing_waits_without_an_application() {
    let db = source();
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let copy = copy_of(&db);
    let pause = Duration::from_millis(300);
    for (target, jobs) in [(&db, 1u32), (&copy, 2)] {
        let started = Instant::now();
        let r = target.run(&[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--batch-target",
            "5ms",
            "--pause",
            "300ms",
            "--jobs",
            &jobs.to_string(),
            "--format",
            "json",
        ]);
        let took = started.elapsed();
        assert_eq!(r.code, 0, "{}", r.both());
        let report = report(&r.stdout);
        assert_eq!(report["batches_blocking"], 0, "{}", r.both());
        let batches = report["batches"].as_u64().unwrap() as u32;
        // One stream pauses after every batch but its last; of two workers, one ran at least
        // half of the batches.
        let least = pause * (batches.div_ceil(jobs).saturating_sub(1));
        assert!(
            batches >= 4 && took >= least,
            "--jobs {jobs}: {batches} batches in {took:?}, under the {least:?} their pauses take"
        );
        assert_eq!(duplicate_groups(target), 0);
    }
}
