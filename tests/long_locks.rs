//! Long locks flagged before they are taken (real PostgreSQL): each form that would hold a
//! strong lock for a time that grows with its table is shown by `migrate plan` on a table above
//! `--long-lock-rows` and refused by `migrate apply` and the release's `plan` and `apply` with
//! nothing changed; a `-- pgmend:long-lock <why>` line lets it through; a table below the
//! threshold passes; the online forms pass.

mod common;

use common::*;

/// The application's tables: `lines` with 3,000 rows (above the tests' threshold of 1,000)
/// and `few` with 10, both analyzed.
fn with_tables() -> TestDb {
    let db = fresh_db();
    db.client()
        .batch_execute(
            "CREATE TABLE products (id int PRIMARY KEY);
             INSERT INTO products SELECT g FROM generate_series(1, 50) g;
             CREATE TABLE lines (id int PRIMARY KEY, product_id int, qty int, note varchar(40));
             INSERT INTO lines SELECT g, 1 + g % 50, g % 7 + 1, 'n' || g FROM generate_series(1, 3000) g;
             CREATE TABLE few (id int PRIMARY KEY, product_id int, qty int, note varchar(40));
             INSERT INTO few SELECT g, 1 + g % 50, g % 7 + 1, 'n' || g FROM generate_series(1, 10) g;
             CREATE MATERIALIZED VIEW lines_ids AS SELECT id FROM lines;
             CREATE MATERIALIZED VIEW few_ids AS SELECT id FROM few;
             ANALYZE products, lines, few, lines_ids, few_ids;",
        )
        .unwrap();
    db
}

/// `sql` with the line that accepts its long lock before its last statement (the one flagged).
fn accepted(sql: &str) -> String {
    let (earlier, last) = sql.rsplit_once('\n').unwrap_or(("", sql));
    let marker = "-- pgmend:long-lock lines is read by a batch job only; tested on a copy";
    if earlier.is_empty() {
        format!("{marker}\n{last}")
    } else {
        format!("{earlier}\n{marker}\n{last}")
    }
}

/// A migrations directory holding `files` alone.
fn dir_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, sql) in files {
        std::fs::write(dir.path().join(name), sql).unwrap();
    }
    dir
}

const THRESHOLD: &str = "1000";

/// pgmend `args` with the migrations of `dir` and a threshold of 1,000 rows.
fn below_threshold(db: &TestDb, args: &[&str], dir: &str) -> Run {
    let mut all = args.to_vec();
    all.extend(["--migrations-dir", dir, "--long-lock-rows", THRESHOLD]);
    db.run(&all)
}

/// Each long form on `lines`, and the same on `few`, with what the plan says it does.
const FORMS: [(&str, &str); 7] = [
    (
        "ALTER TABLE {t} ADD CONSTRAINT {t}_product_fk FOREIGN KEY (product_id) REFERENCES products (id);",
        "adds a FOREIGN KEY that checks every row",
    ),
    (
        "ALTER TABLE {t} ALTER COLUMN note SET NOT NULL;",
        "SET NOT NULL on note checks every row",
    ),
    (
        "ALTER TABLE {t} ALTER COLUMN qty TYPE bigint;",
        "changing qty to bigint rewrites the table",
    ),
    (
        "CREATE INDEX {t}_by_product ON {t} (product_id);",
        "builds the index without CONCURRENTLY",
    ),
    (
        "ALTER TABLE {t} ADD COLUMN token double precision DEFAULT random();",
        "adding token with a volatile default rewrites the table",
    ),
    (
        "ALTER TABLE {t} ADD CONSTRAINT {t}_qty_positive CHECK (qty > 0) NOT VALID;\nALTER TABLE {t} VALIDATE CONSTRAINT {t}_qty_positive;",
        "scans the table while the ACCESS EXCLUSIVE lock taken at line 1 is held",
    ),
    (
        "REFRESH MATERIALIZED VIEW {t}_ids;",
        "refreshes the materialized view without CONCURRENTLY: its readers wait",
    ),
];

