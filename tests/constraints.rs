//! The migrations that repairs of references and missing values enable, against a real server:
//! a FOREIGN KEY added NOT VALID (its census counts the orphans under the key's match rule),
//! `VALIDATE CONSTRAINT` of a foreign key or a CHECK (its census, from the catalog or the earlier
//! pending migration, stops the step before the VALIDATE), the NOT NULL pattern through a
//! validated CHECK, and the VALIDATE's own time bound and lock. Every expected count is computed
//! by SQL written apart from pgmend's.

mod common;

use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// A release directory named `shop` with `files` as its migrations, one step per migration.
fn release(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("migrations")).unwrap();
    std::fs::create_dir(dir.path().join("repairs")).unwrap();
    let mut toml = String::from("name = \"shop\"\n");
    for (name, sql) in files {
        std::fs::write(dir.path().join("migrations").join(name), sql).unwrap();
        let version: String = name[1..].chars().take_while(char::is_ascii_digit).collect();
        toml.push_str(&format!("\n[[step]]\nmigrate = {version}\n"));
    }
    std::fs::write(dir.path().join("release.toml"), toml).unwrap();
    dir
}

const V1: &str = "CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE pair (x int, y int, PRIMARY KEY (x, y));
CREATE TABLE child (id int PRIMARY KEY, parent_id int, a int, b int, note text);";

/// A database with the release's V1 applied and rows in it: parents 1 to 10, pairs (i, i) for
/// i in 1..10, and 200 children whose references miss in every way the rules tell apart.
fn at_v1(dir: &tempfile::TempDir) -> TestDb {
    let db = fresh_db();
    let r = db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--target",
        "1",
        "--release",
        &rel(dir),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    db.client()
        .batch_execute(
            "INSERT INTO parent SELECT g FROM generate_series(1, 10) g;
             INSERT INTO pair SELECT g, g FROM generate_series(1, 10) g;
             INSERT INTO child
             SELECT g,
                    CASE WHEN g % 7 = 0 THEN NULL ELSE g % 13 END,      -- 11, 12 and 0 have no parent
                    CASE WHEN g % 5 = 0 THEN NULL ELSE g % 12 END,
                    CASE WHEN g % 3 = 0 THEN NULL ELSE g % 12 END,      -- (a, b) partly NULL, or (11, 11)
                    CASE WHEN g % 4 = 0 THEN NULL ELSE 'n' || g END
               FROM generate_series(1, 200) g;",
        )
        .unwrap();
    db
}

fn rel(dir: &tempfile::TempDir) -> String {
    dir_arg(dir.path())
}

fn convalidated(db: &TestDb, name: &str) -> Option<bool> {
    db.client()
        .query_opt(
            "SELECT convalidated FROM pg_constraint WHERE conname = $1",
            &[&name],
        )
        .unwrap()
        .map(|r| r.get(0))
}

fn versions(db: &TestDb) -> Vec<i32> {
    db.history().iter().map(|(v, _)| *v).collect()
}

/// Orphans under MATCH SIMPLE, by an anti-join.
const SIMPLE_ORPHANS: &str = "SELECT count(*) FROM child c LEFT JOIN parent p ON p.id = c.parent_id
                               WHERE c.parent_id IS NOT NULL AND p.id IS NULL";
/// Violators of a MATCH FULL key on (a, b): NULL in part, or both set and no pair.
const FULL_ORPHANS: &str = "SELECT count(*) FROM child c
                             WHERE num_nulls(c.a, c.b) = 1
                                OR (num_nulls(c.a, c.b) = 0 AND (c.a, c.b) NOT IN (SELECT x, y FROM pair))";

