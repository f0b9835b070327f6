//! `pgmend plan` and `pgmend apply`: the whole release of `release.toml`, in order.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};
use serde::Serialize;

use super::migrate::{load, policy};
use super::repair::{render_summary, run_options, run_repair, source};
use super::{confirm, open, print_json};
use crate::cli::{Format, ReleaseApplyArgs, ReleasePlanArgs};
use crate::db::{privileges, runner_lock};
use crate::error::{Outcome, PgContext, Stopped, Violators};
use crate::migrate::{apply as migrate_apply, history, plan as migrate_plan};
use crate::online::census::{added_column, AddedColumn};
use crate::release::{self, Step};
use crate::repair::guard;
use crate::repair::preview::{self, Change, Preview};

#[derive(Serialize)]
struct StepPlan<'a> {
    step: usize,
    #[serde(flatten)]
    what: &'a Step,
    done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    migration: Option<&'a migrate_plan::PlannedMigration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repair: Option<Preview>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    sample: Vec<Change>,
}

pub fn plan(args: &ReleasePlanArgs, format: Format) -> Result<Outcome> {
    let files = load(&args.migrations)?;
    let repairs = source(&args.repairs).load()?;
    let steps = release::steps()?;
    let unreleased = release::resolve(&steps, &files, &repairs)?;
    for note in &unreleased {
        crate::say!("note: {note}");
    }
    let mut session = open(&args.conn)?;
    let migrations = migrate_plan::build(&mut session.client, files.clone(), None)?;
    let mut tx = super::read_only(&mut session.client)?;
    let applied: Vec<i32> = history::read(&mut tx)?.iter().map(|a| a.version).collect();
    let progress = release::progress(&mut tx, applied)?;
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut out = crate::output::stdout();
    let mut shadows: Vec<AddedColumn> = Vec::new();
    let mut docs = Vec::new();
    if format != Format::Json {
        writeln!(
            out,
            "The release on {} (dry run in read-only transactions; nothing is changed):",
            session.params
        )?;
        if let Some(environment) = &session.environment {
            writeln!(out, "{environment}")?;
        }
    }
    for (i, step) in steps.iter().enumerate() {
        let done = progress.done(i, step);
        let mut doc = StepPlan {
            step: i + 1,
            what: step,
            done,
            migration: None,
            repair: None,
            sample: Vec::new(),
        };
        if format != Format::Json {
            writeln!(
                out,
                "\n## step {}: {}{}",
                i + 1,
                step.label(),
                if done { " — done" } else { "" }
            )?;
        }
        if !done {
            match step {
                Step::Migrate { version, .. } => {
                    let m = migrations.pending.iter().find(|m| m.version == *version);
                    if let Some(m) = m {
                        if format != Format::Json {
                            migrate_plan::render_migration(m, &mut out)?;
                            if let Step::Migrate {
                                retry_with: Some(repair),
                                ..
                            } = step
                            {
                                writeln!(out, "   (census counted now; the {repair} step before it clears what it finds, and apply runs it again for duplicates that arrive late)")?;
                            }
                        }
                        let file = files
                            .iter()
                            .find(|f| f.version == *version)
                            .expect("planned from files");
                        shadows.extend(file.statements.iter().filter_map(added_column));
                    }
                    doc.migration = m;
                }
                Step::Repair { name } => {
                    let repair = repairs.iter().find(|r| &r.name == name).ok_or_else(|| {
                        anyhow::anyhow!(
                            "release.toml names repair {name:?}, which has no definition"
                        )
                    })?;
                    let mut sample = Vec::new();
                    let p =
                        preview::preview(&mut tx, repair, &shadows, Some(args.sample), &mut |c| {
                            if format == Format::Json {
                                sample.push(c.clone());
                            } else {
                                preview::render_diff(c, colour, &mut out)?;
                            }
                            Ok(())
                        })?;
                    if format != Format::Json {
                        render_summary(&p, &mut out)?;
                        writeln!(
                            out,
                            "(computed on the data as it is now; earlier pending steps change it)"
                        )?;
                    }
                    doc.repair = Some(p);
                    doc.sample = sample;
                }
                Step::Gate { explain, name } => {
                    if format != Format::Json {
                        writeln!(out, "{explain}\n`pgmend apply --yes` stops here; `pgmend apply --yes --confirm {name}` passes it.")?;
                    }
                }
            }
        }
        docs.push(doc);
    }
    tx.rollback().doing("closing the read-only transaction")?;
    drop(out);
    // What `apply` (with every gate confirmed) would be refused for by the connected role.
    let gates: Vec<String> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Gate { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let needs = privileges::for_release(&steps, &progress, &files, &repairs, &gates);
    let (role, lacking) = privileges::missing(&mut session.client, &needs)?;
    let mut blockers = migrations.blockers.clone();
    blockers.extend(
        lacking
            .iter()
            .map(|l| format!("role {role} lacks a privilege apply needs: {l}")),
    );
    if format == Format::Json {
        #[derive(Serialize)]
        struct Doc<'a> {
            steps: Vec<StepPlan<'a>>,
            blockers: &'a [String],
            unreleased_migrations: &'a [String],
        }
        print_json(&Doc {
            steps: docs,
            blockers: &blockers,
            unreleased_migrations: &unreleased,
        })?;
    }
    if !blockers.is_empty() {
        bail!(
            "apply would stop before changing anything:\n  - {}",
            blockers.join("\n  - ")
        );
    }
    Ok(Outcome::Done)
}

