//! Online migrations: each CONCURRENTLY statement alone in autocommit on a connection of its own,
//! without lock_timeout (a concurrent build waits for every older transaction, and a lock_timeout
//! there leaves an INVALID index), watched from pgmend's main session and cancelled once it has
//! waited longer than `--build-wait`.
//!
//! `apply` runs each statement of an `OnlineMigration` (label, origin, statements, censuses, given
//! by `migrate/apply.rs`); the caller then records it with `migrate::history::record`, the
//! history's one writer. For a `CREATE INDEX CONCURRENTLY` (name and table read with `regex`),
//! `build_index` looks the name up in `pg_index`: a valid, ready index with the same definition
//! (`same_definition` ignores schema `public.`, `USING btree`, parentheses, quotes, case and
//! spaces) is adopted; any other is dropped first. Then a preflight (table size, up to five open
//! transactions in the database) and up to `BUILD_ATTEMPTS` (3), each preceded by
//! `evaluate::check_before`. With `census_alongside` (the release's), no open transaction in
//! the preflight and no crowding of the application by pgmend's workers in this process
//! (`db::crowding::ceiling`), the first attempt instead takes `evaluate::check_during_build` on the main
//! session once the build is sent, before the first look at it; a violator or an error cancels
//! the build, whose INVALID index is dropped, and is returned. A build that fails with 23505,
//! 40P01 or 55P03, or ends not valid, has its index dropped and is tried again; any other error
//! drops the index and returns it (exit 2), 57014 included: pgmend's own cancel after
//! `--build-wait` comes back from `run_watched` as `Stopped` and is handled before, so a 57014
//! here is someone else's cancel and is not retried;
//! three failures return `Violators` (exit 1; the release answers it with the step's `retry_with`).
//! `drop_index` is `DROP INDEX CONCURRENTLY IF EXISTS`, run the same way. A statement that
//! builds nothing (`DROP INDEX CONCURRENTLY`, `VACUUM`) takes the migration's censuses first,
//! unless a build before it took them (an index adopted as it was takes none), so that its
//! preconditions stop it as they stop a transactional migration.
//!
//! `run_watched` opens a fresh connection (`db::connect`), sets `lock_timeout = 0` and
//! `statement_timeout = 0`, runs the statement on a thread, and every 500 ms (`POLL`) `watch`es it
//! from the main session (`pg_stat_progress_create_index`, `pg_blocking_pids`, the progress view's
//! `current_locker_pid`, `pg_stat_activity.wait_event_type`), reporting on change or every 10 s.
//! Each poll that finds the statement waiting on another session adds 500 ms to its waited time;
//! once that exceeds `--build-wait` it calls `pg_cancel_backend` and returns `Stopped`, after which
//! `build_index` drops the INVALID index. A stop request (`signals`) cancels a build
//! (`OnStop::Cancel`) at the next poll the same way; a drop (`OnStop::FinishInTime`) is left to
//! finish until `signals::cleanup_deadline` and cancelled then, and the message says the INVALID
//! index remains and which command drops it. While a build runs, its index is registered with
//! `signals::leave` for the leftover report.

use std::sync::mpsc;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use anyhow::Result;
use regex::Regex;

use super::census::Census;
use super::evaluate;
use super::parallel::{self, BuildWorkers};
use crate::db::conninfo::ConnParams;
use crate::error::{describe, sqlstate, PgContext, Stopped, Violators};
use crate::statements::Statement;

/// What an online build needs of a migration; the migration layer above gives it, and writes
/// the history row once [`apply`] returns.
pub struct OnlineMigration<'a> {
    /// For messages: `V4 (name)`.
    pub label: String,
    /// Where the file came from, for the message of a failed statement.
    pub origin: &'a str,
    pub statements: &'a [Statement],
    pub censuses: &'a [Census],
    /// `Some(lock_timeout)`: unless the preflight finds a transaction open, the first attempt
    /// takes the censuses on the main session while the index is built (the release's repair
    /// right before removed the violators, so the census is expected clean and the build need
    /// not wait for it). A census that finds violators, fails, or waits longer than
    /// `lock_timeout` for a lock (while it waits, the build is not watched) cancels the build,
    /// whose INVALID index is then dropped. `None`: every attempt takes its census first.
    pub census_alongside: Option<Duration>,
}

/// How often the watcher looks at the build.
const POLL: Duration = Duration::from_millis(500);
/// How many times a failed build is retried after its census comes back clean.
const BUILD_ATTEMPTS: u32 = 3;

