//! Hostile and broken input (issue 7, part 5): every case exits 2 with a message that says
//! what went wrong, where, and what to do, and changes nothing in the database. "Nothing"
//! is checked on a snapshot of the catalog (schemas, relations and their owners, columns,
//! constraints, indexes) and a checksum of every table's rows, taken before and after.
//!
//! Covered elsewhere and not repeated here: a malformed URL port and an unknown connection
//! parameter, a wrong password and an unreachable host for `migrate status`
//! (tests/connect.rs); a duplicate version, a misnamed, comment-only, transaction-control or
//! non-UTF-8 file, an edited and a missing applied migration, and a read-only database for
//! `migrate apply` (tests/migrate.rs).

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// A legacy database with the demo's dirty data, adopted with `migrate baseline`: the
/// release has everything still to do.
fn legacy() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(30);
    db
}

/// Runs `args`, expects exit 2 with every `expect` in stderr, and nothing changed.
fn refused(db: &TestDb, args: &[&str], expect: &[&str]) -> Run {
    let before = snapshot(db);
    let r = db.run(args);
    if std::env::var_os("HOSTILE_SHOW").is_some() {
        eprintln!("--- {args:?}\n{}", r.stderr);
    }
    assert_eq!(r.code, 2, "{args:?}\n{}", r.both());
    for e in expect {
        assert!(
            r.stderr.contains(e),
            "{args:?}: expected {e:?} in:\n{}",
            r.stderr
        );
    }
    assert!(
        r.stderr.contains("pgmend: error:"),
        "one error line first: {}",
        r.stderr
    );
    assert_eq!(snapshot(db), before, "{args:?} changed the database");
    r
}

fn refused_with(db: &TestDb, dir_flag: &str, dir: &Path, args: &[&str], expect: &[&str]) {
    let d = dir_arg(dir);
    let mut all: Vec<&str> = args.to_vec();
    all.extend([dir_flag, d.as_str()]);
    refused(db, &all, expect);
}

#[test]
fn malformed_migration_sets_are_refused_by_every_command_that_writes() {
    let db = legacy();
    let bom = "\u{feff}CREATE TABLE with_bom (x int);".to_string();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "V1.5__point.sql",
            b"SELECT 1;".to_vec(),
            "is not a whole number",
        ),
        (
            "U90__undo.sql",
            b"SELECT 1;".to_vec(),
            "unversioned (U) migrations",
        ),
        (
            "v90__lower.sql",
            b"SELECT 1;".to_vec(),
            "V<version>__<name>.sql",
        ),
        ("V0__zero.sql", b"SELECT 1;".to_vec(), "versions start at 1"),
        (
            "V99999999999__huge.sql",
            b"SELECT 1;".to_vec(),
            "larger than 2147483647",
        ),
        (
            "V90__has-dash.sql",
            b"SELECT 1;".to_vec(),
            "ASCII letters, digits or underscores",
        ),
        (
            "V90__caf\u{e9}.sql",
            b"SELECT 1;".to_vec(),
            "ASCII letters, digits or underscores",
        ),
        ("V90__.sql", b"SELECT 1;".to_vec(), "must be 1 to 200"),
        (
            "V3__again.sql",
            b"SELECT 1;".to_vec(),
            "two migrations have version 3",
        ),
        ("V90__zero_bytes.sql", Vec::new(), "holds no SQL statement"),
        (
            "V90__blank.sql",
            b"\n  \n\t\n".to_vec(),
            "holds no SQL statement",
        ),
        (
            "V90__comments.sql",
            b"/* later */ -- and later\n".to_vec(),
            "holds no SQL statement",
        ),
        (
            "V90__latin1.sql",
            b"CREATE TABLE caf\xe9 (x int);".to_vec(),
            "not valid UTF-8 (at byte 16)",
        ),
        ("V90__bom.sql", bom.into_bytes(), "byte order mark"),
        (
            "V90__mixed.sql",
            b"CREATE TABLE m (x int);\nCREATE INDEX CONCURRENTLY mi ON m (x);".to_vec(),
            "put the online statements in a migration file of their own",
        ),
    ];
    for (name, bytes, expect) in cases {
        let dir = migrations_dir(&[]);
        std::fs::write(dir.path().join(name), &bytes).unwrap();
        for args in [
            &["migrate", "apply", "--yes"][..],
            &["apply", "--yes", "--confirm", "deploy-new-application"][..],
        ] {
            // Where: the file is named (the duplicate names both). What to do: `expect`.
            refused_with(&db, "--migrations-dir", dir.path(), args, &[expect, name]);
        }
    }
}

