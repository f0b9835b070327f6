//! `pgmend repair list|plan|apply|status|log|undo|abandon`.
//!
//! - `list` loads the definitions (no connection) and prints a `tabled` table or JSON.
//! - `plan` opens a `READ ONLY` transaction and calls `preview::preview` without shadows: human
//!   output renders each sampled change with `preview::render_diff` as it arrives, then
//!   `preview::render_summary`; JSON collects the sample into one document (the `Preview`
//!   flattened, plus `sample`).
//! - `apply` opens the session, checks it is writable, takes the runner lock, checks the
//!   privileges, shows five changes and the summary on stderr and asks (unless `--yes`), installs
//!   the signal handler (`signals::install`), then `verdict::run_repair` (progress to stderr),
//!   `print_report` and `verdict::finish`, which turns an interrupted run, skipped keys and a void
//!   run's `left_over` into `Stopped` (exit 1), after the report has been printed.
//! - `status` reads `store::runs::all` in a `READ ONLY` transaction (a table, or JSON).
//! - `log` streams the ledger of one run (`store::runs::ledger_records`, a `FallibleIterator`) from
//!   a `READ ONLY` transaction as lines, a JSON array written record by record, or CSV through
//!   `csv`.
//! - `undo` takes the runner lock, finds the run and its repair's definition (by name, without the
//!   `undo:` prefix), asks, and calls `undo::undo`.
//! - `abandon` takes the runner lock, asks, sets an unfinished run `abandoned`, and prints the run
//!   (a line, or the run's JSON document with `--format json`).

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tabled::Tabled;

use super::{confirm, open, policy, print_json, run_options, source};
use crate::cli::{
    Format, Limit, RepairApplyArgs, RepairListArgs, RepairLogArgs, RepairPlanArgs, RepairRunArgs,
    RepairStatusArgs,
};
use crate::db::retry::LockPolicy;
use crate::db::runner_lock;
use crate::error::{Outcome, PgContext};
use crate::human;
use crate::preflight::privileges;
use crate::repair::preview::{self, Change, Preview};
use crate::repair::runner::RunReport;
use crate::repair::{undo, verdict};
use crate::store;

pub fn list(args: &RepairListArgs, format: Format) -> Result<Outcome> {
    let repairs = source(&args.repairs)?.load()?;
    #[derive(Serialize, Tabled)]
    struct Row {
        name: String,
        kind: String,
        description: String,
    }
    let rows: Vec<Row> = repairs
        .iter()
        .map(|r| Row {
            name: r.name.clone(),
            kind: r.kind().as_str().into(),
            description: r.description().into(),
        })
        .collect();
    match format {
        Format::Json => print_json(&rows)?,
        _ => writeln!(crate::output::stdout(), "{}", crate::human::table(&rows))?,
    }
    Ok(Outcome::Done)
}

pub fn plan(args: &RepairPlanArgs, format: Format) -> Result<Outcome> {
    let repair = source(&args.repairs)?.find(&args.name)?;
    let mut session = open(&args.conn, &repair.tables())?;
    crate::repair::runner::check_definition(&mut session.client, &repair)?;
    let mut tx = super::read_only(&mut session.client)?;
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let sample = if args.all { None } else { Some(args.sample) };
    let mut out = crate::output::stdout();
    match format {
        Format::Json => {
            let mut changes: Vec<Change> = Vec::new();
            let p = preview::preview(&mut tx, &repair, &[], sample, &mut |c| {
                changes.push(c.clone());
                Ok(())
            })?;
            #[derive(Serialize)]
            struct Doc<'a> {
                #[serde(flatten)]
                preview: &'a Preview,
                sample: Vec<Change>,
            }
            print_json(&Doc {
                preview: &p,
                sample: changes,
            })?;
        }
        _ => {
            writeln!(
                out,
                "Dry run of {} (read-only transaction; nothing is changed):",
                repair.name
            )?;
            let p = preview::preview(&mut tx, &repair, &[], sample, &mut |c| {
                Ok(preview::render_diff(c, colour, &mut out)?)
            })?;
            preview::render_summary(&p, &mut out)?;
            if sample.is_some_and(|n| p.changes as usize > n) {
                writeln!(
                    out,
                    "(showing {} of {} changes; --all shows every one)",
                    args.sample, p.changes
                )?;
            }
        }
    }
    tx.rollback().doing("closing the read-only transaction")?;
    Ok(Outcome::Done)
}

