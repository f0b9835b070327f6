//! Applying the release (`pgmend apply`): the pending steps in order, one function per step
//! kind, up to the first gate that was not confirmed. Returns what was done; the command
//! renders it.
//!
//! The caller holds the runner lock, has run the privilege check and installed the signal
//! handler. Between steps the engine reads the history and the release's records again, so a
//! step done by another path (`migrate apply`, `repair apply`) is not done twice.
//!
//! `apply` first drops any guard trigger a killed pgmend left (`repair::guard::remove_all`). Then,
//! for each step: a stop request returns `Stopped` (`SIGTERM received; stopped before step N (...);
//! every step before it is complete. Continue with: ...`, the command `signals::install` was
//! given); with `--pooler session` the session's server backend is checked
//! (`db::runner_lock::ensure_backend`); the history and the progress are read again and a done
//! step is skipped. One function per step kind:
//!
//! - `migration` plans the step's version alone (`migrate::plan::build_with`, no censuses:
//!   `migrate::apply::execute` takes them right before the step) and executes it. On an error whose
//!   chain holds `Violators` (a census found violators, or a unique build kept failing on new
//!   duplicates; not a lock budget or `--build-wait`), with a `retry_with` and no stop requested,
//!   it installs that void repair's guard (`install_guard`, once, recording into the repair's
//!   latest run), runs the repair (`repair::verdict::run_repair`) and tries again, at most
//!   `CENSUS_PASSES` (3) times. Whether the step then succeeds or stops, the guard is dropped
//!   (`drop_guard`: a failure to drop it after a stop is printed, not raised over the stop's own
//!   error). A migration after a gate first checks that every counter the release rebuilds equals
//!   its source (`counters_match`, exit 1 naming the keys).
//! - `repair` runs the repair, stops through `repair::verdict::finish` when the run was
//!   interrupted, skipped keys or left counters drifting after the gate (`stop_if_unfinished`), and
//!   records the step (`store::records::record_step`).
//! - `gate` ends the walk (`Walk::stopped_at`) unless `--confirm` names it; a confirmed gate
//!   creates pgmend's schema if needed, has `report::legacy_counter::record_at_gate` record the
//!   legacy counter (for `deploy-new-application` only), and is recorded
//!   (`store::records::confirm_gate`) as `os_user()@hostname()` with the role.
//!
//! With `--plan` (`Settings::plan`), each step finished also records the table shapes it left
//! (`record_shapes`: `fingerprint::table_shapes` under the plan's digest, what
//! `fingerprint::check` compares a resumed plan with): a repair step and a gate in the
//! transaction that records them; a migration right after its history row, which `migrate`
//! commits (a crash between the two leaves the step unrecorded, and the plan is then refused).
//!
//! Any other error inside a step gets context (`step_failed`): the step, that the steps before it
//! are complete and what it committed stays, and the command that continues (`continue_command`,
//! with the gates this run was given).

use std::time::{Duration, Instant};

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use super::{fingerprint, identity, progress, Release, Step};
use crate::db::conninfo::ConnParams;
use crate::db::retry::LockPolicy;
use crate::error::{PgContext, Stopped, Violators};
use crate::migrate::{apply as migrate_apply, history, plan as migrate_plan};
use crate::repair::definition::{self, Kind, Repair, Spec};
use crate::repair::options::RunOptions;
use crate::repair::runner::RunReport;
use crate::repair::{guard, verdict};
use crate::store;

/// How many times a migration whose census found violators sends its `retry_with` repair
/// back over what arrived meanwhile.
const CENSUS_PASSES: u32 = 3;

/// How the steps run.
pub struct Settings<'a> {
    pub params: &'a ConnParams,
    pub policy: &'a LockPolicy,
    pub options: &'a RunOptions,
    pub build_wait: Duration,
    /// The gates given with `--confirm`.
    pub confirm: &'a [String],
    /// With `--pooler session`: the server backend, checked before every step.
    pub keep_backend: Option<i32>,
    /// With `--plan`: the saved plan being applied.
    pub plan: Option<Following<'a>>,
}

