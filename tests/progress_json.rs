//! `--progress json`: every line on stderr is one JSON object that the documented schema
//! (docs/progress.schema.json) accepts, checked with a JSON Schema validator, and carrying
//! the facts of the human line: steps started and done, batch progress, a stop, an error.

mod common;

use common::*;

fn validator() -> jsonschema::Validator {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/progress.schema.json")).unwrap(),
    )
    .unwrap();
    jsonschema::validator_for(&schema).expect("the schema is a valid JSON Schema")
}

/// Every line of `stderr`, parsed and validated.
fn parsed(stderr: &str) -> Vec<serde_json::Value> {
    let validator = validator();
    stderr
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{stderr}"));
            let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{line}: {errors:?}");
            v
        })
        .collect()
}

fn of<'a>(lines: &'a [serde_json::Value], event: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|l| l["event"] == event).collect()
}

#[test]
fn a_whole_release_with_two_workers_writes_only_schema_valid_json_lines_with_the_human_facts() {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    let human = copy_of(&db);
    let r = db.run(&[
        "apply",
        "--yes",
        "--jobs",
        "2",
        "--progress",
        "json",
        "--batch-target",
        "20ms",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let lines = parsed(&r.stderr);
    // The same release in human lines, for the facts to compare.
    let h = human.run(&["apply", "--yes", "--jobs", "2", "--batch-target", "20ms"]);
    assert_eq!(h.code, 0, "{}", h.both());

    // Steps started and done: the same steps, in order, as the human lines name them.
    let started: Vec<(i64, String)> = of(&lines, "step_started")
        .iter()
        .map(|l| {
            (
                l["step"].as_i64().unwrap(),
                l["label"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let human_started: Vec<(i64, String)> = h
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("== step "))
        .map(|l| {
            let (n, label) = l.split_once(": ").unwrap();
            (n.parse().unwrap(), label.to_string())
        })
        .collect();
    assert_eq!(started, human_started);
    assert!(
        started.len() >= 6,
        "the release up to the deploy gate: {started:?}"
    );
    let done: Vec<i64> = of(&lines, "step_done")
        .iter()
        .map(|l| l["step"].as_i64().unwrap())
        .collect();
    // Every step started is done, but the gate, where the release waits.
    assert_eq!(
        done,
        started
            .iter()
            .filter(|s| !s.1.starts_with("gate "))
            .map(|s| s.0)
            .collect::<Vec<_>>()
    );
    for l in of(&lines, "step_started") {
        assert_eq!(l["release"], "coupon-incident");
        assert_eq!(
            l["message"].as_str().unwrap(),
            format!("== step {}: {}", l["step"], l["label"].as_str().unwrap())
        );
    }
    // Batch progress: the void's last progress line counts every target, with its workers.
    let progress = of(&lines, "progress");
    let void: Vec<&&serde_json::Value> = progress
        .iter()
        .filter(|l| l["repair"] == "void-duplicate-coupons")
        .collect();
    assert!(!void.is_empty(), "{}", r.stderr);
    let last = void.last().unwrap();
    assert_eq!(last["done"], last["targets"], "{last}");
    assert!(last["message"]
        .as_str()
        .unwrap()
        .starts_with("void-duplicate-coupons: "));
    // The rows the void changed, as the ledger counts them independently.
    let voided = db.scalar_i64(
        "SELECT count(*) FROM pgmend.ledger_records r JOIN pgmend.repair_runs u USING (run_id)
          WHERE u.repair = 'void-duplicate-coupons'",
    );
    assert_eq!(last["changed"].as_i64().unwrap(), voided);

    // A stop (exit 1) and an error (exit 2), each one JSON line with its exit code.
    let r = db.run(&["apply", "--progress", "json"]);
    assert_eq!(r.code, 2, "{}", r.both());
    let lines_ = parsed(&r.stderr);
    let errors = of(&lines_, "error");
    assert_eq!(errors.len(), 1, "{}", r.stderr);
    assert_eq!(errors[0]["exit_code"], 2);
    let r = run(
        db.pgmend().args(["verify"]).env("PGMEND_PROGRESS", "json"),
        &db.password(),
    );
    // At the gate V5's check is still missing: exit 1, and stderr parses all the same.
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(parsed(&r.stderr).iter().all(|l| l["event"] == "message"));
    // A usage error, before the command runs, is a JSON line too.
    let r = run_without_password(pgmend_command().args([
        "--progress",
        "json",
        "apply",
        "--no-such-option",
    ]));
    assert_eq!(r.code, 2, "{}", r.both());
    let l = parsed(&r.stderr);
    assert_eq!(of(&l, "error").len(), 1, "{}", r.stderr);
}

#[test]
fn a_stop_is_a_stopped_line_with_exit_code_1() {
    let db = fresh_db();
    db.make_legacy_baselined(100);
    // The duplicates stop the migrations at V4's census: exit 1, after V2 and V3.
    let r = db.run(&["migrate", "apply", "--yes", "--progress", "json"]);
    assert_eq!(r.code, 1, "{}", r.both());
    let l = parsed(&r.stderr);
    let stopped = of(&l, "stopped");
    assert_eq!(stopped.len(), 1, "{}", r.stderr);
    assert_eq!(stopped[0]["exit_code"], 1);
    assert_eq!(stopped[0]["level"], "warning");
    assert!(
        stopped[0]["message"]
            .as_str()
            .unwrap()
            .contains("V4__one_coupon_per_member was not attempted"),
        "{}",
        r.stderr
    );
}
