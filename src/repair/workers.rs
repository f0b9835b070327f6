//! Several batch workers for one run (`--jobs N`): the run's targets cut into slices
//! (`store::slices::cut`), each walked by one worker on a connection of its own (opened by
//! [`walk`], closed when it ends), through the same batch path as the runner's single stream
//! ([`super::batch`]), which advances the slice's checkpoint and the run's counts
//! (`store::slices::advance`).
//!
//! Only a run whose targets are ranges of keys is walked this way (`runner::apply` decides):
//! ranges are disjoint, so two workers never lock the same rows, and each batch is what one
//! worker would have done with the same range, so the end state and the ledger records are
//! those of one worker. The main session runs no batch; before each commit a worker checks that
//! the session holding the runner lock (the lease's) is still there
//! (`store::slices::lock_held_by`), and rolls back and stops when it is not. A signal, an error
//! in one worker, or a lock budget spent stops every worker after its current batch: each
//! batch in flight commits or rolls back whole. The slices are taken from one queue, so a
//! worker that finishes early takes the next; there are four per worker, so that the last
//! ones to finish are short.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Result};

use super::batch::{self, Checkpoint, Pace, Progress, Tally, Targets};
use super::engine::Engine;
use super::neighbour;
use super::options::{RunOptions, Workers};
use crate::db::Session;
use crate::store::slices::{self, Slice};
use crate::store::Run;

/// Slices per worker.
const SLICES_PER_WORKER: usize = 4;

/// Opens `workers.jobs` sessions, connected as the main session is, and walks what is left of
/// `run` with them, to the end or to a stop; the sessions close when the walk ends.
pub(super) fn walk(
    engine: &Engine,
    name: &str,
    run: &Run,
    options: &RunOptions,
    workers: &Workers,
    main: &mut postgres::Client,
    progress: &mut dyn FnMut(&str),
) -> Result<Tally> {
    let mut sessions = connect(name, workers)?;
    progress(&format!(
        "{name}: {} workers, each on its own connection, over ranges of the run's targets",
        workers.jobs
    ));
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
    let done = AtomicI64::new(run.targets - left_at_start);
    let changed = AtomicI64::new(run.changed);
    let blocking = AtomicU64::new(0);
    let times: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    // pgmend's own sessions, which wait for each other on the run's row, are no application.
    let ours: Vec<i32> = sessions.iter().map(|s| s.backend_pid).collect();
    let mut shown = Progress::new(
        name,
        run.targets,
        done.load(Ordering::Relaxed),
        Some(workers.jobs),
    );
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
                        lock_pid: workers.lock_pid,
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
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            shown.show(
                (done.load(Ordering::Relaxed), run.targets),
                changed.load(Ordering::Relaxed),
                None,
                progress,
            );
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a batch worker panicked")))
            })
            .collect()
    });
    shown.finish(
        (done.load(Ordering::Relaxed), run.targets),
        changed.load(Ordering::Relaxed),
        progress,
    );
    // Whatever stopped the workers, the run's checkpoint is raised to what they committed.
    let settled = slices::settle(main, run.run_id);
    for r in results {
        r?;
    }
    settled?;
    Ok(Tally {
        interrupted: crate::signals::requested().is_some(),
        times: times.into_inner().expect("times"),
        blocking: blocking.into_inner(),
    })
}

/// The workers' sessions, connected as the main session is.
fn connect(name: &str, workers: &Workers) -> Result<Vec<Session>> {
    (0..workers.jobs)
        .map(|_| {
            crate::db::connect(&workers.params).map_err(|e| {
                e.context(format!(
                    "opening a connection for a worker of {name} (--jobs {})",
                    workers.jobs
                ))
            })
        })
        .collect()
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
    lock_pid: i32,
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
        let mut pace = Pace::new();
        loop {
            let Some(slice) = queue.lock().expect("queue").pop_front() else {
                return Ok(());
            };
            let mut checkpoint = slice.checkpoint;
            while checkpoint < slice.hi {
                if stop.load(Ordering::Relaxed) || crate::signals::requested().is_some() {
                    return Ok(());
                }
                let options = &super::steer::before_batch(
                    client,
                    self.run_id,
                    &format!(
                        "run {} of {} (worker {})",
                        self.run_id, self.name, self.number
                    ),
                    self.options,
                    &|| stop.load(Ordering::Relaxed) || crate::signals::requested().is_some(),
                    &mut |line| crate::say!("{line}"),
                )?;
                if stop.load(Ordering::Relaxed) || crate::signals::requested().is_some() {
                    return Ok(());
                }
                let targets = Targets {
                    lo: checkpoint,
                    hi: (checkpoint + pace.size()).min(slice.hi),
                    in_ranges: true,
                    merge: false,
                };
                let done = batch::run(
                    client,
                    self.engine,
                    self.name,
                    self.run_id,
                    options,
                    Checkpoint::Slice {
                        slice: slice.slice,
                        worker: self.number,
                        lock_pid: self.lock_pid,
                        ours: self.ours,
                    },
                    targets,
                )?;
                counts
                    .times
                    .lock()
                    .expect("times")
                    .push(done.in_transaction.as_millis() as u64);
                checkpoint = targets.hi;
                counts
                    .done
                    .fetch_add(targets.hi - targets.lo, Ordering::Relaxed);
                counts
                    .changed
                    .fetch_add(done.result.changed, Ordering::Relaxed);
                counts
                    .blocking
                    .fetch_add(u64::from(done.waiting > 0), Ordering::Relaxed);
                neighbour::sleep(pace.after(options, targets, &done, true));
            }
        }
    }
}
