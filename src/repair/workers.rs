//! Several batch workers for one run (`--jobs N`): the run's targets cut into slices
//! (`store::slices::cut`), each walked by one worker on its own connection, one batch per
//! transaction as in the runner's single stream, with the slice's checkpoint and the run's
//! counts advanced in it (`store::slices::advance`).
//!
//! Only a run whose targets are ranges of keys is walked this way (`runner::apply` decides):
//! ranges are disjoint, so two workers never lock the same rows, and each batch is what one
//! worker would have done with the same range, so the end state and the ledger records are
//! those of one worker. The main session keeps the runner lock and runs no batch; before each
//! commit a worker checks that the session holding the lock is still there
//! (`store::slices::lock_held_by`), and rolls back and stops when it is not. A signal, an error
//! in one worker, or a lock budget spent stops every worker after its current batch: each
//! batch in flight commits or rolls back whole. The slices are taken from one queue, so a
//! worker that finishes early takes the next; there are four per worker, so that the last
//! ones to finish are short.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::neighbour;
use super::runner::{next_batch_size, Engine, RunOptions, MAX_BATCH};
use crate::db::conninfo::ConnParams;
use crate::db::retry::with_lock_retry;
use crate::db::Session;
use crate::human;
use crate::store::slices::{self, Slice};
use crate::store::{self, Run};

/// How the command lets a run use several workers: how many, where to connect them, and the
/// main session's backend, which holds the runner lock.
#[derive(Clone)]
pub struct Workers {
    pub jobs: usize,
    pub params: ConnParams,
    pub main_pid: i32,
}

/// Slices per worker.
const SLICES_PER_WORKER: usize = 4;

/// What the workers did.
pub struct Walked {
    pub interrupted: bool,
    /// Batch transaction times in milliseconds, every worker's.
    pub times: Vec<u64>,
    /// Batches that another session waited for (`RunReport::batches_blocking`).
    pub blocking: u64,
}

/// Walks what is left of `run` with `workers.jobs` workers, to the end or to a stop.
#[allow(clippy::too_many_arguments)]
pub fn walk(
    engine: &Engine,
    name: &str,
    run: &Run,
    options: &RunOptions,
    workers: &Workers,
    sessions: &mut [Session],
    main: &mut postgres::Client,
    progress: &mut dyn FnMut(&str),
) -> Result<Walked> {
    let pieces = workers.jobs * SLICES_PER_WORKER;
    let queue: Mutex<VecDeque<Slice>> = Mutex::new(
        slices::cut(main, run.run_id, run.checkpoint, run.targets, pieces)?
            .into_iter()
            .collect(),
    );
    let stop = AtomicBool::new(false);
    let left_at_start: i64 = queue
        .lock()
        .expect("queue")
        .iter()
        .map(|s| s.hi - s.checkpoint)
        .sum();
    let done_before = run.targets - left_at_start;
    let done = AtomicI64::new(done_before);
    let changed = AtomicI64::new(run.changed);
    let blocking = AtomicU64::new(0);
    let times: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    // pgmend's own sessions, which wait for each other on the run's row, are no application.
    let ours: Vec<i32> = sessions.iter().map(|s| s.backend_pid).collect();
    let started = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .iter_mut()
            .enumerate()
            .map(|(i, session)| {
                let counts = Counts {
                    done: &done,
                    changed: &changed,
                    blocking: &blocking,
                    times: &times,
                };
                let (queue, stop, ours) = (&queue, &stop, &ours);
                scope.spawn(move || {
                    let worker = Worker {
                        engine,
                        name,
                        run_id: run.run_id,
                        options,
                        main_pid: workers.main_pid,
                        ours,
                        number: i as i32 + 1,
                    };
                    let r = worker.run(&mut session.client, queue, stop, counts);
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut last_line = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            if last_line.elapsed() >= Duration::from_secs(2) {
                let now = done.load(Ordering::Relaxed);
                let rate = (now - done_before) as f64 / started.elapsed().as_secs_f64().max(0.001);
                let eta = ((run.targets - now) as f64 / rate.max(0.001)) as u64;
                progress(&format!(
                    "{name}: {}/{} targets ({}), {} changed, {} targets over {} workers, ETA {}",
                    human::int(now),
                    human::int(run.targets),
                    human::percent(now, run.targets),
                    human::count(changed.load(Ordering::Relaxed), "row"),
                    human::rate(rate),
                    workers.jobs,
                    human::duration(Duration::from_secs(eta)),
                ));
                last_line = Instant::now();
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a batch worker panicked")))
            })
            .collect()
    });
    // Whatever stopped the workers, the run's checkpoint is raised to what they committed.
    let settled = slices::settle(main, run.run_id);
    for r in results {
        r?;
    }
    settled?;
    Ok(Walked {
        interrupted: crate::signals::requested().is_some(),
        times: times.into_inner().expect("times"),
        blocking: blocking.into_inner(),
    })
}

/// What every worker adds to: targets done, rows changed, batches that made a session wait,
/// batch times.
#[derive(Clone, Copy)]
struct Counts<'a> {
    done: &'a AtomicI64,
    changed: &'a AtomicI64,
    blocking: &'a AtomicU64,
    times: &'a Mutex<Vec<u64>>,
}

