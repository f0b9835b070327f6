//! Helpers shared by `tests/faults.rs` and `tests/signals.rs`: run the real binary as a
//! child, hold the release at a known point (in the middle of a void batch, in a concurrent
//! build waiting for an old reader), and compare its end state with an uninterrupted run's.
//! Included with `#[path]` by test binaries that also include `examples/kill_campaign.rs`
//! as `kill_campaign`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::kill_campaign::{self, differences, end_state, EndState, CONFIRM};

/// `pg_ctl ARGS` on `pg`'s data directory, as the server's user when the tests run as root.
pub fn pg_ctl(pg: &pgmend::localpg::LocalPg, args: &[&str]) {
    let pg_ctl = pg.bin_dir.join("pg_ctl");
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut c = if root {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
        c
    } else {
        std::process::Command::new(&pg_ctl)
    };
    let out = c
        .arg("-D")
        .arg(pg.data_dir())
        .arg("-l")
        .arg(pg.root.join("server.log"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Holds a coupon of the middle duplicate group FOR SHARE in an open transaction, so that the
/// void batch that reaches the group waits for it inside its transaction.
pub const HOLD_THE_MIDDLE_GROUP: &str = "BEGIN; SELECT 1 FROM issued_coupons WHERE (campaign_id, member_id) =
   (SELECT campaign_id, member_id FROM issued_coupons GROUP BY 1, 2 HAVING count(*) > 1
     ORDER BY 1, 2 LIMIT 1 OFFSET (SELECT count(*) / 2 FROM (SELECT 1 FROM issued_coupons
                                    GROUP BY campaign_id, member_id HAVING count(*) > 1) g)) FOR SHARE";

/// A server of its own with durable commits, as in production (the throwaway default,
/// synchronous_commit off, lets an immediate shutdown lose the last commits), holding the
/// legacy data for 2,000 members as `faulty`, and the end state of an uninterrupted release on
/// a copy of the same data.
pub fn durable_server_with_faulty_copy() -> (pgmend::localpg::LocalPg, EndState) {
    let pg =
        pgmend::localpg::LocalPg::start_with(false, &[], &[("synchronous_commit", "on")]).unwrap();
    let conn = |db: &str| pg.conninfo(db);
    kill_campaign::create_legacy_source(&exe(), &conn, "src", 2000).unwrap();
    kill_campaign::copy_database(&conn, "src", "reference").unwrap();
    let r = kill_campaign::run_pgmend(&exe(), &conn("reference"), &CONFIRM).unwrap();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let expected = end_state(&exe(), &conn("reference")).unwrap();
    kill_campaign::copy_database(&conn, "src", "faulty").unwrap();
    (pg, expected)
}

pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pgmend"))
}

/// Waits for `child` for up to `limit` (a deadlock shows as a timeout); returns its exit
/// code, stdout and stderr.
pub fn finish(mut child: Child, limit: Duration, what: &str) -> Run {
    // Read both pipes while waiting: a full pipe would block the child.
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "{what} did not finish within {limit:?} (deadlock?):\n{}",
                stderr.join().unwrap()
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

pub fn spawn(exe: &Path, conninfo: &str, args: &[&str]) -> Child {
    kill_campaign::pgmend(exe, conninfo)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub fn confirm_with(extra: &[&str]) -> Vec<String> {
    CONFIRM.iter().chain(extra).map(|s| s.to_string()).collect()
}

pub fn assert_same(expected: &EndState, got: &EndState) {
    let diff = differences(expected, got);
    assert!(
        diff.is_empty(),
        "the end state differs from the uninterrupted run's:\n{}",
        diff.join("\n")
    );
}

/// The end state of an uninterrupted release on a copy of `source`.
pub fn reference(source: &TestDb) -> EndState {
    let db = copy_of(source);
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    end_state(&exe(), &db.conninfo()).unwrap()
}

pub fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Starts the release on a database at V3 and holds it in the middle of a void batch,
/// without depending on timing: a session first holds a coupon of the middle duplicate group
/// FOR SHARE, so the batch that reaches that group waits in its `FOR UPDATE` (earlier
/// batches have committed); then `holder` takes FOR SHARE on the run's row and the coupon
/// is let go, so that batch writes its coupons and ledger records and waits again, on its
/// checkpoint UPDATE. Returns the child, the holder (its transaction open), the pid of the
/// waiting backend, the run and its committed checkpoint.
pub fn hold_in_the_middle_of_a_batch(conninfo: &str) -> (Child, postgres::Client, i32, i64, i64) {
    let out = kill_campaign::run_pgmend(
        &exe(),
        conninfo,
        &["migrate", "apply", "--yes", "--target", "3"],
    )
    .unwrap();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut coupon = kill_campaign::connect(conninfo).unwrap();
    coupon.batch_execute(HOLD_THE_MIDDLE_GROUP).unwrap();
    let child = spawn(
        &exe(),
        conninfo,
        &confirm_with(&["--batch-target", "5ms", "--lock-timeout", "60s"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let mut watch = kill_campaign::connect(conninfo).unwrap();
    let waiting_on = |watch: &mut postgres::Client, pattern: &str| -> Option<i32> {
        watch
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgmend'
                    AND wait_event_type = 'Lock' AND query LIKE $1",
                &[&pattern],
            )
            .unwrap()
            .map(|r| r.get(0))
    };
    poll(
        "a void batch waiting for the held coupon",
        Duration::from_secs(60),
        || waiting_on(&mut watch, "%FOR UPDATE%"),
    );
    let (run_id, checkpoint): (i64, i64) = {
        let r = watch
            .query_one(
                "SELECT run_id, checkpoint FROM pgmend.repair_runs WHERE repair = 'void-duplicate-coupons' AND state = 'running'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(checkpoint > 0, "earlier batches have committed");
    let mut holder = kill_campaign::connect(conninfo).unwrap();
    holder.batch_execute("BEGIN").unwrap();
    holder
        .query_one(
            "SELECT checkpoint FROM pgmend.repair_runs WHERE run_id = $1 FOR SHARE",
            &[&run_id],
        )
        .unwrap();
    coupon.batch_execute("COMMIT").unwrap();
    let pid = poll(
        "the batch waiting on its checkpoint UPDATE, its coupons written",
        Duration::from_secs(60),
        || waiting_on(&mut watch, "%SET checkpoint%"),
    );
    (child, holder, pid, run_id, checkpoint)
}

/// After a fault: the run is still `running`, its checkpoint is where the last committed
/// batch left it (`checkpoint`, or one batch further), and its ledger holds exactly the
/// coupons marked.
pub fn assert_whole_batches(conninfo: &str, run_id: i64, checkpoint: i64, exact: bool) {
    let mut c = kill_campaign::connect(conninfo).unwrap();
    let row = c
        .query_one(
            "SELECT state, checkpoint, (SELECT count(*) FROM pgmend.ledger_records WHERE run_id = $1),
                    (SELECT count(*) FROM issued_coupons WHERE legacy_duplicate)
               FROM pgmend.repair_runs WHERE run_id = $1",
            &[&run_id],
        )
        .unwrap();
    let (state, now, ledger, marked): (String, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(state, "running");
    // Across a restart the batch in flight can commit whole when the holder's session
    // ends a moment before pgmend's (a shutdown signals every backend at once). What
    // never happens is half a batch, or a committed batch lost (the restart tests run with
    // synchronous_commit on): the ledger still matches the marked coupons. `exact` asks
    // for the rollback where no such race is possible.
    if exact {
        assert_eq!(now, checkpoint, "the batch in flight was rolled back whole");
    } else {
        assert!(now >= checkpoint, "a committed batch survives the restart");
    }
    assert_eq!(
        ledger, marked,
        "every committed batch is whole: one ledger record per marked coupon"
    );
    assert_checkpoint_in_step(&mut c, run_id);
}

/// The run's checkpoint and counts are those of its committed batches, to the row: its
/// `changed` is its number of ledger records and its `processed` its checkpoint; no ledger
/// record belongs to a target past the checkpoint; and exactly the targets up to the
/// checkpoint have one live coupon left (those past it still have their duplicates). A
/// checkpoint committed apart from its batch's changes breaks this when a fault falls
/// between the two.
pub fn assert_checkpoint_in_step(c: &mut postgres::Client, run_id: i64) {
    let ranges: bool = c
        .query_one(
            "SELECT target_ranges FROM pgmend.repair_runs WHERE run_id = $1",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    if ranges {
        return assert_range_checkpoint_in_step(c, run_id);
    }
    let row = c
        .query_one(
            "WITH r AS (SELECT * FROM pgmend.repair_runs WHERE run_id = $1),
                  groups AS (SELECT ARRAY[campaign_id, member_id] AS key,
                                    count(*) FILTER (WHERE NOT legacy_duplicate) AS live
                               FROM issued_coupons GROUP BY campaign_id, member_id)
             SELECT r.checkpoint, r.processed, r.changed,
                    (SELECT count(*) FROM pgmend.ledger_records l WHERE l.run_id = r.run_id),
                    (SELECT count(*) FROM pgmend.ledger_records l
                       JOIN issued_coupons i ON i.coupon_id = (l.row_key->>'coupon_id')::uuid
                       JOIN pgmend.repair_targets t ON t.run_id = l.run_id AND t.key = ARRAY[i.campaign_id, i.member_id]
                      WHERE l.run_id = r.run_id AND t.seq > r.checkpoint),
                    (SELECT count(*) FROM pgmend.repair_targets t JOIN groups g USING (key)
                      WHERE t.run_id = r.run_id AND (t.seq <= r.checkpoint) <> (g.live = 1))
               FROM r",
            &[&run_id],
        )
        .unwrap();
    assert_counts_in_step(
        run_id,
        &row,
        "targets whose coupons disagree with the checkpoint (done up to it, untouched past it)",
    );
}

/// The six counts both checks read: checkpoint, processed, changed, the ledger's records,
/// records past the checkpoint, and `out_of_step` (what `out_of_step_is` says it counts).
fn assert_counts_in_step(run_id: i64, row: &postgres::Row, out_of_step_is: &str) {
    let [checkpoint, processed, changed, ledger, past, out_of_step]: [i64; 6] =
        std::array::from_fn(|i| row.get(i));
    assert_eq!(
        changed, ledger,
        "run {run_id}: repair_runs.changed counts the ledger's records (checkpoint {checkpoint})"
    );
    assert_eq!(
        processed, checkpoint,
        "run {run_id}: processed is the checkpoint"
    );
    assert_eq!(
        past, 0,
        "run {run_id}: ledger records past the checkpoint {checkpoint}"
    );
    assert_eq!(
        out_of_step, 0,
        "run {run_id}: {out_of_step_is} (checkpoint {checkpoint})"
    );
}

/// [`assert_checkpoint_in_step`] for a run that walks the groups in ranges of `member_id`:
/// the groups up to the last value of the range at the checkpoint have one live coupon left,
/// and no ledger record belongs to a group after it.
fn assert_range_checkpoint_in_step(c: &mut postgres::Client, run_id: i64) {
    let row = c
        .query_one(
            "WITH r AS (SELECT * FROM pgmend.repair_runs WHERE run_id = $1),
                  b AS (SELECT r.checkpoint > 0 AS started, t.key[1] AS up_to
                          FROM r LEFT JOIN pgmend.repair_targets t ON t.run_id = r.run_id AND t.seq = r.checkpoint),
                  groups AS (SELECT campaign_id, member_id, count(*) AS rows,
                                    count(*) FILTER (WHERE NOT legacy_duplicate) AS live,
                                    b.started AND (b.up_to IS NULL OR member_id <= b.up_to) AS done
                               FROM issued_coupons, b GROUP BY campaign_id, member_id, b.started, b.up_to)
             SELECT r.checkpoint, r.processed, r.changed,
                    (SELECT count(*) FROM pgmend.ledger_records l WHERE l.run_id = r.run_id),
                    (SELECT count(*) FROM pgmend.ledger_records l
                       JOIN issued_coupons i ON i.coupon_id = (l.row_key->>'coupon_id')::uuid
                       JOIN groups g USING (campaign_id, member_id)
                      WHERE l.run_id = r.run_id AND NOT g.done),
                    (SELECT count(*) FROM groups g WHERE g.done AND g.live > 1)
               FROM r",
            &[&run_id],
        )
        .unwrap();
    assert_counts_in_step(
        run_id,
        &row,
        "groups up to the checkpoint's last value that still hold duplicates",
    );
}

/// The rerun resumes the run and reaches the reference's end state.
pub fn rerun_resumes(conninfo: &str, expected: &EndState, password: &str) {
    let r = kill_campaign::run_pgmend(&exe(), conninfo, &CONFIRM).unwrap();
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("resuming run"),
        "the rerun resumes the interrupted run:\n{}",
        r.stderr
    );
    assert!(!r.stderr.contains(password) && !r.stdout.contains(password));
    assert_same(expected, &end_state(&exe(), conninfo).unwrap());
}

/// Starts the release on `db` (at V2) with `args` and holds it in the concurrent build of
/// V3: a reader's REPEATABLE READ transaction, opened first, makes `CREATE INDEX
/// CONCURRENTLY` wait for it. Returns the child, the reader (its transaction open) and the
/// pid of the waiting build.
pub fn hold_the_concurrent_build(db: &TestDb, args: &[&str]) -> (Child, postgres::Client, i32) {
    hold_the_concurrent_build_reading(db, args, "campaigns")
}

/// As [`hold_the_concurrent_build`], the reader having read `table` (`issued_coupons`: the
/// reader's lock on the table makes a `DROP INDEX CONCURRENTLY` wait for it too).
pub fn hold_the_concurrent_build_reading(
    db: &TestDb,
    args: &[&str],
    table: &str,
) -> (Child, postgres::Client, i32) {
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    let mut reader = db.client();
    reader
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM {table}"
        ))
        .unwrap();
    let child = spawn(&exe(), &db.conninfo(), args);
    let pid = waiting_for_a_lock(
        db,
        "the concurrent statement waiting for the old reader",
        "CREATE INDEX CONCURRENTLY%",
    );
    (child, reader, pid)
}

/// The pid of pgmend's statement matching `pattern` (ILIKE) once it waits for a lock;
/// `what` names the wait in a timeout's message.
pub fn waiting_for_a_lock(db: &TestDb, what: &str, pattern: &str) -> i32 {
    let mut watch = db.client();
    poll(what, Duration::from_secs(60), || {
        watch
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgmend'
                    AND query ILIKE $1 AND wait_event_type = 'Lock'",
                &[&pattern],
            )
            .unwrap()
            .map(|r| r.get(0))
    })
}
