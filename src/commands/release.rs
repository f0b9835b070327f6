//! `pgmend plan` and `pgmend apply`: the whole release of `release.toml`, in order. The
//! dry run is [`release::dry_run`], the execution [`release::engine`]; this module asks,
//! calls them and renders what they return.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};
use serde::Serialize;

use super::{confirm, load, open_checked, policy, print_json, run_options, source};
use crate::cli::{Format, ReleaseApplyArgs, ReleasePlanArgs};
use crate::db::runner_lock;
use crate::error::{Outcome, PgContext};
use crate::migrate::{history, plan as migrate_plan};
use crate::preflight::privileges;
use crate::release::dry_run::{self, StepPlan};
use crate::release::engine::{self, Applied, Release, Settings};
use crate::release::{self, Step};
use crate::repair::preview;

pub fn plan(args: &ReleasePlanArgs, format: Format) -> Result<Outcome> {
    let files = load(&args.migrations)?;
    let repairs = source(&args.repairs).load()?;
    let steps = release::steps()?;
    let unreleased = release::resolve(&steps, &files, &repairs)?;
    for note in &unreleased {
        crate::say!("note: {note}");
    }
    let (mut session, environment) = open_checked(&args.conn)?;
    let migrations = migrate_plan::build(&mut session.client, files.clone(), None)?;
    let mut tx = super::read_only(&mut session.client)?;
    let applied: Vec<i32> = history::read(&mut tx)?.iter().map(|a| a.version).collect();
    let progress = release::progress(&mut tx, applied)?;
    let plans = dry_run::steps(
        &mut tx,
        &steps,
        &progress,
        &migrations,
        &files,
        &repairs,
        args.sample,
    )?;
    tx.rollback().doing("closing the read-only transaction")?;
    if format != Format::Json {
        let mut out = crate::output::stdout();
        writeln!(
            out,
            "The release on {} (dry run in read-only transactions; nothing is changed):",
            session.params
        )?;
        writeln!(out, "{environment}")?;
        let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        for plan in &plans {
            render_step(plan, colour, &mut out)?;
        }
    }
    // What `apply` (with every gate confirmed) would be refused for by the connected role.
    let gates: Vec<String> = gate_names(&steps).map(String::from).collect();
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
            steps: plans,
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

/// One step of the dry run, for people.
fn render_step(plan: &StepPlan, colour: bool, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "\n## step {}: {}{}",
        plan.step,
        plan.what.label(),
        if plan.done { " — done" } else { "" }
    )?;
    if plan.done {
        return Ok(());
    }
    match plan.what {
        Step::Migrate { retry_with, .. } => {
            if let Some(m) = plan.migration {
                migrate_plan::render_migration(m, out)?;
                if let Some(repair) = retry_with {
                    writeln!(out, "   (census counted now; the {repair} step before it clears what it finds, and apply runs it again for duplicates that arrive late)")?;
                }
            }
        }
        Step::Repair { .. } => {
            for change in &plan.sample {
                preview::render_diff(change, colour, out)?;
            }
            if let Some(p) = &plan.repair {
                preview::render_summary(p, out)?;
            }
            if let Some(on) = &plan.predicted_on {
                writeln!(out, "(predicted on {on})")?;
            }
        }
        Step::Gate { explain, name } => {
            writeln!(out, "{explain}\n`pgmend apply --yes` stops here; `pgmend apply --yes --confirm {name}` passes it.")?;
        }
    }
    Ok(())
}

fn gate_names(steps: &[Step]) -> impl Iterator<Item = &str> {
    steps.iter().filter_map(|s| match s {
        Step::Gate { name, .. } => Some(name.as_str()),
        _ => None,
    })
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
    let gates: Vec<&str> = gate_names(&steps).collect();
    for c in &args.confirm {
        if !gates.contains(&c.as_str()) {
            bail!(
                "--confirm {c}: this release has no such gate; its gates are: {}",
                gates.join(", ")
            );
        }
    }
    let (mut session, environment) = open_checked(&args.conn)?;
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
    crate::signals::install(&engine::continue_command(&args.confirm));
    let release = Release {
        steps: &steps,
        files: &files,
        repairs: &repairs,
    };
    let settings = Settings {
        params: &params,
        policy: &policy,
        options: &options,
        build_wait: args.safety.build_wait,
        confirm: &args.confirm,
        keep_backend: environment
            .intermediary
            .is_some()
            .then_some(session.backend_pid),
    };
    let walk = engine::apply(&mut session.client, &release, &settings)?;
    match format {
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                steps: &'a [Applied],
                stopped_at_gate: Option<String>,
                complete: bool,
            }
            print_json(&Doc {
                steps: &walk.steps,
                complete: walk.stopped_at.is_none(),
                stopped_at_gate: walk.stopped_at.map(|w| w.name),
            })?;
        }
        _ => {
            let mut out = crate::output::stdout();
            match walk.stopped_at {
                Some(w) => writeln!(out, "The release stopped at gate {} (step {}).\n{}\nWhen that is done, continue with:\n  pgmend apply --yes --confirm {}", w.name, w.step, w.explain, w.name)?,
                None => writeln!(
                    out,
                    "The release is complete on {params}. Check it with: pgmend verify"
                )?,
            }
        }
    }
    Ok(Outcome::Done)
}