#[test]
fn each_long_form_is_flagged_refused_with_nothing_changed_and_accepted_by_its_marker() {
    let db = with_tables();
    for (sql, what) in FORMS {
        let sql = sql.replace("{t}", "lines");
        let dir = dir_of(&[("V1__long.sql", &sql)]);
        let d = dir_arg(dir.path());
        let before = snapshot(&db);

        let r = below_threshold(&db, &["migrate", "plan"], &d);
        assert_eq!(r.code, 2, "{sql}\n{}", r.both());
        assert!(
            r.stdout.contains("long lock: V1 line"),
            "{sql}\n{}",
            r.stdout
        );
        assert!(r.stdout.contains(what), "{sql}: {what}\n{}", r.stdout);
        assert!(r.stdout.contains("3,000 rows"), "{sql}\n{}", r.stdout);
        assert!(
            r.stdout.contains("apply refuses this (exit 2)"),
            "{sql}\n{}",
            r.stdout
        );
        assert!(r.stdout.contains("Online form:"), "{sql}\n{}", r.stdout);

        let r = below_threshold(&db, &["migrate", "apply", "--yes"], &d);
        assert_eq!(r.code, 2, "{sql}\n{}", r.both());
        assert!(
            r.stderr.contains("nothing was changed"),
            "{sql}\n{}",
            r.stderr
        );
        assert!(r.stderr.contains("pgmend:long-lock"), "{sql}\n{}", r.stderr);
        assert_eq!(snapshot(&db), before, "{sql}: nothing changed");

        // The default threshold, 1,000,000 rows, lets 3,000 through: not applied here, only
        // planned (the plan exits 0 and shows the statement without a refusal).
        let r = db.run(&["migrate", "plan", "--migrations-dir", &d]);
        assert_eq!(r.code, 0, "{sql}\n{}", r.both());
        assert!(!r.stdout.contains("apply refuses"), "{sql}\n{}", r.stdout);
    }
    // Each, accepted by its migration, is applied.
    for (i, (sql, _)) in FORMS.iter().enumerate() {
        let sql = sql.replace("{t}", "lines");
        let marked = accepted(&sql);
        let files: Vec<(String, String)> = (0..=i)
            .map(|k| {
                let body = if k == i {
                    marked.clone()
                } else {
                    "SELECT 1;".to_string()
                };
                (format!("V{}__step_{k}.sql", k + 1), body)
            })
            .collect();
        // Earlier forms were applied by earlier rounds: their files stay as they were.
        let files: Vec<(String, String)> = files
            .into_iter()
            .enumerate()
            .map(|(k, (name, body))| {
                if k < i {
                    (name, accepted(&FORMS[k].0.replace("{t}", "lines")))
                } else {
                    (name, body)
                }
            })
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_str()))
            .collect();
        let dir = dir_of(&refs);
        let d = dir_arg(dir.path());
        let r = below_threshold(&db, &["migrate", "apply", "--yes"], &d);
        assert_eq!(r.code, 0, "{sql}\n{}", r.both());
        assert_eq!(db.history().len(), i + 1, "{sql}");
    }
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pg_constraint WHERE conname IN ('lines_product_fk', 'lines_qty_positive') AND convalidated"
        ),
        2
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_attribute WHERE attrelid = 'lines'::regclass AND attname = 'note' AND attnotnull"),
        1
    );
}

#[test]
fn a_table_below_the_threshold_and_the_online_forms_pass() {
    let db = with_tables();
    let below: Vec<String> = FORMS
        .iter()
        .enumerate()
        .map(|(i, (sql, _))| format!("-- form {i}\n{}", sql.replace("{t}", "few")))
        .collect();
    let files: Vec<(String, &str)> = below
        .iter()
        .enumerate()
        .map(|(i, sql)| (format!("V{}__few_{i}.sql", i + 1), sql.as_str()))
        .collect();
    let online = [
        (
            "V8__fk_not_valid.sql",
            "ALTER TABLE lines ADD CONSTRAINT lines_product_fk FOREIGN KEY (product_id) REFERENCES products (id) NOT VALID;",
        ),
        ("V9__fk_validate.sql", "ALTER TABLE lines VALIDATE CONSTRAINT lines_product_fk;"),
        (
            "V10__note_check.sql",
            "ALTER TABLE lines ADD CONSTRAINT lines_note_nn CHECK (note IS NOT NULL) NOT VALID;",
        ),
        ("V11__note_validate.sql", "ALTER TABLE lines VALIDATE CONSTRAINT lines_note_nn;"),
        ("V12__note_not_null.sql", "ALTER TABLE lines ALTER COLUMN note SET NOT NULL;"),
        ("V13__note_text.sql", "ALTER TABLE lines ALTER COLUMN note TYPE text;"),
        (
            "V14__flag.sql",
            "ALTER TABLE lines ADD COLUMN flagged boolean NOT NULL DEFAULT false, ADD COLUMN seen_at timestamptz DEFAULT now();",
        ),
        (
            "V15__index.sql",
            "CREATE INDEX CONCURRENTLY lines_by_product ON lines (product_id);",
        ),
        (
            "V16__ids_unique.sql",
            "CREATE UNIQUE INDEX CONCURRENTLY lines_ids_id ON lines_ids (id);",
        ),
        ("V17__ids_refresh.sql", "REFRESH MATERIALIZED VIEW CONCURRENTLY lines_ids;"),
    ];
    let mut all: Vec<(&str, &str)> = files.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    all.extend(online);
    let dir = dir_of(&all);
    let d = dir_arg(dir.path());
    let r = below_threshold(&db, &["migrate", "plan"], &d);
    assert_eq!(r.code, 0, "{}", r.both());
    // Below the threshold a long form is still shown, without a refusal; the online forms on
    // the large table are not long locks at all.
    assert_eq!(r.stdout.matches("long lock: ").count(), 7, "{}", r.stdout);
    assert!(!r.stdout.contains("on lines ("), "{}", r.stdout);
    assert!(!r.stdout.contains("on lines_ids ("), "{}", r.stdout);
    let r = below_threshold(&db, &["migrate", "apply", "--yes"], &d);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.history().len(), 17);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_attribute WHERE attrelid = 'lines'::regclass AND attname = 'note' AND attnotnull AND atttypid = 'text'::regtype"),
        1
    );
}

