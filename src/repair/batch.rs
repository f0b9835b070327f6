//! One batch, the same for the runner's single stream and for every worker of `--jobs`: the
//! bounds of a run in ranges (`store::runs::range_bounds`), the engine's read outside the
//! transaction, then one short transaction under the lock policy (`SET LOCAL` timeouts and the
//! lease's fence) that writes the rows and their ledger records (`Engine::batch`), checks that
//! the runner lock's session is still there (a worker's batch: the lock is held elsewhere),
//! counts the sessions waiting for its locks, advances the checkpoint (the run's, or the
//! worker's slice's and the run's counts) and commits; through `with_lock_retry`, so a lock
//! wait or a deadlock is retried whole.
//!
//! Also one rule for the size of the next batch ([`Pace`]: aimed at `--batch-target`, clamped
//! for ranges, halved after a batch that made a session wait) and one progress line or bar
//! ([`Progress`]) for either kind of stream.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::counter::BatchResult;
use super::engine::Engine;
use super::neighbour;
use super::options::RunOptions;
use crate::db::retry::with_lock_retry;
use crate::human;
use crate::store;
use crate::store::slices;

/// Whose checkpoint a batch advances.
#[derive(Clone, Copy)]
pub(super) enum Checkpoint<'a> {
    /// The run's own, on the session that holds the runner lock.
    Run,
    /// A slice's, by worker `worker` on a session of its own; `lock_pid` is the backend that
    /// holds the runner lock, `ours` every backend of pgmend's workers (which wait for each other
    /// on the run's row and are no application).
    Slice {
        slice: i32,
        worker: i32,
        lock_pid: i32,
        ours: &'a [i32],
    },
}

/// The targets `(lo, hi]` of one batch, whether they are ranges of keys (else frozen keys), and
/// whether the batch merges into ledger records the run wrote earlier (a counter run's second
/// pass).
#[derive(Clone, Copy)]
pub(super) struct Targets {
    pub lo: i64,
    pub hi: i64,
    pub in_ranges: bool,
    pub merge: bool,
}

/// What one committed batch did.
pub(super) struct Done {
    pub result: BatchResult,
    /// The batch transaction's time, from its first statement to its commit.
    pub in_transaction: Duration,
    /// The whole batch's time, its read and its retries included.
    pub took: Duration,
    /// Sessions that waited for the batch's locks before it committed.
    pub waiting: i64,
}

