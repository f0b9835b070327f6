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
    let (result, in_transaction, waiting) = with_lock_retry(client, policy, &who, &[], |c| {
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
    })?;
    Ok(Done {
        result,
        in_transaction,
        took: started.elapsed(),
        waiting,
    })
}

/// What the batches of a run added up to, over its streams and passes: whether a stop cut them
/// short, each batch transaction's time in milliseconds, and how many made another session wait
/// (`RunReport::batches_blocking`).
#[derive(Default)]
pub(super) struct Tally {
    pub interrupted: bool,
    pub times: Vec<u64>,
    pub blocking: u64,
}

impl Tally {
    pub fn add(&mut self, more: Tally) {
        self.interrupted |= more.interrupted;
        self.times.extend(more.times);
        self.blocking += more.blocking;
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
                Some(jobs) => format!(" over {jobs} workers"),
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
