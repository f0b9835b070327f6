//! Reviewed plans (issue 18): what `pgmend plan` predicts equals what `pgmend apply` then
//! writes, counted in the tables afterwards; a plan saved with `plan --output` is applied by
//! `apply --plan` only while the database and the files are those it was made from (or, after
//! an interrupted apply of it, the tables are as its own steps left them), and each refusal
//! changes nothing (a snapshot of every schema and table, pgmend's included).

mod common;

use std::path::{Path, PathBuf};

use common::{copy_of, dir_arg, fresh_db, migrations_dir, repo, snapshot, TestDb};
use serde_json::Value;

/// A legacy database with the demo's data, adopted, and a plan of it saved in `dir`.
fn planned(dir: &Path, extra: &[&str]) -> (TestDb, PathBuf, String) {
    let db = fresh_db();
    db.make_legacy_baselined(200);
    let (file, digest) = save_plan(&db, dir, extra);
    (db, file, digest)
}

/// `plan --output DIR/plan.json EXTRA` on `db`: the file and its digest.
fn save_plan(db: &TestDb, dir: &Path, extra: &[&str]) -> (PathBuf, String) {
    let file = dir.join("plan.json");
    let mut args = vec!["plan", "--output", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let r = db.run(&args);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.contains("wrote the plan to"), "{}", r.stderr);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let digest = doc["plan_sha256"].as_str().unwrap().to_string();
    (file, digest)
}

/// `apply --plan FILE --yes ARGS` on `db` exits with `code`, says `says`, and changes nothing.
fn refused(db: &TestDb, file: &Path, args: &[&str], code: i32, says: &str) {
    let before = snapshot(db);
    let mut all = vec!["apply", "--plan", file.to_str().unwrap(), "--yes"];
    all.extend_from_slice(args);
    let r = db.run(&all);
    assert_eq!(r.code, code, "{}", r.both());
    assert!(
        r.stderr.contains(says),
        "expected {says:?} in:\n{}",
        r.stderr
    );
    assert!(r.stderr.contains("nothing was changed"), "{}", r.stderr);
    assert_eq!(snapshot(db), before, "a refused plan changed something");
}

/// Takes a coupon of the middle duplicate group FOR SHARE, in a transaction left open.
const HOLD_THE_MIDDLE_GROUP: &str =
    "BEGIN; SELECT 1 FROM issued_coupons WHERE (campaign_id, member_id) =
       (SELECT campaign_id, member_id FROM issued_coupons GROUP BY 1, 2 HAVING count(*) > 1
         ORDER BY 1, 2 LIMIT 1 OFFSET (SELECT count(*) / 2 FROM (SELECT 1 FROM issued_coupons
                                        GROUP BY campaign_id, member_id HAVING count(*) > 1) g)) FOR SHARE";

/// Runs `ARGS` (an apply) on `db`, adopted at V1, and stops it in step 4 after V2 and V3,
/// without depending on timing: a reader's REPEATABLE READ transaction holds V3's concurrent
/// build while a coupon of the middle duplicate group is taken FOR SHARE, then ends. The
/// void's batch that reaches the coupon waits past its lock budget: exit 1, the run half done.
fn apply_stopped_in_the_void(db: &TestDb, args: &[&str]) {
    let mut reader = db.client();
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM campaigns")
        .unwrap();
    let mut command = db.pgmend();
    command.args(args).args([
        "--batch-target",
        "5ms",
        "--lock-timeout",
        "100ms",
        "--lock-retry-for",
        "1s",
    ]);
    let password = db.password();
    let apply = std::thread::spawn(move || common::run(&mut command, &password));
    let mut watch = db.client();
    let started = std::time::Instant::now();
    while watch
        .query_opt(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgmend'
                AND query ILIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'",
            &[],
        )
        .unwrap()
        .is_none()
    {
        assert!(
            started.elapsed().as_secs() < 60,
            "V3's build never waited for the reader"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut holder = db.client();
    holder.batch_execute(HOLD_THE_MIDDLE_GROUP).unwrap();
    reader.batch_execute("COMMIT").unwrap();
    let r = apply.join().unwrap();
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(r.code, 1, "{}", r.both());
    assert_eq!(db.history().len(), 3, "V1 to V3 applied");
    assert!(
        db.scalar_i64(
            "SELECT changed FROM pgmend.repair_runs WHERE repair = 'void-duplicate-coupons' AND state = 'running'"
        ) > 0,
        "the void stopped half done"
    );
}

fn add_duplicates(db: &TestDb, n: i64) {
    db.client()
        .execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), campaign_id, member_id, month, amount_yen
               FROM issued_coupons WHERE redeemed_at IS NULL ORDER BY coupon_id LIMIT $1",
            &[&n],
        )
        .unwrap();
}