#[test]
fn an_edited_applied_migration_stops_the_release_before_any_step() {
    let db = legacy();
    let dir = migrations_dir(&[]);
    let v1 = dir.path().join("V1__legacy_baseline.sql");
    let text = std::fs::read_to_string(&v1).unwrap();
    std::fs::write(&v1, format!("{text}\n-- reviewed\n")).unwrap();
    for args in [
        &["apply", "--yes", "--confirm", "deploy-new-application"][..],
        &["migrate", "apply", "--yes"][..],
    ] {
        refused_with(
            &db,
            "--migrations-dir",
            dir.path(),
            args,
            &["V1__legacy_baseline.sql was edited"],
        );
    }
    assert_eq!(db.history().len(), 1);
    // With V2 and V3 applied the next step is a repair: the edit still stops the release
    // before it (the history is checked up front, not at the next migration step).
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    refused_with(
        &db,
        "--migrations-dir",
        dir.path(),
        &["apply", "--yes", "--confirm", "deploy-new-application"],
        &[
            "V1__legacy_baseline.sql was edited",
            "restore the file as it was applied",
        ],
    );
    assert!(!db.exists("pgmend.repair_runs"));
}

/// The shipped definitions with `file` replaced (or added) by `text`.
fn repairs_dir(file: &str, text: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo().join("repairs")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join(file), text).unwrap();
    dir
}