/// The saved plan an `apply --plan` follows.
#[derive(Clone, Copy)]
pub struct Following<'a> {
    /// Its `plan_sha256`, under which each step finished records the table shapes it left.
    pub digest: &'a str,
    /// The last step it covers; the walk ends before the next.
    pub through_step: usize,
}

/// One step as `apply` left it.
#[derive(Serialize)]
pub struct Applied {
    pub step: usize,
    pub label: String,
    pub outcome: String,
    /// For repair steps: the run, with its batch timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunReport>,
}

/// The gate the release stopped at, waiting for a person.
pub struct Waiting {
    pub step: usize,
    pub name: String,
    pub explain: String,
}

/// What `apply` did: every step it looked at, and the gate it stopped at, if any.
#[derive(Default)]
pub struct Walk {
    pub steps: Vec<Applied>,
    pub stopped_at: Option<Waiting>,
    /// The first pending step a saved plan did not cover, where the walk ended.
    pub beyond_plan: Option<usize>,
}

/// How one step ended.
enum StepEnd {
    Done(Option<Box<RunReport>>),
    WaitingAtGate,
}

/// Runs every pending step in order, up to the first unconfirmed gate.
pub fn apply(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
) -> Result<Walk> {
    // A guard that a killed pgmend left on a table would mark the new application's rows;
    // the step that needs one installs it again.
    for dropped in guard::remove_all(client, settings.policy)? {
        crate::say!("dropped the guard trigger {dropped}, left by an interrupted release");
    }
    // The caller checked that no other release is unfinished (`identity::check`).
    store::ensure(client, settings.policy)?;
    identity::enter(client, release, &release.digest())?;
    let mut walk = Walk {
        steps: Vec::new(),
        stopped_at: None,
        beyond_plan: None,
    };
    for (i, step) in release.steps.iter().enumerate() {
        let failed = |e| step_failed(e, i + 1, step, settings.confirm);
        stop_if_signalled(i, step)?;
        if done(client, release, settings, i, step).map_err(failed)? {
            walk.steps.push(applied_step(i, step, "already done", None));
            continue;
        }
        if settings.plan.is_some_and(|p| i + 1 > p.through_step) {
            walk.beyond_plan = Some(i + 1);
            break;
        }
        crate::output::event(
            "step_started",
            &format!("\n== step {}: {}", i + 1, step.label()),
            serde_json::json!({ "step": i + 1, "label": step.label(), "release": release.name }),
        );
        let started = Instant::now();
        let end =
            run_step(client, release, settings, i, step, just_exact(&walk, i)).map_err(failed)?;
        match end {
            StepEnd::WaitingAtGate => {
                walk.steps
                    .push(applied_step(i, step, "waiting for confirmation", None));
                if let Step::Gate { name, explain } = step {
                    walk.stopped_at = Some(Waiting {
                        step: i + 1,
                        name: name.clone(),
                        explain: explain.clone(),
                    });
                }
                break;
            }
            StepEnd::Done(run) => {
                let took = Duration::from_millis(started.elapsed().as_millis() as u64);
                crate::output::event(
                    "step_done",
                    &format!(
                        "step {} done in {}",
                        i + 1,
                        crate::config::format_duration(took)
                    ),
                    serde_json::json!({
                        "step": i + 1,
                        "label": step.label(),
                        "release": release.name,
                        "seconds": took.as_secs_f64(),
                    }),
                );
                walk.steps
                    .push(applied_step(i, step, "done", run.map(|r| *r)));
            }
        }
    }
    if walk.stopped_at.is_none() && walk.beyond_plan.is_none() {
        identity::finish(client, release)?;
    }
    Ok(walk)
}

/// Whether step `i` is done already, read again before each step; first, with
/// `--pooler session`, whether the session still has its server backend.
fn done(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    i: usize,
    step: &Step,
) -> Result<bool> {
    if let Some(pid) = settings.keep_backend {
        crate::db::runner_lock::ensure_backend(client, pid)?;
    }
    let applied: Vec<i32> = history::read(client)?.iter().map(|a| a.version).collect();
    Ok(progress(client, release.name, applied)?.done(i, step))
}