/// The plan's JSON document on `db`.
fn plan_json(db: &common::TestDb) -> Value {
    let r = db.run(&["plan", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    serde_json::from_str(&r.stdout).unwrap()
}

/// Steps 4, 6 and 7 wrote what the plan `doc` predicted, counted in the tables.
fn written_as_predicted(db: &TestDb, doc: &Value) {
    let (void, budgets, usage) = (
        &step(doc, 4)["repair"],
        &step(doc, 6)["repair"],
        &step(doc, 7)["repair"],
    );
    // The void: rows marked, rows voided.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate"),
        void["changes"].as_i64().unwrap()
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL"),
        void["voided_or_created"].as_i64().unwrap()
    );
    // Every campaign's new counter: created (there was no campaign_budgets) with the value the
    // plan gave it, which is the sum after the void.
    let mut c = db.client();
    let rows = c
        .query(
            "SELECT campaign_id, issued_yen::bigint FROM campaign_budgets",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len() as i64, budgets["changes"].as_i64().unwrap());
    for row in rows {
        let (id, yen): (String, i64) = (row.get(0), row.get(1));
        assert_eq!(budgets["amounts"][&id].as_i64(), Some(yen), "campaign {id}");
    }
    // Every member-month the plan lists (its first 1,000 keys): created with that value.
    let used: std::collections::BTreeMap<String, i64> = c
        .query(
            "SELECT member_id || '/' || month, used_yen::bigint FROM member_monthly_usage",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(used.len() as i64, usage["changes"].as_i64().unwrap());
    for (key, yen) in usage["amounts"].as_object().unwrap() {
        assert_eq!(used.get(key).copied(), yen.as_i64(), "member-month {key}");
    }
}

fn step(doc: &Value, n: usize) -> &Value {
    &doc["steps"][n - 1]
}

#[test]
fn on_a_quiet_database_apply_writes_what_the_plan_predicts() {
    let db = fresh_db();
    db.make_legacy_baselined(300);
    let doc = plan_json(&db);
    let void = &step(&doc, 4)["repair"];
    assert!(void["changes"].as_i64().unwrap() > 0, "{void}");
    // V4's unique-index census, counted now, finds the groups step 4 voids; predicted after
    // it, none: the step's index builds at once.
    let v4 = step(&doc, 5);
    assert!(
        v4["migration"]["censuses"][0]["violators"]
            .as_i64()
            .unwrap()
            > 0,
        "{v4}"
    );
    assert_eq!(v4["predicted_censuses"][0]["violators"], 0, "{v4}");

    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());

    written_as_predicted(&db, &doc);
    // The passes after the gate: nothing left on a quiet database, in the plan and in apply.
    for n in [9, 10] {
        assert_eq!(step(&doc, n)["repair"]["changes"], 0, "step {n}");
        assert!(step(&doc, n)["predicted_on"]
            .as_str()
            .unwrap()
            .contains("not predicted"));
    }
    let r = db.run(&[
        "apply",
        "--yes",
        "--confirm",
        "deploy-new-application",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let walk: Value = serde_json::from_str(&r.stdout).unwrap();
    for s in walk["steps"].as_array().unwrap() {
        if s["step"] == 9 || s["step"] == 10 {
            assert_eq!(s["run"]["run"]["changed"], 0, "{s}");
        }
    }
}

#[test]
fn a_saved_plan_applied_unchanged_runs_to_the_gate_and_records_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, digest) = planned(dir.path(), &[]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let print = &doc["fingerprint"];
    // V1 is baselined: the plan covers the pending steps up to the gate.
    assert_eq!(print["covers"], serde_json::json!([2, 3, 4, 5, 6, 7]));
    assert_eq!(print["server"]["dbname"], db.name.as_str());
    assert_eq!(print["files"].as_object().unwrap().len(), 5 + 4 + 1);
    assert!(print["tables"]["issued_coupons"].as_str().unwrap().len() == 64);
    let plan = file.to_str().unwrap();
    let r = db.run(&[
        "apply",
        "--plan",
        plan,
        "--plan-sha256",
        &digest,
        "--yes",
        "--confirm",
        "deploy-new-application",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let out: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(out["plan"]["next_step_needs_new_plan"], 8, "{out}");
    assert_eq!(out["complete"], false);
    // Steps 1–7 done, the gate not passed although --confirm named it: the plan ends before.
    assert_eq!(db.history().len(), 4);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.gates"), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.release_steps WHERE step IN (4, 6, 7)"),
        3
    );
    let mut c = db.client();
    let row = c
        .query_one(
            "SELECT plan_sha256, first_step, through_step, applied_by FROM pgmend.applied_plans",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), digest);
    assert_eq!((row.get::<_, i32>(1), row.get::<_, i32>(2)), (2, 7));
    assert!(row.get::<_, String>(3).contains('@'));

    // After the deploy: a new plan covers the gate and what follows, and passes it.
    let after = dir.path().join("after.json");
    let r = db.run(&[
        "plan",
        "--output",
        after.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        doc["fingerprint"]["covers"],
        serde_json::json!([8, 9, 10, 11])
    );
    assert_eq!(doc["applied_plans"][0]["plan_sha256"], digest.as_str());
    // Without --confirm the walk stops at the gate, the plan's first step: nothing to record.
    let r = db.run(&["apply", "--plan", after.to_str().unwrap(), "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains("ran no step; it is not recorded"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.applied_plans"),
        1
    );
    let r = db.run(&[
        "apply",
        "--plan",
        after.to_str().unwrap(),
        "--yes",
        "--confirm",
        "deploy-new-application",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.history().len(), 5);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.applied_plans"),
        2
    );
}

#[test]
fn a_migration_file_edited_after_the_plan_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let migrations = migrations_dir(&[]);
    let m = dir_arg(migrations.path());
    let (db, file, _) = planned(dir.path(), &["--migrations-dir", &m]);
    let v5 = migrations.path().join("V5__issued_within_budget.sql");
    let text = std::fs::read_to_string(&v5).unwrap();
    std::fs::write(&v5, text + "\n-- edited after the review\n").unwrap();
    refused(
        &db,
        &file,
        &["--migrations-dir", &m],
        2,
        "migrations/V5__issued_within_budget.sql",
    );
}

#[test]
fn a_repair_definition_changed_after_the_plan_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let repairs = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo().join("repairs")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, repairs.path().join(path.file_name().unwrap())).unwrap();
    }
    let r = dir_arg(repairs.path());
    let (db, file, _) = planned(dir.path(), &["--repairs-dir", &r]);
    let def = repairs.path().join("void-duplicate-coupons.toml");
    let text = std::fs::read_to_string(&def).unwrap();
    std::fs::write(
        &def,
        text.replace(
            "\"issued_at\", order = \"asc\"",
            "\"issued_at\", order = \"desc\"",
        ),
    )
    .unwrap();
    refused(
        &db,
        &file,
        &["--repairs-dir", &r],
        2,
        "repairs/void-duplicate-coupons.toml",
    );
}

