//! The repair kinds `backfill` and `orphans`, end to end on the second example release
//! (`examples/shop-orders`): the end state against expectations computed in SQL from the seed,
//! one ledger record per changed row, the dry run's diff against what apply writes, `--jobs 4`
//! against one worker, undo, a row the application changes while its batch waits, an expression
//! that raises on one row, hostile definitions refused before the first change, and kill -9 at
//! random moments.

mod common;

#[allow(dead_code)]
#[path = "../examples/kill_campaign.rs"]
mod kill_campaign;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn shop() -> PathBuf {
    repo().join("examples/shop-orders")
}

fn shop_arg() -> String {
    shop().display().to_string()
}

/// A database with the shop's legacy schema (V1, adopted by `baseline`) and its broken rows.
fn shop_db() -> TestDb {
    let db = fresh_db();
    let mut c = db.client();
    c.batch_execute(
        &std::fs::read_to_string(shop().join("migrations/V1__shop_baseline.sql")).unwrap(),
    )
    .unwrap();
    c.batch_execute(&std::fs::read_to_string(shop().join("seed.sql")).unwrap())
        .unwrap();
    let r = db.run(&["migrate", "baseline", "--yes", "--release", &shop_arg()]);
    assert_eq!(r.code, 0, "{}", r.both());
    db
}

/// What the release must leave, computed from the seed's rows before it runs, in a schema of
/// the test's own (`expect`): every line kept with its quantity, product and total, and the
/// ids of the lines quarantined.
fn remember_expected(db: &TestDb) {
    db.client()
        .batch_execute(
            "CREATE SCHEMA expect;
             CREATE TABLE expect.lines AS
               SELECT l.line_id, l.order_id,
                      CASE WHEN EXISTS (SELECT 1 FROM products p WHERE p.product_id = l.product_id) THEN l.product_id END AS product_id,
                      greatest(l.quantity, 1) AS quantity, l.unit_cents,
                      greatest(l.quantity, 1)::bigint * l.unit_cents AS total_cents
                 FROM order_lines l WHERE EXISTS (SELECT 1 FROM orders o WHERE o.order_id = l.order_id);
             CREATE TABLE expect.quarantined AS
               SELECT l.* FROM order_lines l WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = l.order_id);
             CREATE TABLE expect.changes AS SELECT
               (SELECT count(*) FROM order_lines WHERE quantity < 1) AS quantities,
               (SELECT count(*) FROM order_lines) AS totals,
               (SELECT count(*) FROM order_lines l WHERE l.product_id IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM products p WHERE p.product_id = l.product_id)) AS products,
               (SELECT count(*) FROM order_lines l WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = l.order_id)) AS orders;",
        )
        .unwrap();
}

/// Lines that differ from the expectation, either way (none: the release did what it should).
fn differences(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM (
           (SELECT line_id, order_id, product_id, quantity, unit_cents, total_cents FROM order_lines
            EXCEPT SELECT * FROM expect.lines)
           UNION ALL
           (SELECT * FROM expect.lines
            EXCEPT SELECT line_id, order_id, product_id, quantity, unit_cents, total_cents FROM order_lines)) d",
    )
}

/// The ledger records of `repair`'s runs (not undo's).
fn records(db: &TestDb, repair: &str) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id) WHERE r.repair = '{repair}'"
    ))
}

fn expected(db: &TestDb, column: &str) -> i64 {
    db.scalar_i64(&format!("SELECT {column} FROM expect.changes"))
}

