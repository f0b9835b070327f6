//! pgmend's own schema has a version: a schema left by a pgmend from before versions (its
//! tables, no `pgmend.schema_version`) is upgraded in place and its unfinished run resumes;
//! a schema from a newer pgmend is refused with exit 2 before anything changes; a database an
//! older binary left at the deploy gate (a frozen dump under `tests/fixtures/`) continues to the
//! release's exact end state.

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

/// The frozen database: pgmend schema version 6, left at the gate `deploy-new-application` by
/// the binary of main e46869a (its header says how it was made; `freeze_the_deploy_gate_fixture`
/// makes it again).
const V6_AT_DEPLOY_GATE: &str = "tests/fixtures/v6_at_deploy_gate.sql";

/// A fresh database holding the fixture `path` (a plain SQL dump, restored in one implicit
/// transaction).
fn restored(path: &str) -> TestDb {
    let db = fresh_db();
    let sql = std::fs::read_to_string(repo().join(path)).unwrap();
    db.client().batch_execute(&sql).unwrap();
    db
}

/// How many coupons the release marks as legacy duplicates, and how many of those it voids, by
/// PRODUCT.md's ranking; and how many coupons are marked and voided otherwise than it says.
const BY_THE_RANKING: &str = "
WITH ranked AS (
  SELECT coupon_id, redeemed_at IS NULL AS unredeemed, legacy_duplicate, voided_at IS NOT NULL AS voided,
         row_number() OVER (PARTITION BY campaign_id, member_id
                            ORDER BY redeemed_at IS NULL, issued_at, coupon_id) > 1 AS later
    FROM issued_coupons)
SELECT count(*) FILTER (WHERE later), count(*) FILTER (WHERE later AND unredeemed),
       count(*) FILTER (WHERE legacy_duplicate <> later OR voided <> (later AND unredeemed))
  FROM ranked";

/// The counters' rows that differ from the sums of the non-voided coupons (a missing row counts
/// as 0 for a member-month, and as a difference for a campaign).
const COUNTERS_OFF: &str = "
SELECT (SELECT count(*) FROM campaigns c LEFT JOIN campaign_budgets b USING (campaign_id)
         WHERE b.issued_yen IS DISTINCT FROM
               (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                 WHERE i.campaign_id = c.campaign_id AND voided_at IS NULL))
     + (SELECT count(*) FROM (SELECT member_id, month, sum(amount_yen) AS yen FROM issued_coupons
                               WHERE voided_at IS NULL GROUP BY 1, 2) t
                  FULL JOIN member_monthly_usage u USING (member_id, month)
         WHERE coalesce(u.used_yen, 0) <> coalesce(t.yen, 0))";