#[derive(Serialize)]
struct Applied {
    step: usize,
    label: String,
    outcome: String,
    /// For repair steps: the run, with its batch timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<crate::repair::runner::RunReport>,
}

pub fn apply(args: &ReleaseApplyArgs, format: Format) -> Result<Outcome> {
    let policy = policy(&args.safety)?;
    let options = run_options(&args.safety, &args.batch)?;
    let files = load(&args.migrations)?;
    let repairs = source(&args.repairs).load()?;
    let steps = release::steps()?;
    for note in release::resolve(&steps, &files, &repairs)? {
        crate::say!("note: {note}");
    }
    let gates: Vec<&str> = steps
        .iter()
        .filter_map(|s| {
            if let Step::Gate { name, .. } = s {
                Some(name.as_str())
            } else {
                None
            }
        })
        .collect();
    for c in &args.confirm {
        if !gates.contains(&c.as_str()) {
            bail!(
                "--confirm {c}: this release has no such gate; its gates are: {}",
                gates.join(", ")
            );
        }
    }
    let mut session = open(&args.conn)?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    let params = session.params.clone();
    {
        // Before any step: an edited or missing applied migration stops the release here,
        // not at the first migration step after a repair has already run.
        let history = history::read(&mut session.client)?;
        crate::migrate::status::ensure_consistent(&crate::migrate::status::compute(
            &files, &history,
        ))?;
        let applied: Vec<i32> = history.iter().map(|a| a.version).collect();
        let progress = release::progress(&mut session.client, applied)?;
        let needs = privileges::for_release(&steps, &progress, &files, &repairs, &args.confirm);
        privileges::check(&mut session.client, "this release", &needs)?;
    }
    if !args.safety.yes {
        confirm(
            false,
            &format!("Apply the pending release to {params} (review it first with `pgmend plan`)?"),
            "review its plan first (`pgmend plan`)",
        )?;
    }
    // With --pooler session: the server backend is checked before every step.
    let keep_backend = session
        .environment
        .as_ref()
        .is_some_and(|e| e.intermediary.is_some())
        .then_some(session.backend_pid);
    crate::signals::install(&continue_command(&args.confirm));
    let client = &mut session.client;
    // A guard that a killed pgmend left on a table would mark the new application's rows;
    // the step that needs one installs it again.
    for dropped in guard::remove_all(client, &policy)? {
        crate::say!("dropped the guard trigger {dropped}, left by an interrupted release");
    }
    let mut report: Vec<Applied> = Vec::new();
    let mut stopped_at: Option<String> = None;
    // The step being run, for the message of an error that ends the release inside it.
    let mut current: Option<(usize, String)> = None;
    let walked = (|| -> Result<()> {
        for (i, step) in steps.iter().enumerate() {
            if let Some(signal) = crate::signals::requested() {
                return Err(Stopped::error(format!(
                    "{} received; stopped before step {} ({}); every step before it is complete. Continue with: {}",
                    signal.name(),
                    i + 1,
                    step.label(),
                    crate::signals::resume_command()
                )));
            }
            if let Some(pid) = keep_backend {
                crate::db::preflight::ensure_backend(client, pid)?;
            }
            let applied: Vec<i32> = history::read(client)?.iter().map(|a| a.version).collect();
            let progress = release::progress(client, applied)?;
            if progress.done(i, step) {
                report.push(Applied {
                    step: i + 1,
                    label: step.label(),
                    outcome: "already done".into(),
                    run: None,
                });
                continue;
            }
            crate::say!("\n== step {}: {}", i + 1, step.label());
            current = Some((i + 1, step.label()));
            let mut run_report = None;
            let step_started = std::time::Instant::now();
            match step {
                Step::Migrate {
                    version,
                    retry_with,
                } => {
                    // A migration after the deploy gate (V5's check) guards the counters'
                    // values from then on: every counter the release rebuilds must equal its
                    // source first, also when the rebuild steps were done by an earlier run.
                    let after_gate = steps[..i].iter().any(|s| matches!(s, Step::Gate { .. }));
                    if after_gate {
                        counters_match(client, &steps, &repairs)?;
                    }
                    let mut passes = 0;
                    let mut guarded = false;
                    let outcome = loop {
                        let plan =
                            migrate_plan::build_with(client, files.clone(), Some(*version), false)?;
                        match migrate_apply::execute(
                            client,
                            &params,
                            &plan,
                            &policy,
                            args.safety.build_wait,
                            &mut |l| crate::say!("{l}"),
                        ) {
                            Ok(_) => break Ok(()),
                            Err(e)
                                if retry_with.is_some()
                                    && passes < 3
                                    && crate::signals::requested().is_none()
                                    && e.chain().any(|c| c.is::<Violators>()) =>
                            {
                                passes += 1;
                                let name = retry_with.as_deref().unwrap();
                                crate::say!("{e:#}\nrunning {name} again for what arrived meanwhile (pass {passes} of 3)");
                                let repair = repairs.iter().find(|r| r.name == name).ok_or_else(|| anyhow::anyhow!("release.toml names repair {name:?}, which has no definition"))?;
                                if !guarded {
                                    match install_guard(client, &policy, repair) {
                                        Ok(installed) => guarded = installed,
                                        Err(e) => break Err(e),
                                    }
                                }
                                if let Err(e) = run_repair(client, repair, &options)
                                    .and_then(|run| stop_if_unfinished(&run, repair))
                                {
                                    break Err(e);
                                }
                            }
                            Err(e) => break Err(e),
                        }
                    };
                    if guarded {
                        let dropped = guard::remove_all(client, &policy);
                        match (&outcome, dropped) {
                            (Ok(()), Ok(dropped)) => {
                                for d in dropped {
                                    crate::say!("dropped the guard trigger {d}: the unique index refuses duplicates from here on");
                                }
                            }
                            (Err(_), Ok(dropped)) => {
                                for d in dropped {
                                    crate::say!("dropped the guard trigger {d}: the step stopped before the unique index was built");
                                }
                            }
                            (Ok(()), Err(e)) => return Err(e),
                            (Err(_), Err(e)) => crate::say!("pgmend: could not drop the guard trigger ({e:#}); the next `pgmend apply` drops it, and `pgmend verify` fails while it exists"),
                        }
                    }
                    outcome?;
                }
                Step::Repair { name } => {
                    let repair = repairs.iter().find(|r| &r.name == name).ok_or_else(|| {
                        anyhow::anyhow!(
                            "release.toml names repair {name:?}, which has no definition"
                        )
                    })?;
                    let run = run_repair(client, repair, &options)?;
                    stop_if_unfinished(&run, repair)?;
                    crate::store::records::record_step(
                        client,
                        i as i32 + 1,
                        &step.label(),
                        Some(run.run.run_id),
                    )?;
                    crate::say!(
                        "run {}: {} changed",
                        run.run.run_id,
                        crate::human::count(run.run.changed, "row")
                    );
                    run_report = Some(run);
                }
                Step::Gate { name, explain } => {
                    if !args.confirm.iter().any(|c| c == name) {
                        stopped_at = Some(name.clone());
                        report.push(Applied {
                            step: i + 1,
                            label: step.label(),
                            outcome: "waiting for confirmation".into(),
                            run: None,
                        });
                        if format != Format::Json {
                            let mut out = crate::output::stdout();
                            writeln!(out, "The release stopped at gate {name} (step {}).\n{explain}\nWhen that is done, continue with:\n  pgmend apply --yes --confirm {name}", i + 1)?;
                        }
                        break;
                    }
                    crate::store::ensure(client, &policy)?;
                    crate::report::legacy_counter::record_at_gate(client, name)?;
                    let who = format!("{}@{}", os_user(), hostname());
                    crate::store::records::confirm_gate(client, name, &who)?;
                    crate::say!("gate {name} confirmed by {who}");
                }
            }
            crate::say!(
                "step {} done in {}",
                i + 1,
                crate::config::format_duration(std::time::Duration::from_millis(
                    step_started.elapsed().as_millis() as u64
                ))
            );
            report.push(Applied {
                step: i + 1,
                label: step.label(),
                outcome: "done".into(),
                run: run_report,
            });
        }
        Ok(())
    })();
    if let Err(e) = walked {
        return Err(step_failed(e, current, &args.confirm));
    }
    match format {
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                steps: &'a [Applied],
                stopped_at_gate: Option<String>,
                complete: bool,
            }
            print_json(&Doc {
                steps: &report,
                complete: stopped_at.is_none(),
                stopped_at_gate: stopped_at,
            })?;
        }
        _ => {
            if stopped_at.is_none() {
                writeln!(
                    crate::output::stdout(),
                    "The release is complete on {params}. Check it with: pgmend verify"
                )?;
            }
        }
    }
    Ok(Outcome::Done)
}