struct Worker<'a> {
    engine: &'a Engine,
    name: &'a str,
    run_id: i64,
    options: &'a RunOptions,
    main_pid: i32,
    ours: &'a [i32],
    number: i32,
}

impl Worker<'_> {
    fn run(
        &self,
        client: &mut postgres::Client,
        queue: &Mutex<VecDeque<Slice>>,
        stop: &AtomicBool,
        counts: Counts,
    ) -> Result<()> {
        let mut size: i64 = 1;
        loop {
            let Some(slice) = queue.lock().expect("queue").pop_front() else {
                return Ok(());
            };
            let mut checkpoint = slice.checkpoint;
            while checkpoint < slice.hi {
                if stop.load(Ordering::Relaxed) || crate::signals::requested().is_some() {
                    return Ok(());
                }
                let (lo, hi) = (checkpoint, (checkpoint + size).min(slice.hi));
                let t = Instant::now();
                let (n, in_transaction, waiting) = self.batch(client, slice.slice, (lo, hi))??;
                counts
                    .times
                    .lock()
                    .expect("times")
                    .push(in_transaction.as_millis() as u64);
                checkpoint = hi;
                counts.done.fetch_add(hi - lo, Ordering::Relaxed);
                counts.changed.fetch_add(n, Ordering::Relaxed);
                counts
                    .blocking
                    .fetch_add(u64::from(waiting > 0), Ordering::Relaxed);
                let took = t.elapsed();
                let planned = next_batch_size(size, self.options.batch_target, took)
                    .min(MAX_BATCH / store::runs::ROWS_PER_RANGE);
                let (next, pause) =
                    self.options
                        .neighbour
                        .after_batch(hi - lo, planned, took, waiting);
                size = next;
                neighbour::sleep(pause);
            }
        }
    }

    /// One batch of targets `(lo, hi]` of `slice`: the rows changed and the transaction's time.
    fn batch(
        &self,
        client: &mut postgres::Client,
        slice: i32,
        (lo, hi): (i64, i64),
    ) -> Result<Result<(i64, Duration, i64)>> {
        let policy = &self.options.policy;
        with_lock_retry(
            client,
            policy,
            &format!("{} batch {lo}..{hi} (worker {})", self.name, self.number),
            &[],
            |c| {
                let bounds = store::runs::range_bounds(c, self.run_id, lo, hi)?;
                let drift = self.engine.read(c, self.run_id, (lo, hi), Some(&bounds))?;
                let t = Instant::now();
                let mut tx = c.transaction()?;
                tx.batch_execute(&policy.set_local_sql())?;
                let r = self.engine.batch(
                    &mut tx,
                    self.run_id,
                    (lo, hi),
                    Some(&bounds),
                    &drift,
                    false,
                )?;
                if !slices::lock_held_by(&mut tx, self.main_pid)? {
                    return Ok(Err(anyhow!(
                        "{} batch {lo}..{hi} (worker {}): the session that holds pgmend's runner lock (backend {}) is gone, so the workers stop; the batch was rolled back. Check `pgmend repair status`, then rerun the command: the run resumes from its slices' checkpoints",
                        self.name, self.number, self.main_pid
                    )));
                }
                // Counted before the run's row is updated: every worker's batch updates that
                // row, so from then to the commit the other workers wait for this one.
                let waiting = neighbour::sessions_waiting_on_me(&mut tx, self.ours)?;
                let advanced = slices::advance(
                    &mut tx,
                    self.run_id,
                    slice,
                    self.number,
                    (lo, hi),
                    r.changed,
                    &r.skipped,
                )?;
                if advanced != 1 {
                    return Ok(Err(anyhow!(
                        "{} batch {lo}..{hi} (worker {}): run {} is no longer running or slice {slice}'s checkpoint moved under this process; the batch was rolled back. Check `pgmend repair status` before running it again",
                        self.name, self.number, self.run_id
                    )));
                }
                tx.commit()?;
                Ok(Ok((r.changed, t.elapsed(), waiting)))
            },
        )
    }
}
