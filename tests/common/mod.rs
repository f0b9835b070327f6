//! The test harness: one throwaway PostgreSQL cluster per test binary (or the server in
//! `PGMEND_TEST_DATABASE_URL`), a fresh database per test, and helpers that run the real
//! binary and check that no output ever shows the password.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use pgmend::db::conninfo::{self, ConnParams};
use pgmend::localpg::LocalPg;

/// A TCP forwarder that can go silent, for fault tests (`common::forwarder::Forwarder`).
pub mod forwarder;

/// The server every test of this binary uses, as admin connection parameters.
struct Server {
    admin: ConnParams,
    _local: Option<LocalPg>,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("PGMEND_TEST_DATABASE_URL") {
        Ok(url) => {
            let mut admin = conninfo::resolve(Some(&url), &|k| std::env::var(k).ok())
                .expect("PGMEND_TEST_DATABASE_URL");
            // A server that asks for no password (trust, peer) never reads one: give it one
            // anyway, so that every run's output is checked for a password (see `run`).
            // (resolve has read the password file already: none is given here.)
            if admin.password.as_deref().is_none_or(str::is_empty) {
                admin.password = Some(format!("unasked{:016x}", rand::random::<u64>()));
            }
            Server {
                admin,
                _local: None,
            }
        }
        Err(_) => {
            let pg = LocalPg::start(false).expect("starting a throwaway PostgreSQL for the tests");
            let admin = conninfo::resolve(Some(&pg.conninfo("postgres")), &|_| None).unwrap();
            Server {
                admin,
                _local: Some(pg),
            }
        }
    })
}

fn keyword_value(p: &ConnParams) -> String {
    format!(
        "host={} port={} user={} password={} dbname={} sslmode={}",
        p.host,
        p.port,
        p.user,
        p.password.clone().unwrap_or_default(),
        p.dbname,
        p.sslmode.as_str()
    )
}

/// Whether the slow fault tests (those that wait by design for pgmend's bounds: silent paths,
/// leases, long lock holders; and the few end-to-end releases run in several cases) are skipped
/// in this run: `.ci/run` runs them on its default server only and sets
/// `PGMEND_SKIP_SLOW_TESTS=1` for the version matrix. Says so on stderr when it skips.
pub fn slow_tests_skipped(name: &str) -> bool {
    let skip = std::env::var_os("PGMEND_SKIP_SLOW_TESTS").is_some_and(|v| v == "1");
    if skip {
        eprintln!("{name}: skipped (PGMEND_SKIP_SLOW_TESTS=1: the slow fault tests run on one server version)");
    }
    skip
}

/// A fresh database for one test, dropped afterwards.
pub struct TestDb {
    pub name: String,
    pub params: ConnParams,
}