fn applied_step(i: usize, step: &Step, outcome: &str, run: Option<RunReport>) -> Applied {
    Applied {
        step: i + 1,
        label: step.label(),
        outcome: outcome.into(),
        run,
    }
}

fn stop_if_signalled(i: usize, step: &Step) -> Result<()> {
    match crate::signals::requested() {
        Some(signal) => Err(Stopped::error(format!(
            "{} received; stopped before step {} ({}); every step before it is complete. Continue with: {}",
            signal.name(),
            i + 1,
            step.label(),
            crate::signals::resume_command()
        ))),
        None => Ok(()),
    }
}

/// The counter rebuild that the step right before step `i` ran in this walk after the gate
/// and found equal to its source when it ended (a reconciliation, or a freeze that found
/// nothing differing): the question `counters_match` would ask of it again a moment later.
fn just_exact(walk: &Walk, i: usize) -> Option<&str> {
    let last = walk.steps.last().filter(|a| a.step == i)?;
    let run = last.run.as_ref()?;
    (run.after_gate && !run.interrupted && run.left_over == Some(0))
        .then_some(run.run.repair.as_str())
}

fn run_step(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    i: usize,
    step: &Step,
    just_exact: Option<&str>,
) -> Result<StepEnd> {
    match step {
        Step::Migrate {
            version,
            retry_with,
        } => {
            // A migration after the deploy gate (V5's check) guards the counters' values
            // from then on: every counter the release rebuilds must equal its source first,
            // also when the rebuild steps were done by an earlier run.
            let after_gate = release.steps[..i]
                .iter()
                .any(|s| matches!(s, Step::Gate { .. }));
            if after_gate {
                counters_match(client, release, just_exact)?;
            }
            migration(client, release, settings, *version, retry_with.as_deref())?;
            if settings.plan.is_some() {
                // Right after, not with the history row: `migrate` writes that (an online
                // migration outside any transaction) and knows nothing of plans.
                store::ensure(client, settings.policy)?;
                record_shapes(client, release, settings, i)?;
            }
            Ok(StepEnd::Done(None))
        }
        Step::Repair { name } => {
            let run = repair(client, release, settings, i, step, name)?;
            Ok(StepEnd::Done(Some(Box::new(run))))
        }
        Step::Gate { name, .. } => gate(client, release, settings, i, name),
    }
}

/// With `--plan`: records the table shapes step `i` left, under the plan's digest; the same
/// plan applied again after an interruption compares the tables with them.
fn record_shapes(
    client: &mut impl GenericClient,
    release: &Release,
    settings: &Settings,
    i: usize,
) -> Result<()> {
    let Some(plan) = settings.plan else {
        return Ok(());
    };
    let shapes = fingerprint::table_shapes(client, release.files, release.repairs)?;
    store::records::record_plan_step(client, plan.digest, i as i32 + 1, &shapes)
}

