//! The batch runner: freeze the targets, walk them in keyset pages (seq ranges, never
//! OFFSET), one short transaction per batch that changes the rows, writes the ledger and
//! advances the checkpoint together. Resumes an unfinished run from its checkpoint.
//!
//! A target is a group or key, or (a run with `target_ranges`: a void run whose groups an
//! index covers, a counter run before the deploy gate) a range of values of one column, whose
//! bounds `store::runs::range_bounds` reads before each batch (`in_ranges`, `Bounds`).
//!
//! `apply` prepares the engine, calls `store::ensure` (which creates or upgrades pgmend's
//! schema), then resumes the repair's
//! `running` run when its `definition_checksum` equals the definition's (a different one is
//! `Stopped`), or calls `freeze` (one transaction: the run row and its targets, under a
//! `statement_timeout` of at least 10 minutes; then `ANALYZE pgmend.repair_targets` unless it froze
//! nothing). Before that, `health::check_readable` refuses a health signal the user set and the role
//! cannot read, and says a note for one pgmend chose. The batch loop reads steering requests,
//! waits while a health signal says pause (`health::wait_until_healthy`, polling every 500 ms;
//! past `--health-pause-limit` the run stops, exit 1), checks `signals::requested()`, and runs one batch
//! through `with_lock_retry`: the engine's read (a counter's drift, outside the transaction), then
//! `SET LOCAL` timeouts, the engine's statements, and the `UPDATE` of the run's checkpoint and
//! counts (guarded by the checkpoint it read; a batch whose update finds no such row is rolled back
//! with an error), committed together. Batch sizes start at one target (a target's cost is unknown
//! until then: a campaign's counter sums 370,000 coupons, a member-month's four) and follow
//! `--batch-target` (ratio clamped to 0.5–2, size to 1–50,000); progress lines go to the callback
//! at most every 2 s. After the last batch `reconcile` gives `left_over` and the run is marked
//! `finished` (an interrupted run stays `running`). `RunReport` carries the run, `resumed`,
//! `interrupted`, the batch count and p50/p99/max batch times, and `left_over`.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::batch::{self, Checkpoint, Pace, Progress, Tally, Targets};
use super::counter::CounterEngine;
use super::definition::Repair;
use super::engine::Engine;
use super::health;
use super::neighbour;
use super::options::{RunOptions, Workers};
use super::split_freeze;
use super::workers;
use crate::db::retry::{with_lock_retry, LockPolicy};
use crate::db::sql_text::names;
use crate::error::{PgContext, Stopped};
use crate::human;
use crate::store::runs::RangeSample;
use crate::store::{self, Run};

/// Whether the run's targets from `lo` on are ranges of keys: a run frozen in ranges, up to
/// the keys a later pass of a counter run appended (`repass_from`).
fn in_ranges(run: &Run, lo: i64) -> bool {
    run.target_ranges && run.repass_from.is_none_or(|from| lo < from)
}

/// How a run ended.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub run: Run,
    pub resumed: bool,
    pub interrupted: bool,
    pub batches: u64,
    /// Batch transaction times in milliseconds: p50, p99, max.
    pub batch_ms_p50: u64,
    pub batch_ms_p99: u64,
    pub batch_ms_max: u64,
    /// Batches that another session waited for before they committed (each was followed by
    /// a smaller one and a pause: `neighbour`).
    pub batches_blocking: u64,
    /// For void: frozen groups that still hold duplicates (new arrivals). For counters:
    /// keys whose counter drifted from the source since their batch. `None`: not counted, as
    /// a later step checks the same (`RunOptions::checked_later`).
    pub left_over: Option<i64>,
    /// `--jobs auto`'s changes to the number of workers, each as the line it printed (a
    /// worker added or removed, and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub worker_changes: Vec<String>,
    /// For counters after the gate: up to ten keys that still differ, as `a/b`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_over_keys: Vec<String>,
    /// Whether the run ran after a gate of the release was passed (`pgmend.gates`): then a
    /// counter that still differs is not a success.
    pub after_gate: bool,
}