pub fn fresh_db() -> TestDb {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let s = server();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let mut admin = postgres::Client::connect(&keyword_value(&s.admin), postgres::NoTls)
        .expect("admin connection");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("CREATE DATABASE");
    let mut params = s.admin.clone();
    params.dbname = name.clone();
    TestDb { name, params }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) =
            postgres::Client::connect(&keyword_value(&server().admin), postgres::NoTls)
        {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// What a run of the binary gave.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn both(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl TestDb {
    pub fn conninfo(&self) -> String {
        keyword_value(&self.params)
    }

    pub fn password(&self) -> String {
        self.params.password.clone().unwrap_or_default()
    }

    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.conninfo(), postgres::NoTls).expect("test connection")
    }

    /// `pgmend` with DATABASE_URL pointing at this database and no stray PG* variables.
    pub fn pgmend(&self) -> Command {
        let mut c = pgmend_command();
        c.env("DATABASE_URL", self.conninfo());
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        run(self.pgmend().args(args), &self.password())
    }

    /// Creates the legacy schema (V1, the shipped file) with no rows; returns the connection
    /// that did (its search_path as the test left it).
    pub fn legacy_schema(&self) -> postgres::Client {
        let mut c = self.client();
        c.batch_execute(&v1_sql()).unwrap();
        c
    }

    /// Creates the legacy schema (V1) the way production has it, with a few dirty rows.
    pub fn make_legacy(&self) {
        let mut c = self.legacy_schema();
        c.batch_execute(
            "INSERT INTO campaigns VALUES ('SW-A', 1000, 100000, 3000), ('SW-B', 1000, 300000, 0);
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), 'SW-A', 'm' || (g % 4), '2026-09', 1000 FROM generate_series(1, 6) g;",
        )
        .unwrap();
    }

    /// Stands in for the void-duplicate-coupons repair (its own issue): rank 1 of each
    /// (campaign, member) stays, later rows become legacy duplicates, unredeemed ones voided.
    pub fn void_duplicates_by_sql(&self) {
        self.client()
            .batch_execute(
                "WITH ranked AS (
                   SELECT coupon_id, redeemed_at, row_number() OVER (PARTITION BY campaign_id, member_id
                          ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rank
                     FROM issued_coupons)
                 UPDATE issued_coupons c SET legacy_duplicate = true,
                        voided_at = CASE WHEN r.redeemed_at IS NULL THEN now() END
                   FROM ranked r WHERE r.coupon_id = c.coupon_id AND r.rank > 1",
            )
            .unwrap();
    }

    /// Stands in for the rebuild-campaign-budgets repair (its own issue).
    pub fn rebuild_budgets_by_sql(&self) {
        self.client()
            .batch_execute(
                "INSERT INTO campaign_budgets (campaign_id, discount_yen, budget_yen, issued_yen)
                 SELECT c.campaign_id, c.discount_yen, c.budget_yen,
                        coalesce((SELECT sum(amount_yen) FROM issued_coupons i
                                   WHERE i.campaign_id = c.campaign_id AND voided_at IS NULL), 0)
                   FROM campaigns c
                 ON CONFLICT (campaign_id) DO UPDATE SET issued_yen = excluded.issued_yen",
            )
            .unwrap();
    }

    pub fn invalid_indexes(&self) -> i64 {
        self.scalar_i64("SELECT count(*) FROM pg_index WHERE NOT indisvalid OR NOT indisready")
    }

    /// The legacy schema with the demo's Silver Week data for `members` members, as
    /// production has it before pgmend touches it (not baselined).
    pub fn make_legacy_data(&self, members: i32) {
        let mut c = self.legacy_schema();
        pgmend::demo_data::generate_dirty_data(&mut c, members).unwrap();
    }

    /// The legacy schema with the demo's Silver Week data for `members` members, adopted
    /// with `migrate baseline`.
    pub fn make_legacy_baselined(&self, members: i32) {
        self.make_legacy_data(members);
        assert_eq!(self.run(&["migrate", "baseline", "--yes"]).code, 0);
    }

    /// The incident's data for `members` members, migrated to V3 and voided by
    /// `repair apply`, with the release's void step (4) recorded as done: `apply` resumes at
    /// V4.
    pub fn voided_before_the_release_reaches_v4(&self, members: i32) {
        self.make_legacy_baselined(members);
        let r = self.run(&["migrate", "apply", "--yes", "--target", "3"]);
        assert_eq!(r.code, 0, "{}", r.both());
        let r = self.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
        assert_eq!(r.code, 0, "{}", r.both());
        self.client()
            .batch_execute("INSERT INTO pgmend.release_steps (release, step, what, run_id) VALUES ('coupon-incident', 4, 'repair void-duplicate-coupons', 1)")
            .unwrap();
    }

    pub fn scalar_i64(&self, sql: &str) -> i64 {
        self.client().query_one(sql, &[]).unwrap().get(0)
    }

    pub fn exists(&self, relation: &str) -> bool {
        self.client()
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&relation])
            .unwrap()
            .get(0)
    }

    pub fn history(&self) -> Vec<(i32, String)> {
        if !self.exists("refinery_schema_history") {
            return Vec::new();
        }
        self.client()
            .query(
                "SELECT version, name FROM refinery_schema_history ORDER BY version",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

pub fn pgmend_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pgmend"));
    for var in pgmend::db::conninfo::environment_variables() {
        c.env_remove(var);
    }
    // The tests written for one stream of batches keep it: `--jobs auto`, the default, is
    // tested where a test unsets this or passes `--jobs` (tests/jobs.rs, tests/health.rs,
    // tests/repair_kinds.rs).
    c.env("PGMEND_JOBS", "1");
    c.stdin(Stdio::null());
    c
}

/// Runs and collects; fails the test if the password shows anywhere in the output. The
/// password must be given: a run that connects with none is [`run_without_password`].
pub fn run(command: &mut Command, password: &str) -> Run {
    assert!(
        !password.is_empty(),
        "run checks the output for the password it was given, and was given none"
    );
    let run = run_without_password(command);
    assert!(
        !run.both().contains(password),
        "the password leaked into the output:\n{}",
        run.both()
    );
    run
}

/// Runs and collects, for a run that is given no password at all (usage, help, completions,
/// the demo's own throwaway server).
pub fn run_without_password(command: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("running pgmend");
    let run = Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    };
    run
}

