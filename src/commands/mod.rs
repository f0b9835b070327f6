//! One module per group of subcommands: each opens what it needs, calls the library
//! parts, and renders the result.
//!
//! Shared by the command modules: `open` and `open_checked` (resolve the connection from the
//! options and the environment, with `--schema` added to the connection's `search_path`, connect,
//! and run the environment's pre-flight, `preflight::check`; `open_checked` also returns what it
//! found; `open_to_read` first checks that the role may read what `verify` or the report reads),
//! `load` (the migration files from `MigrationsArgs`), `source` (the repair definitions),
//! `load_release` (the release `plan` and `apply` run, `release::project`), `release_name`, `policy`
//! (`SafetyArgs` to a checked `LockPolicy`), `run_options` (the batch options), `confirm` (ask
//! `[y/N]` on the terminal, and stop with exit 1 on any answer but yes; without `--yes` and
//! without a terminal on both stdin and stderr, refuse (exit 2), naming the caller's own dry
//! run), `print_json` (one pretty-printed document on stdout, through `output::stdout`).

pub mod demo;
pub mod migrate;
pub mod release;
pub mod repair;
pub mod report;
pub mod verify;

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};

use crate::cli::{
    BatchArgs, ConnectionArgs, MigrationsArgs, Pooler, ProjectArgs, ReleaseArgs, RepairsArgs,
    SafetyArgs,
};
use crate::config::{self, AutovacuumPause};
use crate::db::retry::LockPolicy;
use crate::db::{self, conninfo, Session};
use crate::migrate::source::Migration;
use crate::preflight::{self, Environment};
use crate::release::project;
use crate::repair::definition::RepairSource;
use crate::repair::health::{Health, Setting};
use crate::repair::options::RunOptions;

pub use crate::db::connect::{read_only, snapshot};

/// The migration set: `--migrations-dir`, else the release's migrations/ (exit 2 with
/// neither, [`project::NOT_FOUND`]).
pub fn load(args: &MigrationsArgs) -> Result<Vec<Migration>> {
    let found = project::find(args.release.release.as_deref())?;
    let mut files = project::migrations(found.as_ref(), args.migrations_dir.as_deref())?;
    if let Some(found) = &found {
        crate::release::name_repairs_in_censuses(&project::definition(found)?.steps, &mut files);
    }
    Ok(files)
}

/// The release `plan` and `apply` run: `--release DIR` or the current directory, its parts
/// overridden by `--migrations-dir` and `--repairs-dir` (exit 2 when there is none).
pub fn load_release(args: &ProjectArgs) -> Result<project::Loaded> {
    let found = project::find(args.release.release.as_deref())?;
    project::load(
        found.as_ref(),
        args.migrations_dir.as_deref(),
        args.repairs_dir.as_deref(),
    )
}

/// The definition of the release `--release` or the current directory holds, when there is
/// one (its files are not read).
pub fn definition(args: &ReleaseArgs) -> Result<Option<crate::release::Definition>> {
    let Some(found) = project::find(args.release.as_deref())? else {
        return Ok(None);
    };
    project::definition(&found).map(Some)
}

/// Refuses (exit 2, before any change) work for the release `definition` names (none: work
/// outside any release, from `--migrations-dir` or `--repairs-dir` alone) while another
/// release is unfinished on the database, or when its migration versions clash with
/// another's (`release::identity::check`). For `migrate apply` and `repair apply`; `apply`
/// checks its own.
pub fn one_release_at_a_time(
    client: &mut postgres::Client,
    definition: Option<&crate::release::Definition>,
) -> Result<()> {
    let applied: Vec<i32> = crate::migrate::history::read(client)?
        .iter()
        .map(|a| a.version)
        .collect();
    let me = definition.map_or("", |d| d.name.as_str());
    let others = crate::release::identity::standings(client, me, &applied)?;
    crate::release::identity::check(
        &others,
        definition.map(|d| d.name.as_str()),
        definition.map_or(&[], |d| d.steps.as_slice()),
    )
}

/// The migration versions other releases than the one `definition` names apply
/// (`release::identity::other_versions`).
pub fn other_versions(
    client: &mut postgres::Client,
    definition: Option<&crate::release::Definition>,
) -> Result<Vec<i32>> {
    crate::release::identity::other_versions(client, definition.map_or("", |d| d.name.as_str()))
}

/// `--lock-timeout`, `--statement-timeout`, `--lock-retry-for` and `--validate-timeout`, checked.
pub fn policy(safety: &SafetyArgs) -> Result<LockPolicy> {
    config::check_lock_options(
        safety.lock_timeout,
        safety.statement_timeout,
        safety.validate_timeout,
    )?;
    Ok(LockPolicy {
        lock_timeout: safety.lock_timeout,
        statement_timeout: safety.statement_timeout,
        retry_for: safety.lock_retry_for,
        validate_timeout: safety.validate_timeout,
    })
}

/// The name of the release `--release` or the current directory holds, when there is one.
pub fn release_name(args: &ReleaseArgs) -> Result<Option<String>> {
    Ok(definition(args)?.map(|d| d.name))
}

