//! pgmend's own schema has a version: a schema left by a pgmend from before versions (its
//! tables, no `pgmend.schema_version`) is upgraded in place and its unfinished run resumes;
//! a schema from a newer pgmend is refused with exit 2 before anything changes.

mod common;

use common::*;

/// The version this binary upgrades pgmend's schema to.
const CURRENT: i64 = pgmend::store::schema::CURRENT as i64;

/// The DDL of pgmend's schema exactly as the binary before schema versions ran it
/// (`src/repair/store.rs` `SCHEMA_SQL` at main 02c8e2b).
const OLD_SCHEMA_SQL: &str = r#"
CREATE SCHEMA IF NOT EXISTS pgmend;
CREATE TABLE IF NOT EXISTS pgmend.repair_runs (
  run_id              bigserial PRIMARY KEY,
  repair              text NOT NULL,
  kind                text NOT NULL,
  definition_checksum text NOT NULL,
  state               text NOT NULL CHECK (state IN ('running', 'finished', 'abandoned')),
  as_of               timestamptz NOT NULL DEFAULT now(),
  targets             bigint NOT NULL DEFAULT 0,
  checkpoint          bigint NOT NULL DEFAULT 0,
  processed           bigint NOT NULL DEFAULT 0,
  changed             bigint NOT NULL DEFAULT 0,
  skipped             jsonb NOT NULL DEFAULT '[]',
  started_by          text NOT NULL DEFAULT current_user,
  finished_at         timestamptz,
  undoes_run          bigint REFERENCES pgmend.repair_runs,
  undone_by_run       bigint REFERENCES pgmend.repair_runs
);
-- One unfinished run per repair (seed 004: the database, not the tool, enforces it).
CREATE UNIQUE INDEX IF NOT EXISTS one_unfinished_run_per_repair
  ON pgmend.repair_runs (repair) WHERE state = 'running';
-- repair_targets and repair_ledger carry no foreign key to repair_runs: their rows are
-- written in bulk (a check per row cost a quarter of a freeze and a tenth of a batch), only
-- in the transaction that creates the run or advances its checkpoint (a batch whose
-- checkpoint update finds no run is rolled back), and runs are never deleted.
CREATE TABLE IF NOT EXISTS pgmend.repair_targets (
  run_id bigint NOT NULL,
  seq    bigint NOT NULL,
  key    text[] NOT NULL,
  PRIMARY KEY (run_id, seq)
);
-- One index only, (run_id, ledger_id): what `repair log` and `undo` read a run's records by.
-- A run writes at most one record per row (its batches are disjoint, each record commits with
-- its checkpoint, and a counter row a batch creates and then corrects keeps its one record).
-- A unique index on (run_id, target_table, row_key) enforced that too, at about a fifth of a
-- void batch's time.
CREATE TABLE IF NOT EXISTS pgmend.repair_ledger (
  ledger_id    bigserial,
  run_id       bigint NOT NULL,
  target_table text NOT NULL,
  row_key      jsonb NOT NULL,
  action       text NOT NULL CHECK (action IN ('update', 'insert', 'restore', 'delete')),
  before       jsonb,
  after        jsonb,
  reason       text NOT NULL,
  at           timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, ledger_id)
);
CREATE TABLE IF NOT EXISTS pgmend.gates (
  gate         text PRIMARY KEY,
  confirmed_by text NOT NULL,
  confirmed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS pgmend.release_steps (
  step        integer PRIMARY KEY,
  what        text NOT NULL,
  run_id      bigint REFERENCES pgmend.repair_runs,
  finished_at timestamptz NOT NULL DEFAULT now()
);
-- A counter run after the deploy gate appends the keys that still differ after its pass to
-- its targets and corrects them again; targets from repass_from on are those.
ALTER TABLE pgmend.repair_runs ADD COLUMN IF NOT EXISTS repass_from bigint;
-- The schema whose release these records are (one row): the pre-flight refuses a session
-- that works in another schema, whose steps would otherwise be taken as done.
CREATE TABLE IF NOT EXISTS pgmend.released_schema (
  only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  schema_name text NOT NULL
);
-- Per campaign, the legacy counter campaigns.issued_yen and what the old system really issued
-- (every coupon, voided ones included), recorded once when the release passes the gate
-- deploy-new-application: the finance report's lost updates (src/report/legacy_counter.rs).
CREATE TABLE IF NOT EXISTS pgmend.legacy_counter_at_deploy (
  campaign_id           text PRIMARY KEY,
  legacy_counter_yen    bigint NOT NULL,
  old_system_issued_yen bigint NOT NULL,
  old_system_coupons    bigint NOT NULL,
  recorded_at           timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgmend.released_schema (schema_name) SELECT current_schema()
  ON CONFLICT (only_row) DO NOTHING;"#;

/// Legacy data at V2 (the release's columns exist), with duplicates to void.
fn at_v2() -> TestDb {
    let db = fresh_db();
    db.make_legacy_data(300);
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    let r = db.run(&["migrate", "apply", "--yes", "--target", "2"]);
    assert_eq!(r.code, 0, "{}", r.both());
    db
}

#[test]
fn a_schema_left_by_the_binary_before_versions_is_upgraded_and_its_run_resumes() {
    let db = at_v2();
    let mut c = db.client();
    c.batch_execute(OLD_SCHEMA_SQL).unwrap();
    // A run the old binary started: its groups frozen (as its freeze statement does), no batch
    // done yet.
    let checksum = pgmend::repair::definition::RepairSource::Embedded
        .load()
        .unwrap()
        .into_iter()
        .find(|r| r.name == "void-duplicate-coupons")
        .unwrap()
        .checksum;
    let run_id: i64 = c
        .query_one(
            "INSERT INTO pgmend.repair_runs (repair, kind, definition_checksum, state)
             VALUES ('void-duplicate-coupons', 'void_duplicates', $1, 'running') RETURNING run_id",
            &[&checksum],
        )
        .unwrap()
        .get(0);
    let frozen = c
        .execute(
            "INSERT INTO pgmend.repair_targets (run_id, seq, key)
             SELECT $1, row_number() OVER (ORDER BY campaign_id, member_id), ARRAY[campaign_id::text, member_id::text]
               FROM issued_coupons WHERE NOT legacy_duplicate GROUP BY campaign_id, member_id HAVING count(*) > 1",
            &[&run_id],
        )
        .unwrap() as i64;
    assert!(frozen > 0, "the data has duplicates to void");
    c.execute(
        "UPDATE pgmend.repair_runs SET targets = $2 WHERE run_id = $1",
        &[&run_id, &frozen],
    )
    .unwrap();
    assert!(!db.exists("pgmend.schema_version"));
    let to_void = db.scalar_i64(
        "SELECT count(*) FROM (SELECT row_number() OVER (PARTITION BY campaign_id, member_id
                                  ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn FROM issued_coupons) r WHERE rn > 1",
    );

    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains(&format!("resuming run {run_id} of void-duplicate-coupons")),
        "{}",
        r.both()
    );
    assert_eq!(
        db.scalar_i64("SELECT version::int8 FROM pgmend.schema_version"),
        CURRENT
    );
    // The old run finished, with no new run beside it, and did the whole job.
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs"), 1);
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.repair_runs WHERE run_id = {run_id} AND state = 'finished'
                AND checkpoint = targets AND processed = targets AND changed = {to_void}"
        )),
        1
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.ledger_records WHERE run_id = {run_id}"
        )),
        to_void
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                    GROUP BY campaign_id, member_id HAVING count(*) > 1) d"
        ),
        0
    );
    // Upgraded once: the next pgmend finds the current version, and the repair has nothing
    // left to do.
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.schema_version"),
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records"),
        to_void
    );
}

