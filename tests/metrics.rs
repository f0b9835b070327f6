//! `verify` and `repair status` in the OpenMetrics text format, read back by a real parser
//! (Python's `prometheus_client`), with figures equal to their JSON documents; `--output`
//! written atomically on exit 0, 1 and 2 alike, the last success kept when the check could
//! not run.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

type Sample = (String, BTreeMap<String, String>, f64);

/// The samples of an OpenMetrics text, as `prometheus_client`'s OpenMetrics parser reads them
/// (it refuses a text that breaks the format).
fn parse(text: &str) -> Vec<Sample> {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import json, sys\n\
             from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
             out = [[s.name, s.labels, s.value] for f in text_string_to_metric_families(sys.stdin.read()) for s in f.samples]\n\
             print(json.dumps(out))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (with prometheus_client: python3 -m pip install prometheus-client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the text:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
}

/// Every check of `verify --format json`, as (name, kind, ok, violations).
fn json_checks(db: &TestDb) -> Vec<(String, &'static str, bool, i64)> {
    let r = db.run(&["verify", "--format", "json"]);
    let v: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.both()));
    let mut out = Vec::new();
    for (kind, key) in [("invariant", "checks"), ("anomaly", "anomalies")] {
        for c in v[key].as_array().unwrap() {
            out.push((
                c["name"].as_str().unwrap().to_string(),
                kind,
                c["ok"].as_bool().unwrap(),
                c["violations"].as_i64().unwrap(),
            ));
        }
    }
    out
}

fn assert_same_as_json(db: &TestDb, samples: &[Sample]) {
    let checks = json_checks(db);
    assert!(checks.len() >= 8, "{checks:?}");
    for (name, kind, ok, violations) in &checks {
        let labels = [
            ("release", "coupon-incident"),
            ("check", name.as_str()),
            ("kind", kind),
        ];
        assert_eq!(
            value(samples, "pgmend_verify_check_ok", &labels),
            Some(if *ok { 1.0 } else { 0.0 }),
            "{name}"
        );
        assert_eq!(
            value(samples, "pgmend_verify_check_violations", &labels),
            Some(*violations as f64),
            "{name}"
        );
    }
    let checks_in_metrics = samples
        .iter()
        .filter(|s| s.0 == "pgmend_verify_check_ok")
        .count();
    assert_eq!(checks_in_metrics, checks.len());
}

#[test]
fn verify_as_openmetrics_parses_and_says_what_verify_json_says_on_exit_0_1_and_2() {
    let db = fresh_db();
    db.make_legacy_baselined(300);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());

    // To stdout, exit 0.
    let r = db.run(&["verify", "--format", "openmetrics"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let samples = parse(&r.stdout);
    assert_eq!(
        value(
            &samples,
            "pgmend_verify_up",
            &[("release", "coupon-incident")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "pgmend_verify_invariants_hold", &[]),
        Some(1.0)
    );
    assert_same_as_json(&db, &samples);

    // A counter changed by hand: exit 1, the file written all the same, the check failing
    // with the count the JSON gives.
    db.client()
        .batch_execute(
            "UPDATE member_monthly_usage SET used_yen = used_yen + 1
              WHERE (member_id, month) IN (SELECT member_id, month FROM member_monthly_usage ORDER BY 1, 2 LIMIT 2)",
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pgmend.prom");
    let out = file.to_str().unwrap();
    let r = db.run(&["verify", "--format", "openmetrics", "--output", out]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert_eq!(r.stdout, "", "with --output, nothing on stdout");
    let text = std::fs::read_to_string(&file).unwrap();
    let samples = parse(&text);
    assert_eq!(
        value(&samples, "pgmend_verify_invariants_hold", &[]),
        Some(0.0)
    );
    assert_eq!(
        value(
            &samples,
            "pgmend_verify_check_violations",
            &[("check", "member_monthly_usage_matches_coupons")]
        ),
        Some(2.0)
    );
    assert_same_as_json(&db, &samples);
    // The drift in yen, the member-months over the cap and the unfinished runs, each equal to
    // what SQL computes here.
    assert_eq!(
        value(
            &samples,
            "pgmend_verify_check_amount",
            &[("check", "member_monthly_usage_matches_coupons")]
        ),
        Some(2.0)
    );
    let over_cap = db.scalar_i64(
        "SELECT coalesce(sum(used_yen - 2000), 0)::int8 FROM member_monthly_usage WHERE used_yen > 2000",
    );
    assert!(over_cap > 0, "the demo data has member-months over the cap");
    assert_eq!(
        value(
            &samples,
            "pgmend_verify_check_amount",
            &[("check", "member_months_over_the_cap"), ("kind", "anomaly")]
        ),
        Some(over_cap as f64)
    );
    assert_eq!(
        value(&samples, "pgmend_verify_unfinished_runs", &[]),
        Some(
            db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'running'") as f64
        )
    );
    let succeeded = value(
        &samples,
        "pgmend_verify_last_success_timestamp_seconds",
        &[],
    )
    .unwrap();
    assert!(succeeded > 1.7e9, "{succeeded}");

    // The check cannot run (the database is gone): exit 2, the file says so and keeps when
    // the check last ran to the end, and its mode; no temporary file is left beside it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let r = run(
        db.pgmend()
            .args(["verify", "--format", "openmetrics", "--output", out])
            .env(
                "DATABASE_URL",
                db.conninfo()
                    .replace(&format!("dbname={}", db.name), "dbname=no_such_database"),
            ),
        &db.password(),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    let samples = parse(&std::fs::read_to_string(&file).unwrap());
    assert_eq!(value(&samples, "pgmend_verify_up", &[]), Some(0.0));
    assert_eq!(
        value(
            &samples,
            "pgmend_verify_last_success_timestamp_seconds",
            &[]
        ),
        Some(succeeded)
    );
    assert!(!samples.iter().any(|s| s.0 == "pgmend_verify_check_ok"));
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // --output without openmetrics, and openmetrics elsewhere, are refused.
    let r = db.run(&["verify", "--output", out]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--format openmetrics"), "{}", r.stderr);
    let r = db.run(&["migrate", "status", "--format", "openmetrics"]);
    assert_eq!(r.code, 2, "{}", r.both());
}

#[test]
fn repair_status_as_openmetrics_parses_and_says_what_its_json_says() {
    let db = fresh_db();
    db.make_legacy_baselined(200);
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let r = db.run(&["repair", "status", "--format", "openmetrics"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let samples = parse(&r.stdout);
    assert_eq!(value(&samples, "pgmend_repair_status_up", &[]), Some(1.0));
    let j = db.run(&["repair", "status", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert!(runs.len() >= 3, "{runs:?}");
    for run in runs {
        let labels = [
            ("run", run["run_id"].to_string()),
            ("repair", run["repair"].as_str().unwrap().to_string()),
        ];
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        for (metric, key) in [
            ("pgmend_repair_run_targets", "targets"),
            ("pgmend_repair_run_targets_done", "checkpoint"),
            ("pgmend_repair_run_rows_changed", "changed"),
        ] {
            assert_eq!(
                value(&samples, metric, &labels),
                Some(run[key].as_i64().unwrap() as f64),
                "{metric} {labels:?}"
            );
        }
    }
    let finished = runs.iter().filter(|r| r["state"] == "finished").count();
    assert_eq!(
        value(&samples, "pgmend_repair_runs", &[("state", "finished")]),
        Some(finished as f64)
    );
    // Counted independently in SQL.
    assert_eq!(
        finished as i64,
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'finished'")
    );
}
