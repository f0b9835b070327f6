//! The migration plan: what `apply` would do, built in a read-only transaction and
//! rendered without a server. `apply` executes this same value.
//!
//! `build` makes the `Plan` value in one `READ ONLY` transaction: reads the history, checks
//! consistency, selects the pending migrations up to `--target`, adds blockers (a pending migration
//! would create tables that already exist; for V1 on an unrecorded database, the blocker says to
//! use `baseline`), and counts each pending migration's censuses (`online::evaluate::evaluate`),
//! passing the columns that the earlier pending migrations add (`census::added_column`) as shadows.
//! For an online migration it also asks `online::index::existing_note` what `apply` will do first
//! about each index it builds that already exists (skip a valid one as defined; drop an INVALID or
//! different one CONCURRENTLY, then build), so the plan shows that drop before it happens.
//! `render_human` writes the plan to any `Write` without a server; `render_migration` (also used by
//! the release plan) writes one pending migration: its statements, their locks, each census finding
//! (marked `apply stops here (exit 1)` when it blocks), the strongest lock and what it blocks, and
//! the SQL. The plan command exits 0 whatever the censuses found. `build_with(..., false)` skips
//! the censuses, for callers that do not show them (`migrate apply --yes`, each migration step of
//! the release): applying takes each census again right before its step, and a census reads the
//! table.

use std::io::Write;

use anyhow::{bail, Result};
use postgres::GenericClient;
use serde::Serialize;

use super::history;
use super::long_locks::{self, LongLockFinding};
use super::source::{by_version, Migration, Mode};
use super::status::{self, Entry};
use crate::error::PgContext;
use crate::online::census::{added_column, AddedColumn};
use crate::online::evaluate::{evaluate, Finding};
use crate::statements::{LockMode, Statement};

#[derive(Debug, Serialize)]
pub struct Plan {
    /// The newest applied version, if any.
    pub current_version: Option<i32>,
    pub target_version: Option<i32>,
    pub pending: Vec<PlannedMigration>,
    /// Problems that would stop `apply` before it changes anything.
    pub blockers: Vec<String>,
    #[serde(skip)]
    pub migrations: Vec<Migration>,
}

#[derive(Debug, Serialize)]
pub struct PlannedMigration {
    pub version: i32,
    pub name: String,
    pub origin: String,
    pub mode: Mode,
    pub in_transaction: bool,
    pub strongest_lock: Option<LockMode>,
    pub statements: Vec<Statement>,
    /// Each census the step takes first, counted now (columns an earlier pending step
    /// adds read as the value that step gives them).
    pub censuses: Vec<Finding>,
    /// What apply does first about indexes this step builds that already exist (an INVALID
    /// one left by a failed build is dropped CONCURRENTLY before the build).
    pub existing_indexes: Vec<String>,
    /// Statements that would hold a strong lock for a time that grows with their table
    /// (`long_locks::flag` fills them in; left out of the JSON when there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub long_locks: Vec<LongLockFinding>,
    pub sql: String,
}

/// Builds the plan up to `target` (or the newest file), reading the database in one
/// READ ONLY transaction: the server refuses any write. `others`: the versions other
/// releases apply (`status::compute`).
pub fn build(
    client: &mut postgres::Client,
    files: Vec<Migration>,
    target: Option<i32>,
    others: &[i32],
) -> Result<Plan> {
    build_with(client, files, target, true, others)
}

/// [`build`], with the censuses taken only when `take_censuses` (for showing them): applying
/// takes each census again right before its step, and one census reads the whole table.
pub fn build_with(
    client: &mut postgres::Client,
    files: Vec<Migration>,
    target: Option<i32>,
    take_censuses: bool,
    others: &[i32],
) -> Result<Plan> {
    if let Some(t) = target {
        if !files.iter().any(|m| m.version == t) {
            let known: Vec<String> = files.iter().map(|m| m.version.to_string()).collect();
            bail!(
                "--target {t} is not a migration version; the known versions are {}",
                known.join(", ")
            );
        }
    }
    let mut tx = client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a read-only transaction for the plan")?;
    let applied = history::read(&mut tx)?;
    let entries = status::compute(&files, &applied, others);
    status::ensure_consistent(&entries)?;
    let current_version = applied.iter().map(|a| a.version).max();
    let pending_entries: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.state == status::State::Pending && target.is_none_or(|t| e.version <= t))
        .collect();
    let mut blockers = Vec::new();
    let mut pending = Vec::new();
    let mut shadows: Vec<AddedColumn> = Vec::new();
    for entry in pending_entries {
        let m = by_version(&files, entry.version);
        let creates: Vec<String> = m
            .statements
            .iter()
            .flat_map(|s| s.creates_tables.clone())
            .collect();
        let existing = existing_tables(&mut tx, &creates)?;
        if !existing.is_empty() {
            blockers.push(if m.version == 1 && current_version.is_none() {
                format!(
                    "the database already has {} but no record of {}: this looks like the legacy production schema. Adopt it with `pgmend migrate baseline` instead of applying V1",
                    existing.join(", "),
                    m.label()
                )
            } else {
                format!(
                    "{} creates {}, which already exist{}; find out who created them before going on",
                    m.label(),
                    existing.join(", "),
                    if existing.len() == 1 { "s" } else { "" }
                )
            });
        }
        let mut censuses = Vec::new();
        for census in m.censuses.iter().filter(|_| take_censuses) {
            censuses.push(evaluate(&mut tx, census, &shadows)?);
        }
        shadows.extend(m.statements.iter().filter_map(added_column));
        let mut existing_indexes = Vec::new();
        if m.mode == Mode::Online {
            for s in &m.statements {
                existing_indexes.extend(crate::online::index::existing_note(&mut tx, s)?);
            }
        }
        pending.push(PlannedMigration {
            censuses,
            existing_indexes,
            version: m.version,
            name: m.name.clone(),
            origin: m.origin.clone(),
            mode: m.mode,
            in_transaction: m.mode == Mode::Transactional,
            strongest_lock: m
                .statements
                .iter()
                .filter_map(Statement::strongest_lock)
                .max(),
            statements: m.statements.clone(),
            long_locks: Vec::new(),
            sql: m.sql.clone(),
        });
    }
    tx.rollback().doing("closing the read-only transaction")?;
    Ok(Plan {
        current_version,
        target_version: target,
        pending,
        blockers,
        migrations: files,
    })
}