#[test]
fn the_release_refuses_a_long_lock_of_its_own_migrations_before_its_first_step() {
    // The coupon release's legacy tables, with its own V2 replaced by one that adds a foreign
    // key without NOT VALID to issued_coupons (above a threshold of 10 rows).
    let db = fresh_db();
    db.make_legacy_baselined(40);
    db.client().batch_execute("ANALYZE issued_coupons").unwrap();
    let v2 = std::fs::read_to_string(repo().join("migrations/V2__expand_for_repair.sql")).unwrap();
    let dir = migrations_dir(&[(
        "V2__expand_for_repair.sql",
        &format!("{v2}\nALTER TABLE issued_coupons ADD CONSTRAINT coupons_campaign_fk FOREIGN KEY (campaign_id) REFERENCES campaigns;\n"),
    )]);
    let d = dir_arg(dir.path());
    let before = snapshot(&db);
    let r = db.run(&["plan", "--migrations-dir", &d, "--long-lock-rows", "10"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.both()
            .contains("adds a FOREIGN KEY that checks every row"),
        "{}",
        r.both()
    );
    let r = db.run(&[
        "apply",
        "--yes",
        "--confirm",
        "deploy-new-application",
        "--migrations-dir",
        &d,
        "--long-lock-rows",
        "10",
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("nothing was changed"), "{}", r.stderr);
    assert_eq!(snapshot(&db), before, "nothing changed");
}

#[test]
fn a_table_never_analyzed_is_counted_up_to_the_threshold() {
    let db = fresh_db();
    // Created and filled in one transaction, never analyzed: the planner knows no row count
    // (reltuples -1; autovacuum is too slow to see it first).
    db.client()
        .batch_execute(
            "BEGIN;
             CREATE TABLE fresh (id int PRIMARY KEY, note text);
             INSERT INTO fresh SELECT g, 'n' || g FROM generate_series(1, 5000) g;
             COMMIT;",
        )
        .unwrap();
    assert!(db.scalar_i64("SELECT reltuples::bigint FROM pg_class WHERE relname = 'fresh'") < 0);
    let dir = dir_of(&[(
        "V1__index.sql",
        "CREATE INDEX fresh_by_note ON fresh (note);",
    )]);
    let r = below_threshold(&db, &["migrate", "plan"], &dir_arg(dir.path()));
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stdout.contains("on fresh (at least 1,001 rows"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("apply refuses this (exit 2)"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_materialized_view_never_populated_is_refreshed_without_a_count() {
    // `WITH NO DATA` leaves the view unreadable ("has not been populated"): counting its rows
    // failed the plan. It has no rows to make the refresh long by its own size.
    let db = with_tables();
    db.client()
        .batch_execute("CREATE MATERIALIZED VIEW lines_later AS SELECT id FROM lines WITH NO DATA")
        .unwrap();
    let dir = dir_of(&[("V1__refresh.sql", "REFRESH MATERIALIZED VIEW lines_later;")]);
    let r = below_threshold(&db, &["migrate", "apply", "--yes"], &dir_arg(dir.path()));
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.scalar_i64("SELECT count(*) FROM lines_later"), 3000);
}
