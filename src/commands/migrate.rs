//! `pgmend migrate status|plan|apply|baseline|validate`: the migrations alone (the top-level
//! `plan` and `apply`, the whole release, are `commands::release`).
//!
//! Each command loads the files (except `validate`), opens the session, calls into `migrate::*` or
//! `online::*`, and renders. Holds the JSON document structs for `status` (with
//! `online::catalog::InvalidIndex`), `apply` and `baseline` (`plan` serializes
//! `migrate::plan::Plan` and `validate` `online::validate::Validation` directly) and the human
//! renderings of status (a `tabled` table, then, under a line `N problem(s):`, the history's
//! problems and each INVALID index), apply, baseline and validate. `status` counts INVALID indexes
//! as problems (exit 1). `apply` takes the runner lock, then builds the plan (so what is shown is
//! what is applied), checks the privileges, shows the plan on stderr and asks, then executes,
//! printing progress (census findings, preflight and watch lines) to stderr. `baseline` takes the
//! runner lock, compares V1 with the live schema, checks the privileges recording V1 needs (the
//! history table), asks, then records. `validate` takes the runner lock, asks, then calls
//! `online::validate::run`.

use std::io::Write;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tabled::Tabled;

use super::{confirm, load, open, policy, print_json};
use crate::cli::{ApplyArgs, BaselineArgs, Format, PlanArgs, StatusArgs, ValidateArgs};
use crate::db::conninfo::ConnParams;
use crate::db::runner_lock;
use crate::error::{Outcome, PgContext};
use crate::migrate::source::{by_version, Migration};
use crate::migrate::{apply, baseline, history, plan, status};
use crate::online::{catalog, validate};
use crate::preflight::privileges;

#[derive(Serialize)]
struct DatabaseJson<'a> {
    host: &'a str,
    port: u16,
    dbname: &'a str,
    user: &'a str,
}

fn database_json(p: &ConnParams) -> DatabaseJson<'_> {
    DatabaseJson {
        host: &p.host,
        port: p.port,
        dbname: &p.dbname,
        user: &p.user,
    }
}

pub fn status(args: &StatusArgs, format: Format) -> Result<Outcome> {
    let files = load(&args.migrations)?;
    let definition = super::definition(&args.migrations.release)?;
    let mut session = open(&args.conn, &super::migration_tables(&files))?;
    let mut tx = super::read_only(&mut session.client)?;
    let applied = history::read(&mut tx)?;
    let invalid_indexes = catalog::invalid_indexes(&mut tx)?;
    let others = crate::release::identity::other_versions(
        &mut tx,
        definition.as_ref().map_or("", |d| d.name.as_str()),
    )?;
    let legacy = match files.iter().find(|m| m.version == 1) {
        Some(v1) if applied.is_empty() => plan::unrecorded_legacy(&mut tx, v1)?,
        _ => Vec::new(),
    };
    tx.rollback().doing("closing the read-only transaction")?;
    let entries = status::compute(&files, &applied, &others);
    let problems = entries.iter().filter(|e| e.state.is_problem()).count() + invalid_indexes.len();
    match format {
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                database: DatabaseJson<'a>,
                migrations: &'a [status::Entry],
                invalid_indexes: &'a [catalog::InvalidIndex],
                problems: usize,
            }
            print_json(&Doc {
                database: database_json(&session.params),
                migrations: &entries,
                invalid_indexes: &invalid_indexes,
                problems,
            })?;
        }
        _ => {
            #[derive(Tabled)]
            struct Row {
                #[tabled(rename = "version")]
                version: i32,
                name: String,
                state: &'static str,
                mode: String,
                #[tabled(rename = "applied on (UTC)")]
                applied_on: String,
                checksum: String,
            }
            let rows: Vec<Row> = entries
                .iter()
                .map(|e| Row {
                    version: e.version,
                    name: e.name.clone(),
                    state: e.state.as_str(),
                    mode: e
                        .mode
                        .map_or("-".into(), |m| format!("{m:?}").to_lowercase()),
                    // To the second (the JSON has it whole), so the table fits 120 columns.
                    applied_on: e.applied_on.as_deref().map_or("-".into(), |at| {
                        at.get(..19).unwrap_or(at).replace('T', " ")
                    }),
                    checksum: e
                        .checksum
                        .clone()
                        .or(e.applied_checksum.clone())
                        .unwrap_or_default(),
                })
                .collect();
            let mut out = crate::output::stdout();
            writeln!(
                out,
                "{} (PostgreSQL {})",
                session.params, session.server_version
            )?;
            writeln!(out, "{}", crate::human::table(rows))?;
            if !legacy.is_empty() {
                writeln!(
                    out,
                    "No migration is recorded, but the database already has V1's tables ({}): it looks like the legacy production schema, not yet adopted. Adopt it first with `pgmend migrate baseline` (it checks the schema against V1, then records V1 without running it); until then `pgmend migrate apply` and `pgmend apply` stop before changing anything.",
                    legacy.join(", ")
                )?;
            }
            if problems > 0 {
                writeln!(out, "{}:", crate::human::count(problems as i64, "problem"))?;
                if let Err(e) = status::ensure_consistent(&entries) {
                    writeln!(out, "{e:#}")?;
                }
                for index in &invalid_indexes {
                    writeln!(out, "{}", index.describe())?;
                }
            }
        }
    }
    Ok(if problems > 0 {
        Outcome::Findings
    } else {
        Outcome::Done
    })
}

