//! What a finished run means for the command that ran it: exit 1 (a [`Stopped`] that says
//! what to do) when it stopped early, skipped keys, or left counters or groups that still
//! differ; done otherwise. Shared by `repair apply` and the release.

use anyhow::Result;

use super::definition::{Kind, Repair};
use super::options::RunOptions;
use super::runner::{self, RunReport};
use crate::error::{Outcome, Stopped};
use crate::human;

/// Runs a repair, progress lines to stderr. The caller has installed the signal handler
/// (`signals::install`): a signal stops the run after its current batch.
pub fn run_repair(
    client: &mut postgres::Client,
    repair: &Repair,
    options: &RunOptions,
) -> Result<RunReport> {
    runner::apply(client, repair, options, &mut |line| crate::say!("{line}"))
}

/// Exit 1 when the run stopped early or skipped keys; the run's state says the rest.
pub fn finish(report: &RunReport, repair: &Repair) -> Result<Outcome> {
    if report.interrupted {
        return Err(Stopped::error(format!(
            "{}: run {} of {} stopped after its current batch ({} of {} done). Resume it with: {}",
            crate::signals::requested().map_or("interrupted", |s| s.name()),
            report.run.run_id,
            repair.name,
            human::int(report.run.checkpoint),
            human::count(report.run.targets, "target"),
            crate::signals::resume_command()
        )));
    }
    let skipped = report.run.skipped.len();
    if skipped > 0 {
        return Err(Stopped::error(format!(
            "run {} of {} skipped {} it could not write: {}. Finance raises the budget or accepts the figure (see runbooks), then rerun the repair",
            report.run.run_id,
            repair.name,
            human::count(skipped as i64, "key"),
            serde_json::to_string(&report.run.skipped).expect("skipped keys serialize")
        )));
    }
    let left_over = report.left_over.unwrap_or(0);
    if left_over > 0 && report.after_gate && repair.kind() == Kind::RebuildCounter {
        return Err(Stopped::error(format!(
            "run {} of {} finished, but {} still differ from their source after the run corrected them again, for example {}: after the deploy gate every writer should change a counter and its source in one transaction, so one does not (the old application still committing, a guard trigger left behind, a manual change or an undo). Find and stop it, then rerun the repair (or `pgmend apply --yes`)",
            report.run.run_id,
            repair.name,
            human::count(left_over, "counter"),
            report.left_over_keys.join(", ")
        )));
    }
    if left_over > 0 && matches!(repair.kind(), Kind::Backfill | Kind::Orphans) {
        return Err(Stopped::error(format!(
            "run {} of {} finished, but {} still {} (written by the application meanwhile, or changed back): run it again",
            report.run.run_id,
            repair.name,
            human::count(left_over, "row"),
            if repair.kind() == Kind::Backfill {
                "match its where and differ from its expressions"
            } else {
                "refer to no row"
            }
        )));
    }
    if left_over > 0 && repair.kind() == Kind::VoidDuplicates {
        return Err(Stopped::error(format!(
            "run {} of {} finished, but {} of its groups received new duplicates meanwhile; run it again (the release does this itself)",
            report.run.run_id, repair.name, left_over
        )));
    }
    Ok(Outcome::Done)
}