pub fn apply(args: &RepairApplyArgs, format: Format) -> Result<Outcome> {
    let repair = source(&args.repairs)?.find(&args.name)?;
    let mut options = run_options(&args.safety, &args.batch)?;
    let mut session = open(&args.conn, &repair.tables())?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    options.workers = super::workers(&mut session, &args.batch)?;
    super::one_release_at_a_time(
        &mut session.client,
        super::definition(&args.repairs.release)?.as_ref(),
    )?;
    privileges::check(
        &mut session.client,
        &format!("repair {}", repair.name),
        &privileges::for_repair(&repair),
    )?;
    if !args.safety.yes {
        super::ensure_can_ask(&format!(
            "review its diff first (`pgmend repair plan {}`)",
            repair.name
        ))?;
        let mut tx = super::read_only(&mut session.client)?;
        let p = preview::preview(&mut tx, &repair, &[], Some(5), &mut |c| {
            Ok(preview::render_diff(c, false, &mut std::io::stderr())?)
        })?;
        tx.rollback().doing("closing the read-only transaction")?;
        preview::render_summary(&p, &mut std::io::stderr())?;
        confirm(
            false,
            &format!("Run {} on {}?", repair.name, session.params),
            &format!(
                "review its diff first (`pgmend repair plan {}`)",
                repair.name
            ),
        )?;
    }
    crate::signals::install(&format!("pgmend repair apply {} --yes", repair.name));
    let report = verdict::run_repair(&mut session.client, &repair, &options)?;
    print_report(&report, format)?;
    verdict::finish(&report, &repair)
}

pub fn print_report(report: &RunReport, format: Format) -> Result<()> {
    match format {
        Format::Json => print_json(report),
        _ => {
            let r = &report.run;
            let mut out = crate::output::stdout();
            writeln!(
                out,
                "run {} of {}{}: {}/{} targets, {} changed in {} (p50 {}, p99 {}, max {}), state {}",
                r.run_id,
                r.repair,
                if report.resumed { " (resumed)" } else { "" },
                human::int(r.processed),
                human::int(r.targets),
                human::count(r.changed, "row"),
                human::count(report.batches as i64, "batch|batches"),
                human::millis(report.batch_ms_p50),
                human::millis(report.batch_ms_p99),
                human::millis(report.batch_ms_max),
                r.state
            )?;
            if let Some(n) = report.left_over.filter(|&n| {
                n > 0 && r.kind == Some(store::RunKind::RebuildCounter) && !report.after_gate
            }) {
                writeln!(out, "  note: {} already differ from the source again (writes by an application that does not maintain them yet); the rebuild after the deploy gate catches them", human::count(n, "counter"))?;
            }
            Ok(())
        }
    }
}

pub fn status(args: &RepairStatusArgs, format: Format) -> Result<Outcome> {
    super::metrics_output_needs_openmetrics(&args.metrics, format)?;
    let chosen = super::definition(&args.release);
    let read = (|| {
        let chosen = chosen.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let mut session = open(&args.conn, &[])?;
        let mut tx = super::read_only(&mut session.client)?;
        let runs = store::runs::all(&mut tx)?;
        let plans = store::records::applied_plans(&mut tx)?;
        let releases = release_lines(&mut tx, chosen.as_ref())?;
        tx.rollback().doing("closing the read-only transaction")?;
        anyhow::Ok((runs, plans, releases))
    })();
    if format == Format::Openmetrics {
        let now = super::unix_now();
        let runs = read.as_ref().ok().map(|(runs, _, _)| runs.as_slice());
        let written = super::emit_metrics(&args.metrics, "repair_status", runs.is_some(), |last| {
            crate::metrics::repair_status(runs, now, last)
        });
        read?;
        written?;
        return Ok(Outcome::Done);
    }
    let (runs, plans, releases) = read?;
    match format {
        Format::Json => print_json(&runs)?,
        _ => {
            #[derive(Tabled)]
            struct Row {
                run: i64,
                repair: String,
                state: String,
                progress: String,
                changed: String,
                skipped: String,
                #[tabled(rename = "as of")]
                as_of: String,
                note: String,
            }
            let rows: Vec<Row> = runs
                .iter()
                .map(|r| Row {
                    run: r.run_id,
                    repair: r.repair.clone(),
                    state: r.state.to_string(),
                    progress: progress_cell(r),
                    changed: human::int(r.changed),
                    skipped: human::int(r.skipped.len() as i64),
                    as_of: r.as_of.clone(),
                    note: [
                        match (r.undone_by_run, r.undoes_run) {
                            (Some(u), _) => format!("undone by run {u}"),
                            (_, Some(u)) => format!("undoes run {u}"),
                            _ => String::new(),
                        },
                        if r.state == store::RunState::Running {
                            steering_note(&r.steering)
                        } else {
                            String::new()
                        },
                    ]
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect::<Vec<_>>()
                    .join("; "),
                })
                .collect();
            let mut out = crate::output::stdout();
            if rows.is_empty() {
                writeln!(out, "No repair has run on this database.")?;
            } else {
                writeln!(out, "{}", crate::human::table(rows))?;
            }
            for r in &runs {
                for s in &r.slices {
                    writeln!(
                        out,
                        "run {} slice {}: targets {}..{}, checkpoint {}{}",
                        r.run_id,
                        s.slice,
                        human::int(s.lo),
                        human::int(s.hi),
                        human::int(s.checkpoint),
                        s.worker
                            .map(|w| format!(" (worker {w})"))
                            .unwrap_or_default()
                    )?;
                }
            }
            for p in &plans {
                writeln!(out, "{p}")?;
            }
            if !releases.is_empty() {
                writeln!(out, "Releases on this database:")?;
                for line in &releases {
                    writeln!(out, "  {line}")?;
                }
            }
        }
    }
    Ok(Outcome::Done)
}

