//! Batches pause while a streaming replica lags: a real standby (pg_basebackup -R) whose
//! replay is paused with pg_wal_replay_pause().

use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use pgmend::localpg::LocalPg;

fn pgmend(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pgmend"));
    for var in pgmend::db::conninfo::environment_variables() {
        c.env_remove(var);
    }
    c.env("PGMEND_JOBS", "1");
    c.args(args).env("DATABASE_URL", url).stdin(Stdio::null());
    c
}

#[test]
fn batches_wait_while_the_replica_lags_and_go_on_when_it_catches_up() {
    let primary = LocalPg::start(false).unwrap();
    let url = primary.url("postgres");
    let mut c = postgres::Client::connect(&primary.conninfo("postgres"), postgres::NoTls).unwrap();
    let v1 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/V1__legacy_baseline.sql"
    ))
    .unwrap();
    c.batch_execute(&v1).unwrap();
    pgmend::demo_data::generate_dirty_data(&mut c, 2000).unwrap();
    assert!(pgmend(&url, &["migrate", "baseline", "--yes"])
        .status()
        .unwrap()
        .success());
    assert!(
        pgmend(&url, &["migrate", "apply", "--yes", "--target", "3"])
            .status()
            .unwrap()
            .success()
    );

    let standby = primary.start_standby().unwrap();
    let mut s = postgres::Client::connect(&standby.conninfo("postgres"), postgres::NoTls).unwrap();
    s.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
    for _ in 0..3 {
        c.batch_execute("CREATE TABLE IF NOT EXISTS filler (x int); INSERT INTO filler SELECT generate_series(1, 10000)").unwrap();
        thread::sleep(Duration::from_millis(700));
    }
    let child = pgmend(
        &url,
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--max-replica-lag",
            "1s",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    thread::sleep(Duration::from_secs(4));
    let done: i64 = c
        .query_one("SELECT coalesce((SELECT checkpoint FROM pgmend.repair_runs WHERE repair = 'void-duplicate-coupons'), 0)", &[])
        .unwrap()
        .get(0);
    assert_eq!(done, 0, "no batch may commit while the replica lags");
    s.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("pausing: a replica is"), "{stderr}");
    let left: i64 = c
        .query_one("SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate GROUP BY campaign_id, member_id HAVING count(*) > 1) g", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 0);

    // The finance report runs on the hot standby: one read-only snapshot, nothing written.
    let out = pgmend(
        &standby.url("postgres"),
        &["report", "overruns", "--format", "json"],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["state"], "partial");
    assert_eq!(doc["campaigns"].as_array().unwrap().len(), 3);
}