/// Runs one batch of `run_id` over `targets` and commits it, advancing `checkpoint`.
pub(super) fn run(
    client: &mut postgres::Client,
    engine: &Engine,
    name: &str,
    run_id: i64,
    options: &RunOptions,
    checkpoint: Checkpoint,
    targets: Targets,
) -> Result<Done> {
    let Targets {
        lo,
        hi,
        in_ranges,
        merge,
    } = targets;
    let who = match checkpoint {
        Checkpoint::Run => format!("{name} batch {lo}..{hi}"),
        Checkpoint::Slice { worker, .. } => format!("{name} batch {lo}..{hi} (worker {worker})"),
    };
    let policy = &options.policy;
    let started = Instant::now();
    let attempt = with_lock_retry(client, policy, &who, &[], |c| {
        let bounds = if in_ranges {
            Some(store::runs::range_bounds(c, run_id, lo, hi)?)
        } else {
            None
        };
        let drift = engine.read(c, run_id, (lo, hi), bounds.as_ref())?;
        let t = Instant::now();
        let mut tx = c.transaction()?;
        tx.batch_execute(&policy.set_local_sql())?;
        let result = engine.batch(&mut tx, run_id, (lo, hi), bounds.as_ref(), &drift, merge)?;
        // Counted before the run's row is updated: every worker's batch updates that row, so
        // from then to the commit the other workers wait for this one.
        let (advanced, waiting) = match checkpoint {
            Checkpoint::Run => {
                let waiting = neighbour::sessions_waiting_on_me(&mut tx, &[])?;
                let advanced = store::runs::advance(
                    &mut tx,
                    run_id,
                    (lo, hi),
                    result.changed,
                    &result.skipped,
                )?;
                (advanced, waiting)
            }
            Checkpoint::Slice {
                slice,
                worker,
                lock_pid,
                ours,
            } => {
                if !slices::lock_held_by(&mut tx, lock_pid)? {
                    // Dropping the transaction rolls the batch back.
                    return Err(anyhow!(
                        "{who}: the session that holds pgmend's runner lock (backend {lock_pid}) is gone, so the workers stop; the batch was rolled back. Check `pgmend repair status`, then rerun the command: the run resumes from its slices' checkpoints"
                    ));
                }
                let waiting = neighbour::sessions_waiting_on_me(&mut tx, ours)?;
                let advanced = slices::advance(
                    &mut tx,
                    run_id,
                    slice,
                    worker,
                    (lo, hi),
                    result.changed,
                    &result.skipped,
                )?;
                (advanced, waiting)
            }
        };
        if advanced != 1 {
            return Err(anyhow!(
                "{who}: run {run_id} is no longer running or {} checkpoint moved under this process; the batch was rolled back. Check `pgmend repair status` before running it again",
                match checkpoint {
                    Checkpoint::Run => "its".to_string(),
                    Checkpoint::Slice { slice, .. } => format!("slice {slice}'s"),
                }
            ));
        }
        tx.commit()?;
        Ok((result, t.elapsed(), waiting))
    });
    let (result, in_transaction, waiting) = match attempt {
        Ok(done) => done,
        Err(e) => return Err(on_a_row(client, engine, options, run_id, targets, &who, e)),
    };
    Ok(Done {
        result,
        in_transaction,
        took: started.elapsed(),
        waiting,
    })
}

/// How many times a batch that ran into the statement timeout is halved and tried again.
pub(super) const MAX_SPLITS: u32 = 4;

