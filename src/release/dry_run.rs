//! The release's dry run (`pgmend plan`) as a value: for each step, whether it is done, and for
//! a pending one its planned migration or its repair's preview with a sample of the changes.
//! Computed in the caller's read-only transaction; the command renders it.
//!
//! `steps` plans every step in the caller's read-only transaction: a pending migration step takes
//! its `PlannedMigration` from the plan, and the columns it adds (`online::census::added_column`)
//! are collected as shadows; a pending repair step gets `repair::preview::preview` with the shadows
//! of the migrations before it and `sample`, its changes kept as the `sample`. `StepPlan`
//! serializes as the step number, the flattened `release::Step`, `done`, and, left out when empty,
//! `migration`, `repair` and `sample`.

use anyhow::Result;
use serde::Serialize;

use super::{Progress, Step};
use crate::migrate::plan::{Plan, PlannedMigration};
use crate::migrate::source::{by_version, Migration};
use crate::online::census::{added_column, AddedColumn};
use crate::repair::definition::{self, Repair};
use crate::repair::preview::{self, Change, Preview};

/// One step of the release as the dry run sees it.
#[derive(Serialize)]
pub struct StepPlan<'a> {
    pub step: usize,
    #[serde(flatten)]
    pub what: &'a Step,
    pub done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<&'a PlannedMigration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<Preview>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<Change>,
}

/// Plans every step: a pending migration from `migrations` (planned from `files`), a pending
/// repair previewed in `tx` with up to `sample` changes, on top of the columns the pending
/// migrations before it add.
pub fn steps<'a>(
    tx: &mut postgres::Transaction<'_>,
    steps: &'a [Step],
    progress: &Progress,
    migrations: &'a Plan,
    files: &[Migration],
    repairs: &[Repair],
    sample: usize,
) -> Result<Vec<StepPlan<'a>>> {
    let mut shadows: Vec<AddedColumn> = Vec::new();
    let mut plans = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let done = progress.done(i, step);
        let mut plan = StepPlan {
            step: i + 1,
            what: step,
            done,
            migration: None,
            repair: None,
            sample: Vec::new(),
        };
        if !done {
            match step {
                Step::Migrate { version, .. } => {
                    plan.migration = migrations.pending.iter().find(|m| m.version == *version);
                    if plan.migration.is_some() {
                        let file = by_version(files, *version);
                        shadows.extend(file.statements.iter().filter_map(added_column));
                    }
                }
                Step::Repair { name } => {
                    let repair = definition::named(repairs, name)?;
                    let mut changes = Vec::new();
                    let p = preview::preview(tx, repair, &shadows, Some(sample), &mut |c| {
                        changes.push(c.clone());
                        Ok(())
                    })?;
                    plan.repair = Some(p);
                    plan.sample = changes;
                }
                Step::Gate { .. } => {}
            }
        }
        plans.push(plan);
    }
    Ok(plans)
}