#[test]
fn two_pgmends_upgrading_an_old_schema_at_once_both_succeed() {
    let db = at_v2();
    db.client().batch_execute(OLD_SCHEMA_SQL).unwrap();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let mut c = db.pgmend();
            c.args(["repair", "status"]);
            std::thread::spawn(move || c.output().unwrap())
        })
        .collect();
    for r in runs {
        assert!(r.join().unwrap().status.success());
    }
    // Read-only commands never create or upgrade the schema.
    assert!(!db.exists("pgmend.schema_version"));
    let applies: Vec<_> = ["rebuild-campaign-budgets", "rebuild-member-monthly-usage"]
        .into_iter()
        .map(|repair| {
            let mut c = db.pgmend();
            c.args(["repair", "apply", repair, "--yes", "--runner-wait", "30s"]);
            std::thread::spawn(move || c.output().unwrap())
        })
        .collect();
    for a in applies {
        let out = a.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.schema_version"),
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT version::int8 FROM pgmend.schema_version"),
        CURRENT
    );
}

#[test]
fn a_schema_from_a_newer_pgmend_is_refused_before_any_change() {
    let db = at_v2();
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT version::int8 FROM pgmend.schema_version"),
        CURRENT
    );
    db.client()
        .batch_execute("UPDATE pgmend.schema_version SET version = 9")
        .unwrap();
    let before = snapshot(&db);
    for args in [
        &["repair", "apply", "void-duplicate-coupons", "--yes"][..],
        &["repair", "status"][..],
        &["apply", "--yes", "--confirm", "deploy-new-application"][..],
    ] {
        let r = db.run(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("version 9") && r.stderr.contains(&format!("up to {CURRENT}")),
            "{args:?}: {}",
            r.both()
        );
        assert!(r.stderr.contains("Use the newer pgmend"), "{}", r.both());
        assert_eq!(snapshot(&db), before, "{args:?} changed something");
    }
}

#[test]
fn a_schema_at_version_2_gains_the_applied_plans_and_plan_steps_tables() {
    let db = at_v2();
    db.client()
        .batch_execute(&format!(
            "{OLD_SCHEMA_SQL}
             CREATE TABLE pgmend.schema_version (
               only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
               version     integer NOT NULL,
               upgraded_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO pgmend.schema_version (version) VALUES (2);"
        ))
        .unwrap();
    // Read-only commands read a version 2 schema as it is: no saved plan applied yet.
    let r = db.run(&["plan", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(!db.exists("pgmend.applied_plans"));
    assert!(!db.exists("pgmend.plan_steps"));
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(db.exists("pgmend.applied_plans"));
    assert!(db.exists("pgmend.plan_steps"));
    assert_eq!(
        db.scalar_i64("SELECT version::int8 FROM pgmend.schema_version"),
        CURRENT
    );
}