/// Where the repair definitions are: `--repairs-dir`, else the release's repairs/ (exit 2
/// with neither, [`project::NOT_FOUND`]).
pub fn source(args: &RepairsArgs) -> Result<RepairSource> {
    let found = project::find(args.release.release.as_deref())?;
    project::repairs(found.as_ref(), args.repairs_dir.as_deref())
}

/// The lock policy and the batch options of a command that runs repairs.
pub fn run_options(safety: &SafetyArgs, batch: &BatchArgs) -> Result<RunOptions> {
    Ok(RunOptions {
        policy: policy(safety)?,
        batch_target: batch
            .batch_target
            .unwrap_or(crate::repair::options::BATCH_TARGET),
        batch_target_given: batch.batch_target.is_some(),
        health: health(batch),
        workers: None,
        checked_later: false,
        neighbour: crate::repair::neighbour::Neighbour {
            pause: batch.pause,
            duty_cycle: batch.duty_cycle,
        },
    })
}

/// The health signals' thresholds: each option given, or pgmend's default (not explicit).
fn health(batch: &BatchArgs) -> Health {
    use crate::repair::health as h;
    Health {
        replica_lag: Setting::given(batch.max_replica_lag, h::DEFAULT_REPLICA_LAG),
        archive_backlog: Setting::given(batch.max_archive_backlog, h::DEFAULT_ARCHIVE_BACKLOG),
        autovacuum: Setting::given(batch.autovacuum_pause, AutovacuumPause::Wraparound),
        requested_checkpoints: Setting::given(
            batch.max_requested_checkpoints,
            h::DEFAULT_REQUESTED_CHECKPOINTS,
        ),
        lock_wait: Setting::given(batch.max_lock_wait, h::DEFAULT_LOCK_WAIT),
        cpu_slowdown: Setting::given(batch.max_cpu_slowdown, h::DEFAULT_CPU_SLOWDOWN),
        pause_limit: batch.health_pause_limit,
    }
}

/// The batch workers `--jobs` asks for, connected as `session` is; with more than one, refuses
/// (exit 2, before any change) when the server's free connection slots cannot serve them
/// ([`preflight::connection_slots`]).
pub fn workers(
    session: &mut Session,
    batch: &BatchArgs,
) -> Result<Option<crate::repair::options::Workers>> {
    let (jobs, auto) = match batch.jobs {
        crate::config::Jobs::Fixed(n) => {
            let jobs = usize::from(n);
            if jobs > 1 {
                preflight::connection_slots(&mut session.client, jobs)?;
            }
            (jobs, false)
        }
        crate::config::Jobs::Auto => {
            let (jobs, line) =
                preflight::auto_jobs(&mut session.client, usize::from(batch.max_jobs))?;
            crate::say!("{line}");
            (jobs, true)
        }
    };
    Ok(Some(crate::repair::options::Workers {
        jobs,
        auto,
        params: session.params.clone(),
        // The workers check in every batch that the lease holding the runner lock is alive.
        lock_pid: crate::db::runner_lock::lease_pid().unwrap_or(session.backend_pid),
    }))
}

/// Opens a session from `--database-url` / `DATABASE_URL` and the PG* variables, in the
/// schema `--schema` names, and runs the pre-flight of the environment on it
/// ([`preflight`]) for a command that works on `tables` (those its release, migrations or
/// repair name; none for one that reads only pgmend's records): every command goes through
/// here before its first statement.
pub fn open(conn: &ConnectionArgs, tables: &[String]) -> Result<Session> {
    Ok(open_checked(conn, tables)?.0)
}

/// [`open`], with what the pre-flight found (for the summaries of `plan`, `apply` and `verify`).
pub fn open_checked(conn: &ConnectionArgs, tables: &[String]) -> Result<(Session, Environment)> {
    open_for(conn, None, tables)
}

/// [`open_checked`] for a command that only reads (`verify`, `report overruns`): first, before
/// the pre-flight reads pgmend's records, whether the role may read pgmend's tables and
/// `tables` ([`preflight::reading`]), refusing with every GRANT it lacks.
pub fn open_to_read(
    conn: &ConnectionArgs,
    command: &str,
    tables: &[String],
) -> Result<(Session, Environment)> {
    open_for(conn, Some(command), tables)
}

fn open_for(
    conn: &ConnectionArgs,
    reads_for: Option<&str>,
    tables: &[String],
) -> Result<(Session, Environment)> {
    let mut params = conninfo::resolve(conn.database_url.as_deref(), &|k| std::env::var(k).ok())?;
    if let Some(schema) = &conn.schema {
        params.options = Some(with_search_path(params.options.as_deref(), schema)?);
    }
    let mut session = db::connect(&params)?;
    let environment = preflight::check(
        &mut session,
        conn.pooler == Pooler::Session,
        reads_for,
        tables,
    )?;
    Ok((session, environment))
}