static CREATE_INDEX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?is)^\s*create\s+(unique\s+)?index\s+concurrently\s+(?:if\s+not\s+exists\s+)?("?[\w$]+"?)\s+on\s+(?:only\s+)?([\w$."]+)"#).unwrap()
});

/// Applies an online migration statement by statement; the caller records it in the history.
pub fn apply(
    main: &mut postgres::Client,
    params: &ConnParams,
    migration: &OnlineMigration,
    build_wait: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    // A build takes the censuses before each attempt; a statement that builds nothing
    // (`DROP INDEX CONCURRENTLY`, `VACUUM`) takes them first unless a build before it did (an
    // index adopted as it was takes none).
    let mut censused = false;
    for statement in migration.statements {
        match CREATE_INDEX.captures(&statement.sql) {
            Some(c) => {
                let name = c[2].trim_matches('"').to_string();
                let table = c[3].to_string();
                censused |= build_index(
                    main, params, migration, statement, &name, &table, build_wait, progress,
                )?;
            }
            None => {
                if !censused {
                    for finding in
                        evaluate::check_before(main, &migration.label, migration.censuses)?
                    {
                        progress(&finding.describe());
                    }
                    censused = true;
                }
                progress(&format!("running {} (online)", statement.summary));
                run_watched(
                    main,
                    params,
                    &statement.sql,
                    "",
                    build_wait,
                    OnStop::Cancel,
                    None,
                    progress,
                )?
                .map_err(|e| {
                    anyhow::Error::new(describe(&e)).context(format!(
                        "{} line {}: {}",
                        migration.origin, statement.line, statement.summary
                    ))
                })?;
            }
        }
    }
    Ok(())
}

/// What `apply` will do first about an index that `statement` builds and that already exists
/// (for the plan): nothing when it is valid and as defined (the build is skipped), else a
/// note that it is dropped CONCURRENTLY before the build. `None` when the statement builds
/// no index or the index does not exist.
pub fn existing_note(
    client: &mut impl postgres::GenericClient,
    statement: &Statement,
) -> Result<Option<String>> {
    let Some(c) = CREATE_INDEX.captures(&statement.sql) else {
        return Ok(None);
    };
    let name = c[2].trim_matches('"').to_string();
    Ok(existing(client, &name)?.map(|found| {
        if found.adoptable(&statement.sql) {
            format!("index {name} already exists, valid and as defined: apply skips this build")
        } else if found.broken() {
            format!("index {name} exists but is {}: apply drops it CONCURRENTLY, then builds it again", found.why_rebuilt())
        } else {
            format!(
                "index {name} exists but is {}: apply drops it CONCURRENTLY, then builds it as this file says",
                found.why_rebuilt()
            )
        }
    }))
}

/// An index's state in the catalog.
struct Existing {
    valid: bool,
    ready: bool,
    definition: String,
}

impl Existing {
    /// Valid, ready and as `sql` defines it: kept, not built again.
    fn adoptable(&self, sql: &str) -> bool {
        !self.broken() && same_definition(&self.definition, sql)
    }

    /// Left INVALID or not ready by a failed build.
    fn broken(&self) -> bool {
        !self.valid || !self.ready
    }

    /// Why an index that is not adoptable is dropped and built again.
    fn why_rebuilt(&self) -> String {
        if self.broken() {
            "INVALID (a failed earlier build)".to_string()
        } else {
            format!("defined differently ({})", self.definition)
        }
    }
}

fn existing(main: &mut impl postgres::GenericClient, name: &str) -> Result<Option<Existing>> {
    let row = main
        .query_opt(
            "SELECT i.indisvalid, i.indisready, pg_get_indexdef(i.indexrelid)
               FROM pg_index i WHERE i.indexrelid = to_regclass(quote_ident($1))",
            &[&name],
        )
        .doing(format!("looking up index {name}"))?;
    Ok(row.map(|r| Existing {
        valid: r.get(0),
        ready: r.get(1),
        definition: r.get(2),
    }))
}

/// Compares an index definition from the catalog with the statement that would create it,
/// ignoring what pg_get_indexdef adds (schema, USING btree, parentheses, case, spaces).
fn same_definition(catalog: &str, statement: &str) -> bool {
    let normal = |s: &str| {
        let s = s
            .to_lowercase()
            .replace("concurrently", "")
            .replace("if not exists", "")
            .replace("using btree", "")
            .replace("public.", "");
        s.chars()
            .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')' && *c != '"' && *c != ';')
            .collect::<String>()
    };
    normal(catalog) == normal(statement)
}