/// A database left at the deploy gate by the binary of schema version 6 (the fixture: steps 1
/// to 7 done, five coupons issued by the old application since) continues with this binary:
/// `apply --confirm` passes the gate, rebuilds both counters, adds V5, and the schema is at
/// this binary's version; every figure is counted in the tables against SQL of its own.
#[test]
fn a_database_left_at_the_deploy_gate_by_the_v6_binary_continues_to_the_exact_end_state() {
    let db = restored(V6_AT_DEPLOY_GATE);
    // The fixture is what it says: version 6, at the gate, the void done by the ranking, the
    // counters behind by the old application's coupons.
    assert_eq!(
        db.scalar_i64("SELECT version::int8 FROM pgmend.schema_version"),
        6
    );
    assert_eq!(
        db.history().iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.gates"), 0);
    let steps = |db: &TestDb| -> Vec<(i32, String)> {
        db.client()
            .query("SELECT step, what FROM pgmend.release_steps WHERE run_id IS NOT NULL ORDER BY step", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    let budgets = "repair rebuild-campaign-budgets".to_string();
    let usage = "repair rebuild-member-monthly-usage".to_string();
    let void = "repair void-duplicate-coupons".to_string();
    assert_eq!(
        steps(&db),
        [(4, void.clone()), (6, budgets.clone()), (7, usage.clone())]
    );
    let by_ranking = |db: &TestDb| -> (i64, i64, i64) {
        let row = db.client().query_one(BY_THE_RANKING, &[]).unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    let (duplicates, to_void, misranked) = by_ranking(&db);
    assert!(
        duplicates > to_void && to_void > 0,
        "{duplicates} {to_void}"
    );
    assert_eq!(misranked, 0);
    assert_eq!(
        db.scalar_i64(COUNTERS_OFF),
        6,
        "SW-B and five member-months are behind"
    );
    let coupons = db.scalar_i64("SELECT count(*) FROM issued_coupons");
    let runs = db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs");
    // The legacy counter and what the old system issued, per campaign, as the gate must record them.
    let legacy = "SELECT string_agg(format('%s %s %s %s', c.campaign_id, c.issued_yen, coalesce(s.yen, 0), coalesce(s.n, 0)), ', ' ORDER BY c.campaign_id)
                    FROM campaigns c LEFT JOIN (SELECT campaign_id, sum(amount_yen) AS yen, count(*) AS n
                                                  FROM issued_coupons GROUP BY 1) s USING (campaign_id)";
    let legacy_at_gate: String = db.client().query_one(legacy, &[]).unwrap().get(0);

    // Its records are the coupon release's, unfinished: another release is refused, naming
    // it, and nothing changes (not even pgmend's schema version).
    let before = snapshot(&db);
    let third = repo().join("tests/data/releases/third");
    let r = db.run(&["apply", "--yes", "--release", third.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("release coupon-incident is unfinished")
            && r.stderr.contains("step 8 (gate deploy-new-application)"),
        "{}",
        r.stderr
    );
    assert_eq!(snapshot(&db), before);

    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 0, "{}", r.both());

    assert_eq!(
        db.scalar_i64("SELECT version::int8 FROM pgmend.schema_version"),
        CURRENT
    );
    assert_eq!(
        db.history().iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_constraint WHERE conname = 'issued_within_budget'
                                                         AND conrelid = 'campaign_budgets'::regclass AND NOT convalidated"),
        1
    );
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates WHERE gate = 'deploy-new-application'"),
        1
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.gates"), 1);
    // Every repair step of the release's eleven recorded once, each with its run; the two
    // after the gate by the runs this binary made.
    assert_eq!(
        steps(&db),
        [
            (4, void),
            (6, budgets.clone()),
            (7, usage.clone()),
            (9, budgets),
            (10, usage)
        ]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.release_steps"),
        5
    );
    // Adopted as the coupon release, with its progress: every record is the coupon release's,
    // and the release is recorded as finished.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.release_steps WHERE release = 'coupon-incident'"
        ),
        5
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates WHERE release = 'coupon-incident' AND gate = 'deploy-new-application'"),
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.releases WHERE release = 'coupon-incident' AND finished_at IS NOT NULL"),
        1
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.releases"), 1);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs"),
        runs + 2
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.release_steps s JOIN pgmend.repair_runs r USING (run_id)
              WHERE s.step IN (9, 10) AND r.run_id > {runs} AND r.state = 'finished'"
        )),
        2
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state <> 'finished'"),
        0
    );
    // No coupon deleted, none voided or marked since the gate or otherwise than the ranking.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons"),
        coupons
    );
    assert_eq!(by_ranking(&db), (duplicates, to_void, 0));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL"),
        to_void
    );
    // The counters equal the sums, the old application's coupons counted.
    assert_eq!(db.scalar_i64(COUNTERS_OFF), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM campaign_budgets"),
        db.scalar_i64("SELECT count(*) FROM campaigns")
    );
    let recorded = "SELECT string_agg(format('%s %s %s %s', campaign_id, legacy_counter_yen, old_system_issued_yen, old_system_coupons), ', ' ORDER BY campaign_id)
                      FROM pgmend.legacy_counter_at_deploy";
    assert_eq!(
        db.client()
            .query_one(recorded, &[])
            .unwrap()
            .get::<_, String>(0),
        legacy_at_gate
    );
}