/// The shipped legacy baseline, V1.
pub fn v1_sql() -> String {
    std::fs::read_to_string(repo().join("migrations/V1__legacy_baseline.sql")).unwrap()
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A migrations directory holding the shipped migrations plus `extra` (name, sql) files.
pub fn migrations_dir(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo().join("migrations")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    for (name, sql) in extra {
        std::fs::write(dir.path().join(name), sql).unwrap();
    }
    dir
}

pub fn dir_arg(dir: &Path) -> String {
    dir.display().to_string()
}

/// Runs pgmend with `args` while another session holds a transaction that ran `hold_sql`
/// (for `hold`), and a probe runs `probe_sql` every 20 ms, as the application would.
/// Returns the run, how long it took, and the probe's longest wait.
pub fn run_while_held(
    db: &TestDb,
    hold_sql: &str,
    hold: std::time::Duration,
    probe_sql: &str,
    args: &[&str],
) -> (Run, std::time::Duration, std::time::Duration) {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let mut holder = db.client();
    let hold_sql = hold_sql.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let holder_thread = std::thread::spawn(move || {
        let mut tx = holder.transaction().unwrap();
        tx.batch_execute(&hold_sql).unwrap();
        ready_tx.send(()).unwrap();
        std::thread::sleep(hold);
        tx.commit().unwrap();
    });
    ready_rx.recv().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        let mut c = db.client();
        let probe_sql = probe_sql.to_string();
        std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                c.batch_execute(&probe_sql).unwrap();
                longest = longest.max(t.elapsed());
                std::thread::sleep(Duration::from_millis(20));
            }
            longest
        })
    };
    let started = Instant::now();
    let run = db.run(args);
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let longest = probe.join().unwrap();
    holder_thread.join().unwrap();
    eprintln!(
        "pgmend {} took {took:?}; the probe's longest wait was {longest:?}",
        args.join(" ")
    );
    (run, took, longest)
}

/// A keyword/value connection string (with the password) for database `dbname` of the
/// tests' server.
pub fn conninfo_for(dbname: &str) -> String {
    let mut p = server().admin.clone();
    p.dbname = dbname.to_string();
    keyword_value(&p)
}