/// The health notes said so far in this process.
static SAID: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Runs (or resumes) `repair` to the end of its frozen targets.
pub fn apply(
    client: &mut postgres::Client,
    repair: &Repair,
    options: &RunOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<RunReport> {
    // The definition is checked against the catalog before pgmend's schema is created: a
    // definition that does not match this database changes nothing.
    check_definition(client, repair)?;
    let engine = Engine::prepare(client, repair)?;
    // A signal the user set and the role cannot read refuses the run before pgmend's schema
    // exists; one pgmend chose is a note, and is not read again.
    let notes = health::check_readable(client, &options.health, &repair.tables())?;
    for note in &notes {
        // Said once a process: a release's every repair step reads the same signals.
        let first = SAID
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(note.clone());
        if first {
            progress(note);
        }
    }
    let options = &RunOptions {
        health: health::without_unreadable(&options.health, &notes),
        ..options.clone()
    };
    store::ensure(client, &options.policy)?;
    // After the deploy gate every writer keeps counter and source in step, so a counter that
    // differs again after its batch means one does not (the old application still
    // committing, a guard left behind, a manual void): its keys are corrected again, a
    // bounded number of times, and what still differs is reported (exit 1).
    let after_gate = matches!(engine, Engine::Counter(_)) && store::gates_passed(client)?;
    // Before the gate a counter run goes through every key in ranges (the first pass fills
    // the counters: nearly every key differs); after it, through the few keys that differ.
    let ranges = engine.freezes_ranges(after_gate);
    let unfinished = store::runs::unfinished(client, &repair.name)?;
    let (mut run, resumed) = match unfinished {
        Some(run) if run.steering.paused.is_some() => {
            let (by, at) = run.steering.paused.clone().unwrap_or_default();
            return Err(Stopped::error(format!(
                "run {} of {} is paused (by {by} at {at}); nothing was changed. Resume it with `pgmend repair resume {}`, then rerun this command",
                run.run_id, repair.name, run.run_id
            )));
        }
        Some(run) if run.definition_checksum == repair.checksum => {
            progress(&format!(
                "resuming run {} of {} from its checkpoint: {} of {} done",
                run.run_id,
                repair.name,
                human::int(run.checkpoint),
                human::count(run.targets, "target")
            ));
            (run, true)
        }
        Some(run) => {
            return Err(Stopped::error(format!(
                "run {} of {} (started {} by {}) is unfinished and used another version of the definition ({} now, {} then); nothing was changed. Finish it with the definition it started with, or abandon it: pgmend repair abandon {} --yes",
                run.run_id, repair.name, run.as_of, run.started_by, repair.checksum, run.definition_checksum, run.run_id
            )))
        }
        None => (
            freeze(client, &engine, repair, ranges, options, progress)?,
            false,
        ),
    };
    if let (true, Engine::Void(e)) = (run.target_ranges, &engine) {
        if e.range_by.is_none() {
            return Err(Stopped::error(format!(
                "run {} of {} walks the groups in ranges of an index on ({}), and no valid index on those columns exists now; nothing was changed. Build the index again (pgmend migrate status lists INVALID ones), or abandon the run: pgmend repair abandon {} --yes",
                run.run_id,
                repair.name,
                names(&e.spec.group_by, ", "),
                run.run_id
            )));
        }
    }

    // Before the first batch (of a new run, or of one resumed, also one an older pgmend began):
    // what the run's compact ledger records leave out, which the ledger's view reads them with.
    store::runs::record_shapes(client, run.run_id, &engine.ledger_shapes())?;

    let mut tally = Tally::default();
    let mut repasses = 0;
    let left_over = loop {
        let walked = match parallel(client, &run, options)? {
            Some(w) => {
                let walked = workers::walk(&engine, repair, &run, options, w, client, progress)?;
                run = store::run(client, run.run_id)?.expect("the run exists");
                if !walked.interrupted && run.checkpoint < run.targets {
                    anyhow::bail!(
                        "{}: the workers of run {} stopped with {} of {} targets done and no error; check `pgmend repair status` and rerun the command to resume",
                        repair.name, run.run_id, human::int(run.checkpoint), human::int(run.targets)
                    );
                }
                walked
            }
            None => stream(client, &engine, repair, options, &mut run, progress)?,
        };
        tally.add(walked);
        // A run that froze nothing found every target agreeing a moment ago; checking again
        // would cost another pass over the source for nothing.
        if tally.interrupted || run.targets == 0 {
            break Some(0);
        }
        if options.checked_later && !after_gate {
            break None;
        }
        let differing = reconcile(client, &engine, &run)?;
        if differing == 0 || !after_gate || repasses == MAX_REPASSES {
            break Some(differing);
        }
        repasses += 1;
        let Engine::Counter(counter) = &engine else {
            unreachable!("only counter runs pass again")
        };
        let added = repass(client, counter, &mut run, &options.policy)?;
        progress(&format!(
        "{}: {} differ from the source again after the pass, so a writer does not keep counter and source in step; correcting {} of them again (pass {} of {MAX_REPASSES})",
        repair.name,
        human::count(differing, "key"),
        human::int(added),
        repasses + 1
    ));
    };
    let left_over_keys = match &engine {
        Engine::Counter(counter) if after_gate && left_over.is_some_and(|n| n > 0) => counter
            .differing_keys(client, 10)
            .doing("listing the counters that still differ")?
            .iter()
            .map(|k| k.join("/"))
            .collect(),
        _ => Vec::new(),
    };
    if !tally.interrupted {
        store::runs::finish(client, run.run_id)?;
    }
    let run = store::run(client, run.run_id)?.expect("the run exists");
    let Tally {
        interrupted,
        mut times,
        blocking,
        decisions,
    } = tally;
    times.sort_unstable();
    let pct = |p: f64| {
        times
            .get(((times.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    Ok(RunReport {
        resumed,
        interrupted,
        batches: times.len() as u64,
        batch_ms_p50: pct(0.5),
        batch_ms_p99: pct(0.99),
        batch_ms_max: times.last().copied().unwrap_or(0),
        batches_blocking: blocking,
        left_over,
        left_over_keys,
        worker_changes: decisions,
        after_gate,
        run,
    })
}

/// The checks of a definition that names its SQL by hand ([`super::expression::check`]), in a
/// read-only transaction of their own.
pub fn check_definition(client: &mut postgres::Client, repair: &Repair) -> Result<()> {
    let mut tx = crate::db::connect::read_only(client)?;
    super::expression::check(&mut tx, repair, &[], &[])?;
    tx.rollback().doing("closing the definition's checks")?;
    Ok(())
}

/// Walks what is left of `run` in one stream of batches on the main session, to the end or to
/// a stop, keeping `run`'s checkpoint and counts as its batches commit them.
fn stream(
    client: &mut postgres::Client,
    engine: &Engine,
    repair: &Repair,
    options: &RunOptions,
    run: &mut Run,
    progress: &mut dyn FnMut(&str),
) -> Result<Tally> {
    let mut tally = Tally::default();
    let mut pace = Pace::new();
    let mut shown = Progress::new(&repair.name, run.targets, run.checkpoint, None);
    let tables = repair.tables();
    while run.checkpoint < run.targets {
        if crate::signals::requested().is_some() {
            tally.interrupted = true;
            break;
        }
        let stop = || crate::signals::requested().is_some();
        let options = &super::steer::before_batch(
            client,
            run.run_id,
            &format!("run {} of {}", run.run_id, repair.name),
            options,
            &stop,
            progress,
        )?;
        health::wait_until_healthy(client, &options.health, &tables, &stop, progress)?;
        if stop() {
            tally.interrupted = true;
            break;
        }
        let lo = run.checkpoint;
        let targets = Targets {
            lo,
            hi: (lo + pace.size()).min(run.targets),
            in_ranges: in_ranges(run, lo),
            merge: run.repass_from.is_some_and(|from| lo >= from),
        };
        let (targets, done) = batch::run_splitting(
            client,
            engine,
            &repair.name,
            run.run_id,
            options,
            Checkpoint::Run,
            targets,
            progress,
        )?;
        pace.at_most(targets.hi - targets.lo);
        tally.times.push(done.in_transaction.as_millis() as u64);
        tally.blocking += u64::from(done.waiting > 0);
        run.checkpoint = targets.hi;
        run.processed += targets.hi - targets.lo;
        run.changed += done.result.changed;
        let pause = pace.after(options, targets, &done, in_ranges(run, run.checkpoint));
        run.skipped.extend(done.result.skipped);
        shown.show(
            (run.checkpoint, run.targets),
            run.changed,
            Some((targets.hi - targets.lo, done.took)),
            progress,
        );
        if run.checkpoint < run.targets {
            neighbour::sleep(pause);
        }
    }
    shown.finish((run.checkpoint, run.targets), run.changed, progress);
    Ok(tally)
}

/// The workers that walk `run`, or None for one stream on the main session: several for a run
/// in ranges with `--jobs` above 1, and for any run left in slices by an earlier `--jobs` (which
/// resumes with any number of workers, 1 included, from its slices' checkpoints).
fn parallel<'a>(
    client: &mut postgres::Client,
    run: &Run,
    options: &'a RunOptions,
) -> Result<Option<&'a Workers>> {
    let sliced = !store::slices::list(client, run.run_id)?.is_empty();
    let ranges = run.target_ranges && run.repass_from.is_none();
    match &options.workers {
        Some(w) if ranges && (w.jobs > 1 || sliced) => Ok(Some(w)),
        None if sliced => Err(Stopped::error(format!(
            "run {} of {} was walked in slices by several workers; resume it with `pgmend repair apply {} --yes` (any --jobs)",
            run.run_id, run.repair, run.repair
        ))),
        _ => Ok(None),
    }
}

/// How many times a counter run after the gate corrects keys that differ again.
const MAX_REPASSES: u32 = 2;

/// Appends the keys that differ now (at most 10,000) to the run's targets, marking where
/// the second pass begins; returns how many. One transaction, so a resumed run finds them.
fn repass(
    client: &mut postgres::Client,
    engine: &CounterEngine,
    run: &mut Run,
    policy: &LockPolicy,
) -> Result<i64> {
    let keys = engine
        .differing_keys(client, 10_000)
        .doing("listing the counters that differ again")?;
    let n = keys.len() as i64;
    let joined: Vec<String> = keys.iter().map(|k| k.join("\u{1f}")).collect();
    let from = run.targets;
    with_lock_retry(
        client,
        policy,
        "recording the keys to correct again",
        &[],
        |c| {
            let mut tx = c.transaction()?;
            store::runs::add_repass_targets(&mut tx, run.run_id, from, &joined)?;
            tx.commit()?;
            Ok(())
        },
    )?;
    run.targets += n;
    run.repass_from.get_or_insert(from);
    Ok(n)
}

/// Creates the run and freezes its targets in one transaction, then ANALYZEs them (if any).
fn freeze(
    client: &mut postgres::Client,
    engine: &Engine,
    repair: &Repair,
    ranges: bool,
    options: &RunOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Run> {
    let started = Instant::now();
    let sample = if ranges {
        Some(RangeSample::of(client, &engine.range_table().to_string())?)
    } else {
        None
    };
    let policy = &options.policy;
    let freeze_policy = LockPolicy {
        statement_timeout: policy.statement_timeout.max(Duration::from_secs(600)),
        ..*policy
    };
    // After the gate, with several workers: the whole-source comparison by ranges, on as many
    // sessions (`split_freeze`).
    let mut split = match (engine, &options.workers) {
        (Engine::Counter(e), Some(w)) if !ranges && w.jobs > 1 => {
            let parts = if w.auto { 2 } else { w.jobs };
            split_freeze::start(client, e, parts, &w.params, &freeze_policy)?
        }
        _ => None,
    };
    // On one session, a key set of few rows (the campaigns'): its sums read apart, in parallel.
    let few_keys = match (engine, &split, ranges) {
        (Engine::Counter(e), None, false) => split_freeze::few_keys(client, e)?,
        _ => false,
    };
    let run_id = with_lock_retry(
        client,
        &freeze_policy,
        &format!("freezing the targets of {}", repair.name),
        &[],
        |c| {
            let mut tx = c.transaction()?;
            tx.batch_execute(&freeze_policy.set_local_sql())?;
            tx.batch_execute(crate::db::connect::RAISE_WORK_MEM)?;
            if let Some(create) = engine.before_freeze_sql() {
                tx.batch_execute(&create)?;
            }
            let run_id = store::runs::create(
                &mut tx,
                &repair.name,
                repair.kind().as_str(),
                &repair.checksum,
                ranges,
            )?;
            let targets = match (&mut split, engine, sample) {
                (Some(split), Engine::Counter(e), _) => {
                    split.freeze(&mut tx, e, run_id, progress)?
                }
                (None, Engine::Counter(e), None) => e.freeze(&mut tx, run_id, few_keys)?,
                _ => tx.execute(&engine.freeze_sql(sample), &[&run_id])? as i64,
            };
            store::runs::set_targets(&mut tx, run_id, targets)?;
            tx.commit()?;
            Ok(run_id)
        },
    );
    let run_id = match (run_id, &mut split) {
        (Err(e), Some(split)) => {
            // The listing sessions still at work are of no use now.
            split.cancel(client);
            return Err(e);
        }
        (run_id, _) => run_id?,
    };
    let run = store::run(client, run_id)?.expect("the run was just created");
    // The batches' plans read the frozen keys; a run that froze none has no batch to plan.
    if run.targets > 0 {
        store::runs::analyze_targets(client)?;
    }
    let what = match engine.range_column().filter(|_| ranges) {
        Some(column) => format!(
            "{}, ranges of {} of about {} rows of {} each{}",
            human::count(run.targets, "target"),
            column.as_str(),
            human::int(store::runs::ROWS_PER_RANGE),
            engine.range_table().as_str(),
            match sample {
                Some(RangeSample::Percent(p)) => format!(" (cut on a {p}% sample)"),
                _ => String::new(),
            }
        ),
        None => human::count(run.targets, "target"),
    };
    let what = match &split {
        Some(split) => format!(
            "{what} (compared in {} ranges on as many sessions, {} of them listed by the others)",
            split.parts,
            human::int(split.listed_elsewhere())
        ),
        None => what,
    };
    progress(&format!(
        "run {} of {}: froze {what} as of {} in {}",
        run.run_id,
        repair.name,
        run.as_of,
        human::duration(started.elapsed())
    ));
    Ok(run)
}

fn reconcile(client: &mut postgres::Client, engine: &Engine, run: &Run) -> Result<i64> {
    let mut tx = client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a transaction to reconcile the run")?;
    tx.batch_execute(crate::db::connect::RAISE_WORK_MEM)
        .doing("raising work_mem to reconcile the run")?;
    let row = match engine {
        Engine::Void(e) if run.target_ranges => tx.query_one(&e.range_reconcile_sql(), &[]),
        Engine::Void(e) => tx.query_one(&e.reconcile_sql(), &[&run.run_id]),
        Engine::Counter(e) => tx.query_one(&e.drift_sql(), &[]),
        Engine::Backfill(e) => tx.query_one(&e.reconcile_sql(), &[]),
        Engine::Orphans(e) => tx.query_one(&e.reconcile_sql(), &[]),
    };
    let left_over = row.doing("reconciling the run")?.get(0);
    tx.commit().doing("closing the reconciliation")?;
    Ok(left_over)
}