#[test]
fn a_column_added_by_someone_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, _) = planned(dir.path(), &[]);
    db.client()
        .batch_execute("ALTER TABLE campaigns ADD COLUMN note text")
        .unwrap();
    refused(&db, &file, &[], 1, "the shape of campaigns differs");
}

#[test]
fn another_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, _) = planned(dir.path(), &[]);
    let other = copy_of(&db);
    refused(
        &other,
        &file,
        &[],
        2,
        "the plan was made for another target: database OID",
    );
}

#[test]
fn another_role_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, _) = planned(dir.path(), &[]);
    let role = common::LoginRole::create(&db, "other", "pw-other-7", "ALTER ROLE {role} SUPERUSER");
    let before = snapshot(&db);
    let r = role.run(&db, &["apply", "--plan", file.to_str().unwrap(), "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr
            .contains(&format!("role {} (the plan's: ", role.name)),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("nothing was changed"), "{}", r.stderr);
    assert_eq!(snapshot(&db), before);
}

#[test]
fn a_plan_past_its_age_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, _) = planned(dir.path(), &[]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    refused(
        &db,
        &file,
        &["--max-plan-age", "1s"],
        1,
        "more than --max-plan-age 1s",
    );
}

#[test]
fn duplicates_grown_past_max_drift_are_refused_and_growth_within_it_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, _) = planned(dir.path(), &[]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let planned_changes = doc["steps"][3]["repair"]["changes"].as_i64().unwrap();
    let bound = ((planned_changes as f64 * 0.05).ceil() as i64).max(100);
    add_duplicates(&db, bound + 1);
    refused(&db, &file, &[], 1, "moved past --max-drift");

    let (db, file, _) = planned(dir.path(), &[]);
    add_duplicates(&db, 3);
    let r = db.run(&["apply", "--plan", file.to_str().unwrap(), "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains("moved within --max-drift: step 4 (repair void-duplicate-coupons) changes"),
        "{}",
        r.stderr
    );
    // The three new duplicates were voided with the rest.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate"),
        planned_changes + 3
    );
}