/// One line per release recorded on the database and for the chosen one (`--release` or the
/// current directory): where it stands, read in `tx`.
fn release_lines(
    tx: &mut postgres::Transaction,
    chosen: Option<&crate::release::Definition>,
) -> Result<Vec<String>> {
    use crate::release::identity;
    let applied: Vec<i32> = crate::migrate::history::read(tx)?
        .iter()
        .map(|a| a.version)
        .collect();
    let me = chosen.map_or("", |d| d.name.as_str());
    let standing = |name: &str,
                    steps: &[crate::release::Step],
                    pending: Option<(usize, String)>| match pending {
        None => format!("{name}: complete ({} steps)", steps.len()),
        Some((n, label)) => format!("{name}: step {n} of {} pending ({label})", steps.len()),
    };
    let mut lines: Vec<String> = identity::standings(tx, me, &applied)?
        .into_iter()
        .map(|o| standing(&o.recorded.name, &o.steps, o.pending))
        .collect();
    if let Some(d) = chosen {
        let done = crate::release::progress(tx, &d.name, applied.clone())?;
        let pending = d
            .steps
            .iter()
            .enumerate()
            .find(|(i, s)| !done.done(*i, s))
            .map(|(i, s)| (i + 1, s.label()));
        lines.push(format!(
            "{} (the chosen release)",
            standing(&d.name, &d.steps, pending)
        ));
    }
    Ok(lines)
}

pub fn log(args: &RepairLogArgs, format: Format) -> Result<Outcome> {
    let mut session = open(&args.conn, &[])?;
    let mut tx = super::read_only(&mut session.client)?;
    if store::run(&mut tx, args.run_id)?.is_none() {
        bail!(
            "there is no repair run {}; `pgmend repair status` lists the runs",
            args.run_id
        );
    }
    let mut out = crate::output::stdout();
    let mut rows = store::runs::ledger_records(&mut tx, &args.run_id)?;
    use fallible_iterator::FallibleIterator;
    let mut csv_writer =
        (format == Format::Csv).then(|| csv::Writer::from_writer(crate::output::stdout()));
    if let Some(w) = csv_writer.as_mut() {
        w.write_record([
            "ledger_id",
            "table",
            "row_key",
            "action",
            "before",
            "after",
            "reason",
            "at",
        ])
        .map_err(std::io::Error::from)?;
    }
    let mut first = true;
    if format == Format::Json {
        write!(out, "[")?;
    }
    let limit = log_limit(args.limit, format);
    let (mut shown, mut left_out) = (0u64, 0i64);
    while let Some(r) = rows.next().doing("reading the ledger")? {
        if crate::output::closed() {
            break; // nobody reads the rest (`| head`)
        }
        if limit.is_some_and(|n| shown >= n) {
            left_out += 1; // counted, not shown: the reader learns how many there are
            continue;
        }
        shown += 1;
        let fields: (i64, String, String, String, String, String, String, String) = (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
            r.get(7),
        );
        match format {
            Format::Csv => {
                let w = csv_writer.as_mut().expect("csv writer");
                w.write_record([
                    &fields.0.to_string(),
                    &fields.1,
                    &fields.2,
                    &fields.3,
                    &fields.4,
                    &fields.5,
                    &fields.6,
                    &fields.7,
                ])
                .map_err(std::io::Error::from)?;
            }
            Format::Json => {
                let value = serde_json::json!({
                    "ledger_id": fields.0, "table": fields.1,
                    "row_key": serde_json::from_str::<serde_json::Value>(&fields.2).unwrap_or_default(),
                    "action": fields.3,
                    "before": serde_json::from_str::<serde_json::Value>(&fields.4).unwrap_or(serde_json::Value::Null),
                    "after": serde_json::from_str::<serde_json::Value>(&fields.5).unwrap_or(serde_json::Value::Null),
                    "reason": fields.6, "at": fields.7,
                });
                write!(out, "{}\n  {}", if first { "" } else { "," }, value)?;
            }
            _ => writeln!(
                out,
                "{} {} {} {}: {} -> {} ({})",
                fields.7, fields.1, fields.2, fields.3, fields.4, fields.5, fields.6
            )?,
        }
        first = false;
    }
    if let Some(mut w) = csv_writer {
        w.flush()?;
    }
    if format == Format::Json {
        writeln!(out, "\n]")?;
    }
    if left_out > 0 {
        let more = format!(
            "{} more entries of run {}",
            crate::human::int(left_out),
            args.run_id
        );
        if format == Format::Human {
            writeln!(
                out,
                "... and {more}: `--limit all` shows them, `--format csv` exports them"
            )?;
        } else {
            crate::say!(
                "pgmend: --limit left out {more}; without --limit the export holds them all"
            );
        }
    }
    Ok(Outcome::Done)
}

