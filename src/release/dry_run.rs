//! The release's dry run (`pgmend plan`) as a value: for each step, whether it is done, and for
//! a pending one its planned migration or its repair's preview with a sample of the changes.
//! Computed in the caller's read-only transaction; the command renders it.
//!
//! Each preview predicts: it reads the tables as the earlier pending steps leave them, the
//! columns pending migrations add as their defaults ([`with_shadows`]) and the table a pending
//! void repair changes as that repair leaves it ([`preview::predict`], a CTE named like the
//! table), so the counter rebuilds after the void count the coupons it leaves. A repair that an
//! earlier pending step already runs, with no prediction since, has nothing left to do on a
//! quiet database. Nothing is written to find this out.
//!
//! [`with_shadows`]: crate::online::census::with_shadows

use anyhow::Result;
use serde::Serialize;

use super::estimate::{self, Estimate};
use super::fingerprint::{self, Fingerprint, Inputs};
use super::{Progress, Release, Step};
use crate::db::conninfo::ConnParams;
use crate::error::PgContext;
use crate::migrate::history;
use crate::migrate::plan::{Plan, PlannedMigration};
use crate::migrate::source::{by_version, Migration};
use crate::online::census::{added_column, AddedColumn, Predicted};
use crate::online::evaluate::{evaluate_predicted, Finding};
use crate::repair::definition::{self, Repair};
use crate::repair::preview::{self, Change, Preview};
use crate::store::{self, records::AppliedPlan};

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
    /// For a pending migration after a pending void: its censuses counted on the tables as
    /// the earlier pending steps leave them (what apply finds on a quiet database).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub predicted_censuses: Vec<Finding>,
    /// For a pending repair: what its preview was computed on, and where it cannot be exact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_on: Option<String>,
    /// For a pending step: how long it should take, and where the figure comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
}

/// The repair steps before which a pending gate lets an application write as well.
const AFTER_GATE: &str = "after the gate, both applications write while the deploy goes on: what they write is not predicted, so on a quiet database this is what apply finds, and on a live one it finds more";
const QUIET: &str = "rows the application writes between this plan and apply are not predicted: on a quiet database these are the values apply writes";

/// The release's dry run with its fingerprint and the saved plans applied so far, all read in
/// one read-only transaction.
pub struct DryRun<'a> {
    pub progress: Progress,
    pub steps: Vec<StepPlan<'a>>,
    pub fingerprint: Fingerprint,
    pub applied_plans: Vec<AppliedPlan>,
}

/// Reads what is done, plans every step ([`steps`]) and takes the plan's fingerprint, in one
/// `READ ONLY` transaction. `migrations` is the migration plan (built in its own).
pub fn run<'a>(
    client: &mut postgres::Client,
    params: &ConnParams,
    release: &Release<'a>,
    migrations: &'a Plan,
    sample: usize,
) -> Result<DryRun<'a>> {
    let mut tx = crate::db::connect::read_only(client)?;
    let applied: Vec<i32> = history::read(&mut tx)?.iter().map(|a| a.version).collect();
    let progress = super::progress(&mut tx, release.name, applied)?;
    check_repairs_in(
        &mut tx,
        release.steps,
        &progress,
        release.files,
        release.repairs,
    )?;
    let mut plans = steps(
        &mut tx,
        release.steps,
        &progress,
        migrations,
        release.files,
        release.repairs,
        sample,
    )?;
    estimate_steps(&mut tx, &mut plans, release.repairs)?;
    let inputs = Inputs {
        release,
        progress: &progress,
    };
    let previews: Vec<(usize, &Preview)> = plans
        .iter()
        .filter_map(|p| Some((p.step, p.repair.as_ref()?)))
        .collect();
    let fingerprint = fingerprint::take(&mut tx, params, &inputs, &previews)?;
    let applied_plans = store::records::applied_plans(&mut tx)?;
    tx.rollback().doing("closing the read-only transaction")?;
    Ok(DryRun {
        progress,
        steps: plans,
        fingerprint,
        applied_plans,
    })
}

/// Checks the definition of every pending repair step, and of every pending migration's
/// `retry_with` ([`crate::repair::expression::check`]), on the schema as the earlier pending
/// migrations leave it, in one read-only transaction of its own: before the first change.
pub fn check_repairs(
    client: &mut postgres::Client,
    steps: &[Step],
    progress: &Progress,
    files: &[Migration],
    repairs: &[Repair],
) -> Result<()> {
    let mut tx = crate::db::connect::read_only(client)?;
    check_repairs_in(&mut tx, steps, progress, files, repairs)?;
    tx.rollback().doing("closing the definitions' checks")?;
    Ok(())
}