#[test]
fn a_hand_edited_plan_file_and_a_wrong_plan_sha256_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file, digest) = planned(dir.path(), &[]);
    let wrong = format!("{}0", &digest[..63]);
    let wrong = if wrong == digest {
        format!("{}1", &digest[..63])
    } else {
        wrong
    };
    refused(
        &db,
        &file,
        &["--plan-sha256", &wrong],
        2,
        "is not the reviewed plan",
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let edited = text.replacen("\"changes\": ", "\"changes\": 1", 1);
    assert_ne!(edited, text);
    std::fs::write(&file, edited).unwrap();
    refused(&db, &file, &[], 2, "was changed after pgmend wrote it");
}

#[test]
fn no_plan_file_is_written_when_the_plan_has_blockers() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    // The legacy tables without a baseline: V1 is pending over them, a blocker.
    db.make_legacy_data(20);
    let file = dir.path().join("plan.json");
    let r = db.run(&["plan", "--output", file.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("no plan file was written"),
        "{}",
        r.stderr
    );
    assert!(!file.exists());
}

#[test]
fn an_interrupted_apply_of_a_saved_plan_resumes_with_the_same_plan() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    db.make_legacy_baselined(2000);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    let file = dir.path().join("plan.json");
    let path = file.to_str().unwrap();
    let r = db.run(&["plan", "--output", path]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let void = &step(&doc, 4)["repair"];
    let (changes, voided) = (
        void["changes"].as_i64().unwrap(),
        void["voided_or_created"].as_i64().unwrap(),
    );
    // A coupon of the middle duplicate group held FOR SHARE: the void's batch that reaches it
    // waits past its lock budget, and the walk stops (exit 1) with half the step done.
    let mut holder = db.client();
    holder.batch_execute(HOLD_THE_MIDDLE_GROUP).unwrap();
    let r = db.run(&[
        "apply",
        "--plan",
        path,
        "--yes",
        "--batch-target",
        "5ms",
        "--lock-timeout",
        "100ms",
        "--lock-retry-for",
        "1s",
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    let done = db.scalar_i64(
        "SELECT changed FROM pgmend.repair_runs WHERE repair = 'void-duplicate-coupons' AND state = 'running'",
    );
    assert!(
        done > 100 && done < changes - 100,
        "the step stopped half done: {done} of {changes}"
    );
    holder.batch_execute("ROLLBACK").unwrap();

    // The same plan again: the step is judged by what it has left plus what its run did.
    let r = db.run(&["apply", "--plan", path, "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("Applied the saved plan"), "{}", r.stdout);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate"),
        changes
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL"),
        voided
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'running'"),
        0
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.applied_plans WHERE plan_sha256 = '{}' AND through_step = 7",
            doc["plan_sha256"].as_str().unwrap()
        )),
        1
    );
}

