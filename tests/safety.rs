//! Bounded lock waits: while another session holds a transaction on issued_coupons, apply
//! waits in short, bounded attempts, and the application's queries keep answering.

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Holds a transaction that read issued_coupons (ACCESS SHARE) for `hold`, while a probe
/// reads the table every 20 ms. Returns (pgmend's run, how long it took, the probe's
/// longest wait).
fn apply_while_a_transaction_holds_the_table(
    db: &TestDb,
    hold: Duration,
    retry_for: &str,
) -> (Run, Duration, Duration) {
    db.make_legacy();
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);

    let mut holder = db.client();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let holder_thread = thread::spawn(move || {
        let mut tx = holder.transaction().unwrap();
        tx.query("SELECT count(*) FROM issued_coupons", &[])
            .unwrap();
        ready_tx.send(()).unwrap();
        thread::sleep(hold);
        tx.commit().unwrap();
    });
    ready_rx.recv().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        let mut c = db.client();
        thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                c.query_one("SELECT count(*) FROM issued_coupons", &[])
                    .unwrap();
                longest = longest.max(t.elapsed());
                thread::sleep(Duration::from_millis(20));
            }
            longest
        })
    };

    let started = Instant::now();
    let out = db
        .pgmend()
        .args([
            "migrate",
            "apply",
            "--yes",
            "--lock-timeout",
            "500ms",
            "--lock-retry-for",
            retry_for,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let longest = probe.join().unwrap();
    holder_thread.join().unwrap();
    let run = Run {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    assert!(!run.both().contains(&db.password()));
    eprintln!("apply took {took:?}; the probe's longest wait was {longest:?}");
    (run, took, longest)
}

#[test]
fn apply_retries_until_the_blocking_transaction_ends_and_the_application_keeps_answering() {
    let db = fresh_db();
    let (run, took, longest) =
        apply_while_a_transaction_holds_the_table(&db, Duration::from_secs(10), "60s");
    assert_eq!(run.code, 0, "{}", run.both());
    assert!(
        took >= Duration::from_secs(8),
        "apply cannot finish before the holder commits: {took:?}"
    );
    assert!(
        run.stderr.contains("55P03"),
        "the retries are logged: {}",
        run.stderr
    );
    assert!(longest < Duration::from_secs(2), "probe waited {longest:?}");
    assert!(db.exists("campaign_budgets"));
    assert_eq!(db.history().len(), 2);
}

#[test]
fn apply_stops_with_exit_1_when_the_retry_budget_is_shorter_than_the_blocker() {
    let db = fresh_db();
    let (run, took, longest) =
        apply_while_a_transaction_holds_the_table(&db, Duration::from_secs(10), "3s");
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