/// A migration step: applies migration `version`. When `retry_with` names a repair and the
/// migration's census finds violators, the repair runs again (with a guard trigger installed
/// the first time, so that the old application's new duplicates are marked as they arrive)
/// and the migration is tried again, up to [`CENSUS_PASSES`] times.
pub fn migration(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    version: i32,
    retry_with: Option<&str>,
) -> Result<()> {
    if let Some(name) = retry_with {
        resume_unfinished(client, release, settings, name, version)?;
    }
    let mut passes = 0;
    let mut guarded = false;
    let outcome = loop {
        let others = identity::other_versions(client, release.name)?;
        let plan = migrate_plan::build_with(
            client,
            release.files.to_vec(),
            Some(version),
            false,
            &others,
        )?;
        let error = match migrate_apply::execute(
            client,
            settings.params,
            &plan,
            settings.policy,
            settings.build_wait,
            if super::census_during_build(retry_with) {
                migrate_apply::CensusTiming::AlongsideBuild
            } else {
                migrate_apply::CensusTiming::First
            },
            &mut |l| crate::say!("{l}"),
        ) {
            Ok(_) => break Ok(()),
            Err(e) => e,
        };
        let Some(name) = retry_with.filter(|_| {
            passes < CENSUS_PASSES
                && crate::signals::requested().is_none()
                && error.chain().any(|c| c.is::<Violators>())
        }) else {
            break Err(error);
        };
        passes += 1;
        crate::say!(
            "{error:#}\nrunning {name} again for what arrived meanwhile (pass {passes} of {CENSUS_PASSES})"
        );
        if let Err(e) = repair_again(client, release, settings, name, &mut guarded) {
            break Err(e);
        }
    };
    if guarded {
        drop_guard(client, settings.policy, outcome.is_ok())?;
    }
    outcome
}

/// Resumes the run of `retry_with` that a stop left unfinished (a pass the census sent back,
/// stopped by a signal or a lost session) before the migration's census: a run in ranges can
/// stop with nothing left to void in its later ranges, so the census would find nothing, the
/// migration would run, and the run would stay `running` for good.
fn resume_unfinished(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    name: &str,
    version: i32,
) -> Result<()> {
    let repair = definition::named(release.repairs, name)?;
    if !store::exists(client)? || store::runs::unfinished(client, &repair.name)?.is_none() {
        return Ok(());
    }
    crate::say!("finishing the unfinished run of {name} before migration V{version}");
    // The migration's census comes next and counts what the run's reconciliation would.
    let run = verdict::run_repair(client, repair, &options_with(settings, true))?;
    stop_if_unfinished(&run, repair)
}

/// The command's run options, with `RunOptions::checked_later` as given.
fn options_with(settings: &Settings, checked_later: bool) -> RunOptions {
    RunOptions {
        checked_later,
        ..settings.options.clone()
    }
}

/// The run options of repair step `i`: `checked_later` when the next step is a migration
/// whose census retries with this repair (the void before V4), or when a gate comes later
/// and this repair again after it (a counter's first pass: the rebuild after the gate
/// corrects what drifts before it; a run after the gate is reconciled all the same).
fn step_options(release: &Release, settings: &Settings, i: usize, name: &str) -> RunOptions {
    let later = &release.steps[i + 1..];
    let census_after = matches!(later.first(),
        Some(Step::Migrate { retry_with: Some(r), .. }) if r == name);
    let again_after_gate = later
        .iter()
        .skip_while(|s| !matches!(s, Step::Gate { .. }))
        .any(|s| matches!(s, Step::Repair { name: n } if n == name));
    options_with(settings, census_after || again_after_gate)
}

/// One more pass of the repair a census sent back, with its guard installed first.
fn repair_again(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    name: &str,
    guarded: &mut bool,
) -> Result<()> {
    let repair = definition::named(release.repairs, name)?;
    if !*guarded {
        *guarded = install_guard(client, settings.policy, repair)?;
    }
    // The migration's census comes next and counts what the run's reconciliation would.
    let run = verdict::run_repair(client, repair, &options_with(settings, true))?;
    stop_if_unfinished(&run, repair)
}

/// Drops the guard a migration step installed, once the step ended (`built`: with its
/// unique index). A failure to drop it after a failed step is reported, not raised: the step's
/// own error is the one to show.
fn drop_guard(client: &mut postgres::Client, policy: &LockPolicy, built: bool) -> Result<()> {
    match guard::remove_all(client, policy) {
        Ok(dropped) => {
            for d in dropped {
                if built {
                    crate::say!("dropped the guard trigger {d}: the unique index refuses duplicates from here on");
                } else {
                    crate::say!("dropped the guard trigger {d}: the step stopped before the unique index was built");
                }
            }
            Ok(())
        }
        Err(e) if built => Err(e),
        Err(e) => {
            crate::say!("pgmend: could not drop the guard trigger ({e:#}); the next `pgmend apply` drops it, and `pgmend verify` fails while it exists");
            Ok(())
        }
    }
}