#[test]
fn malformed_repair_definitions_are_refused_before_connecting() {
    let db = legacy();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    let void = std::fs::read_to_string(repo().join("repairs/void-duplicate-coupons.toml")).unwrap();
    let budgets =
        std::fs::read_to_string(repo().join("repairs/rebuild-campaign-budgets.toml")).unwrap();
    let v = "void-duplicate-coupons.toml";
    let b = "rebuild-campaign-budgets.toml";
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        // Unknown keys: a typo, and a key that would widen what the repair touches.
        (
            v,
            void.replace("report_by =", "report_bye ="),
            vec!["unknown field `report_bye`"],
        ),
        (
            v,
            format!("{void}\ndelete_where = \"true\"\n"),
            vec!["unknown field `delete_where`", "expected one of"],
        ),
        (
            b,
            budgets.replace("keys_from", "key_from"),
            vec!["unknown field `key_from`"],
        ),
        // Missing fields.
        (
            v,
            void.replace("row_key = \"coupon_id\"", ""),
            vec!["missing field `row_key`"],
        ),
        (
            b,
            budgets.replace("when_no_source = \"zero\"", ""),
            vec!["missing field `when_no_source`"],
        ),
        (
            v,
            void.replace("kind = \"void_duplicates\"", ""),
            vec!["missing field `kind`"],
        ),
        // Identifiers that would break out of their quotes or end the statement.
        (
            v,
            void.replace(
                "mark = \"legacy_duplicate\"",
                r#"mark = 'legacy_duplicate" = true, amount_yen = 0, "x'"#,
            ),
            vec![
                "mark \"legacy_duplicate\\\" = true",
                "is not a plain identifier",
            ],
        ),
        (
            v,
            void.replace(
                "table = \"issued_coupons\"",
                "table = \"issued_coupons; DROP TABLE campaigns\"",
            ),
            vec!["table \"issued_coupons; DROP TABLE campaigns\" is not a plain identifier"],
        ),
        (
            v,
            void.replace("void = \"voided_at\"", "void = \"voided_at -- \""),
            vec!["void \"voided_at -- \" is not a plain identifier"],
        ),
        (
            v,
            void.replace(
                "report_by = \"campaign_id\"",
                "report_by = \"campaign_id /* x */\"",
            ),
            vec!["report_by", "is not a plain identifier"],
        ),
        (
            b,
            budgets.replace("key = [\"campaign_id\"]", "key = [\"campaign_id\\\"\"]"),
            vec!["key \"campaign_id\\\"\" is not a plain identifier"],
        ),
        (
            b,
            budgets.replace(
                "budget_yen = \"budget_yen\"",
                "budget_yen = \"budget_yen;\"",
            ),
            vec!["copy_on_create", "is not a plain identifier"],
        ),
        (
            v,
            void.replace(
                "{ column = \"issued_at\", order = \"asc\" }",
                "{ column = \"issued_at/**/\", order = \"asc\" }",
            ),
            vec!["rank_by", "is not a plain identifier"],
        ),
        // Wrong types and values.
        (
            v,
            void.replace(
                "group_by = [\"campaign_id\", \"member_id\"]",
                "group_by = \"campaign_id\"",
            ),
            vec!["invalid type: string \"campaign_id\", expected a sequence"],
        ),
        (
            b,
            budgets.replace("aggregate = \"sum\"", "aggregate = 5"),
            vec!["aggregate = 5", "TOML parse error at line 8"],
        ),
        (
            v,
            void.replace(
                "order = \"asc\" },\n  { column = \"coupon_id\"",
                "order = \"sideways\" },\n  { column = \"coupon_id\"",
            ),
            vec!["unknown variant `sideways`"],
        ),
        (
            v,
            void.replace("kind = \"void_duplicates\"", "kind = \"delete_duplicates\""),
            vec!["unknown variant `delete_duplicates`"],
        ),
        (
            v,
            void.replace(
                "group_by = [\"campaign_id\", \"member_id\"]",
                "group_by = []",
            ),
            vec!["group_by and rank_by need at least one column"],
        ),
        // Columns in two roles.
        (
            v,
            void.replace("void = \"voided_at\"", "void = \"legacy_duplicate\""),
            vec!["mark and void name the same column"],
        ),
        (
            v,
            void.replace("mark = \"legacy_duplicate\"", "mark = \"member_id\""),
            vec!["mark \"member_id\" is also the row_key or in group_by"],
        ),
        (
            b,
            budgets.replace(
                "key = [\"campaign_id\"]",
                "key = [\"campaign_id\", \"campaign_id\"]",
            ),
            vec!["key names \"campaign_id\" twice"],
        ),
        // Not TOML, not UTF-8, a bad file name.
        (
            v,
            void.replace("table = \"issued_coupons\"", "table = \"issued_coupons"),
            vec!["TOML parse error at line", "invalid basic string"],
        ),
        (
            "evil.toml",
            "kind = \"void_duplicates\"\u{0}\n".into(),
            vec!["evil.toml"],
        ),
    ];
    for (file, text, expect) in cases {
        let dir = repairs_dir(file, text.as_bytes());
        let mut expect = expect.clone();
        expect.push(file);
        for args in [
            &["repair", "apply", "void-duplicate-coupons", "--yes"][..],
            &["apply", "--yes", "--confirm", "deploy-new-application"][..],
        ] {
            refused_with(&db, "--repairs-dir", dir.path(), args, &expect);
        }
    }
    let dir = repairs_dir(
        v,
        b"kind = \"void_duplicates\"\ndescription = \"caf\xe9\"\n",
    );
    refused_with(
        &db,
        "--repairs-dir",
        dir.path(),
        &["repair", "apply", "void-duplicate-coupons", "--yes"],
        &[v, "not valid UTF-8 (at byte 43)"],
    );
    let dir = repairs_dir("Evil Repair.toml", void.as_bytes());
    refused_with(
        &db,
        "--repairs-dir",
        dir.path(),
        &["apply", "--yes"],
        &["Evil Repair.toml", "lowercase letters, digits and dashes"],
    );
    assert!(!db.exists("pgmend.repair_runs"));
}

#[test]
fn a_definition_that_does_not_match_the_database_changes_nothing() {
    // Well formed, but for a column this database lacks: refused before pgmend's schema is
    // created.
    let db = legacy();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    let void = std::fs::read_to_string(repo().join("repairs/void-duplicate-coupons.toml")).unwrap();
    let dir = repairs_dir(
        "void-duplicate-coupons.toml",
        void.replace("void = \"voided_at\"", "void = \"cancelled_at\"")
            .as_bytes(),
    );
    refused_with(
        &db,
        "--repairs-dir",
        dir.path(),
        &["repair", "apply", "void-duplicate-coupons", "--yes"],
        &["issued_coupons.cancelled_at does not exist"],
    );
    assert!(!db.exists("pgmend.repair_runs"));
}