/// The tables a migration set works on: those its statements lock.
pub fn migration_tables(files: &[Migration]) -> Vec<String> {
    let mut out: Vec<String> = files
        .iter()
        .flat_map(|m| m.statements.iter())
        .flat_map(|s| s.locks.iter().map(|l| l.relation.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The connection's `options` with `-c search_path=SCHEMA` added last, so that every
/// connection pgmend opens (an online build's too) works in that schema alone. The schema is
/// quoted as an identifier, and blanks and backslashes escaped as the options string needs.
fn with_search_path(options: Option<&str>, schema: &str) -> Result<String> {
    if schema.is_empty() || schema.contains('\0') {
        bail!("--schema {schema:?}: give the name of the schema that holds the legacy tables");
    }
    let quoted = crate::db::sql_text::Ident::new(schema).to_string();
    let escaped: String = quoted
        .chars()
        .flat_map(|c| match c {
            ' ' | '\\' | '\t' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let set = format!("-c search_path={escaped}");
    Ok(match options {
        Some(o) if !o.trim().is_empty() => format!("{o} {set}"),
        _ => set,
    })
}

/// Refuses (exit 2) to ask where no one can answer: without a terminal on both stdin and
/// stderr, or with `--progress json` (stderr is for a program then). `review` names the
/// command's own dry run. Called before anything is shown for the question.
pub fn ensure_can_ask(review: &str) -> Result<()> {
    if crate::output::json_lines() {
        bail!("this command changes the database and asks first, and with --progress json there is no one to ask; {review}, then rerun with --yes");
    }
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        bail!("this command changes the database and there is no terminal to ask on; {review}, then rerun with --yes");
    }
    Ok(())
}

/// Asks on the terminal before a change; refuses without one unless `--yes` was given,
/// saying `review`: how to see first what this command would do (its own dry run).
pub fn confirm(yes: bool, question: &str, review: &str) -> Result<()> {
    if yes {
        return Ok(());
    }
    ensure_can_ask(review)?;
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        // A safe stop, not an input error; and never 0, so that `pgmend apply && deploy`
        // does not deploy after a no.
        Err(crate::error::Stopped::error(format!(
            "the question was answered {}, not yes; nothing was changed. To go on, run the command again and answer y, or add --yes",
            match answer.trim() {
                "" => "with nothing".to_string(),
                a => format!("{a:?}"),
            }
        )))
    }
}

/// Writes a JSON document to stdout, followed by a newline.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = crate::output::stdout();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// The directory a file `path` goes in (`.` for a bare name).
pub fn parent(path: &std::path::Path) -> &std::path::Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    }
}

/// A temporary file beside `path`, to be renamed into place once complete.
pub fn temporary_beside(path: &std::path::Path) -> Result<tempfile::NamedTempFile> {
    let dir = parent(path);
    // Mode 0666 is masked by the umask when the file is created, as for any new file;
    // tempfile's default (0600) would hide the report from the people it is for.
    tempfile::Builder::new()
        .prefix(".pgmend-report-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .with_context(|| {
            format!(
                "cannot create a temporary file in {}; check the directory exists and is writable",
                dir.display()
            )
        })
}

/// Writes `text` to `path` atomically: a temporary file beside it (with the mode of the file it
/// replaces), synced, renamed over it (a reader such as node_exporter's textfile collector sees
/// the old file or the new one).
pub fn write_atomically(path: &std::path::Path, text: &str) -> Result<()> {
    let mut file = temporary_beside(path)?;
    // A file replaced keeps its mode: whoever reads it (node_exporter) still may.
    if let Ok(meta) = std::fs::metadata(path) {
        std::fs::set_permissions(file.path(), meta.permissions()).with_context(|| {
            format!(
                "giving {} the mode of {}",
                file.path().display(),
                path.display()
            )
        })?;
    }
    file.write_all(text.as_bytes())
        .and_then(|()| file.as_file().sync_all())
        .with_context(|| format!("writing {}", file.path().display()))?;
    file.persist(path).map_err(|e| e.error).with_context(|| {
        format!(
            "cannot write {} (nothing was written there)",
            path.display()
        )
    })?;
    Ok(())
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64().floor())
}

/// Refuses (exit 2, before connecting) `--output` without `--format openmetrics`.
pub fn metrics_output_needs_openmetrics(
    args: &crate::cli::MetricsArgs,
    format: crate::cli::Format,
) -> Result<()> {
    if args.output.is_some() && format != crate::cli::Format::Openmetrics {
        bail!("--output writes the metrics of --format openmetrics; add --format openmetrics, or leave --output out");
    }
    Ok(())
}

/// Writes the OpenMetrics document `render` makes (given the last success the file it
/// replaces recorded) to `--output`, atomically, or to stdout. A run that could not check
/// (`ran` false) still writes its file, with `_up` 0, unless there is no `--output`.
pub fn emit_metrics(
    args: &crate::cli::MetricsArgs,
    command: &str,
    ran: bool,
    render: impl FnOnce(Option<f64>) -> String,
) -> Result<()> {
    match &args.output {
        Some(path) => {
            let previous = std::fs::read_to_string(path).unwrap_or_default();
            write_atomically(
                path,
                &render(crate::metrics::last_success(&previous, command)),
            )
        }
        None if ran => {
            crate::output::stdout().write_all(render(None).as_bytes())?;
            Ok(())
        }
        None => Ok(()),
    }
}
