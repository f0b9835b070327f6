//! `pgmend plan` and `pgmend apply`: the whole release of `release.toml`, in order. The
//! dry run is [`release::dry_run`], the execution [`release::engine`]; this module asks,
//! calls them and renders what they return.
//!
//! `plan` loads the migrations and the repair definitions, builds the migration plan
//! (`migrate::plan::build`, in its own read-only transaction, no target), then opens a second `READ
//! ONLY` transaction to read the progress (`release::progress`) and calls
//! `release::dry_run::steps`. It renders each `StepPlan`: a pending migration with
//! `migrate::plan::render_migration`, a pending repair's sampled changes with
//! `repair::preview::render_diff` and its `render_summary`, a gate's explanation and the commands
//! that stop at it and pass it. JSON: the `StepPlan`s and the `blockers` (the migration plan's and
//! the privileges `preflight::privileges::missing` reports). Blockers exit 2 after the output.
//! `--format markdown` renders the same plan with `release::markdown::render` (the change ticket);
//! `--compare FILE` reads the staging plan before connecting (`release::compare::open`, exit 2
//! when it is not one) and renders `release::compare::compare` of it and the plan made here
//! instead of the plan.
//!
//! `apply` resolves the release and checks `--confirm` against its gates before connecting, opens
//! the session (`open_checked`), checks it is writable, takes the runner lock, checks the history
//! against the files and the privileges the pending steps need, with `--plan` checks the saved
//! plan (`check_saved_plan`: `fingerprint::check` against a fingerprint taken now and the shapes
//! its own earlier steps recorded, `store::records::plan_steps`), asks once, installs the signal
//! handler (`signals::install`), and calls `release::engine::apply`. It renders the `Walk` it gets
//! back: the gate it stopped at with the command that passes it (exit 0), or `The release is
//! complete on host=... port=... dbname=... user=.... Check it with: pgmend verify`. JSON: `steps`
//! (`Applied` per step, with the `RunReport` of a repair step), `stopped_at_gate`, `complete`.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::{confirm, open_checked, policy, print_json, run_options};
use crate::cli::{Format, ReleaseApplyArgs, ReleasePlanArgs};
use crate::config::Jobs;
use crate::db::runner_lock;
use crate::error::Outcome;
use crate::migrate::{history, plan as migrate_plan};
use crate::preflight::{self, privileges};
use crate::release::dry_run::{self, DryRun, StepPlan};
use crate::release::engine::{self, Applied, Following, Settings};
use crate::release::fingerprint::{self, Fingerprint, Limits};
use crate::release::{self, identity, Release, Step};
use crate::release::{compare, markdown};
use crate::repair::preview;