#[test]
fn bad_connection_strings_exit_2_before_connecting() {
    let db = legacy();
    let p = &db.params;
    let pw = db.password();
    let base = format!(
        "postgresql://{}:{}@{}:{}/{}",
        p.user, pw, p.host, p.port, db.name
    );
    for (url, expect) in [
        (format!("{base}?sslmode=verify-everything"), "sslmode \"verify-everything\" is not one of disable, allow, prefer, require, verify-ca, verify-full"),
        (format!("{base}?sslmode=disable&connect_timeout=soon"), "connect_timeout \"soon\" is not a whole number"),
        (format!("postgresql://{}:{}@{}:0/{}?sslmode=disable", p.user, pw, p.host, db.name), "port \"0\" is not a number between 1 and 65535"),
        (format!("postgresql://{}:{}@{}:65536/{}?sslmode=disable", p.user, pw, p.host, db.name), "port \"65536\""),
        (format!("postgresql://{}:{}@[{}:{}/{}", p.user, pw, p.host, p.port, db.name), "missing its closing ']'"),
        (format!("postgresql://{}:{}@{},,{}:{}/{}", p.user, pw, p.host, p.host, p.port, db.name), "host number 2 of the 3 in the URL is empty"),
        (format!("{base}?sslmode"), "URL parameter number 1 has no '='"),
        (format!("{base}?sslmode=disable&appname=x"), "unknown connection parameter \"appname\""),
        (format!("host={} port={} user={} password={} dbname={} sslmode=disable timeout=3", p.host, p.port, p.user, pw, db.name), "unknown connection parameter \"timeout\""),
        (format!("host={} port={} user={} password='{} dbname={}", p.host, p.port, p.user, pw, db.name), "has no closing quote"),
        (format!("{base}%00?sslmode=disable"), "the value of dbname contains a NUL character"),
    ] {
        for args in [&["apply", "--yes"][..], &["migrate", "apply", "--yes"][..]] {
            let mut all = args.to_vec();
            all.extend(["--database-url", url.as_str()]);
            let r = refused(&db, &all, &[expect]);
            assert!(!r.both().contains(&pw));
        }
    }
    // A password holding '/' or a space, unencoded or unquoted: refused, and no part of it
    // is shown (it would otherwise come back as a "port" or a "parameter").
    for (url, part) in [
        (
            format!(
                "postgresql://{}:AB12/CD34@{}:{}/{}",
                p.user, p.host, p.port, db.name
            ),
            "AB12",
        ),
        (
            format!(
                "postgresql://{}:AB12?CD34@{}:{}/{}",
                p.user, p.host, p.port, db.name
            ),
            "CD34",
        ),
        (
            format!(
                "postgresql://{}@{}:{}/{}?password=AB12&CD34",
                p.user, p.host, p.port, db.name
            ),
            "CD34",
        ),
        (
            format!(
                "host={} user={} password=AB12 CD34 dbname={}",
                p.host, p.user, db.name
            ),
            "CD34",
        ),
        (
            format!(
                "host={} user={} password=AB12 CD34=x dbname={}",
                p.host, p.user, db.name
            ),
            "CD34",
        ),
    ] {
        let r = refused(
            &db,
            &["apply", "--yes", "--database-url", &url],
            &["is malformed"],
        );
        assert!(!r.both().contains(part), "{url}: {}", r.both());
        assert!(
            r.stderr.contains("percent-encode")
                || r.stderr.contains("%26")
                || r.stderr.contains("password='...'"),
            "says what to do: {}",
            r.stderr
        );
    }
}

