//! Where each migration stands: the files on one side, the history table on the other.
//!
//! Pure: pairs the files with the history by version into `Entry` values with a `State` (`applied`,
//! `pending`, `pending_out_of_order`, `edited`, `missing_from_disk`, `other_release`: one history
//! serves the releases run on a database one after another, so a version another recorded
//! release's steps apply is not a missing file). `ensure_consistent` turns the
//! problem states into one error that says what to do for each.

use anyhow::{bail, Result};
use serde::Serialize;

use super::history::Applied;
use super::source::{Migration, Mode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Applied,
    Pending,
    /// Pending, but a later version is already applied: it would never run in order.
    PendingOutOfOrder,
    /// Applied, and the file changed since (checksum or name differ).
    Edited,
    /// Applied, and no file has this version.
    MissingFromDisk,
    /// Applied by the steps of another release recorded on the database: that release's.
    OtherRelease,
}

impl State {
    pub fn is_problem(self) -> bool {
        matches!(
            self,
            State::PendingOutOfOrder | State::Edited | State::MissingFromDisk
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Applied => "applied",
            State::Pending => "pending",
            State::PendingOutOfOrder => "pending, out of order",
            State::Edited => "edited since applied",
            State::MissingFromDisk => "missing from disk",
            State::OtherRelease => "applied (another release)",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub version: i32,
    pub name: String,
    pub state: State,
    pub mode: Option<Mode>,
    pub applied_on: Option<String>,
    /// The checksum of the file on disk.
    pub checksum: Option<String>,
    /// The checksum recorded when it was applied.
    pub applied_checksum: Option<String>,
    /// The name recorded when it was applied, when it differs from the file's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied_name: Option<String>,
    pub origin: Option<String>,
}

/// Pairs the files with the history, by version. `others`: the versions the steps of the
/// other releases recorded on the database apply (`release::identity::other_versions`); one
/// of them applied without a file here is that release's, not a missing file.
pub fn compute(files: &[Migration], applied: &[Applied], others: &[i32]) -> Vec<Entry> {
    let newest_applied = applied.iter().map(|a| a.version).max();
    let mut entries: Vec<Entry> = files
        .iter()
        .map(|m| {
            let record = applied.iter().find(|a| a.version == m.version);
            let state = match record {
                Some(a) if a.name == m.name && a.checksum == m.checksum.to_string() => {
                    State::Applied
                }
                Some(_) => State::Edited,
                None if newest_applied.is_some_and(|v| v > m.version) => State::PendingOutOfOrder,
                None => State::Pending,
            };
            Entry {
                version: m.version,
                name: m.name.clone(),
                state,
                mode: Some(m.mode),
                applied_on: record.map(|a| a.applied_on.clone()),
                checksum: Some(m.checksum.to_string()),
                applied_checksum: record.map(|a| a.checksum.clone()),
                applied_name: record.filter(|a| a.name != m.name).map(|a| a.name.clone()),
                origin: Some(m.origin.clone()),
            }
        })
        .collect();
    for a in applied
        .iter()
        .filter(|a| !files.iter().any(|m| m.version == a.version))
    {
        entries.push(Entry {
            version: a.version,
            name: a.name.clone(),
            state: if others.contains(&a.version) {
                State::OtherRelease
            } else {
                State::MissingFromDisk
            },
            mode: None,
            applied_on: Some(a.applied_on.clone()),
            checksum: None,
            applied_checksum: Some(a.checksum.clone()),
            applied_name: None,
            origin: None,
        });
    }
    entries.sort_by_key(|e| e.version);
    entries
}

/// Refuses (exit 2) a history that cannot safely move forward, naming what to do.
pub fn ensure_consistent(entries: &[Entry]) -> Result<()> {
    let mut problems = Vec::new();
    let newest = entries
        .iter()
        .filter(|e| e.applied_on.is_some())
        .map(|e| e.version)
        .max()
        .unwrap_or(0);
    for e in entries.iter().filter(|e| e.state.is_problem()) {
        let applied_on = e.applied_on.as_deref().unwrap_or("?");
        problems.push(match e.state {
            State::Edited if e.applied_name.as_deref().is_some_and(|n| n != e.name) => format!(
                "{} has version {}, which this database's history already holds as V{}__{} (applied on {applied_on}): a migration of another release, or a renamed one. Migrations are one history per database: number this release's migrations after V{newest} (the newest applied)",
                e.origin.as_deref().unwrap_or("?"),
                e.version,
                e.version,
                e.applied_name.as_deref().unwrap_or("?"),
            ),
            State::Edited => format!(
                "{} was edited after it was applied on {applied_on} (checksum recorded {}, on disk {}). An applied migration must not change: restore the file as it was applied (see its history in git) and put the change in a new migration",
                e.origin.as_deref().unwrap_or("?"),
                e.applied_checksum.as_deref().unwrap_or("?"),
                e.checksum.as_deref().unwrap_or("?"),
            ),
            State::MissingFromDisk => format!(
                "V{}__{} is recorded as applied on {applied_on}, but no migration file has version {}. Restore the file, or check that this pgmend (or --migrations-dir) is the release this database was migrated with",
                e.version, e.name, e.version
            ),
            State::PendingOutOfOrder => format!(
                "{} is not applied, but a later version already is; pgmend applies migrations strictly in order. Renumber it above the newest applied version",
                e.origin.as_deref().unwrap_or("?"),
            ),
            State::Applied | State::Pending | State::OtherRelease => unreachable!(),
        });
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "the migration history does not match the files; nothing was changed:\n  - {}",
        problems.join("\n  - ")
    )
}