/// [`run`], splitting a batch that runs into the statement timeout: rolled back (as every
/// failed batch is), its first half tried, up to [`MAX_SPLITS`] times, each said in a line;
/// then the error as it came (exit 2, docs/exit-codes.md), naming the range. Returns the
/// targets the committed batch covered (the first part of `targets`).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_splitting(
    client: &mut postgres::Client,
    engine: &Engine,
    name: &str,
    run_id: i64,
    options: &RunOptions,
    checkpoint: Checkpoint,
    targets: Targets,
    progress: &mut dyn FnMut(&str),
) -> Result<(Targets, Done)> {
    let mut t = targets;
    let mut splits = 0;
    loop {
        match run(client, engine, name, run_id, options, checkpoint, t) {
            Ok(done) => return Ok((t, done)),
            Err(e) if statement_timeout(&e) && t.hi - t.lo > 1 && splits < MAX_SPLITS => {
                let half = t.lo + (t.hi - t.lo) / 2;
                progress(&format!(
                    "{name}: batch {}..{} ran into the statement timeout ({}) and was rolled back; trying its first half, {}..{half}",
                    t.lo,
                    t.hi,
                    human::duration(options.policy.statement_timeout),
                    t.lo
                ));
                t.hi = half;
                splits += 1;
            }
            Err(e) if statement_timeout(&e) => {
                return Err(e.context(format!(
                    "{name}: batch {}..{} ran into the statement timeout ({}){}; nothing of it was written. Raise --statement-timeout, or make the repair's work per target smaller, then rerun: the run resumes from its checkpoint",
                    t.lo,
                    t.hi,
                    human::duration(options.policy.statement_timeout),
                    if splits > 0 {
                        format!(" after it was halved {splits} times")
                    } else {
                        " and is one target, which cannot be split".to_string()
                    }
                )))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether `error` is pgmend's own statement timeout cancelling a statement (57014 with the
/// server's words for it; a cancel by someone else is not split).
fn statement_timeout(error: &anyhow::Error) -> bool {
    error.chain().any(|c| {
        c.downcast_ref::<crate::error::DbFailure>()
            .is_some_and(|f| {
                f.sqlstate.as_deref() == Some("57014")
                    && f.to_string().contains("statement timeout")
            })
            || c.downcast_ref::<postgres::Error>().is_some_and(|e| {
                e.as_db_error().is_some_and(|d| {
                    d.code().code() == "57014" && d.message().contains("statement timeout")
                })
            })
    })
}

/// A batch that failed on what a row holds (a data exception, an integrity violation, an error
/// raised by a function: SQLSTATE classes 22, 23, 2F, 38, 39 and P0) in a backfill: the row and
/// the key of the definition whose expression raised, found by [`BackfillEngine::find_failing_row`],
/// as a stop (exit 1): the batch was rolled back, the ones before it stay committed and the run
/// resumes from its checkpoint once the row or the definition is fixed. Any other error as it is.
///
/// [`BackfillEngine::find_failing_row`]: super::backfill::BackfillEngine::find_failing_row
fn on_a_row(
    client: &mut postgres::Client,
    engine: &Engine,
    options: &RunOptions,
    run_id: i64,
    targets: Targets,
    who: &str,
    error: anyhow::Error,
) -> anyhow::Error {
    let Engine::Backfill(backfill) = engine else {
        return error;
    };
    let Some(state) = error.chain().find_map(|c| {
        c.downcast_ref::<postgres::Error>()
            .and_then(|e| e.code())
            .map(|c| c.code().to_string())
            .or_else(|| {
                c.downcast_ref::<crate::error::DbFailure>()
                    .and_then(|f| f.sqlstate.clone())
            })
    }) else {
        return error;
    };
    if !super::backfill::raised_by_a_row(&state) {
        return error;
    }
    let found = store::runs::range_bounds(client, run_id, targets.lo, targets.hi)
        .map_err(anyhow::Error::from)
        .and_then(|(after, up_to)| {
            backfill.find_failing_row(client, &options.policy, after.as_deref(), up_to.as_deref())
        });
    let resume = "Fix the row (or the definition: abandon the run first, `pgmend repair status` names it), then rerun: the run resumes from its checkpoint";
    match found {
        Ok(Some((key, part, raised))) => crate::error::Stopped::error(format!(
            "{who}: {part} raised on the row {} = {key}: {raised}. The batch was rolled back; the batches before it stay committed. {resume}",
            backfill.spec.row_key.as_str()
        )),
        _ => crate::error::Stopped::error(format!(
            "{who}: the batch failed on a row of its range ({:#}); the row could not be singled out. The batch was rolled back; the batches before it stay committed. {resume}",
            error
        )),
    }
}

/// What the batches of a run added up to, over its streams and passes: whether a stop cut them
/// short, each batch transaction's time in milliseconds, and how many made another session wait
/// (`RunReport::batches_blocking`).
#[derive(Default)]
pub(super) struct Tally {
    pub interrupted: bool,
    pub times: Vec<u64>,
    pub blocking: u64,
    /// `--jobs auto`'s changes to the number of workers, as the lines it printed.
    pub decisions: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, more: Tally) {
        self.interrupted |= more.interrupted;
        self.times.extend(more.times);
        self.blocking += more.blocking;
        self.decisions.extend(more.decisions);
    }
}

/// The size of a stream's batches: the first is one target (a target's cost is unknown until
/// then: a campaign's counter sums 370,000 coupons where a member-month's sums four, and a
/// first batch of 200 campaigns would hold their locks for as long as that takes); each next
/// one follows `--batch-target` ([`next_batch_size`]), at most [`MAX_BATCH`] keys' worth of
/// ranges for a batch of ranges, and halves after a batch that made a session wait
/// ([`neighbour::Neighbour::after_batch`]).
pub(super) struct Pace {
    size: i64,
}

impl Pace {
    pub fn new() -> Pace {
        Pace { size: 1 }
    }

    /// How many targets the next batch takes.
    pub fn size(&self) -> i64 {
        self.size
    }

    /// After a batch that was split ([`run_splitting`]): the size that went through.
    pub fn at_most(&mut self, size: i64) {
        self.size = self.size.min(size).max(1);
    }

    /// Sizes the next batch after `done`, whose targets were `targets`, and returns the pause
    /// to take before it; `next_in_ranges`: whether the next batch's targets are ranges.
    pub fn after(
        &mut self,
        options: &RunOptions,
        targets: Targets,
        done: &Done,
        next_in_ranges: bool,
    ) -> Duration {
        let mut planned = next_batch_size(self.size, options.batch_target, done.took);
        if next_in_ranges {
            // A range holds about ROWS_PER_RANGE rows of its table: about the same bound on
            // keys per batch as for frozen keys.
            planned = planned.min(MAX_BATCH / store::runs::ROWS_PER_RANGE);
        }
        let (next, pause) = options.neighbour.after_batch(
            targets.hi - targets.lo,
            planned,
            done.took,
            done.waiting,
        );
        self.size = next;
        pause
    }
}

/// The size of the next batch: aimed at `target` from how long `size` targets took, changing
/// by at most 2x at a time, between 1 and 50,000. Rounded up when growing: from one target,
/// rounding down would never grow again once a batch's fixed cost passes half the target.
pub(super) fn next_batch_size(size: i64, target: Duration, took: Duration) -> i64 {
    let ratio = (target.as_secs_f64() / took.as_secs_f64().max(0.001)).clamp(0.5, 2.0);
    let next = size as f64 * ratio;
    let next = if ratio > 1.0 {
        next.ceil()
    } else {
        next.floor()
    };
    (next as i64).clamp(1, MAX_BATCH)
}

/// The most targets one batch takes.
pub(super) const MAX_BATCH: i64 = 50_000;

/// How a run's progress is shown while its batches run, by one stream or several workers: on a
/// terminal a bar on stderr with rate and ETA, elsewhere a line at most every 2 s (and at the
/// end), through the command's progress callback.
pub(super) struct Progress {
    name: String,
    bar: Option<indicatif::ProgressBar>,
    workers: Option<usize>,
    started: Instant,
    last_line: Instant,
    done_before: i64,
}

impl Progress {
    /// For a run of `name` with `done` of `targets` done, walked by `workers` (None: one stream).
    pub fn new(name: &str, targets: i64, done: i64, workers: Option<usize>) -> Progress {
        let bar = progress_bar(name, targets, done);
        crate::signals::draws(bar.as_ref());
        Progress {
            name: name.to_string(),
            bar,
            workers,
            started: Instant::now(),
            last_line: Instant::now(),
            done_before: done,
        }
    }

    /// The number of workers the lines name from now on (`--jobs auto` changed it).
    pub fn set_workers(&mut self, workers: usize) {
        self.workers = Some(workers);
    }

    /// Shows `done` of `targets` done and `changed` rows changed, with the last batch's size
    /// and time when one stream walks the run.
    pub fn show(
        &mut self,
        (done, targets): (i64, i64),
        changed: i64,
        last_batch: Option<(i64, Duration)>,
        progress: &mut dyn FnMut(&str),
    ) {
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
            bar.set_message(match last_batch {
                Some((n, took)) => format!(
                    "{} changed, last batch {} in {}",
                    human::count(changed, "row"),
                    human::int(n),
                    human::duration(took)
                ),
                None => format!("{} changed", human::count(changed, "row")),
            });
            return;
        }
        if self.last_line.elapsed() < Duration::from_secs(2) && done < targets {
            return;
        }
        let rate =
            (done - self.done_before) as f64 / self.started.elapsed().as_secs_f64().max(0.001);
        let eta = ((targets - done) as f64 / rate.max(0.001)) as u64;
        let line = format!(
            "{}: {}/{} targets ({}), {} changed, {} targets{}, ETA {}{}",
            self.name,
            human::int(done),
            human::int(targets),
            human::percent(done, targets),
            human::count(changed, "row"),
            human::rate(rate),
            match self.workers {
                Some(jobs) => format!(" over {}", human::count(jobs as i64, "worker")),
                None => String::new(),
            },
            human::duration(Duration::from_secs(eta)),
            match last_batch {
                Some((n, took)) => format!(
                    ", last batch {} in {}",
                    human::int(n),
                    human::duration(took)
                ),
                None => String::new(),
            }
        );
        if crate::output::json_lines() {
            crate::output::event(
                "progress",
                &line,
                serde_json::json!({
                    "repair": self.name,
                    "done": done,
                    "targets": targets,
                    "changed": changed,
                    "targets_per_second": (rate * 10.0).round() / 10.0,
                    "workers": self.workers,
                    "eta_seconds": eta,
                }),
            );
        } else {
            progress(&line);
        }
        self.last_line = Instant::now();
    }

    /// Clears the bar, if any, leaving one line with where the run stands.
    pub fn finish(
        mut self,
        (done, targets): (i64, i64),
        changed: i64,
        progress: &mut dyn FnMut(&str),
    ) {
        if let Some(bar) = self.bar.take() {
            crate::signals::draws(None);
            bar.finish_and_clear();
            progress(&format!(
                "{}: {}/{} targets, {} changed",
                self.name,
                human::int(done),
                human::int(targets),
                human::count(changed, "row")
            ));
        }
    }
}

impl Drop for Progress {
    /// A run that ends in an error leaves its bar where it was, and no longer drawn.
    fn drop(&mut self) {
        if self.bar.is_some() {
            crate::signals::draws(None);
        }
    }
}

/// On a terminal, a progress bar on stderr with rate and ETA; elsewhere none.
fn progress_bar(name: &str, targets: i64, done: i64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || crate::output::json_lines() || targets == 0 {
        return None;
    }
    let bar = indicatif::ProgressBar::new(targets as u64);
    // Rate and ETA written as every other line of pgmend writes them (`human`), not in
    // indicatif's own forms (`29428.7221/s`, `3 minutes`).
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix} [{bar:30}] {count} targets, {rate}, ETA {left}: {msg}",
    ) {
        let style = style
            .with_key(
                "count",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(
                        w,
                        "{}/{}",
                        human::int(s.pos()),
                        human::int(s.len().unwrap_or(0))
                    );
                },
            )
            .with_key(
                "rate",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{}", human::rate(s.per_sec()));
                },
            )
            .with_key(
                "left",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let whole_seconds = Duration::from_secs(s.eta().as_secs());
                    let _ = write!(w, "{}", human::duration(whole_seconds));
                },
            );
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(name.to_string());
    bar.set_position(done as u64);
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::next_batch_size;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_batch_of_one_grows_while_it_is_under_the_target() {
        // 150 ms of fixed cost against a 200 ms target: 1 * 1.33 must not round back to 1.
        assert_eq!(next_batch_size(1, ms(200), ms(150)), 2);
        assert_eq!(next_batch_size(2, ms(200), ms(160)), 3);
        // Fast batches double, slow ones halve, and the size stays between 1 and 50,000.
        assert_eq!(next_batch_size(100, ms(200), ms(10)), 200);
        assert_eq!(next_batch_size(100, ms(200), ms(2000)), 50);
        assert_eq!(next_batch_size(1, ms(200), ms(2000)), 1);
        assert_eq!(next_batch_size(40_000, ms(200), ms(1)), 50_000);
        // On target: unchanged.
        assert_eq!(next_batch_size(300, ms(200), ms(200)), 300);
    }
}