#[test]
fn the_shop_release_ends_in_the_expected_state_with_one_record_per_changed_row() {
    let db = shop_db();
    remember_expected(&db);
    let plan = db.run(&["plan", "--release", &shop_arg()]);
    assert_eq!(plan.code, 0, "{}", plan.both());
    let r = db.run(&["apply", "--yes", "--release", &shop_arg()]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(differences(&db), 0);
    // The quarantined lines, whole (as the earlier repairs left them: quantity and product
    // repaired, total filled), with their run and reason.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (
               (SELECT line_id, order_id, unit_cents, total_cents FROM order_lines_quarantine
                EXCEPT SELECT line_id, order_id, unit_cents, greatest(quantity, 1)::bigint * unit_cents FROM expect.quarantined)
               UNION ALL
               (SELECT line_id, order_id, unit_cents, greatest(quantity, 1)::bigint * unit_cents FROM expect.quarantined
                EXCEPT SELECT line_id, order_id, unit_cents, total_cents FROM order_lines_quarantine)) d"
        ),
        0
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines_quarantine q JOIN pgmend.repair_runs r ON r.run_id = q.pgmend_run_id WHERE r.repair = 'quarantine-lines-without-order' AND q.pgmend_reason LIKE 'no row of orders has (order_id) = (%'"),
        expected(&db, "orders")
    );
    // One record per changed row, none for a row left as it was.
    for (repair, column) in [
        ("normalise-quantities", "quantities"),
        ("backfill-line-totals", "totals"),
        ("clear-deleted-products", "products"),
        ("quarantine-lines-without-order", "orders"),
    ] {
        assert!(expected(&db, column) > 0, "{column}");
        assert_eq!(records(&db, repair), expected(&db, column), "{repair}");
    }
    // A record holds the row's values before and after.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id)
              WHERE r.repair = 'normalise-quantities' AND (l.before->>'quantity')::int < 1 AND (l.after->>'quantity')::int = 1"
        ),
        expected(&db, "quantities")
    );
    // The constraints the repairs made true are validated, and total_cents is NOT NULL.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_constraint WHERE conrelid = 'order_lines'::regclass AND contype IN ('f', 'c') AND convalidated"),
        4
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_attribute WHERE attrelid = 'order_lines'::regclass AND attname = 'total_cents' AND attnotnull"),
        1
    );
    let v = db.run(&["verify", "--release", &shop_arg()]);
    assert_eq!(v.code, 0, "{}", v.both());
    // Idempotent: every repair again changes and records nothing.
    let before = snapshot_of_tables(&db);
    for repair in [
        "normalise-quantities",
        "backfill-line-totals",
        "clear-deleted-products",
        "quarantine-lines-without-order",
    ] {
        let ledger = records(&db, repair);
        let r = db.run(&["repair", "apply", repair, "--yes", "--release", &shop_arg()]);
        assert_eq!(r.code, 0, "{repair}: {}", r.both());
        assert_eq!(records(&db, repair), ledger, "{repair}");
    }
    assert_eq!(snapshot_of_tables(&db), before);
}

/// The application's tables, as sorted lines.
fn snapshot_of_tables(db: &TestDb) -> Vec<String> {
    let mut c = db.client();
    let mut out = Vec::new();
    for t in ["order_lines", "products", "orders"] {
        let row = c
            .query_one(
                &format!("SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {t} t"),
                &[],
            )
            .unwrap();
        out.push(format!(
            "{t} {} {}",
            row.get::<_, i64>(0),
            row.get::<_, String>(1)
        ));
    }
    out
}