pub fn plan(args: &ReleasePlanArgs, format: Format) -> Result<Outcome> {
    // The staging plan is read, and refused when it is not one, before connecting.
    let staging = match &args.compare {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!(
                    "reading the staging plan {} (--compare takes the file `pgmend plan --output` wrote on staging)",
                    path.display()
                )
            })?;
            Some(compare::open(path, &text)?)
        }
        None => None,
    };
    let loaded = super::load_release(&args.project)?;
    let (files, repairs) = (&loaded.files, &loaded.repairs);
    let steps = &loaded.definition.steps;
    let unreleased = release::resolve(steps, files, repairs)?;
    for note in &unreleased {
        crate::say!("note: {note}");
    }
    let (mut session, environment) = open_checked(&args.conn, &loaded.release().tables())?;
    // What `apply --jobs N` would find of the server's connection slots now.
    let slots = match args.jobs {
        None | Some(Jobs::Fixed(1)) => None,
        Some(Jobs::Fixed(jobs)) => Some(preflight::connection_slots_for(
            &mut session.client,
            usize::from(jobs),
        )?),
        Some(Jobs::Auto) => Some(Ok(preflight::auto_jobs(
            &mut session.client,
            usize::from(args.max_jobs),
        )?
        .1)),
    };
    let others = identity::other_versions(&mut session.client, &loaded.definition.name)?;
    let mut migrations = migrate_plan::build(&mut session.client, files.clone(), None, &others)?;
    let long_locks = migrations.flag_long_locks(
        &mut session.client,
        args.long_locks.long_lock_rows,
        |version| release::runs_migration(steps, version),
    )?;
    let release = loaded.release();
    let DryRun {
        progress,
        steps: plans,
        fingerprint: print,
        applied_plans,
    } = dry_run::run(
        &mut session.client,
        &session.params.clone(),
        &release,
        &migrations,
        args.sample,
    )?;
    // What `apply` (with every gate confirmed) would be refused for by the connected role.
    let gates: Vec<String> = gate_names(steps).map(String::from).collect();
    let needs = privileges::for_release(steps, &progress, files, repairs, &gates);
    let (role, lacking) = privileges::missing(&mut session.client, &needs)?;
    let mut blockers = migrations.blockers.clone();
    blockers.extend(long_locks);
    // What `apply` would refuse first: another release unfinished, or a migration version
    // another release has.
    let applied: Vec<i32> = history::read(&mut session.client)?
        .iter()
        .map(|a| a.version)
        .collect();
    let standings = identity::standings(&mut session.client, &loaded.definition.name, &applied)?;
    if let Err(refused) = identity::check(&standings, Some(release.name), release.steps) {
        blockers.insert(0, format!("apply would be refused: {refused:#}"));
    }
    if let Some(Err(short)) = &slots {
        blockers.push(format!("apply would be refused: {short}"));
    }
    blockers.extend(
        lacking
            .iter()
            .map(|l| format!("role {role} lacks a privilege apply needs: {l}")),
    );
    if format == Format::Human && staging.is_none() {
        let mut out = crate::output::stdout();
        writeln!(
            out,
            "The release on {} (dry run in read-only transactions; nothing is changed):",
            session.params
        )?;
        writeln!(out, "{environment}")?;
        if let Some(Ok(line)) = &slots {
            writeln!(out, "{line}")?;
        }
        // What stops apply comes first, not after hundreds of lines of SQL.
        if !blockers.is_empty() {
            writeln!(
                out,
                "\napply would stop before changing anything (the dry run follows):\n  - {}",
                blockers.join("\n  - ")
            )?;
        }
        let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        for plan in &plans {
            render_step(plan, colour, &mut out)?;
        }
        for p in &applied_plans {
            writeln!(out, "\n{p}")?;
        }
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        steps: &'a [StepPlan<'a>],
        blockers: &'a [String],
        unreleased_migrations: &'a [String],
        applied_plans: &'a [crate::store::records::AppliedPlan],
        fingerprint: &'a Fingerprint,
    }
    let (document, digest) = fingerprint::seal(&Doc {
        steps: &plans,
        blockers: &blockers,
        unreleased_migrations: &unreleased,
        applied_plans: &applied_plans,
        fingerprint: &print,
    })?;
    if let Some(staging) = &staging {
        let here = compare::open(std::path::Path::new("(the plan made here)"), &document)?;
        let comparison = compare::compare(staging, &here);
        let file = args
            .compare
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let mut out = crate::output::stdout();
        match format {
            Format::Json => print_json(&comparison)?,
            Format::Markdown => compare::render_markdown(&mut out, &comparison, &file)?,
            _ => compare::render_human(&mut out, &comparison, &file)?,
        }
    } else if format == Format::Json {
        crate::output::stdout().write_all(document.as_bytes())?;
    } else if format == Format::Markdown {
        let ticket = markdown::Ticket {
            target: session.params.to_string(),
            made_at: &print.made_at,
            steps: &plans,
            blockers: &blockers,
            saved: args
                .output
                .as_ref()
                .filter(|_| blockers.is_empty())
                .map(|p| (p.display().to_string(), digest.clone())),
        };
        markdown::render(&mut crate::output::stdout(), &ticket)?;
    }
    if !blockers.is_empty() {
        bail!(
            "apply would stop before changing anything{}:\n  - {}",
            if args.output.is_some() {
                "; no plan file was written"
            } else {
                ""
            },
            blockers.join("\n  - ")
        );
    }
    if let Some(path) = &args.output {
        std::fs::write(path, &document)
            .with_context(|| format!("writing the plan to {}", path.display()))?;
        crate::say!(
            "wrote the plan to {} (plan_sha256 {digest}); it covers steps {}. Apply it with:\n  pgmend apply --plan {} --plan-sha256 {digest} --yes",
            path.display(),
            steps_text(&print.covers),
            path.display()
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
    if let Some(e) = &plan.estimate {
        writeln!(out, "(estimated {}: {})", e.shown(), e.from)?;
    }
    match plan.what {
        Step::Migrate { retry_with, .. } => {
            if let Some(m) = plan.migration {
                let predicted = !plan.predicted_censuses.is_empty();
                migrate_plan::render_migration(m, predicted, out)?;
                if predicted {
                    writeln!(out, "   predicted on the data as the earlier pending steps leave it (rows the application writes meanwhile are not predicted):")?;
                    for f in &plan.predicted_censuses {
                        writeln!(
                            out,
                            "     {} — {}",
                            f.describe(),
                            if f.stops() {
                                "apply stops here (exit 1)"
                            } else {
                                "apply passes it"
                            }
                        )?;
                    }
                }
                if let Some(repair) = retry_with {
                    writeln!(out, "   (census counted now; the {repair} step before it clears what it finds, and apply runs it again for rows that break it meanwhile)")?;
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
                writeln!(out, "(predicted: {on})")?;
            }
        }
        Step::Gate { explain, name } => {
            writeln!(out, "{explain}\n`pgmend apply --yes` stops here; `pgmend apply --yes --confirm {name}` passes it.")?;
        }
    }
    Ok(())
}

fn steps_text(steps: &[usize]) -> String {
    match (steps.first(), steps.last()) {
        (Some(a), Some(b)) if a == b => format!("{a}"),
        (Some(a), Some(b)) => format!("{a}–{b}"),
        _ => "none (the release is complete)".into(),
    }
}

/// With `--plan`: the saved plan, checked against the database as it is now (exit 2 for
/// another target or other files, 1 for moved tables, age or counts). Returns the plan, the
/// last step it covers and the counts that moved within `--max-drift`.
fn check_saved_plan(
    args: &ReleaseApplyArgs,
    session: &mut crate::db::connect::Session,
    release: &Release,
) -> Result<Option<(fingerprint::Saved, usize, Vec<String>)>> {
    let Some(path) = &args.saved.plan else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the plan file {}", path.display()))?;
    let saved = fingerprint::open(path, &text, args.saved.plan_sha256.as_deref())?;
    let others = identity::other_versions(&mut session.client, release.name)?;
    let migrations =
        migrate_plan::build(&mut session.client, release.files.to_vec(), None, &others)?;
    let params = session.params.clone();
    let now = dry_run::run(&mut session.client, &params, release, &migrations, 0)?.fingerprint;
    let limits = Limits {
        max_age: args.saved.max_plan_age,
        max_drift: args.saved.max_drift,
    };
    let recorded = crate::store::records::plan_steps(&mut session.client, &saved.digest)?;
    let moved = fingerprint::check(&saved.fingerprint, &now, release.steps, &recorded, &limits)?;
    let Some(&through) = saved.fingerprint.covers.last() else {
        bail!(
            "the plan {} covers no step: the release was complete when it was made; nothing was changed",
            path.display()
        );
    };
    Ok(Some((saved, through, moved)))
}

fn gate_names(steps: &[Step]) -> impl Iterator<Item = &str> {
    steps.iter().filter_map(|s| match s {
        Step::Gate { name, .. } => Some(name.as_str()),
        _ => None,
    })
}

pub fn apply(args: &ReleaseApplyArgs, format: Format) -> Result<Outcome> {
    let policy = policy(&args.safety)?;
    let mut options = run_options(&args.safety, &args.batch)?;
    let loaded = super::load_release(&args.project)?;
    let (files, repairs) = (&loaded.files, &loaded.repairs);
    let steps = &loaded.definition.steps;
    for note in release::resolve(steps, files, repairs)? {
        crate::say!("note: {note}");
    }
    let gates: Vec<&str> = gate_names(steps).collect();
    for c in &args.confirm {
        if !gates.contains(&c.as_str()) {
            bail!(
                "--confirm {c}: this release has no such gate; its gates are: {}",
                gates.join(", ")
            );
        }
    }
    let (mut session, environment) = open_checked(&args.conn, &loaded.release().tables())?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    options.workers = super::workers(&mut session, &args.batch)?;
    let params = session.params.clone();
    let complete = {
        // Before any step: an edited or missing applied migration stops the release here,
        // not at the first migration step after a repair has already run.
        let history = history::read(&mut session.client)?;
        let others = identity::other_versions(&mut session.client, &loaded.definition.name)?;
        crate::migrate::status::ensure_consistent(&crate::migrate::status::compute(
            files, &history, &others,
        ))?;
        let applied: Vec<i32> = history.iter().map(|a| a.version).collect();
        let progress = release::progress(
            &mut session.client,
            &loaded.definition.name,
            applied.clone(),
        )?;
        let steps_pending = steps
            .iter()
            .enumerate()
            .any(|(i, step)| !progress.done(i, step));
        // Another release unfinished, or a migration version another release has, stops this
        // one before it asks (a complete release has nothing to run).
        if steps_pending {
            let standings =
                identity::standings(&mut session.client, &loaded.definition.name, &applied)?;
            identity::check(&standings, Some(&loaded.definition.name), steps)?;
        }
        let needs = privileges::for_release(steps, &progress, files, repairs, &args.confirm);
        privileges::check(&mut session.client, "this release", &needs)?;
        // A repair whose SQL does not hold stops the release here, not at its step; so does a
        // health signal the user set that the role cannot read (its notes come with each run).
        dry_run::check_repairs(&mut session.client, steps, &progress, files, repairs)?;
        if steps_pending {
            crate::repair::health::check_readable(
                &mut session.client,
                &options.health,
                &loaded.release().tables(),
            )?;
        }
        // A pending migration that would hold a strong lock over a large table stops the
        // release here, not after the repairs before it have run.
        let mut pending =
            migrate_plan::build_with(&mut session.client, files.clone(), None, false, &others)?;
        let refused = pending.flag_long_locks(
            &mut session.client,
            args.long_locks.long_lock_rows,
            |version| release::runs_migration(steps, version),
        )?;
        if !refused.is_empty() {
            bail!(
                "the release would hold strong locks over large tables; nothing was changed:\n  - {}",
                refused.join("\n  - ")
            );
        }
        // A guard trigger a killed pgmend left is work too: the walk drops it.
        !steps_pending && crate::repair::guard::installed(&mut session.client)?.is_empty()
    };
    // Nothing to do is no change to confirm: exit 0 without asking, with or without --yes or
    // a terminal, as `migrate apply` does. (A saved plan is still checked: it names steps.)
    if complete && args.saved.plan.is_none() {
        if format == Format::Json {
            return render_walk(format, &params, steps, engine::Walk::default(), None);
        }
        writeln!(
            crate::output::stdout(),
            "Nothing to apply: the release is complete on {params}. Check it with: pgmend verify"
        )?;
        return Ok(Outcome::Done);
    }
    let release = loaded.release();
    let saved = check_saved_plan(args, &mut session, &release)?;
    if let Some((plan, through, moved)) = &saved {
        crate::say!(
            "the saved plan {} matches this database and these files; it covers steps up to {through}",
            plan.digest
        );
        for m in moved {
            crate::say!("moved within --max-drift: {m}");
        }
    }
    if !args.safety.yes {
        confirm(
            false,
            &format!("Apply the pending release to {params} (review it first with `pgmend plan`)?"),
            "review its plan first (`pgmend plan`)",
        )?;
    }
    crate::signals::install(&engine::continue_command(&args.confirm));
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
        plan: saved.as_ref().map(|(plan, through, _)| Following {
            digest: &plan.digest,
            through_step: *through,
        }),
    };
    let walk = engine::apply(&mut session.client, &release, &settings)?;
    let plan_record = match &saved {
        Some((plan, _, moved)) => record_plan(&mut session.client, &policy, plan, moved, &walk)?,
        None => None,
    };
    render_walk(format, &params, steps, walk, plan_record)
}

/// What `apply` did: the steps it ran and where it stopped, or that the release is complete.
fn render_walk(
    format: Format,
    params: &crate::db::conninfo::ConnParams,
    steps: &[Step],
    walk: engine::Walk,
    plan_record: Option<PlanApplied>,
) -> Result<Outcome> {
    match format {
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                steps: &'a [Applied],
                stopped_at_gate: Option<String>,
                complete: bool,
                #[serde(skip_serializing_if = "Option::is_none")]
                plan: Option<PlanApplied>,
            }
            print_json(&Doc {
                steps: &walk.steps,
                complete: walk.stopped_at.is_none() && walk.beyond_plan.is_none(),
                stopped_at_gate: walk.stopped_at.map(|w| w.name),
                plan: plan_record,
            })?;
        }
        _ => {
            let mut out = crate::output::stdout();
            if let Some(p) = &plan_record {
                writeln!(
                    out,
                    "Applied the saved plan {} (steps {}–{}); recorded with who and when.",
                    p.plan_sha256, p.first_step, p.through_step
                )?;
                if let Some(next) = p.next_step_needs_new_plan {
                    writeln!(out, "The plan ends before step {next} ({}). To continue, make a new plan and review it:\n  pgmend plan --output FILE\n  pgmend apply --plan FILE --plan-sha256 HEX --yes{}", steps[next - 1].label(), match &steps[next - 1] { Step::Gate { name, .. } => format!(" --confirm {name}"), _ => String::new() })?;
                    return Ok(Outcome::Done);
                }
            }
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

/// Records the saved plan the walk ran (nothing when it ran no step: a gate not confirmed
/// first), and what the JSON document says of it.
fn record_plan(
    client: &mut postgres::Client,
    policy: &crate::db::retry::LockPolicy,
    plan: &fingerprint::Saved,
    moved: &[String],
    walk: &engine::Walk,
) -> Result<Option<PlanApplied>> {
    let ran = walk.steps.iter().filter(|s| s.outcome == "done");
    let (Some(first), Some(through)) = (
        plan.fingerprint.covers.first().copied(),
        ran.map(|s| s.step).max(),
    ) else {
        crate::say!(
            "the saved plan {} ran no step; it is not recorded",
            plan.digest
        );
        return Ok(None);
    };
    engine::record_plan(
        client,
        policy,
        &plan.digest,
        &plan.fingerprint.made_at,
        (first as i32, through as i32),
    )?;
    Ok(Some(PlanApplied {
        plan_sha256: plan.digest.clone(),
        first_step: first,
        through_step: through,
        moved_within_drift: moved.to_vec(),
        next_step_needs_new_plan: walk.beyond_plan,
    }))
}

/// What `apply --plan` ran, in its JSON document.
#[derive(Serialize)]
struct PlanApplied {
    plan_sha256: String,
    first_step: usize,
    through_step: usize,
    /// The next data step's counts that moved since the plan, within `--max-drift`.
    moved_within_drift: Vec<String>,
    /// The first pending step the plan did not cover (a new plan is needed for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    next_step_needs_new_plan: Option<usize>,
}