/// A fresh database created as a copy of `source` (`CREATE DATABASE ... TEMPLATE`, so the
/// copies of one source share their rows, generated ids included), dropped afterwards.
/// Nothing may be connected to `source` meanwhile.
pub fn copy_of(source: &TestDb) -> TestDb {
    static COPIES: AtomicU32 = AtomicU32::new(0);
    let s = server();
    let name = format!(
        "c{}_{}",
        std::process::id(),
        COPIES.fetch_add(1, Ordering::SeqCst)
    );
    let mut admin = postgres::Client::connect(&keyword_value(&s.admin), postgres::NoTls)
        .expect("admin connection");
    let mut tries = 0;
    // A session of the source that has just closed can still count for a moment.
    while let Err(e) =
        admin.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {}", source.name))
    {
        tries += 1;
        assert!(
            tries < 100,
            "CREATE DATABASE {name} TEMPLATE {}: {e}",
            source.name
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut params = s.admin.clone();
    params.dbname = name.clone();
    TestDb { name, params }
}

/// Everything pgmend could change, as sorted lines: compare two snapshots with `assert_eq!`.
pub fn snapshot(db: &TestDb) -> Vec<String> {
    let mut c = db.client();
    let user_schemas = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'";
    let mut lines: Vec<String> = Vec::new();
    for sql in [
        format!("SELECT format('schema %s %s', nspname, pg_get_userbyid(nspowner)) FROM pg_namespace n WHERE {user_schemas}"),
        format!("SELECT format('relation %s.%s %s %s %s', n.nspname, c.relname, c.relkind, pg_get_userbyid(c.relowner), c.relacl) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {user_schemas}"),
        format!("SELECT format('column %s.%s.%s %s %s %s', n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attnum > 0 AND NOT a.attisdropped AND {user_schemas}"),
        format!("SELECT format('constraint %s.%s %s %s', n.nspname, co.conname, pg_get_constraintdef(co.oid), co.convalidated) FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace WHERE {user_schemas}"),
        format!("SELECT format('index %s %s', pg_get_indexdef(i.indexrelid), i.indisvalid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {user_schemas}"),
        "SELECT format('setting %s', setconfig) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())".to_string(),
    ] {
        for row in c.query(&sql, &[]).unwrap() {
            lines.push(row.get(0));
        }
    }
    let tables: Vec<String> = c
        .query(
            &format!("SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND {user_schemas}"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for t in tables {
        let row = c
            .query_one(
                &format!("SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {t} t"),
                &[],
            )
            .unwrap();
        let (n, sum): (i64, String) = (row.get(0), row.get(1));
        lines.push(format!("rows {t} {n} {sum}"));
    }
    lines.sort();
    lines
}

/// A role that logs in with a password, created by the admin on `db`'s server (as the
/// application's owner role, or a role short of privileges) and dropped when the test ends,
/// with everything it owns given back to the admin (best effort).
pub struct LoginRole {
    pub name: String,
    pub password: &'static str,
    /// The test database and the server's `postgres` database, as the admin.
    admin: [String; 2],
}

impl LoginRole {
    /// Creates `{prefix}_{database}` with `password`, then runs `sql` as the admin, `{role}`
    /// in it standing for the role's name and `{db}` for the database's.
    pub fn create(db: &TestDb, prefix: &str, password: &'static str, sql: &str) -> LoginRole {
        let name = format!("{prefix}_{}", db.name);
        db.client()
            .batch_execute(&format!(
                "CREATE ROLE {name} LOGIN PASSWORD '{password}'; {}",
                sql.replace("{role}", &name).replace("{db}", &db.name)
            ))
            .unwrap();
        LoginRole {
            admin: [db.conninfo(), conninfo_for("postgres")],
            name,
            password,
        }
    }

    /// A connection string for this role to `db`, with its password.
    pub fn url(&self, db: &TestDb) -> String {
        format!(
            "host={} port={} user={} password={} dbname={} sslmode=disable",
            db.params.host, db.params.port, self.name, self.password, db.name
        )
    }

    /// pgmend as this role on `db`; fails the test if the role's password shows.
    pub fn run(&self, db: &TestDb, args: &[&str]) -> Run {
        let mut c = pgmend_command();
        c.env("DATABASE_URL", self.url(db)).args(args);
        run(&mut c, self.password)
    }
}

impl Drop for LoginRole {
    fn drop(&mut self) {
        for (conninfo, sql) in self.admin.iter().zip([
            format!(
                "REASSIGN OWNED BY {0} TO CURRENT_USER; DROP OWNED BY {0}",
                self.name
            ),
            format!("DROP ROLE IF EXISTS {}", self.name),
        ]) {
            if let Ok(mut c) = postgres::Client::connect(conninfo, postgres::NoTls) {
                let _ = c.batch_execute(&sql);
            }
        }
    }
}

/// Runs `pgmend ARGS` inside a pseudo-terminal (util-linux `script`) and types `typed` into it; returns the exit
/// code and everything the terminal showed.
pub fn in_terminal(db: &TestDb, args: &str, typed: &str) -> (i32, String) {
    use std::io::Write as _;
    let exe = env!("CARGO_BIN_EXE_pgmend");
    let mut script = Command::new("script");
    for var in pgmend::db::conninfo::environment_variables() {
        script.env_remove(var);
    }
    script.env("PGMEND_JOBS", "1");
    let mut child = script
        .args(["-q", "-e", "-c", &format!("{exe} {args}"), "/dev/null"])
        .env("DATABASE_URL", db.conninfo())
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux script");
    // The terminal buffers the line until pgmend reads its answer.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(typed.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let shown =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !shown.contains(&db.password()),
        "the password showed on the terminal"
    );
    (out.status.code().unwrap_or(-1), shown)
}

/// `pgmend demo --keep --members 30`, its reports in `reports`: the throwaway server stays up
/// for the caller to use and stop.
pub fn demo_keep(reports: &Path) -> Run {
    run_without_password(pgmend_command().args([
        "demo",
        "--keep",
        "--members",
        "30",
        "--reports-dir",
        reports.to_str().unwrap(),
    ]))
}