/// A repair step: runs the repair, stops (exit 1) when the run did not finish cleanly, and
/// records the step as finished.
pub fn repair(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    i: usize,
    step: &Step,
    name: &str,
) -> Result<RunReport> {
    let repair = definition::named(release.repairs, name)?;
    let run = verdict::run_repair(client, repair, &step_options(release, settings, i, name))?;
    stop_if_unfinished(&run, repair)?;
    let mut tx = client.transaction().doing("recording the finished step")?;
    store::records::record_step(
        &mut tx,
        release.name,
        i as i32 + 1,
        &step.label(),
        Some(run.run.run_id),
    )?;
    record_shapes(&mut tx, release, settings, i)?;
    tx.commit().doing("recording the finished step")?;
    crate::say!(
        "run {}: {} changed",
        run.run.run_id,
        crate::human::count(run.run.changed, "row")
    );
    Ok(run)
}

/// A gate step: waits (ends the walk) unless `--confirm` names it; when it does, records the
/// legacy counter's figures and who confirmed it.
fn gate(
    client: &mut postgres::Client,
    release: &Release,
    settings: &Settings,
    i: usize,
    name: &str,
) -> Result<StepEnd> {
    if !settings.confirm.iter().any(|c| c == name) {
        return Ok(StepEnd::WaitingAtGate);
    }
    store::ensure(client, settings.policy)?;
    if release.name == super::COUPON_RELEASE {
        crate::report::legacy_counter::record_at_gate(client, name)?;
    }
    let who = format!("{}@{}", os_user(), hostname());
    let mut tx = client.transaction().doing("recording the gate")?;
    store::records::confirm_gate(&mut tx, release.name, name, &who)?;
    record_shapes(&mut tx, release, settings, i)?;
    tx.commit().doing("recording the gate")?;
    crate::say!("gate {name} confirmed by {who}");
    Ok(StepEnd::Done(None))
}

/// An error inside a step (a lost connection, a cancelled statement, a server restart) ends
/// the release with exit 2: say what is kept and the command that continues. A [`Stopped`]
/// or [`Violators`] already says what to do.
fn step_failed(error: anyhow::Error, n: usize, step: &Step, confirm: &[String]) -> anyhow::Error {
    if error
        .chain()
        .any(|c| c.is::<Stopped>() || c.is::<Violators>())
    {
        return error;
    }
    error.context(format!(
        "step {n} ({}) did not finish; the steps before it are complete, and what it committed stays committed (a migration either applied and recorded or not at all, repair batches with their ledger and checkpoint). Once the cause is fixed, continue with: {}",
        step.label(),
        continue_command(confirm)
    ))
}

/// The command that continues the release, with the gates this one was given.
pub fn continue_command(confirm: &[String]) -> String {
    let mut again = String::from("pgmend apply --yes");
    for gate in confirm {
        again.push_str(&format!(" --confirm {gate}"));
    }
    again
}