#[test]
fn the_dry_runs_diff_is_what_apply_writes() {
    let db = shop_db();
    let plan = db.run(&[
        "plan",
        "--release",
        &shop_arg(),
        "--format",
        "json",
        "--sample",
        "100000",
    ]);
    assert_eq!(plan.code, 0, "{}", plan.both());
    let doc: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    let r = db.run(&["apply", "--yes", "--release", &shop_arg()]);
    assert_eq!(r.code, 0, "{}", r.both());
    let mut c = db.client();
    for step in doc["steps"].as_array().unwrap() {
        let Some(repair) = step["repair"]["repair"].as_str() else {
            continue;
        };
        let mut predicted: Vec<String> = step["sample"]
            .as_array()
            .unwrap()
            .iter()
            .map(|change| {
                let key = change["key"].as_str().unwrap().to_string();
                let before: Vec<String> = change["before"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                    .collect();
                let after: Vec<String> = change["after"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                    .collect();
                format!("{key} {} -> {}", before.join(","), after.join(","))
            })
            .collect();
        // What the run wrote, in the same words: the changed columns before and after (a
        // quarantined row: its reference before, nothing after).
        let columns: Vec<String> = step["sample"][0]["before"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mut written: Vec<String> = c
            .query(
                "SELECT 'line_id = ' || (l.row_key->>'line_id'),
                        (SELECT string_agg(c || '=' || coalesce(l.before->>c, 'NULL'), ',' ORDER BY c) FROM unnest($2::text[]) c),
                        coalesce((SELECT string_agg(c || '=' || coalesce(l.after->>c, 'NULL'), ',' ORDER BY c) FROM unnest($2::text[]) c WHERE l.after IS NOT NULL), '')
                   FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id) WHERE r.repair = $1",
                &[&repair, &columns],
            )
            .unwrap()
            .iter()
            .map(|r| format!("{} {} -> {}", r.get::<_, String>(0), r.get::<_, String>(1), r.get::<_, String>(2)))
            .collect();
        predicted.sort();
        written.sort();
        assert!(!written.is_empty(), "{repair}");
        assert_eq!(predicted, written, "{repair}");
    }
}

#[test]
fn four_workers_end_as_one_worker_does() {
    let source = shop_db();
    let one = copy_of(&source);
    let four = copy_of(&source);
    drop(source);
    for (db, jobs) in [(&one, "1"), (&four, "4")] {
        let r = db.run(&[
            "apply",
            "--yes",
            "--release",
            &shop_arg(),
            "--jobs",
            jobs,
            "--batch-target",
            "2ms",
        ]);
        assert_eq!(r.code, 0, "--jobs {jobs}: {}", r.both());
    }
    assert_eq!(snapshot_of_tables(&one), snapshot_of_tables(&four));
    let ledger = |db: &TestDb| -> Vec<String> {
        let mut rows: Vec<String> = db
            .client()
            .query(
                "SELECT r.repair || ' ' || l.target_table || ' ' || l.row_key::text || ' ' || l.action || ' ' || coalesce(l.before::text, '') || ' ' || coalesce(l.after::text, '') || ' ' || l.reason
                   FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id)",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        rows.sort();
        rows
    };
    let (a, b) = (ledger(&one), ledger(&four));
    assert!(a.len() > 20_000);
    assert_eq!(a, b);
    // The quarantines hold the same rows.
    let quarantined = |db: &TestDb| {
        db.scalar_i64("SELECT sum(hashtext(line_id || ' ' || order_id || ' ' || quantity || ' ' || pgmend_reason)) FROM order_lines_quarantine")
    };
    assert_eq!(quarantined(&one), quarantined(&four));
}

/// The shop's database with V2 applied: the repairs can run one by one, no constraint validated.
fn shop_at_v2() -> TestDb {
    let db = shop_db();
    let r = db.run(&[
        "migrate",
        "apply",
        "--yes",
        "--release",
        &shop_arg(),
        "--target",
        "2",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    db
}

fn run_id(db: &TestDb, repair: &str) -> String {
    db.scalar_i64(&format!(
        "SELECT max(run_id) FROM pgmend.repair_runs WHERE repair = '{repair}'"
    ))
    .to_string()
}

#[test]
fn undo_restores_each_kind_exactly_and_refuses_a_row_changed_since() {
    let db = shop_at_v2();
    // Without the constraints V2 adds NOT VALID: they check what is written, so no undo could
    // put an orphan or a quantity of 0 back while they exist (the next test).
    db.client()
        .batch_execute("ALTER TABLE order_lines DROP CONSTRAINT order_lines_product_fk, DROP CONSTRAINT order_lines_order_fk, DROP CONSTRAINT order_lines_quantity_positive")
        .unwrap();
    let before = snapshot_of_tables(&db);
    for repair in [
        "normalise-quantities",
        "backfill-line-totals",
        "clear-deleted-products",
        "quarantine-lines-without-order",
    ] {
        let r = db.run(&["repair", "apply", repair, "--yes", "--release", &shop_arg()]);
        assert_eq!(r.code, 0, "{repair}: {}", r.both());
    }
    assert_ne!(snapshot_of_tables(&db), before);
    // A row changed since its run: the backfill's undo is refused, naming it, and changes nothing.
    db.client()
        .batch_execute("UPDATE order_lines SET total_cents = 1 WHERE line_id = 5")
        .unwrap();
    let changed = snapshot_of_tables(&db);
    let totals = run_id(&db, "backfill-line-totals");
    let r = db.run(&["repair", "undo", &totals, "--yes", "--release", &shop_arg()]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stderr.contains("{\"line_id\": 5}"), "{}", r.stderr);
    assert_eq!(snapshot_of_tables(&db), changed);
    db.client()
        .batch_execute(
            "UPDATE order_lines SET total_cents = quantity::bigint * unit_cents WHERE line_id = 5",
        )
        .unwrap();
    // Undone in the reverse order, each exactly: the tables as they were before the runs.
    for repair in [
        "quarantine-lines-without-order",
        "clear-deleted-products",
        "backfill-line-totals",
        "normalise-quantities",
    ] {
        let id = run_id(&db, repair);
        let r = db.run(&["repair", "undo", &id, "--yes", "--release", &shop_arg()]);
        assert_eq!(r.code, 0, "{repair}: {}", r.both());
    }
    // total_cents was NULL everywhere before: the undo puts NULL back.
    assert_eq!(snapshot_of_tables(&db), before);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines_quarantine"),
        0
    );
}

#[test]
fn once_a_constraint_checks_the_table_an_undo_that_would_break_it_is_refused() {
    let db = shop_db();
    let r = db.run(&["apply", "--yes", "--release", &shop_arg()]);
    assert_eq!(r.code, 0, "{}", r.both());
    let before = snapshot_of_tables(&db);
    for (repair, says) in [
        (
            "clear-deleted-products",
            "restoring it would break the foreign key",
        ),
        (
            "quarantine-lines-without-order",
            "restoring it would break the foreign key",
        ),
        (
            "normalise-quantities",
            "restoring it would break CHECK order_lines_quantity_positive",
        ),
    ] {
        let id = run_id(&db, repair);
        let r = db.run(&["repair", "undo", &id, "--yes", "--release", &shop_arg()]);
        assert_eq!(r.code, 1, "{repair}: {}", r.both());
        assert!(r.stderr.contains(says), "{repair}: {}", r.stderr);
        assert_eq!(snapshot_of_tables(&db), before, "{repair}");
    }
}

#[test]
fn a_row_the_application_changes_while_its_batch_waits_is_judged_as_it_is_then() {
    let db = shop_at_v2();
    // Line 29 has quantity -1; the application sets it to 5 in a transaction the batch waits for.
    let (r, _, _) = run_while_held(
        &db,
        "UPDATE order_lines SET quantity = 5 WHERE line_id = 29",
        Duration::from_secs(2),
        "SELECT 1",
        &[
            "repair",
            "apply",
            "normalise-quantities",
            "--yes",
            "--release",
            &shop_arg(),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT quantity::bigint FROM order_lines WHERE line_id = 29"),
        5
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.ledger_records WHERE row_key->>'line_id' = '29'"
        ),
        0
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines WHERE quantity < 1"),
        0
    );
    // Line 17 refers to product 222, deleted: the application puts the product back and touches
    // the line in one transaction the batch waits for. The line is no orphan then: left alone.
    let (r, _, _) = run_while_held(
        &db,
        "INSERT INTO products VALUES (222, 'back again', 500); UPDATE order_lines SET quantity = quantity WHERE line_id = 17",
        Duration::from_secs(2),
        "SELECT 1",
        &["repair", "apply", "clear-deleted-products", "--yes", "--release", &shop_arg()],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT product_id FROM order_lines WHERE line_id = 17"),
        222
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines l WHERE l.product_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM products p WHERE p.product_id = l.product_id)"),
        0
    );
}

/// A copy of the shop release in a temporary directory, with `repair` written as `toml`.
fn release_with(repair: &str, toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&shop(), dir.path());
    std::fs::write(
        dir.path().join("repairs").join(format!("{repair}.toml")),
        toml,
    )
    .unwrap();
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let target = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &target);
        } else {
            std::fs::copy(&p, &target).unwrap();
        }
    }
}

