//! Where each migration stands: the files on one side, the history table on the other.
//!
//! Pure: pairs the files with the history by version into `Entry` values with a `State` (`applied`,
//! `pending`, `pending_out_of_order`, `edited`, `missing_from_disk`). `ensure_consistent` turns the
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
    pub origin: Option<String>,
}

/// Pairs the files with the history, by version.
pub fn compute(files: &[Migration], applied: &[Applied]) -> Vec<Entry> {
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
            state: State::MissingFromDisk,
            mode: None,
            applied_on: Some(a.applied_on.clone()),
            checksum: None,
            applied_checksum: Some(a.checksum.clone()),
            origin: None,
        });
    }
    entries.sort_by_key(|e| e.version);
    entries
}

/// Refuses (exit 2) a history that cannot safely move forward, naming what to do.
pub fn ensure_consistent(entries: &[Entry]) -> Result<()> {
    let mut problems = Vec::new();
    for e in entries.iter().filter(|e| e.state.is_problem()) {
        let applied_on = e.applied_on.as_deref().unwrap_or("?");
        problems.push(match e.state {
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
            State::Applied | State::Pending => unreachable!(),
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