/// Stops (exit 1) when the counter of any rebuild step of the release differs from its
/// source now, naming the repair and the first keys; `just_exact`, the rebuild the step
/// before found equal to its source as it ended, is not read again.
fn counters_match(
    client: &mut postgres::Client,
    release: &Release,
    just_exact: Option<&str>,
) -> Result<()> {
    let mut differing = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for step in release.steps {
        let Step::Repair { name } = step else {
            continue;
        };
        let Some(repair) = release.repairs.iter().find(|r| &r.name == name) else {
            continue;
        };
        let Spec::RebuildCounter(spec) = &repair.spec else {
            continue;
        };
        if seen.contains(&name.as_str()) || just_exact == Some(name.as_str()) {
            continue;
        }
        seen.push(name);
        let engine = crate::repair::counter::CounterEngine::prepare(client, spec)?;
        let mut tx = crate::db::connect::read_only(client)?;
        tx.batch_execute(crate::db::connect::RAISE_WORK_MEM)
            .doing("raising work_mem to compare the counters with their source")?;
        let keys = engine.differing_keys(&mut tx, 5).doing(format!(
            "comparing {} with its source",
            spec.counter_table.as_str()
        ))?;
        tx.rollback().doing("closing the read-only transaction")?;
        if !keys.is_empty() {
            differing.push(format!(
                "{} ({}), for example {}",
                spec.counter_table.as_str(),
                name,
                keys.iter()
                    .map(|k| k.join("/"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if !differing.is_empty() {
        return Err(Stopped::error(format!(
            "counters differ from their source before a migration after the deploy gate: {}. After the gate every writer changes a counter and its source together, so one does not (the old application still committing, a guard left behind, a manual change). Stop it, rebuild each named counter (`pgmend repair apply REPAIR --yes`), then rerun `pgmend apply --yes`; nothing of this step was changed",
            differing.join("; ")
        )));
    }
    Ok(())
}

/// Stops the release (the run's own exit-1 message) when a run was interrupted, skipped keys,
/// or left counters drifting after the gate.
fn stop_if_unfinished(run: &RunReport, repair: &Repair) -> Result<()> {
    let drifting_after_gate = run.after_gate
        && run.left_over.is_some_and(|n| n > 0)
        && repair.kind() == Kind::RebuildCounter;
    if run.interrupted || drifting_after_gate || !run.run.skipped.is_empty() {
        verdict::finish(run, repair)?;
    }
    Ok(())
}

/// Records that the saved plan `digest` (made at `made_at`) ran steps `first..=through`, by
/// whom (the operating system's user and host, as for a gate).
pub fn record_plan(
    client: &mut postgres::Client,
    policy: &LockPolicy,
    digest: &str,
    made_at: &str,
    steps: (i32, i32),
) -> Result<()> {
    store::ensure(client, policy)?;
    let who = format!("{}@{}", os_user(), hostname());
    store::records::record_plan(client, digest, made_at, steps, &who)
}

pub fn os_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .or_else(|| {
            std::process::Command::new("id")
                .arg("-un")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// Installs the guard of a void repair that a migration's census sent back: duplicates the old
/// application inserts from now on are marked as they arrive, so that the census can reach
/// zero. Returns whether one was installed (a counter repair has none; a repair that has not
/// run yet has no run to record in).
fn install_guard(
    client: &mut postgres::Client,
    policy: &LockPolicy,
    repair: &Repair,
) -> Result<bool> {
    let Spec::VoidDuplicates(spec) = &repair.spec else {
        return Ok(false);
    };
    let run_id = store::runs::latest_run_id(client, &repair.name)?;
    let Some(run_id) = run_id else {
        return Ok(false);
    };
    guard::install(client, policy, &repair.name, spec, run_id)?;
    crate::say!(
        "installed a guard trigger on {}: until the unique index is valid, a duplicate the old application inserts is marked as it arrives (recorded in the ledger of run {run_id})",
        spec.table.as_str()
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continue_command_repeats_the_confirmed_gates() {
        assert_eq!(continue_command(&[]), "pgmend apply --yes");
        assert_eq!(
            continue_command(&["deploy-new-application".into()]),
            "pgmend apply --yes --confirm deploy-new-application"
        );
    }

    #[test]
    fn a_failed_step_says_what_is_kept_unless_the_error_already_says_what_to_do() {
        let step = Step::Repair {
            name: "void-duplicate-coupons".into(),
        };
        let lost = step_failed(anyhow::anyhow!("connection lost"), 4, &step, &[]);
        let text = format!("{lost:#}");
        assert!(
            text.starts_with("step 4 (repair void-duplicate-coupons) did not finish")
                && text.contains("continue with: pgmend apply --yes")
                && text.ends_with("connection lost"),
            "{text}"
        );
        let stopped = step_failed(Stopped::error("stopped safely"), 4, &step, &[]);
        assert_eq!(format!("{stopped:#}"), "stopped safely");
    }
}