const TOTALS: &str =
    "kind = \"backfill\"\ndescription = \"d\"\ntable = \"order_lines\"\nrow_key = \"line_id\"\n";
const ORPHANS: &str = "kind = \"orphans\"\ndescription = \"d\"\ntable = \"order_lines\"\nrow_key = \"line_id\"\ncolumns = [\"order_id\"]\nreferences = { table = \"orders\", columns = [\"order_id\"] }\n";

#[test]
fn hostile_definitions_are_refused_naming_file_and_key_before_the_first_migration() {
    let db = shop_db();
    db.client()
        .batch_execute(
            "CREATE FUNCTION rnd_cents() RETURNS bigint LANGUAGE sql VOLATILE AS 'SELECT 1';
             CREATE FUNCTION owner_cents(bigint) RETURNS bigint LANGUAGE sql IMMUTABLE SECURITY DEFINER AS 'SELECT $1';
             CREATE TABLE order_lines_quarantine (line_id bigint, note text);
             CREATE TABLE order_notes (note_id bigint PRIMARY KEY, line_id bigint REFERENCES order_lines ON DELETE CASCADE);",
        )
        .unwrap();
    let before = snapshot(&db);
    let backfill =
        |set: &str, filter: &str| format!("{TOTALS}set = {{ {set} }}\nwhere = \"{filter}\"\n");
    for (repair, toml, key, says) in [
        (
            "backfill-line-totals",
            TOTALS.replace("order_lines", "order_linez")
                + "set = { total_cents = \"1\" }\nwhere = \"true\"\n",
            "table",
            "does not exist",
        ),
        (
            "backfill-line-totals",
            backfill("totl_cents = \"1\"", "true"),
            "set.totl_cents",
            "no column",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"quantity *\"", "true"),
            "set.total_cents",
            "42601",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"1; DROP TABLE orders\"", "true"),
            "set.total_cents",
            "`;`",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"rnd_cents()\"", "true"),
            "set.total_cents",
            "VOLATILE",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"owner_cents(quantity)\"", "true"),
            "set.total_cents",
            "SECURITY DEFINER",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"now()\"", "true"),
            "set.total_cents",
            "does not take",
        ),
        (
            "backfill-line-totals",
            backfill(
                "total_cents = \"1\"",
                "line_id IN (SELECT line_id FROM no_such_table)",
            ),
            "where",
            "42P01",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"1\"", "total_cents IS NULL) OR (true"),
            "where",
            "unbalanced parentheses",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"sum(quantity)\"", "true"),
            "set.total_cents",
            "42803",
        ),
        (
            "backfill-line-totals",
            backfill("total_cents = \"length(E'x')\"", "true"),
            "set.total_cents",
            "E'...'",
        ),
        (
            "backfill-line-totals",
            TOTALS.replace("line_id", "order_id")
                + "set = { total_cents = \"1\" }\nwhere = \"true\"\n",
            "row_key",
            "unique index",
        ),
        (
            "quarantine-lines-without-order",
            format!("{ORPHANS}action = \"quarantine\"\n"),
            "quarantine table",
            "exists with other columns",
        ),
        (
            "quarantine-lines-without-order",
            format!("{ORPHANS}action = \"quarantine\"\nquarantine_table = \"lines_held\"\n"),
            "action",
            "ON DELETE CASCADE",
        ),
        (
            "quarantine-lines-without-order",
            format!("{ORPHANS}action = \"set_null\"\n"),
            "action",
            "NOT NULL",
        ),
    ] {
        let dir = release_with(repair, &toml);
        let r = db.run(&["apply", "--yes", "--release", &dir_arg(dir.path())]);
        assert_eq!(r.code, 2, "{toml}\n{}", r.both());
        let file = format!("repairs/{repair}.toml");
        assert!(
            r.stderr.contains(&file) && r.stderr.contains(key) && r.stderr.contains(says),
            "{toml}\nwanted {file}, {key}, {says}:\n{}",
            r.stderr
        );
        assert_eq!(snapshot(&db), before, "{toml}");
        // `plan` refuses it too.
        let p = db.run(&["plan", "--release", &dir_arg(dir.path())]);
        assert_eq!(p.code, 2, "{toml}\n{}", p.both());
    }
}