/// Builds the index `name` of `statement` (see the module's docs); whether it took the
/// migration's censuses (not when it adopted the index as it was).
#[allow(clippy::too_many_arguments)]
fn build_index(
    main: &mut postgres::Client,
    params: &ConnParams,
    migration: &OnlineMigration,
    statement: &Statement,
    name: &str,
    table: &str,
    build_wait: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<bool> {
    let label = &migration.label;
    if let Some(found) = existing(main, name)? {
        if found.adoptable(&statement.sql) {
            progress(&format!(
                "index {name} already exists, valid and as defined; nothing to build"
            ));
            return Ok(false);
        }
        cancel_orphaned_build(main, name, progress)?;
        progress(&format!(
            "index {name} exists but is {}; dropping it concurrently before building it again",
            found.why_rebuilt()
        ));
        drop_index(main, params, name, build_wait, progress)?;
    }
    let quiet = preflight(main, table, progress)?;
    let leftover = format!("index {name}");
    // Alongside only while no transaction is open: a build the census cancels leaves an
    // INVALID index, whose drop would wait for such a transaction to end. Nor once pgmend's
    // workers crowded the application out of the CPUs: one backend of pgmend's at a time then.
    let crowded = crate::db::crowding::ceiling().is_some();
    let mut census_alongside = migration
        .census_alongside
        .filter(|_| quiet && !crowded && !migration.censuses.is_empty());
    for attempt in 1..=BUILD_ATTEMPTS {
        crate::signals::check(&format!("building {name} ({label})"))?;
        let alongside = census_alongside.take();
        if alongside.is_none() {
            for finding in evaluate::check_before(main, label, migration.censuses)? {
                progress(&finding.describe());
            }
        }
        let mut census = alongside.map(|lock_timeout| {
            move |c: &mut postgres::Client| {
                evaluate::check_during_build(c, label, migration.censuses, lock_timeout)
            }
        });
        // Unreadable, the server's own settings, as before; while the application is at work
        // too (an unreadable pg_stat_activity counts as no application: the build goes on).
        let workers = match crate::db::crowding::app_at_work(main).unwrap_or(None) {
            Some(seen) => BuildWorkers::app_at_work(seen, crowded),
            None => parallel::capacity(main)
                .map(BuildWorkers::choose)
                .unwrap_or(BuildWorkers::NONE),
        };
        progress(&format!(
            "building {name} concurrently (attempt {attempt} of {BUILD_ATTEMPTS}) with {}",
            workers.describe()
        ));
        let started = Instant::now();
        crate::signals::leave(
            &leftover,
            format!(
                "the index {name} of {label}, whose CONCURRENTLY build was under way, may remain INVALID; `{}` drops it and builds it again",
                crate::signals::resume_command()
            ),
        );
        let outcome = match run_watched(
            main,
            params,
            &statement.sql,
            &workers.settings_sql(),
            build_wait,
            OnStop::Cancel,
            census.as_mut().map(|f| f as Alongside),
            progress,
        ) {
            Ok(outcome) => outcome,
            Err(stopped) => {
                // Cancelled after --build-wait, on a signal, or by the census taken alongside:
                // the build left an INVALID index behind, unless it was cancelled before
                // creating it.
                let left = existing(main, name)?.is_some();
                if left {
                    progress(&format!(
                        "dropping the INVALID index {name} the cancelled build left"
                    ));
                    // The drop's own error decides the exit code, as before the build.
                    if let Err(e) = drop_index(main, params, name, build_wait, progress) {
                        return Err(e.context(format!(
                            "{label}: the build was cancelled ({stopped:#}), but its INVALID index {name} could not be dropped; `{}` drops it and builds it again",
                            crate::signals::resume_command()
                        )));
                    }
                    progress(&format!("dropped the INVALID index {name}"));
                }
                crate::signals::cleaned(&leftover);
                return Err(stopped.context(format!(
                    "{label}: {}; nothing of this step remains",
                    if left {
                        "the INVALID index was dropped"
                    } else {
                        "the cancelled build left no index"
                    }
                )));
            }
        };
        match outcome {
            Ok(()) => match existing(main, name)? {
                Some(e) if e.valid && e.ready => {
                    crate::signals::cleaned(&leftover);
                    progress(&format!(
                        "built {name} in {}; it is valid",
                        crate::config::format_duration(Duration::from_millis(
                            started.elapsed().as_millis() as u64
                        ))
                    ));
                    return Ok(true);
                }
                _ => {
                    progress(&format!("{name} finished but is not valid; dropping it"));
                    drop_index(main, params, name, build_wait, progress)?;
                    crate::signals::cleaned(&leftover);
                }
            },
            Err(e) => {
                let code = sqlstate(&e).unwrap_or("").to_string();
                let text = describe(&e).to_string();
                if existing(main, name)?.is_some() {
                    progress(&format!(
                        "the build failed ({text}); dropping the INVALID index it left"
                    ));
                    drop_index(main, params, name, build_wait, progress)?;
                }
                crate::signals::cleaned(&leftover);
                // 57014 here is someone else's cancel (pgmend's own, after --build-wait, is
                // handled above): a person stopped the build, so pgmend does not retry it.
                if !matches!(code.as_str(), "23505" | "40P01" | "55P03") {
                    return Err(anyhow::anyhow!("{text}").context(format!(
                        "building {name} ({label}); the INVALID index it left was dropped"
                    )));
                }
                progress(&format!(
                    "the build failed with {code}; taking the census again"
                ));
            }
        }
    }
    Err(Violators::error(format!(
        "{name} could not be built in {BUILD_ATTEMPTS} attempts; no INVALID index was left behind. Find what keeps breaking the build (new duplicates from the old application, deadlocks), then rerun `pgmend migrate apply`"
    )))
}

/// `DROP INDEX CONCURRENTLY`, watched like a build.
pub fn drop_index(
    main: &mut postgres::Client,
    params: &ConnParams,
    name: &str,
    build_wait: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let sql = format!(
        "DROP INDEX CONCURRENTLY IF EXISTS {}",
        crate::db::sql_text::Ident::new(name)
    );
    run_watched(
        main,
        params,
        &sql,
        "",
        build_wait,
        OnStop::FinishInTime,
        None,
        progress,
    )?
    .map_err(|e| {
        anyhow::Error::new(describe(&e)).context(format!(
            "dropping index {name} concurrently; drop it by hand with: {sql}"
        ))
    })
}

/// The table's size and the transactions a concurrent build will have to wait for.
fn preflight(
    main: &mut postgres::Client,
    table: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<bool> {
    let size: String = main
        .query_one(
            "SELECT pg_size_pretty(pg_total_relation_size(to_regclass($1)))",
            &[&table],
        )
        .doing("measuring the table")?
        .get(0);
    progress(&format!("preflight: {table} takes {size} with its indexes"));
    let open = old_transactions(main)?;
    for line in &open {
        progress(&format!("preflight: the build will wait for {line}"));
    }
    Ok(open.is_empty())
}

/// Open transactions in this database, oldest first, other than pgmend's own.
fn old_transactions(main: &mut postgres::Client) -> Result<Vec<String>> {
    let rows = main
        .query(
            "SELECT pid, coalesce(application_name, ''), coalesce(state, ''),
                    extract(epoch FROM now() - xact_start)::int,
                    left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 80)
               FROM pg_stat_activity
              WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid() AND datname = current_database()
                AND backend_type = 'client backend' AND query NOT ILIKE '%CONCURRENTLY%'
              ORDER BY xact_start LIMIT 5",
            &[],
        )
        .doing("listing open transactions")?;
    Ok(rows.iter().map(session_line).collect())
}

fn session_line(r: &postgres::Row) -> String {
    format!(
        "pid {} ({:?}, {}, transaction open {}s: {})",
        r.get::<_, i32>(0),
        r.get::<_, String>(1),
        r.get::<_, String>(2),
        r.get::<_, i32>(3),
        r.get::<_, String>(4)
    )
}

/// What a stop request (`crate::signals`) does to a watched statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnStop {
    /// The work itself (a build): cancelled at once.
    Cancel,
    /// A clean-up (dropping an INVALID index): left to finish until the clean-up deadline,
    /// cancelled then.
    FinishInTime,
}