#[test]
fn a_plan_past_the_gate_stopped_after_its_gate_and_a_repair_step_resumes_with_the_same_plan() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    db.make_legacy_baselined(1000);
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // The old application issued a campaign meanwhile: both counters have work after the gate.
    db.client()
        .batch_execute(
            "INSERT INTO campaigns (campaign_id, discount_yen, budget_yen, issued_yen) VALUES ('SW-Z', 1000, 100000000, 0);
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), 'SW-Z', 'm' || lpad(g::text, 7, '0'), '2026-09', 1000
               FROM generate_series(1, 600) g",
        )
        .unwrap();
    let file = dir.path().join("plan.json");
    let path = file.to_str().unwrap();
    let r = db.run(&["plan", "--output", path]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.contains("it covers steps 8–11"), "{}", r.stderr);
    // A member-month held FOR SHARE: step 10 waits past its lock budget after steps 8 and 9.
    let mut holder = db.client();
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM member_monthly_usage WHERE member_id = 'm0000300' AND month = '2026-09' FOR SHARE",
        )
        .unwrap();
    let again = [
        "apply",
        "--plan",
        path,
        "--yes",
        "--confirm",
        "deploy-new-application",
    ];
    let mut first = again.to_vec();
    first.extend(["--lock-timeout", "100ms", "--lock-retry-for", "1s"]);
    let r = db.run(&first);
    assert_eq!(r.code, 1, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.release_steps WHERE step IN (9, 10)"),
        1,
        "step 9 finished, step 10 did not"
    );
    holder.batch_execute("ROLLBACK").unwrap();

    let r = db.run(&again);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("The release is complete"), "{}", r.stdout);
    assert_eq!(db.history().len(), 5);
    assert_eq!(db.run(&["verify"]).code, 0, "the counters hold the truth");
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.applied_plans WHERE first_step = 8 AND through_step = 11"
        ),
        1
    );
}

#[test]
fn a_saved_plan_stopped_after_its_own_migrations_resumes_and_writes_what_it_predicted() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    db.make_legacy_baselined(2000);
    let (file, digest) = save_plan(&db, dir.path(), &[]);
    let path = file.to_str().unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    apply_stopped_in_the_void(&db, &["apply", "--plan", path, "--yes"]);
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.plan_steps WHERE plan_sha256 = '{digest}' AND step IN (2, 3)"
        )),
        2,
        "the shapes V2 and V3 left are recorded"
    );

    let r = db.run(&["apply", "--plan", path, "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("Applied the saved plan"), "{}", r.stdout);
    assert_eq!(db.history().len(), 4, "V4 applied, the gate not passed");
    written_as_predicted(&db, &doc);
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.applied_plans WHERE plan_sha256 = '{digest}' AND through_step = 7"
        )),
        1
    );
}

#[test]
fn a_column_added_after_a_saved_plan_stopped_past_its_migrations_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    db.make_legacy_baselined(2000);
    let (file, _) = save_plan(&db, dir.path(), &[]);
    apply_stopped_in_the_void(&db, &["apply", "--plan", file.to_str().unwrap(), "--yes"]);
    db.client()
        .batch_execute("ALTER TABLE issued_coupons ADD COLUMN note text")
        .unwrap();
    refused(
        &db,
        &file,
        &[],
        1,
        "the shape of issued_coupons differs from what step 3, the last an apply of this plan ran, left",
    );
}

#[test]
fn migrations_done_since_the_plan_by_a_plain_apply_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    db.make_legacy_baselined(2000);
    let (file, _) = save_plan(&db, dir.path(), &[]);
    apply_stopped_in_the_void(&db, &["apply", "--yes"]);
    refused(
        &db,
        &file,
        &[],
        1,
        "the release moved on since the plan was made",
    );
}