/// How many entries `repair log` writes: `--limit`, else 200 in the table and all of them in
/// JSON and CSV (an export is never cut unless asked).
fn log_limit(limit: Option<Limit>, format: Format) -> Option<u64> {
    match (limit, format) {
        (Some(Limit::All), _) => None,
        (Some(Limit::First(n)), _) => Some(n),
        (None, Format::Human) => Some(200),
        (None, _) => None,
    }
}

/// A run's progress for the status table: done of total, and where it resumes. An undo's
/// checkpoint is a ledger record id of the run it undoes, not a count: said as such, and only
/// while it is unfinished.
fn progress_cell(r: &store::Run) -> String {
    let counts = format!("{}/{}", human::int(r.processed), human::int(r.targets));
    match (r.undoes_run, &r.state) {
        (None, _) => format!("{counts} (checkpoint {})", human::int(r.checkpoint)),
        (Some(_), store::RunState::Running) => format!(
            "{counts} (resumes after ledger record {})",
            human::int(r.checkpoint)
        ),
        (Some(_), _) => counts,
    }
}

fn find_run(client: &mut postgres::Client, run_id: i64) -> Result<store::Run> {
    store::run(client, run_id)?.with_context(|| {
        format!("there is no repair run {run_id}; `pgmend repair status` lists the runs")
    })
}

pub fn undo(args: &RepairRunArgs, format: Format) -> Result<Outcome> {
    let policy: LockPolicy = policy(&args.safety)?;
    let mut session = open(&args.conn, &[])?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    let run = find_run(&mut session.client, args.run_id)?;
    let repair = source(&args.repairs)?.find(run.repair.trim_start_matches("undo:"))?;
    // Every missing GRANT at once, before the question, as `repair apply` does.
    privileges::check(
        &mut session.client,
        &format!("undoing run {}", run.run_id),
        &privileges::for_repair(&repair),
    )?;
    confirm(
        args.safety.yes,
        &format!(
            "Restore the {} run {} of {} changed?",
            human::count(run.changed, "row"),
            run.run_id,
            run.repair
        ),
        &format!(
            "review what the run changed first (`pgmend repair log {}`)",
            run.run_id
        ),
    )?;
    let report = undo::undo(&mut session.client, &repair, &run, &policy, &mut |l| {
        crate::say!("{l}")
    })?;
    match format {
        Format::Json => print_json(&report)?,
        _ => writeln!(
            crate::output::stdout(),
            "run {} undid run {}: {} restored, {} deleted",
            report.undo_run,
            report.undone_run,
            human::count(report.restored, "row"),
            human::count(report.deleted, "created row")
        )?,
    }
    Ok(Outcome::Done)
}