#[test]
fn an_expression_that_raises_on_a_row_stops_the_run_naming_the_row_and_its_sqlstate() {
    let db = shop_at_v2();
    let dir = release_with(
        "backfill-line-totals",
        &format!("{TOTALS}set = {{ total_cents = \"quantity::bigint * unit_cents / (line_id - 7777)\" }}\nwhere = \"total_cents IS NULL AND quantity > 0\"\n"),
    );
    let r = db.run(&[
        "repair",
        "apply",
        "backfill-line-totals",
        "--yes",
        "--release",
        &dir_arg(dir.path()),
        "--batch-target",
        "2ms",
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("set.total_cents raised on the row line_id = 7777")
            && r.stderr.contains("22012"),
        "{}",
        r.stderr
    );
    // Nothing skipped: the row and the rows after its batch are untouched, the run unfinished.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM order_lines WHERE line_id = 7777 AND total_cents IS NULL"
        ),
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE repair = 'backfill-line-totals' AND state = 'running'"),
        1
    );
    let changed = db.scalar_i64("SELECT count(*) FROM order_lines WHERE total_cents IS NOT NULL");
    assert_eq!(records(&db, "backfill-line-totals"), changed);
}

#[test]
fn a_value_the_table_refuses_as_it_is_written_stops_the_run_naming_the_row_and_its_sqlstate() {
    let db = shop_at_v2();
    // The quantities first: V2's CHECK on them (NOT VALID) refuses any write of a line whose
    // quantity is not positive yet.
    let r = db.run(&[
        "repair",
        "apply",
        "normalise-quantities",
        "--yes",
        "--release",
        &shop_arg(),
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    // Every total computes; the table refuses one of them when the batch writes it.
    db.client()
        .batch_execute(
            "ALTER TABLE order_lines ADD CONSTRAINT no_total_for_7777
               CHECK (line_id <> 7777 OR total_cents IS NULL) NOT VALID",
        )
        .unwrap();
    let r = db.run(&[
        "repair",
        "apply",
        "backfill-line-totals",
        "--yes",
        "--release",
        &shop_arg(),
        "--batch-target",
        "2ms",
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("set.total_cents raised on the row line_id = 7777")
            && r.stderr.contains("23514")
            && r.stderr.contains("no_total_for_7777"),
        "{}",
        r.stderr
    );
    // The search wrote nothing: the row untouched, one record per changed row.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM order_lines WHERE line_id = 7777 AND total_cents IS NULL"
        ),
        1
    );
    let changed = db.scalar_i64("SELECT count(*) FROM order_lines WHERE total_cents IS NOT NULL");
    assert_eq!(records(&db, "backfill-line-totals"), changed);
}

#[test]
fn killed_at_random_the_shop_release_resumes_to_the_same_state_and_ledger() {
    let db = shop_db();
    remember_expected(&db);
    let seed = kill_campaign::seed_from_env().unwrap();
    eprintln!("kill seed {seed}; replay with PGMEND_KILL_SEED={seed}");
    let mut rng = kill_campaign::Rng::new(seed);
    let shop = shop_arg();
    let kill_campaign::Killed { kills, completed } = kill_campaign::kill_then_finish(
        || {
            let mut c = db.pgmend();
            c.args([
                "apply",
                "--yes",
                "--release",
                &shop,
                "--batch-target",
                "2ms",
                "--runner-wait",
                "30s",
            ]);
            c
        },
        &mut rng,
        40,
        6,
        (30, 400),
    )
    .unwrap_or_else(|e| panic!("seed {seed}: {e:#}"));
    assert!(kills >= 2, "interrupted only {kills} times (seed {seed})");
    assert!(completed, "no run finished (seed {seed})");
    assert_eq!(differences(&db), 0, "seed {seed}");
    // One record per changed row, however many runs it took.
    for (repair, column) in [
        ("normalise-quantities", "quantities"),
        ("backfill-line-totals", "totals"),
        ("clear-deleted-products", "products"),
        ("quarantine-lines-without-order", "orders"),
    ] {
        assert_eq!(
            records(&db, repair),
            expected(&db, column),
            "{repair} (seed {seed})"
        );
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines_quarantine"),
        expected(&db, "orders")
    );
}

#[test]
fn a_batch_that_runs_into_the_statement_timeout_is_halved_and_the_run_ends_exact() {
    // It waits for timeouts by design: one server version is enough.
    if slow_tests_skipped(
        "a_batch_that_runs_into_the_statement_timeout_is_halved_and_the_run_ends_exact",
    ) {
        return;
    }
    let db = shop_at_v2();
    // A total that takes a quarter of a millisecond a row (declared IMMUTABLE, as a slow real
    // one would be): about 0.1 s a range of 400 lines, so batches grow to 15 ranges (1.5 s)
    // under --batch-target 10s, past the 1 s timeout, and a half of one goes through.
    db.client()
        .batch_execute(
            "CREATE FUNCTION slow_total(q int, u int, ms float8) RETURNS bigint LANGUAGE plpgsql IMMUTABLE
               AS 'BEGIN PERFORM pg_sleep(ms / 1000); RETURN q::bigint * u; END'",
        )
        .unwrap();
    let dir = release_with(
        "backfill-line-totals",
        &format!("{TOTALS}set = {{ total_cents = \"slow_total(quantity, unit_cents, 0.25)\" }}\nwhere = \"total_cents IS NULL AND quantity > 0 AND line_id <= 12000\"\n"),
    );
    let r = db.run(&[
        "repair",
        "apply",
        "backfill-line-totals",
        "--yes",
        "--release",
        &dir_arg(dir.path()),
        "--statement-timeout",
        "1s",
        "--batch-target",
        "10s",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains(
            "ran into the statement timeout (1s) and was rolled back; trying its first half"
        ),
        "{}",
        r.stderr
    );
    let chosen = "line_id <= 12000 AND quantity > 0";
    assert_eq!(
        db.scalar_i64(&format!("SELECT count(*) FROM order_lines WHERE {chosen} AND total_cents IS DISTINCT FROM quantity::bigint * unit_cents")),
        0
    );
    assert_eq!(
        records(&db, "backfill-line-totals"),
        db.scalar_i64(&format!("SELECT count(*) FROM order_lines WHERE {chosen}"))
    );
    // One target that alone runs past the timeout cannot be split: the run stops, exit 2,
    // naming its range, and nothing of that batch is written.
    let dir = release_with(
        "normalise-quantities",
        "kind = \"backfill\"\ndescription = \"d\"\ntable = \"order_lines\"\nrow_key = \"line_id\"\nset = { quantity = \"slow_total(1, 1, 20 + line_id * 0)::int\" }\nwhere = \"line_id <= 600\"\n",
    );
    let before = snapshot_of_tables(&db);
    let r = db.run(&[
        "repair",
        "apply",
        "normalise-quantities",
        "--yes",
        "--release",
        &dir_arg(dir.path()),
        "--statement-timeout",
        "1s",
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("batch 0..1 ran into the statement timeout (1s) and is one target, which cannot be split"), "{}", r.stderr);
    assert_eq!(snapshot_of_tables(&db), before);
}

#[test]
fn a_backfill_compares_values_as_the_column_stores_them_so_a_second_run_writes_nothing() {
    let db = fresh_db();
    db.client()
        .batch_execute(
            "CREATE TABLE prices (id bigint PRIMARY KEY, cost numeric NOT NULL, label text NOT NULL,
                                  price numeric(10,2), code char(5), doc json, tag text);
             INSERT INTO prices SELECT i, i + 0.234, 'ab' || i, NULL, NULL, NULL, 'T' || i FROM generate_series(1, 50) i;",
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("price-fields.toml"),
        "kind = \"backfill\"\ndescription = \"d\"\ntable = \"prices\"\nrow_key = \"id\"\n\
         set = { price = \"cost\", code = \"upper(label)\", doc = \"json_build_object('id', id)\", tag = \"lower(tag)\" }\nwhere = \"true\"\n",
    )
    .unwrap();
    let repairs = dir_arg(dir.path());
    let args = [
        "repair",
        "apply",
        "price-fields",
        "--yes",
        "--repairs-dir",
        &repairs,
    ];
    let r = db.run(&args);
    assert_eq!(r.code, 0, "{}", r.both());
    // As the columns store them: rounded to cents, the whole label in char(5).
    assert_eq!(db.scalar_i64("SELECT count(*) FROM prices WHERE price <> round(cost, 2) OR code <> upper(label) OR tag <> lower(tag)"), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records WHERE (after->>'price')::numeric <> round((after->>'price')::numeric, 2)"),
        0
    );
    let xmins = |db: &TestDb| -> Vec<String> {
        db.client()
            .query("SELECT xmin::text FROM prices ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let before = xmins(&db);
    let records = db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records");
    let r = db.run(&args);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(xmins(&db), before, "a second run writes no row");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records"),
        records
    );
    // The dry run agrees: nothing to change.
    let p = db.run(&["repair", "plan", "price-fields", "--repairs-dir", &repairs]);
    assert_eq!(p.code, 0, "{}", p.both());
    assert!(
        p.stdout.contains("price-fields: 0 rows would change"),
        "{}",
        p.stdout
    );
}