pub fn plan(args: &PlanArgs, format: Format) -> Result<Outcome> {
    let files = load(&args.migrations)?;
    let definition = super::definition(&args.migrations.release)?;
    let mut session = open(&args.conn, &super::migration_tables(&files))?;
    let others = super::other_versions(&mut session.client, definition.as_ref())?;
    let mut plan = plan::build(&mut session.client, files, args.target, &others)?;
    let refused =
        plan.flag_long_locks(&mut session.client, args.long_locks.long_lock_rows, |_| {
            true
        })?;
    plan.blockers.extend(refused);
    render_plan(&plan, format)?;
    if !plan.blockers.is_empty() {
        bail!(
            "apply would stop before changing anything:\n  - {}",
            plan.blockers.join("\n  - ")
        );
    }
    Ok(Outcome::Done)
}

fn render_plan(plan: &plan::Plan, format: Format) -> Result<()> {
    match format {
        Format::Json => print_json(plan),
        _ => Ok(plan::render_human(plan, &mut crate::output::stdout())?),
    }
}

pub fn apply(args: &ApplyArgs, format: Format) -> Result<Outcome> {
    let policy = policy(&args.safety)?;
    let files = load(&args.plan.migrations)?;
    let definition = super::definition(&args.plan.migrations.release)?;
    let mut session = open(&args.plan.conn, &super::migration_tables(&files))?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    let others = super::other_versions(&mut session.client, definition.as_ref())?;
    // Planned under the runner lock: what is shown is what is applied.
    let mut plan = plan::build_with(
        &mut session.client,
        files,
        args.plan.target,
        !args.safety.yes,
        &others,
    )?;
    let refused = plan.flag_long_locks(
        &mut session.client,
        args.plan.long_locks.long_lock_rows,
        |_| true,
    )?;
    plan.blockers.extend(refused);
    if !plan.pending.is_empty() {
        super::one_release_at_a_time(&mut session.client, definition.as_ref())?;
    }
    if plan.blockers.is_empty() {
        let pending = plan
            .pending
            .iter()
            .map(|p| by_version(&plan.migrations, p.version));
        privileges::check(
            &mut session.client,
            "these migrations",
            &privileges::for_migrations(pending),
        )?;
    }
    if !plan.pending.is_empty() && !args.safety.yes {
        super::ensure_can_ask("review its plan first (`pgmend migrate plan`)")?;
        plan::render_human(&plan, &mut std::io::stderr().lock())?;
        confirm(
            false,
            &format!(
                "Apply {} to {}?",
                crate::human::count(plan.pending.len() as i64, "migration"),
                session.params
            ),
            "review its plan first (`pgmend migrate plan`)",
        )?;
    }
    let params = session.params.clone();
    crate::signals::install(&match args.plan.target {
        Some(v) => format!("pgmend migrate apply --yes --target {v}"),
        None => "pgmend migrate apply --yes".to_string(),
    });
    let applied = apply::execute(
        &mut session.client,
        &params,
        &plan,
        &policy,
        args.safety.build_wait,
        apply::CensusTiming::First,
        &mut |line| crate::say!("{line}"),
    )?;
    let now_at = applied.last().map(|a| a.version).or(plan.current_version);
    match format {
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                database: DatabaseJson<'a>,
                applied: &'a [apply::AppliedMigration],
                current_version: Option<i32>,
            }
            print_json(&Doc {
                database: database_json(&session.params),
                applied: &applied,
                current_version: now_at,
            })?;
        }
        _ => {
            let mut out = crate::output::stdout();
            if applied.is_empty() {
                writeln!(
                    out,
                    "Nothing to apply: {} is at V{} and up to date.",
                    session.params,
                    now_at.unwrap_or(0)
                )?;
            } else {
                for a in &applied {
                    writeln!(
                        out,
                        "applied V{}__{} ({})",
                        a.version,
                        a.name,
                        crate::human::millis(a.duration_ms)
                    )?;
                }
                writeln!(
                    out,
                    "{} is now at V{}.",
                    session.params,
                    now_at.unwrap_or(0)
                )?;
            }
        }
    }
    Ok(Outcome::Done)
}