/// Regenerates [`V6_AT_DEPLOY_GATE`] with the binary `PGMEND_FREEZE_BINARY` (built from commit
/// `PGMEND_FREEZE_COMMIT`, written into the header): the harness's Silver Week data for 200
/// members, `migrate baseline --yes` and `apply --yes` by that binary (it stops at the gate),
/// then five coupons the old application issues while the new one is deployed, dumped with the
/// `pg_dump` of the tests' server binaries. Not run by default, and never with the binary under
/// test: the fixture is what an older pgmend left. `scripts/freeze-deploy-gate-fixture.sh
/// COMMIT` builds the commit and runs it.
#[test]
#[ignore]
fn freeze_the_deploy_gate_fixture() {
    let (Some(binary), Ok(commit)) = (
        std::env::var_os("PGMEND_FREEZE_BINARY"),
        std::env::var("PGMEND_FREEZE_COMMIT"),
    ) else {
        panic!("set PGMEND_FREEZE_BINARY (the older pgmend) and PGMEND_FREEZE_COMMIT (its commit); see scripts/freeze-deploy-gate-fixture.sh");
    };
    let db = fresh_db();
    db.make_legacy_data(200);
    for args in [
        &["migrate", "baseline", "--yes"][..],
        &["apply", "--yes"][..],
    ] {
        let mut older = std::process::Command::new(&binary);
        for var in pgmend::db::conninfo::environment_variables() {
            older.env_remove(var);
        }
        older.env("DATABASE_URL", db.conninfo()).args(args);
        let r = run(&mut older, &db.password());
        assert_eq!(r.code, 0, "{args:?}: {}", r.both());
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates"),
        0,
        "stopped at the gate"
    );
    // The old application keeps running until the new one is deployed: members new to SW-B
    // take a coupon (the unique index refuses duplicates by now), and the old code adds them
    // to campaigns.issued_yen only. The rebuilds after the gate must count them.
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
             SELECT md5('issued after the stop ' || m)::uuid, 'SW-B', 'm' || lpad(m::text, 7, '0'), '2026-09',
                    1000, timestamptz '2026-09-24 09:00+09' + m * interval '1 minute'
               FROM generate_series(201, 205) m;
             UPDATE campaigns SET issued_yen = issued_yen + 5000 WHERE campaign_id = 'SW-B';",
        )
        .unwrap();
    let pg_dump = std::env::var_os("PGMEND_FREEZE_PG_DUMP").map_or_else(
        || pgmend::localpg::find_bin_dir().unwrap().join("pg_dump"),
        std::path::PathBuf::from,
    );
    let out = std::process::Command::new(&pg_dump)
        .args([
            "--schema=public",
            "--schema=pgmend",
            "--no-owner",
            "--no-privileges",
            "--no-comments",
            "--inserts",
            "--rows-per-insert=100",
            "--dbname",
            &db.conninfo(),
        ])
        .output()
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8(out.stdout).unwrap();
    let version = std::process::Command::new(&pg_dump)
        .arg("--version")
        .output()
        .unwrap();
    // What a fresh database or some PostgreSQL versions do not take: the schema public that
    // every database has, and psql's meta-commands and settings of newer pg_dumps.
    let left_out = |line: &str| {
        line == "CREATE SCHEMA public;"
            || line.starts_with("\\restrict")
            || line.starts_with("\\unrestrict")
            || line.starts_with("SET transaction_timeout")
    };
    let mut text = format!(
        "-- pgmend test fixture: a database left at the gate deploy-new-application by pgmend's
-- schema version 6, for tests/schema_version.rs. Do not edit; make it again with
--   scripts/freeze-deploy-gate-fixture.sh {commit}
-- (the ignored test freeze_the_deploy_gate_fixture, the pgmend binary built from {commit}).
--
-- Made by: the test harness's legacy schema (V1) with the Silver Week data for 200 members
-- (make_legacy_data(200)); the binary of commit {commit} ran `pgmend migrate baseline --yes`
-- and `pgmend apply --yes`, which stopped at the gate (steps 1 to 7 done); then the old
-- application issued five coupons (members m0000201 to m0000205, SW-B) and added them to
-- campaigns.issued_yen only. Dumped with
--   {}
-- (schemas public and pgmend, data as INSERTs, no owners or privileges). Left out, so that it
-- restores as one batch into a fresh database on PostgreSQL 14 to 18: CREATE SCHEMA public,
-- and any \\restrict, \\unrestrict and SET transaction_timeout line.
",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    for line in dump.lines() {
        if left_out(line) {
            eprintln!("left out: {line}");
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    std::fs::create_dir_all(repo().join("tests/fixtures")).unwrap();
    std::fs::write(repo().join(V6_AT_DEPLOY_GATE), text).unwrap();
}