#[test]
fn a_wrong_password_or_an_unreachable_server_exits_2_for_apply() {
    let db = legacy();
    let p = &db.params;
    let url = format!(
        "host={} port={} user={} password=NotTheRightOne9 dbname={} sslmode=disable",
        p.host, p.port, p.user, db.name
    );
    let before = snapshot(&db);
    for args in [
        &["apply", "--yes"][..],
        &["repair", "apply", "void-duplicate-coupons", "--yes"][..],
    ] {
        let mut all = args.to_vec();
        all.extend(["--database-url", url.as_str()]);
        let r = run(db.pgmend().args(&all), "NotTheRightOne9");
        assert_eq!(r.code, 2, "{}", r.both());
        assert!(
            r.stderr.contains("password authentication failed"),
            "{}",
            r.stderr
        );
        assert!(
            r.stderr
                .contains(&format!("could not connect to host={}", p.host)),
            "where: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("check the user and password"),
            "what to do: {}",
            r.stderr
        );
    }
    assert_eq!(snapshot(&db), before);

    // A closed port on 127.0.0.1, and a short connect_timeout for good measure.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!(
        "postgresql://{}:{}@127.0.0.1:{closed}/{}?sslmode=disable&connect_timeout=2",
        p.user,
        db.password(),
        db.name
    );
    let started = Instant::now();
    let r = db.run(&["apply", "--yes", "--database-url", &url]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        r.stderr.contains(&format!(
            "could not connect to host=127.0.0.1 port={closed}"
        )),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("check that the server is running"),
        "{}",
        r.stderr
    );
}

/// A role that can log in with a password and has only the privileges `grants` gives it
/// (`{role}` stands for its name).
fn weak_role(db: &TestDb, grants: &str) -> LoginRole {
    LoginRole::create(
        db,
        "weak",
        "Weak-Pass-1",
        &format!("GRANT CONNECT ON DATABASE {{db}} TO {{role}}; {grants}"),
    )
}

fn refused_for(db: &TestDb, role: &LoginRole, args: &[&str], expect: &[&str]) -> Run {
    let before = snapshot(db);
    let r = role.run(db, args);
    if std::env::var_os("HOSTILE_SHOW").is_some() {
        eprintln!("--- {args:?}\n{}", r.stderr);
    }
    assert_eq!(r.code, 2, "{args:?}\n{}", r.both());
    for e in expect {
        assert!(
            r.stderr.contains(e),
            "{args:?}: expected {e:?} in:\n{}",
            r.stderr
        );
    }
    assert!(r.stderr.contains("nothing was changed"), "{}", r.stderr);
    assert_eq!(snapshot(db), before, "{args:?} changed the database");
    r
}

#[test]
fn a_role_that_owns_nothing_is_refused_before_any_change() {
    let db = legacy();
    // PostgreSQL 14 lets every role create in schema public; 15 took that away. Revoke it
    // so that the role owns nothing and may create nothing on every version.
    let role = weak_role(
        &db,
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
    );
    let owner = db.params.user.clone();
    for args in [
        &["apply", "--yes", "--confirm", "deploy-new-application"][..],
        &["migrate", "apply", "--yes"][..],
    ] {
        refused_for(
            &db,
            &role,
            args,
            &[
                &format!("role {} lacks privileges", role.name),
                &format!("ownership of table issued_coupons (owned by {owner}"),
                "V2__expand_for_repair, line 4: ALTER TABLE issued_coupons",
                "CREATE on schema public, to create table campaign_budgets: GRANT CREATE ON SCHEMA public TO",
                "INSERT on table refinery_schema_history",
            ],
        );
    }
    let r = refused_for(&db, &role, &["apply", "--yes"], &["CREATE on database"]);
    assert!(
        r.stderr.contains(&format!(
            "GRANT CREATE ON DATABASE {} TO {}",
            db.name, role.name
        )),
        "{}",
        r.stderr
    );
    assert!(!db.exists("pgmend.repair_runs"));
    assert_eq!(db.history().len(), 1);
}