/// Which of `tables` already exist (in the search_path).
pub fn existing_tables(client: &mut impl GenericClient, tables: &[String]) -> Result<Vec<String>> {
    Ok(client
        .query(
            "SELECT t FROM unnest($1::text[]) t WHERE to_regclass(quote_ident(t)) IS NOT NULL",
            &[&tables],
        )
        .doing("checking which tables already exist")?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// With no migration recorded: the tables of `v1` that the database already has, when it has
/// any (a legacy database that `migrate baseline` should adopt).
pub fn unrecorded_legacy(client: &mut impl GenericClient, v1: &Migration) -> Result<Vec<String>> {
    let creates: Vec<String> = v1
        .statements
        .iter()
        .flat_map(|s| s.creates_tables.clone())
        .collect();
    existing_tables(client, &creates)
}

impl Plan {
    /// Flags the long locks of the pending migrations whose version `runs` (a release runs
    /// only its own; [`long_locks::flag`]): each pending migration's `long_locks` filled in.
    /// Returns a blocker for each one refused, for the caller to add where it refuses.
    pub fn flag_long_locks(
        &mut self,
        client: &mut postgres::Client,
        threshold: i64,
        runs: impl Fn(i32) -> bool,
    ) -> Result<Vec<String>> {
        let pending: Vec<&Migration> = self
            .pending
            .iter()
            .filter(|p| runs(p.version))
            .map(|p| by_version(&self.migrations, p.version))
            .collect();
        let (found, refused) = long_locks::flag(client, &pending, threshold)?;
        for finding in found {
            if let Some(p) = self
                .pending
                .iter_mut()
                .find(|p| p.version == finding.version)
            {
                p.long_locks.push(finding);
            }
        }
        Ok(refused)
    }
}

/// The plan for people: each pending migration, its statements with their locks, its SQL.
pub fn render_human(plan: &Plan, out: &mut impl Write) -> std::io::Result<()> {
    let at = plan
        .current_version
        .map_or("no migration applied yet".to_string(), |v| {
            format!("at V{v}")
        });
    if plan.pending.is_empty() {
        writeln!(
            out,
            "Nothing to apply: the database is {at} and up to date."
        )?;
    } else {
        writeln!(
            out,
            "The database is {at}; {} pending (dry run: nothing was changed).",
            crate::human::count(plan.pending.len() as i64, "migration")
        )?;
    }
    // What stops apply comes first, not after the SQL of every pending migration.
    if !plan.blockers.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "apply would stop before changing anything{}:",
            if plan.pending.is_empty() {
                ""
            } else {
                " (the dry run follows)"
            }
        )?;
        for b in &plan.blockers {
            writeln!(out, "  - {b}")?;
        }
    }
    for m in &plan.pending {
        render_migration(m, false, out)?;
    }
    Ok(())
}

/// One pending migration for people: statements with locks, censuses, SQL. With `predicted`
/// (the release plan predicts each census on the data as the earlier pending steps leave it),
/// the censuses counted now carry no verdict: the caller's prediction is the one verdict.
pub fn render_migration(
    m: &PlannedMigration,
    predicted: bool,
    out: &mut impl Write,
) -> std::io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "== V{}__{} ({}) — {}",
        m.version,
        m.name,
        m.origin,
        if m.in_transaction {
            "one transaction, with its history row"
        } else {
            "online: each statement in autocommit"
        }
    )?;
    for s in &m.statements {
        let locks = if s.locks.is_empty() {
            "no lock on existing tables".to_string()
        } else {
            s.locks
                .iter()
                .map(|l| format!("{} on {}", l.mode, l.relation))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(
            out,
            "   line {:>3}  {:<48} {locks}{}",
            s.line,
            s.summary,
            if s.lock_assumed {
                " (not recognised: assumed)"
            } else {
                ""
            }
        )?;
    }
    for finding in &m.censuses {
        writeln!(
            out,
            "   {}{}",
            finding.describe(),
            if predicted {
                " — counted now, before the earlier pending steps run; the prediction below is what apply meets"
            } else if finding.stops() {
                " — apply stops here (exit 1)"
            } else {
                ""
            }
        )?;
    }
    for note in &m.existing_indexes {
        writeln!(out, "   {note}")?;
    }
    for finding in &m.long_locks {
        writeln!(
            out,
            "   long lock: {}{}",
            finding.describe(&format!("V{}", m.version)),
            if finding.refused {
                " — apply refuses this (exit 2)"
            } else {
                ""
            }
        )?;
    }
    if let Some(mode) = m.strongest_lock {
        writeln!(
            out,
            "   strongest lock: {mode} — while held it blocks {}",
            mode.blocks()
        )?;
    }
    writeln!(out, "   SQL:")?;
    for line in m.sql.lines() {
        writeln!(out, "   | {line}")?;
    }
    Ok(())
}