/// [`check_repairs`] in the caller's read-only transaction.
fn check_repairs_in(
    tx: &mut postgres::Transaction<'_>,
    steps: &[Step],
    progress: &Progress,
    files: &[Migration],
    repairs: &[Repair],
) -> Result<()> {
    let mut shadows: Vec<AddedColumn> = Vec::new();
    let mut created: Vec<String> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if progress.done(i, step) {
            continue;
        }
        let (repair, file) = match step {
            Step::Migrate {
                version,
                retry_with,
            } => (
                retry_with.as_deref(),
                files.iter().find(|m| m.version == *version),
            ),
            Step::Repair { name } => (Some(name.as_str()), None),
            Step::Gate { .. } => (None, None),
        };
        if let Some(name) = repair {
            crate::repair::expression::check(
                tx,
                definition::named(repairs, name)?,
                &shadows,
                &created,
            )?;
        }
        if let Some(file) = file {
            shadows.extend(file.statements.iter().filter_map(added_column));
            created.extend(
                file.statements
                    .iter()
                    .flat_map(|s| s.creates_tables.iter().cloned()),
            );
        }
    }
    Ok(())
}

/// Fills in each pending step's estimate, from the rates of this server's finished runs and
/// the rows of its tables (read in `tx`).
fn estimate_steps(
    tx: &mut postgres::Transaction<'_>,
    plans: &mut [StepPlan],
    repairs: &[Repair],
) -> Result<()> {
    let rows = estimate::table_rows(tx)?;
    let rates = store::records::recorded_rates(tx)?;
    for plan in plans.iter_mut().filter(|p| !p.done) {
        plan.estimate = match (plan.migration, &plan.repair) {
            (Some(m), _) => Some(estimate::migration(
                m,
                &rows,
                matches!(plan.what, Step::Migrate { retry_with, .. }
                    if super::census_during_build(retry_with.as_deref())),
            )),
            (None, Some(p)) => Some(estimate::repair(
                definition::named(repairs, &p.repair)?,
                p.changes,
                &rates,
                &rows,
            )),
            _ => None,
        };
    }
    Ok(())
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
    let mut predicted: Vec<Predicted> = Vec::new();
    // Each pending repair, with how many predictions there were when it was previewed.
    let mut previewed: Vec<(&str, usize, usize)> = Vec::new();
    let mut gate_pending = false;
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
            predicted_censuses: Vec::new(),
            predicted_on: None,
            estimate: None,
        };
        if !done {
            match step {
                Step::Migrate { version, .. } => {
                    plan.migration = migrations.pending.iter().find(|m| m.version == *version);
                    if plan.migration.is_some() {
                        let file = by_version(files, *version);
                        for census in file
                            .censuses
                            .iter()
                            .filter(|c| predicted.iter().any(|p| c.tables.contains(&p.table)))
                        {
                            plan.predicted_censuses
                                .push(evaluate_predicted(tx, census, &shadows, &predicted)?);
                        }
                        shadows.extend(file.statements.iter().filter_map(added_column));
                    }
                }
                Step::Repair { name } => {
                    let repair = definition::named(repairs, name)?;
                    let earlier = previewed
                        .iter()
                        .find(|(n, _, seen)| n == name && *seen == predicted.len());
                    let caveat = if gate_pending { AFTER_GATE } else { QUIET };
                    if let Some((_, step, _)) = earlier {
                        plan.repair = Some(Preview {
                            repair: repair.name.clone(),
                            kind: repair.kind(),
                            description: repair.description().into(),
                            ..Preview::default()
                        });
                        plan.predicted_on = Some(format!(
                            "nothing left: step {step} runs this repair first; {caveat}"
                        ));
                    } else {
                        let mut changes = Vec::new();
                        let p = preview::preview_predicted(
                            tx,
                            repair,
                            &shadows,
                            &predicted,
                            Some(sample),
                            &mut |c| {
                                changes.push(c.clone());
                                Ok(())
                            },
                        )?;
                        plan.repair = Some(p);
                        plan.sample = changes;
                        plan.predicted_on = Some(format!(
                            "on the data as the earlier pending steps leave it; {caveat}"
                        ));
                        if let Some(next) = preview::predict(tx, repair, &shadows, &predicted)? {
                            predicted.retain(|p| p.table != next.table);
                            predicted.push(next);
                        }
                    }
                    previewed.push((name, i + 1, predicted.len()));
                }
                Step::Gate { .. } => gate_pending = true,
            }
        }
        plans.push(plan);
    }
    Ok(plans)
}