/// Cancels a build of index `name` that is still running on the server for a pgmend that is
/// gone: this pgmend holds the runner lock, so no other pgmend is working, and a build still
/// under way is one whose pgmend was cut off from the server (a silent network path, a kill)
/// while the server went on. Waiting for it could take hours and would still leave an index
/// this run did not watch; pgmend cancels it, says so, and waits (up to a minute) for the
/// cancel to land before the INVALID index is dropped and built again.
fn cancel_orphaned_build(
    main: &mut postgres::Client,
    name: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let orphans: Vec<(i32, String)> = main
        .query(
            "SELECT a.pid, coalesce(to_char(a.query_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), '')
               FROM pg_stat_progress_create_index p JOIN pg_stat_activity a USING (pid)
              WHERE p.index_relid = to_regclass($1)::oid AND a.pid <> pg_backend_pid()",
            &[&name],
        )
        .doing(format!("looking for a build of {name} still running on the server"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (pid, since) in orphans {
        progress(&format!(
            "an earlier build of index {name} is still running on the server (backend pid {pid}, since {since}) for a pgmend that is gone; cancelling it (pg_cancel_backend) before building the index again"
        ));
        let cancelled: bool = main
            .query_one("SELECT pg_cancel_backend($1)", &[&pid])
            .doing(format!(
                "cancelling the orphaned build of {name} (backend pid {pid})"
            ))?
            .get(0);
        let started = Instant::now();
        while cancelled && started.elapsed() < Duration::from_secs(60) {
            let running: bool = main
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_stat_progress_create_index WHERE pid = $1)",
                    &[&pid],
                )
                .doing("waiting for the orphaned build to end")?
                .get(0);
            if !running {
                break;
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(())
}

/// The server-side time a look at a running build may take before the margin: 30 s.
const WATCH_BOUND: Duration = Duration::from_secs(30);

/// Work for the main session while the watched statement runs: a census, whose findings are
/// reported, or whose error cancels the statement.
type Alongside<'a> = &'a mut dyn FnMut(&mut postgres::Client) -> Result<Vec<evaluate::Finding>>;

/// Runs `sql` on a fresh connection with no lock_timeout or statement_timeout, watching
/// it from `main`. Time spent waiting on other sessions counts against `build_wait`; past
/// it the statement is cancelled and pgmend stops (exit 1); so it is on a stop request, as
/// `on_stop` says. `alongside` runs on `main` once the statement has been sent, before the
/// first look at it; its error cancels the statement and is returned. Returns the
/// statement's own result otherwise.
#[allow(clippy::too_many_arguments)]
fn run_watched(
    main: &mut postgres::Client,
    params: &ConnParams,
    sql: &str,
    settings: &str,
    build_wait: Duration,
    on_stop: OnStop,
    alongside: Option<Alongside>,
    progress: &mut dyn FnMut(&str),
) -> Result<Result<(), postgres::Error>> {
    let mut worker = crate::db::connect(params)?;
    worker
        .client
        .batch_execute(&format!(
            "SET lock_timeout = 0; SET statement_timeout = 0; {settings}"
        ))
        .doing("preparing the connection for an online statement")?;
    let pid: i32 = worker
        .client
        .query_one("SELECT pg_backend_pid()", &[])
        .doing("reading the worker's pid")?
        .get(0);
    let (sender, receiver) = mpsc::channel();
    let owned_sql = sql.to_string();
    let handle = std::thread::spawn(move || {
        // No client-side bound: the build may rightly run for hours; the watcher on the main
        // session bounds it by its progress instead.
        let _unbounded = crate::db::deadline::unbounded();
        let result = worker.client.batch_execute(&owned_sql);
        let _ = sender.send(result);
    });
    if let Some(work) = alongside {
        // The census is taken while the statement runs: wait until the server has started it,
        // so that a cancel on the census's findings cannot land before the statement begins.
        let sent = Instant::now();
        while sent.elapsed() < Duration::from_secs(5) {
            let started = main
                .query_one(
                    "SELECT coalesce((SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1), true)",
                    &[&pid],
                )
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(true);
            if started || handle.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        match work(main) {
            Ok(findings) => findings.iter().for_each(|f| progress(&f.describe())),
            Err(e) => {
                let cancelled = main.execute("SELECT pg_cancel_backend($1)", &[&pid]);
                if receiver.recv_timeout(Duration::from_secs(30)).is_ok() {
                    let _ = handle.join();
                }
                return Err(match cancelled {
                    Ok(_) => e,
                    Err(c) => e.context(format!(
                        "and the statement running alongside could not be cancelled: {}",
                        describe(&c)
                    )),
                });
            }
        }
    }
    let mut waited = Duration::ZERO;
    let mut last_report = String::new();
    let mut last_report_at = Instant::now() - Duration::from_secs(60);
    loop {
        match receiver.recv_timeout(POLL) {
            Ok(result) => {
                let _ = handle.join();
                return Ok(result);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the online statement's thread ended without a result");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        // The watcher's look is a catalog read of milliseconds: bounded tightly, so that a
        // silent path stops pgmend within a minute while it waits for a build.
        let (waiting, report) = {
            let _bounded = crate::db::deadline::within(WATCH_BOUND);
            watch(main, pid)?
        };
        if waiting {
            waited += POLL;
        }
        if report != last_report || last_report_at.elapsed() >= Duration::from_secs(10) {
            progress(&format!(
                "{report} (waited {} of --build-wait {})",
                crate::config::format_duration(Duration::from_secs(waited.as_secs())),
                crate::config::format_duration(build_wait)
            ));
            last_report = report.clone();
            last_report_at = Instant::now();
        }
        let stop = match (crate::signals::requested(), on_stop) {
            (None, _) => None,
            (Some(signal), OnStop::Cancel) => Some(signal),
            (Some(signal), OnStop::FinishInTime) => crate::signals::cleanup_deadline()
                .filter(|d| Instant::now() >= *d)
                .map(|_| signal),
        };
        if let Some(signal) = stop {
            main.execute("SELECT pg_cancel_backend($1)", &[&pid])
                .doing("cancelling the online statement")?;
            // A cancelled statement ends at once; a thread that does not answer is left
            // behind rather than waited for past the clean-up limit.
            if let Ok(result) = receiver.recv_timeout(Duration::from_secs(2)) {
                let _ = handle.join();
                if result.is_ok() {
                    return Ok(Ok(()));
                }
            }
            return Err(Stopped::error(match on_stop {
                OnStop::Cancel => format!(
                    "{} received: the online statement was cancelled ({report}). Continue with: {}",
                    signal.name(),
                    crate::signals::resume_command()
                ),
                OnStop::FinishInTime => format!(
                    "{} received: `{sql}` did not end in time for the clean-up limit and was cancelled ({report})",
                    signal.name()
                ),
            }));
        }
        if waited > build_wait {
            main.execute("SELECT pg_cancel_backend($1)", &[&pid])
                .doing("cancelling the online statement")?;
            let result = receiver.recv_timeout(Duration::from_secs(30));
            let _ = handle.join();
            if let Ok(Ok(())) = result {
                return Ok(Ok(()));
            }
            return Err(Stopped::error(format!(
                "the online statement waited longer than --build-wait {} and was cancelled: {report}. End or wait out those sessions, then rerun; or rerun with a longer --build-wait",
                crate::config::format_duration(build_wait)
            )));
        }
    }
}

/// What the online statement of backend `pid` is doing, and whether it is waiting for
/// other sessions.
fn watch(main: &mut postgres::Client, pid: i32) -> Result<(bool, String)> {
    let progress_row = main
        .query_opt(
            "SELECT phase, current_locker_pid::int, lockers_total::bigint, lockers_done::bigint,
                    blocks_total::bigint, blocks_done::bigint
               FROM pg_stat_progress_create_index WHERE pid = $1",
            &[&pid],
        )
        .doing("reading pg_stat_progress_create_index")?;
    let blockers = main
        .query(
            "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
                    coalesce(extract(epoch FROM now() - a.xact_start)::int, 0),
                    left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 80)
               FROM pg_stat_activity a
              WHERE a.pid = ANY (pg_blocking_pids($1))
                 OR a.pid = (SELECT current_locker_pid FROM pg_stat_progress_create_index WHERE pid = $1)",
            &[&pid],
        )
        .doing("looking up what the online statement waits for")?;
    let wait_event: Option<String> = main
        .query_opt(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .doing("reading the online statement's wait state")?
        .and_then(|r| r.get(0));
    let waiting = !blockers.is_empty() || wait_event.as_deref() == Some("Lock");
    let mut report = match &progress_row {
        Some(r) => {
            let phase: String = r.get(0);
            let (bt, bd): (i64, i64) = (r.get(4), r.get(5));
            if bt > 0 {
                format!("{phase}: {}% of blocks", bd * 100 / bt.max(1))
            } else {
                phase
            }
        }
        None => "running".to_string(),
    };
    if !blockers.is_empty() {
        report.push_str(&format!(
            ", waiting for {}",
            blockers
                .iter()
                .map(session_line)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    Ok((waiting, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_definitions_compare_with_statements() {
        assert!(same_definition(
            "CREATE UNIQUE INDEX one_coupon_per_member ON public.issued_coupons USING btree (campaign_id, member_id) WHERE (NOT legacy_duplicate)",
            "CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate;"
        ));
        assert!(!same_definition(
            "CREATE UNIQUE INDEX one_coupon_per_member ON public.issued_coupons USING btree (campaign_id, member_id)",
            "CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate;"
        ));
    }
}