pub fn baseline(args: &BaselineArgs, format: Format) -> Result<Outcome> {
    let policy = policy(&args.safety)?;
    let files = load(&args.migrations)?;
    let v1 = files
        .iter()
        .find(|m| m.version == 1)
        .context("there is no V1 migration to adopt as the baseline; check --migrations-dir")?
        .clone();
    let mut session = open(&args.conn, &super::migration_tables(&files))?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    let applied = history::read(&mut session.client)?;
    let entries = status::compute(&files, &applied, &[]);
    status::ensure_consistent(&entries)?;
    if applied.iter().any(|a| a.version == 1) {
        report_baseline(format, &session.params, &v1, None, true)?;
        return Ok(Outcome::Done);
    }
    if let Some(other) = applied.first() {
        bail!(
            "the history already records V{}__{} but not V1; a baseline adopts a database with no history. Inspect {} before going on",
            other.version, other.name, history::TABLE
        );
    }
    let comparison = baseline::compare(&mut session.client, &v1, &policy)?;
    if !comparison.missing.is_empty() || !comparison.different.is_empty() {
        let mut lines: Vec<String> = comparison
            .missing
            .iter()
            .map(|m| format!("missing: {m}"))
            .collect();
        lines.extend(
            comparison
                .different
                .iter()
                .map(|d| format!("different: {d}")),
        );
        bail!(
            "schema {:?} does not match {}; nothing was recorded:\n  - {}\nThis database is not the legacy schema pgmend expects. Fix the differences (or the migration, if production is right and V1 is wrong) before adopting it",
            comparison.schema,
            v1.origin,
            lines.join("\n  - ")
        );
    }
    privileges::check(
        &mut session.client,
        "the baseline",
        &privileges::for_history(&format!("recording {} as applied", v1.label())),
    )?;
    confirm(
        args.safety.yes,
        &format!(
            "Record {} as applied on {} without running it?",
            v1.label(),
            session.params
        ),
        "check what is applied first (`pgmend migrate status`)",
    )?;
    baseline::record(&mut session.client, &v1, &policy)?;
    report_baseline(format, &session.params, &v1, Some(&comparison), false)?;
    Ok(Outcome::Done)
}

fn report_baseline(
    format: Format,
    params: &ConnParams,
    v1: &Migration,
    comparison: Option<&baseline::Comparison>,
    already: bool,
) -> Result<()> {
    match format {
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                database: DatabaseJson<'a>,
                baseline_version: i32,
                already_baselined: bool,
                extra: Vec<String>,
            }
            print_json(&Doc {
                database: database_json(params),
                baseline_version: v1.version,
                already_baselined: already,
                extra: comparison.map(|c| c.extra.clone()).unwrap_or_default(),
            })
        }
        _ => {
            let mut out = crate::output::stdout();
            if already {
                writeln!(
                    out,
                    "{params} already records {} as applied; nothing to do.",
                    v1.label()
                )?;
                return Ok(());
            }
            writeln!(out, "{params}: the live schema has everything {} defines; recorded it as applied (not run).", v1.label())?;
            if let Some(c) = comparison.filter(|c| !c.extra.is_empty()) {
                writeln!(out, "Also present, not part of V1 (allowed):")?;
                for e in &c.extra {
                    writeln!(out, "  - {e}")?;
                }
            }
            Ok(())
        }
    }
}

pub fn validate(args: &ValidateArgs, format: Format) -> Result<Outcome> {
    let policy = policy(&args.safety)?;
    let mut session = open(&args.conn, &[])?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    confirm(
        args.safety.yes,
        &format!(
            "Validate constraint {} on {} (a full scan under SHARE UPDATE EXCLUSIVE)?",
            args.name, session.params
        ),
        "it counts the rows that break the constraint before it validates, and stops (exit 1) while there are any",
    )?;
    let result = validate::run(&mut session.client, &args.name, &policy)?;
    match format {
        Format::Json => print_json(&result)?,
        _ => {
            let mut out = crate::output::stdout();
            if result.already_valid {
                writeln!(
                    out,
                    "{} on {} is already valid; nothing to do.",
                    result.constraint, result.table
                )?;
            } else {
                writeln!(
                    out,
                    "{} on {}: no row breaks it; validated.",
                    result.constraint, result.table
                )?;
            }
        }
    }
    Ok(Outcome::Done)
}