/// An error inside a step (a lost connection, a cancelled statement, a server restart) ends
/// the release with exit 2: say what is kept and the command that continues. A [`Stopped`]
/// or [`Violators`] already says what to do.
fn step_failed(
    error: anyhow::Error,
    step: Option<(usize, String)>,
    confirm: &[String],
) -> anyhow::Error {
    let Some((n, label)) = step else {
        return error;
    };
    if error
        .chain()
        .any(|c| c.is::<Stopped>() || c.is::<Violators>())
    {
        return error;
    }
    error.context(format!(
        "step {n} ({label}) did not finish; the steps before it are complete, and what it committed stays committed (a migration either applied and recorded or not at all, repair batches with their ledger and checkpoint). Once the cause is fixed, continue with: {}",
        continue_command(confirm)
    ))
}

/// The command that continues the release, with the gates this one was given.
fn continue_command(confirm: &[String]) -> String {
    let mut again = String::from("pgmend apply --yes");
    for gate in confirm {
        again.push_str(&format!(" --confirm {gate}"));
    }
    again
}

/// Stops (exit 1) when the counter of any rebuild step of the release differs from its
/// source now, naming the repair and the first keys.
fn counters_match(
    client: &mut postgres::Client,
    steps: &[Step],
    repairs: &[crate::repair::definition::Repair],
) -> Result<()> {
    let mut differing = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for step in steps {
        let Step::Repair { name } = step else {
            continue;
        };
        let Some(repair) = repairs.iter().find(|r| &r.name == name) else {
            continue;
        };
        let crate::repair::definition::Spec::RebuildCounter(spec) = &repair.spec else {
            continue;
        };
        if seen.contains(&name.as_str()) {
            continue;
        }
        seen.push(name);
        let engine = crate::repair::counter::CounterEngine::prepare(client, spec)?;
        let mut tx = super::read_only(client)?;
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

fn stop_if_unfinished(
    run: &crate::repair::runner::RunReport,
    repair: &crate::repair::definition::Repair,
) -> Result<()> {
    let drifting_after_gate = run.after_gate
        && run.left_over > 0
        && run.run.kind == Some(crate::store::RunKind::RebuildCounter);
    if run.interrupted
        || drifting_after_gate
        || run.run.skipped.as_array().is_some_and(|s| !s.is_empty())
    {
        super::repair::finish(run, repair)?;
    }
    Ok(())
}

fn os_user() -> String {
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

fn hostname() -> String {
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
    policy: &crate::db::retry::LockPolicy,
    repair: &crate::repair::definition::Repair,
) -> Result<bool> {
    let crate::repair::definition::Spec::VoidDuplicates(spec) = &repair.spec else {
        return Ok(false);
    };
    let run_id = crate::store::runs::latest_run_id(client, &repair.name)?;
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