#[test]
fn baseline_by_a_role_that_cannot_create_the_history_table_is_refused_before_any_change() {
    // Not baselined: the history table does not exist yet, and baseline creates it in the
    // schema it adopts. The role owns nothing and (once PUBLIC loses it, as on 15+) may not
    // create in public.
    let db = fresh_db();
    db.make_legacy();
    let role = weak_role(
        &db,
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
    );
    let grant = format!("GRANT CREATE ON SCHEMA public TO {}", role.name);
    let r = refused_for(
        &db,
        &role,
        &["migrate", "baseline", "--yes"],
        &[
            &format!("role {} lacks privileges", role.name),
            &format!("CREATE on schema public, to create table refinery_schema_history: {grant}"),
        ],
    );
    assert!(!r.stderr.contains(role.password), "{}", r.stderr);
    assert!(!r.stderr.contains("SQLSTATE"), "{}", r.stderr);
    assert!(!db.exists("refinery_schema_history"));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgmend'"),
        0
    );
    // What the message says to grant is enough.
    db.client().batch_execute(&grant).unwrap();
    let r = role.run(&db, &["migrate", "baseline", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.history().len(), 1);
}

#[test]
fn a_role_that_cannot_create_pgmends_schema_is_refused_before_v2_runs() {
    // The role owns the tables and may create tables, so V2 and V3 would succeed; the first
    // repair would then fail at CREATE SCHEMA pgmend and leave the release half-done.
    let db = legacy();
    let role = weak_role(
        &db,
        "ALTER TABLE campaigns OWNER TO {role}; ALTER TABLE issued_coupons OWNER TO {role};
         GRANT CREATE ON SCHEMA public TO {role}; GRANT SELECT, INSERT ON refinery_schema_history TO {role}",
    );
    let r = refused_for(
        &db,
        &role,
        &["apply", "--yes", "--confirm", "deploy-new-application"],
        &[
            "CREATE on database",
            "to create pgmend's schema pgmend",
            "repair void-duplicate-coupons",
        ],
    );
    assert!(!r.stderr.contains("ownership"), "{}", r.stderr);
    // The migrations alone need nothing the role lacks: the check is not stricter than the server.
    let r = role.run(&db, &["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.history().len(), 3);
    // A repair needs pgmend's schema too.
    refused_for(
        &db,
        &role,
        &["repair", "apply", "void-duplicate-coupons", "--yes"],
        &["CREATE on database"],
    );
    assert!(!db.exists("pgmend.repair_runs"));
}

#[test]
fn a_repair_without_update_on_its_table_is_refused_before_pgmends_schema_exists() {
    let db = legacy();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    let role = weak_role(
        &db,
        "GRANT CREATE ON DATABASE {db} TO {role}; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"
            .replace("{db}", &db.name)
            .as_str(),
    );
    refused_for(
        &db,
        &role,
        &["repair", "apply", "void-duplicate-coupons", "--yes"],
        &[
            "UPDATE on table issued_coupons: GRANT UPDATE ON issued_coupons TO",
            "(needed for repair void-duplicate-coupons)",
        ],
    );
    assert!(!db.exists("pgmend.repair_runs"));
}

#[test]
fn a_read_only_server_is_refused_by_every_command_that_writes() {
    let db = legacy();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .unwrap();
    for args in [
        &["apply", "--yes", "--confirm", "deploy-new-application"][..],
        &["migrate", "apply", "--yes"][..],
        &["repair", "apply", "void-duplicate-coupons", "--yes"][..],
        &["migrate", "validate", "issued_within_budget", "--yes"][..],
    ] {
        refused(
            &db,
            args,
            &[
                "has default_transaction_read_only = on",
                &format!("dbname={}", db.name),
                "Use a role or database that allows writes",
            ],
        );
    }
    let r = db.run(&["plan"]);
    assert_eq!(r.code, 0, "the dry run still works: {}", r.both());
}

/// A function that writes whenever it is read, as an audit of reads does, and a view over
/// it: SQL that the data (not pgmend) controls, run by any dry run that reads the view or
/// calls the function. Its `nextval` is the witness: a sequence is not rolled back, so a
/// dry run made read-write leaves it advanced even though the dry run rolls back its
/// transaction; in a read-only transaction the server refuses it (25006) before anything
/// is written.
const READ_AUDIT: &str = "
    CREATE SEQUENCE reads_audited;
    CREATE TABLE read_audit (at timestamptz NOT NULL DEFAULT now(), what text NOT NULL);
    CREATE FUNCTION audited(what text, v integer) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
      PERFORM nextval('reads_audited');
      INSERT INTO read_audit (what) VALUES (what);
      RETURN v;
    END $$;
    CREATE VIEW coupons_audited AS
      SELECT coupon_id, campaign_id, member_id, month, audited('coupon', amount_yen) AS amount_yen,
             issued_at, redeemed_at, voided_at
        FROM issued_coupons;";

/// What the read audit recorded: whether its sequence was ever called, and its rows.
fn audited_reads(db: &TestDb) -> (bool, i64) {
    let row = db
        .client()
        .query_one(
            "SELECT (SELECT is_called FROM reads_audited), (SELECT count(*) FROM read_audit)",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// Every dry run — `repair plan`, `migrate plan` and `plan`, through a repair's preview and
/// through a migration's census — runs what the data controls in a read-only transaction:
/// the server refuses the write (25006), pgmend exits 2 saying so, and nothing is written,
/// not even what a rollback cannot undo.
#[test]
fn a_dry_run_reading_a_function_that_writes_is_refused_by_the_server_and_writes_nothing() {
    let db = legacy();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    db.client().batch_execute(READ_AUDIT).unwrap();
    // The member-month counters summed from the audited view ...
    let shipped =
        std::fs::read_to_string(repo().join("repairs/rebuild-member-monthly-usage.toml")).unwrap();
    let audited = shipped.replace(
        "source_table = \"issued_coupons\"",
        "source_table = \"coupons_audited\"",
    );
    assert_ne!(audited, shipped);
    let repairs = repairs_dir("rebuild-member-monthly-usage.toml", audited.as_bytes());
    // ... and a check whose census calls the function on every coupon.
    let migrations = migrations_dir(&[(
        "V6__audited_amounts.sql",
        "ALTER TABLE issued_coupons ADD CONSTRAINT amounts_audited CHECK (audited('census', amount_yen) > 0) NOT VALID;",
    )]);
    let (r, m) = (dir_arg(repairs.path()), dir_arg(migrations.path()));
    for args in [
        &[
            "repair",
            "plan",
            "rebuild-member-monthly-usage",
            "--repairs-dir",
            &r,
        ][..],
        &[
            "repair",
            "plan",
            "rebuild-member-monthly-usage",
            "--format",
            "json",
            "--repairs-dir",
            &r,
        ],
        &["plan", "--repairs-dir", &r],
        &["migrate", "plan", "--migrations-dir", &m],
        &["plan", "--migrations-dir", &m],
    ] {
        let r = refused(&db, args, &["read-only transaction", "SQLSTATE 25006"]);
        if args.contains(&"--repairs-dir") {
            assert!(
                r.stderr
                    .contains("previewing repair rebuild-member-monthly-usage"),
                "{args:?}: the error names the repair whose preview failed:\n{}",
                r.stderr
            );
        }
        assert_eq!(
            audited_reads(&db),
            (false, 0),
            "{args:?}: the dry run wrote (the read audit's sequence moved)"
        );
    }
    // The same view read where writing is allowed does advance the witness.
    db.client()
        .batch_execute("SELECT sum(amount_yen) FROM coupons_audited")
        .unwrap();
    assert!(audited_reads(&db).0);
}

/// A repair previewed before the migrations that add its columns (`repair plan` takes no
/// shadows) cannot be computed yet: the preview says so, with the server's 42703, and exits
/// 0 instead of failing, in both formats.
#[test]
fn a_repair_previewed_before_its_columns_exist_says_it_is_not_computable_yet() {
    let db = legacy();
    let before = snapshot(&db);
    for format in ["human", "json"] {
        let r = db.run(&[
            "repair",
            "plan",
            "void-duplicate-coupons",
            "--format",
            format,
        ]);
        assert_eq!(r.code, 0, "{}", r.both());
        let said = match format {
            "json" => serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()["not_yet"]
                .as_str()
                .map(|why| format!("void-duplicate-coupons: {why}"))
                .unwrap_or_default(),
            _ => r.stdout.clone(),
        };
        assert!(
            said.contains(
                "void-duplicate-coupons: not computable before the earlier pending steps run"
            ) && said.contains("SQLSTATE 42703"),
            "{format}: {}",
            r.both()
        );
    }
    assert_eq!(snapshot(&db), before, "a dry run changed the database");
}