pub fn abandon(args: &RepairRunArgs, format: Format) -> Result<Outcome> {
    let mut session = open(&args.conn, &[])?;
    session.ensure_writable()?;
    let _lock = runner_lock::acquire(&mut session, args.safety.runner_wait)?;
    let run = find_run(&mut session.client, args.run_id)?;
    if run.state != store::RunState::Running {
        bail!(
            "run {} is {}, not unfinished; only an unfinished run can be abandoned",
            run.run_id,
            run.state
        );
    }
    confirm(
        args.safety.yes,
        &format!(
            "Abandon run {} of {} at {}/{}? Its changes stay (undo can restore them).",
            run.run_id, run.repair, run.checkpoint, run.targets
        ),
        "check the run first (`pgmend repair status`)",
    )?;
    store::runs::abandon(&mut session.client, run.run_id)?;
    match format {
        Format::Json => print_json(&store::run(&mut session.client, run.run_id)?)?,
        _ => writeln!(
            crate::output::stdout(),
            "run {} abandoned; its {} changed rows stay (pgmend repair undo {} --yes restores them)",
            run.run_id, run.changed, run.run_id
        )?,
    }
    Ok(Outcome::Done)
}

/// `repair pause`, `resume` and `throttle`: records the request on the run's row for the pgmend
/// walking it (`repair::steer`); needs neither `--yes` nor the runner lock, which that pgmend
/// holds. Refuses (exit 2) a run that does not exist or is not running, and a throttle that
/// changes nothing.
pub fn steer(
    conn: &crate::cli::ConnectionArgs,
    run_id: i64,
    pause: Option<bool>,
    pause_for: Option<std::time::Duration>,
    duty_cycle: Option<u8>,
    format: Format,
) -> Result<Outcome> {
    if pause.is_none() && pause_for.is_none() && duty_cycle.is_none() {
        bail!("pgmend repair throttle {run_id}: give --pause DURATION, --duty-cycle PERCENT, or both (--pause 0s --duty-cycle 100 lifts a throttle)");
    }
    let mut session = open(conn, &[])?;
    session.ensure_writable()?;
    let run = store::run(&mut session.client, run_id)?;
    match &run {
        None => bail!("there is no repair run {run_id}; `pgmend repair status` lists the runs"),
        Some(r) if r.state != store::RunState::Running => bail!(
            "run {run_id} of {} is {}: only a running run can be paused, resumed or throttled; `pgmend repair status` lists the runs",
            r.repair,
            r.state
        ),
        Some(r) if r.repair.starts_with("undo:") => bail!(
            "run {run_id} is an undo ({}): an undo is not paused or throttled between its batches; stop it with SIGINT or SIGTERM, and rerun it to resume",
            r.repair
        ),
        Some(_) => {}
    }
    let who = format!(
        "{}@{}",
        crate::release::engine::os_user(),
        crate::release::engine::hostname()
    );
    let throttle = (
        pause_for.map(|d| d.as_millis() as i64),
        duty_cycle.map(i16::from),
    );
    let Some(run) = store::runs::steer(&mut session.client, run_id, &who, pause, throttle)? else {
        bail!(
            "run {run_id} finished (or was abandoned) as the request was recorded; nothing was asked of it. `pgmend repair status` shows it"
        );
    };
    if format == Format::Json {
        return print_json(&run).map(|()| Outcome::Done);
    }
    let mut out = crate::output::stdout();
    let said = match (pause, &run.steering.paused) {
        (Some(true), Some((by, at))) => format!(
            "run {run_id} of {} is paused (by {by} at {at}): the pgmend walking it stops before its next batch, with no transaction open, until `pgmend repair resume {run_id}`",
            run.repair
        ),
        (Some(false), _) => format!(
            "run {run_id} of {} is not paused: the pgmend walking it goes on with its next batch",
            run.repair
        ),
        _ => format!(
            "run {run_id} of {}: after each batch, pause {} and spend at most {}% of the time in batches, from its next batch on",
            run.repair,
            run.steering.pause_ms.map_or("as the command said".into(), |ms| human::millis(ms.max(0) as u64)),
            run.steering.duty_cycle.map_or("as the command said".into(), |p| p.to_string()),
        ),
    };
    writeln!(out, "{said}")?;
    Ok(Outcome::Done)
}

/// What another session asked of a run, for `repair status`.
fn steering_note(s: &store::runs::Steering) -> String {
    let mut parts = Vec::new();
    if let Some((by, at)) = &s.paused {
        parts.push(format!("PAUSED by {by} at {at}"));
    }
    if let Some(ms) = s.pause_ms {
        parts.push(format!(
            "throttled: pause {}",
            human::millis(ms.max(0) as u64)
        ));
    }
    if let Some(p) = s.duty_cycle {
        parts.push(format!("duty cycle {p}%"));
    }
    parts.join(", ")
}