fn censuses(plan: &serde_json::Value, version: i64) -> Vec<serde_json::Value> {
    plan["pending"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["version"] == version)
        .unwrap_or_else(|| panic!("V{version} is not pending: {plan}"))["censuses"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn the_plan_counts_orphans_under_each_match_rule_and_a_key_without_not_valid_stops_apply() {
    let dir = release(&[
        ("V1__shop.sql", V1),
        (
            "V2__keys_not_valid.sql",
            "ALTER TABLE child ADD CONSTRAINT child_parent_fk FOREIGN KEY (parent_id) REFERENCES parent (id) NOT VALID;
             ALTER TABLE child ADD CONSTRAINT child_pair_fk FOREIGN KEY (a, b) REFERENCES pair (x, y) MATCH FULL NOT VALID;",
        ),
        (
            // No referenced columns: the parent's primary key, read from the catalog.
            "V3__key_validated_at_once.sql",
            "ALTER TABLE child ADD CONSTRAINT child_parent_fk2 FOREIGN KEY (parent_id) REFERENCES parent;",
        ),
    ]);
    let db = at_v1(&dir);
    let simple = db.scalar_i64(SIMPLE_ORPHANS);
    let full = db.scalar_i64(FULL_ORPHANS);
    assert!(simple > 0 && full > simple, "{simple} {full}");

    let r = db.run(&[
        "migrate",
        "plan",
        "--format",
        "json",
        "--release",
        &rel(&dir),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let v2 = censuses(&plan, 2);
    assert_eq!(v2[0]["guard"], "foreign_key_not_valid");
    assert_eq!(v2[0]["name"], "child_parent_fk");
    assert_eq!(v2[0]["violators"], simple);
    assert_eq!(v2[0]["sample"].as_array().unwrap().len(), 5);
    assert_eq!(v2[1]["guard"], "foreign_key_not_valid");
    assert_eq!(v2[1]["violators"], full);
    let v3 = censuses(&plan, 3);
    assert_eq!(v3[0]["guard"], "foreign_key");
    assert_eq!(v3[0]["violators"], simple);
    // Every sampled orphan is one: a parent_id set and missing from parent.
    for row in v3[0]["sample"].as_array().unwrap() {
        let row: serde_json::Value = serde_json::from_str(row.as_str().unwrap()).unwrap();
        let id = row["parent_id"].as_i64().unwrap();
        assert!(!(1..=10).contains(&id), "{row}");
    }
    let human = db.run(&["migrate", "plan", "--release", &rel(&dir)]);
    assert!(
        human.stdout.contains(&format!(
            "census child_parent_fk: {simple} rows of child whose (parent_id) has no row in parent"
        )),
        "{}",
        human.stdout
    );

    // V2 goes in with its orphans (reported); V3 is not attempted.
    let r = db.run(&["migrate", "apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("V3__key_validated_at_once was not attempted"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains(&format!("census child_parent_fk2: {simple} rows")),
        "{}",
        r.stderr
    );
    assert_eq!(versions(&db), [1, 2]);
    assert_eq!(convalidated(&db, "child_parent_fk"), Some(false));
    assert_eq!(convalidated(&db, "child_pair_fk"), Some(false));
    assert_eq!(convalidated(&db, "child_parent_fk2"), None);
    // verify: a key added NOT VALID is there, its orphans counted and accepted.
    let v = db.run(&["verify", "--format", "json", "--release", &rel(&dir)]);
    let doc: serde_json::Value =
        serde_json::from_str(&v.stdout).unwrap_or_else(|_| panic!("{}", v.both()));
    let fk = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "foreign_key_child_pair_fk")
        .unwrap_or_else(|| panic!("{doc}"))
        .clone();
    assert_eq!(fk["ok"], true, "{fk}");
    let detail = fk["detail"].as_str().unwrap();
    assert!(
        detail.contains("NOT VALID") && detail.contains(&format!("{full} rows")),
        "{detail}"
    );

    // The keys still refuse new orphans.
    let e = db
        .client()
        .batch_execute("INSERT INTO child VALUES (1000, 99, NULL, NULL, 'x')")
        .unwrap_err();
    assert_eq!(e.code().unwrap().code(), "23503");
}

#[test]
fn a_validate_stops_before_it_runs_while_orphans_remain_and_validates_once_they_are_fixed() {
    let dir = release(&[
        ("V1__shop.sql", V1),
        (
            "V2__key_not_valid.sql",
            "ALTER TABLE child ADD CONSTRAINT child_parent_fk FOREIGN KEY (parent_id) REFERENCES parent (id) NOT VALID;",
        ),
        (
            "V3__validate_key.sql",
            "ALTER TABLE child VALIDATE CONSTRAINT child_parent_fk;",
        ),
    ]);
    let db = at_v1(&dir);
    let simple = db.scalar_i64(SIMPLE_ORPHANS);

    // Planned before V2: V3's census counts by V2's text, the constraint not yet in the catalog.
    let r = db.run(&[
        "migrate",
        "plan",
        "--format",
        "json",
        "--release",
        &rel(&dir),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let v3 = censuses(&plan, 3);
    assert_eq!(v3[0]["guard"], "validate");
    assert_eq!(v3[0]["violators"], simple);
    assert_eq!(
        plan["pending"][1]["strongest_lock"],
        "SHARE_UPDATE_EXCLUSIVE"
    );

    // The release's plan shows the same census.
    let r = db.run(&["plan", "--release", &rel(&dir)]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout.contains(&format!(
            "census child_parent_fk: {simple} rows of child whose (parent_id) has no row in parent"
        )),
        "{}",
        r.stdout
    );

    // Applied: V2 goes in, V3's census (from the catalog now) stops it before the VALIDATE.
    let r = db.run(&["migrate", "apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("pgmend: stopped: V3__validate_key was not attempted"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&format!(
            "census child_parent_fk: {simple} rows of child whose (parent_id) has no row in parent"
        )),
        "{}",
        r.stderr
    );
    assert_eq!(versions(&db), [1, 2]);
    assert_eq!(convalidated(&db, "child_parent_fk"), Some(false));

    // The orphans' references set to NULL: the VALIDATE goes through.
    db.client()
        .batch_execute("UPDATE child c SET parent_id = NULL WHERE NOT EXISTS (SELECT 1 FROM parent p WHERE p.id = c.parent_id)")
        .unwrap();
    let r = db.run(&["migrate", "apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains("census child_parent_fk: no rows of child"),
        "{}",
        r.stderr
    );
    assert_eq!(versions(&db), [1, 2, 3]);
    assert_eq!(convalidated(&db, "child_parent_fk"), Some(true));

    // verify derives a check from each census: the key present, and validated.
    let v = db.run(&["verify", "--format", "json", "--release", &rel(&dir)]);
    let doc: serde_json::Value =
        serde_json::from_str(&v.stdout).unwrap_or_else(|_| panic!("{}", v.both()));
    let check = |name: &str| -> serde_json::Value {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {doc}"))
            .clone()
    };
    assert_eq!(check("foreign_key_child_parent_fk")["ok"], true);
    assert_eq!(check("validated_child_parent_fk")["ok"], true);
}

#[test]
fn the_not_null_pattern_stops_at_the_validate_while_nulls_remain_and_then_sets_not_null_without_a_long_lock(
) {
    let dir = release(&[
        ("V1__shop.sql", V1),
        (
            "V2__note_checked.sql",
            "ALTER TABLE child ADD CONSTRAINT child_note_set CHECK (note IS NOT NULL) NOT VALID;",
        ),
        (
            "V3__note_validated.sql",
            "ALTER TABLE child VALIDATE CONSTRAINT child_note_set;",
        ),
        (
            "V4__note_not_null.sql",
            "ALTER TABLE child ALTER COLUMN note SET NOT NULL;",
        ),
    ]);
    let db = at_v1(&dir);
    let nulls = db.scalar_i64("SELECT count(*) FROM child WHERE note IS NULL");
    assert!(nulls > 0);
    // SET NOT NULL after the validated check scans nothing: not a long lock, even at 1 row.
    let r = db.run(&[
        "migrate",
        "plan",
        "--long-lock-rows",
        "1",
        "--release",
        &rel(&dir),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(!r.stdout.contains("long lock"), "{}", r.stdout);

    // The release stops at V3, before its VALIDATE; V4 is not reached.
    let r = db.run(&["apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("V3__note_validated was not attempted"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&format!(
            "census child_note_set: {nulls} rows of child that break CHECK ((note IS NOT NULL))"
        )),
        "{}",
        r.stderr
    );
    assert_eq!(versions(&db), [1, 2]);
    assert_eq!(convalidated(&db, "child_note_set"), Some(false));

    db.client()
        .batch_execute("UPDATE child SET note = '' WHERE note IS NULL")
        .unwrap();
    let r = db.run(&["apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(versions(&db), [1, 2, 3, 4]);
    assert_eq!(convalidated(&db, "child_note_set"), Some(true));
    let not_null: bool = db
        .client()
        .query_one(
            "SELECT attnotnull FROM pg_attribute WHERE attrelid = 'child'::regclass AND attname = 'note'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(not_null);
}

#[test]
fn a_validate_runs_under_its_own_time_bound_and_lets_writes_through() {
    // A check that takes 10 ms a row: 200 rows make a VALIDATE of about 2 s.
    let dir = release(&[
        ("V1__shop.sql", V1),
        (
            "V2__slow_check.sql",
            "ALTER TABLE child ADD CONSTRAINT child_id_positive CHECK (slow_positive(id)) NOT VALID;",
        ),
        (
            "V3__validate_slow_check.sql",
            "ALTER TABLE child VALIDATE CONSTRAINT child_id_positive;",
        ),
    ]);
    let db = at_v1(&dir);
    // (Created apart from V2: a census taken before V2 cannot call a function V2 creates.)
    db.client()
        .batch_execute(
            "CREATE FUNCTION slow_positive(v int) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(0.01); RETURN v > 0; END $$",
        )
        .unwrap();
    let r = db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--target",
        "2",
        "--release",
        &rel(&dir),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());

    // Under a bound shorter than its scan the VALIDATE is cancelled: exit 1, nothing changed.
    let r = db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--statement-timeout",
        "300ms",
        "--validate-timeout",
        "500ms",
        "--release",
        &rel(&dir),
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("VALIDATE CONSTRAINT child_id_positive was still scanning when its bound, --validate-timeout 500ms, ran out"),
        "{}",
        r.stderr
    );
    assert_eq!(versions(&db), [1, 2]);
    assert_eq!(convalidated(&db, "child_id_positive"), Some(false));

    // --statement-timeout 300ms does not bound it: it runs its 2 s under --validate-timeout
    // (1h by default), holding SHARE UPDATE EXCLUSIVE only, and an INSERT goes through meanwhile.
    let apply = db
        .pgmend()
        .args([
            "migrate",
            "apply",
            "--yes",
            "--statement-timeout",
            "300ms",
            "--release",
            &rel(&dir),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut probe = db.client();
    let held = |c: &mut postgres::Client| -> Vec<String> {
        c.query(
            "SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a USING (pid)
              WHERE l.relation = 'child'::regclass AND l.granted AND a.application_name = 'pgmend'
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let started = Instant::now();
    loop {
        if held(&mut probe).contains(&"ShareUpdateExclusiveLock".to_string()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the VALIDATE never started"
        );
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(held(&mut probe), ["ShareUpdateExclusiveLock"]);
    let t = Instant::now();
    probe
        .batch_execute("SET lock_timeout = '1s'; INSERT INTO child VALUES (1001, 1, 1, 1, 'during the validate')")
        .unwrap();
    let insert_took = t.elapsed();
    let still_validating = held(&mut probe).contains(&"ShareUpdateExclusiveLock".to_string());
    let out = apply.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        insert_took < Duration::from_millis(500),
        "the INSERT waited {insert_took:?}"
    );
    assert!(
        still_validating,
        "the VALIDATE ended before the INSERT did: the test shows nothing"
    );
    assert_eq!(versions(&db), [1, 2, 3]);
    assert_eq!(convalidated(&db, "child_id_positive"), Some(true));
}

#[test]
fn migrate_validate_takes_a_foreign_key_and_zero_validate_timeout_is_refused() {
    let dir = release(&[
        ("V1__shop.sql", V1),
        (
            "V2__key_not_valid.sql",
            "ALTER TABLE child ADD CONSTRAINT child_parent_fk FOREIGN KEY (parent_id) REFERENCES parent (id) NOT VALID;",
        ),
    ]);
    let db = at_v1(&dir);
    let r = db.run(&["migrate", "apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 0, "{}", r.both());
    let r = db.run(&[
        "migrate",
        "validate",
        "child_parent_fk",
        "--yes",
        "--validate-timeout",
        "0",
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--validate-timeout 0"), "{}", r.stderr);

    let simple = db.scalar_i64(SIMPLE_ORPHANS);
    let r = db.run(&[
        "migrate",
        "validate",
        "child_parent_fk",
        "--yes",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains(&format!("census child_parent_fk: {simple} rows")),
        "{}",
        r.stderr
    );
    assert_eq!(convalidated(&db, "child_parent_fk"), Some(false));

    db.client()
        .batch_execute("DELETE FROM child c WHERE NOT EXISTS (SELECT 1 FROM parent p WHERE p.id = c.parent_id) AND c.parent_id IS NOT NULL")
        .unwrap();
    let r = db.run(&[
        "migrate",
        "validate",
        "child_parent_fk",
        "--yes",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["finding"]["guard"], "validate");
    assert_eq!(doc["finding"]["violators"], 0);
    assert_eq!(convalidated(&db, "child_parent_fk"), Some(true));
}

/// A VALIDATE step with `retry_with`: its census sends the release back to the repair that
/// fixes the rows (here a counter rebuild, whose true values meet the check), then validates.
#[test]
fn in_the_release_a_validate_census_runs_its_retry_with_repair_then_validates() {
    let dir = release(&[
        (
            "V1__shop.sql",
            "CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, amount_yen int NOT NULL);
             CREATE TABLE customer_totals (customer_id int PRIMARY KEY, total_yen bigint NOT NULL);",
        ),
        (
            "V2__total_checked.sql",
            "ALTER TABLE customer_totals ADD CONSTRAINT total_not_negative CHECK (total_yen >= 0) NOT VALID;",
        ),
        (
            "V3__total_validated.sql",
            "ALTER TABLE customer_totals VALIDATE CONSTRAINT total_not_negative;",
        ),
    ]);
    let toml = dir.path().join("release.toml");
    let text = std::fs::read_to_string(&toml).unwrap().replace(
        "migrate = 3\n",
        "migrate = 3\nretry_with = \"rebuild-customer-totals\"\n",
    );
    std::fs::write(&toml, text).unwrap();
    std::fs::write(
        dir.path().join("repairs/rebuild-customer-totals.toml"),
        "kind = \"rebuild_counter\"
description = \"set each customer's total from the sum of their orders\"
counter_table = \"customer_totals\"
key = [\"customer_id\"]
counter = \"total_yen\"
source_table = \"orders\"
aggregate = \"sum\"
value = \"amount_yen\"
keys_from = \"source\"
when_no_source = \"zero\"
",
    )
    .unwrap();
    let db = fresh_db();
    let r = db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--target",
        "1",
        "--release",
        &rel(&dir),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    db.client()
        .batch_execute(
            "INSERT INTO orders SELECT g, g % 20, 100 FROM generate_series(1, 400) g;
             -- drifted totals, a quarter of them below zero
             INSERT INTO customer_totals SELECT c, CASE WHEN c % 4 = 0 THEN -100 ELSE 5 END FROM generate_series(0, 19) c;",
        )
        .unwrap();
    let negative = db.scalar_i64("SELECT count(*) FROM customer_totals WHERE total_yen < 0");
    assert_eq!(negative, 5);

    let r = db.run(&["apply", "--yes", "--release", &rel(&dir)]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains(&format!(
            "census total_not_negative: {negative} rows of customer_totals that break CHECK"
        )),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("pgmend repair apply rebuild-customer-totals --yes"),
        "the census names the repair: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains("running rebuild-customer-totals again"),
        "{}",
        r.stderr
    );
    assert_eq!(versions(&db), [1, 2, 3]);
    assert_eq!(convalidated(&db, "total_not_negative"), Some(true));
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM customer_totals t
               JOIN (SELECT customer_id, sum(amount_yen) AS s FROM orders GROUP BY customer_id) o USING (customer_id)
              WHERE t.total_yen <> o.s"
        ),
        0
    );
}
