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
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::batch::{self, Checkpoint, Pace, Progress, Tally, Targets};
use super::controller::{self, Controller, Decision, Observation};
use super::definition::Repair;
use super::engine::Engine;
use super::neighbour;
use super::options::{RunOptions, Workers, BATCH_TARGET_AT_WORK};
use crate::db::Session;
use crate::store::slices::{self, Slice};
use crate::store::Run;

/// Slices per worker.
const SLICES_PER_WORKER: usize = 4;

/// What the start line of a walk under `--jobs auto` adds for an application at work as it
/// starts: one worker to start with (when `max` allows more) and the shorter batches
/// (`batch_target`: None when `--batch-target` chose them).
fn at_work_words(app_at_start: bool, max: usize, batch_target: Option<Duration>) -> String {
    if !app_at_start {
        return String::new();
    }
    let one = (max > 1).then(|| "one to start with".to_string());
    let batches = batch_target.map(|t| format!("batches of about {}", crate::human::duration(t)));
    let both: Vec<String> = one.into_iter().chain(batches).collect();
    if both.is_empty() {
        return String::new();
    }
    format!(", {} while the application is at work", both.join(" and "))
}

/// Opens the workers' sessions, connected as the main session is, and walks what is left of
/// `run` with them, to the end or to a stop; the sessions close when the walk ends. With
/// `--jobs auto` the controller ([`super::controller`]) decides every [`WINDOW`] how many of
/// the `workers.jobs` work: a worker added connects then, a worker removed hands its slice back
/// after its batch and closes its connection.
pub(super) fn walk(
    engine: &Engine,
    repair: &Repair,
    run: &Run,
    options: &RunOptions,
    workers: &Workers,
    main: &mut postgres::Client,
    progress: &mut dyn FnMut(&str),
) -> Result<Tally> {
    let name = repair.name.as_str();
    let tables = repair.tables();
    // With `--jobs auto`, whether the workers crowd the application out of the CPUs: the probe's
    // baseline is measured before they start.
    // It is advice: a probe that fails leaves the CPU unwatched, with a line.
    let mut cpu = match (workers.auto, options.health.cpu_slowdown.limit) {
        (true, Some(limit)) => {
            match crate::db::crowding::Watch::start(main, f64::from(limit) / 100.0) {
                Ok(w) => Some(w),
                Err(e) => {
                    progress(&unwatched_cpu(&e));
                    None
                }
            }
        }
        _ => None,
    };
    // With the application at work, one worker to start with: a second one is added only when
    // the probes show the CPUs have room for it (a crowd at one worker sets the ceiling at
    // one), instead of crowding the application out for a window first.
    let app_at_start = cpu
        .as_ref()
        .is_some_and(crate::db::crowding::Watch::app_at_start);
    // And shorter batches, unless --batch-target says otherwise: the application's writes wait
    // for fewer and shorter row locks.
    let at_work;
    let options = if app_at_start && !options.batch_target_given {
        at_work = RunOptions {
            batch_target: options.batch_target.min(BATCH_TARGET_AT_WORK),
            ..options.clone()
        };
        &at_work
    } else {
        options
    };
    // Below what crowded the application out, or did not pay, in an earlier run of the process
    // (`unpaid`: when that is the lower of the two).
    let crowd = crate::db::crowding::ceiling();
    let unpaid = controller::remembered_unpaid()
        .filter(|&n| n <= workers.jobs && crowd.is_none_or(|c| n < c));
    let mut controller = workers.auto.then(|| {
        Controller::new(
            if app_at_start { 1 } else { 2 },
            workers.jobs,
            unpaid.or(crowd),
        )
    });
    let mut crowded: Option<String> = None;
    let start = controller
        .as_ref()
        .map_or(workers.jobs, Controller::workers);
    let sessions = connect(name, workers, start)?;
    progress(&format!(
        "{name}: {}, each on its own connection, over ranges of the run's targets{}",
        crate::human::count(start as i64, "worker"),
        if workers.auto {
            format!(
                " (--jobs auto: between 1 and {}{}){}",
                workers.jobs,
                match unpaid {
                    Some(n) => format!(
                        ", but {n} did not pay for the worker added in an earlier run of this process: at most {}",
                        n - 1
                    ),
                    None => String::new(),
                },
                at_work_words(
                    app_at_start,
                    workers.jobs,
                    (!options.batch_target_given).then_some(options.batch_target)
                )
            )
        } else {
            String::new()
        }
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
    let active = AtomicUsize::new(start);
    let held = AtomicUsize::new(0);
    let paused = AtomicBool::new(false);
    let mut watch = Watch::default();
    let mut stopped_by_health: Option<anyhow::Error> = None;
    // pgmend's own sessions, which wait for each other on the run's row, are no application.
    let ours: RwLock<Vec<i32>> =
        RwLock::new(sessions.iter().flatten().map(|s| s.backend_pid).collect());
    let mut shown = Progress::new(name, run.targets, done.load(Ordering::Relaxed), Some(start));
    let mut decisions: Vec<String> = Vec::new();
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let shared = Shared {
            queue: &queue,
            stop: &stop,
            active: &active,
            held: &held,
            paused: &paused,
            ours: &ours,
            counts: Counts {
                done: &done,
                changed: &changed,
                blocking: &blocking,
                times: &times,
            },
        };
        let handles: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(i, session)| {
                scope.spawn(move || {
                    let worker = Worker {
                        engine,
                        name,
                        run_id: run.run_id,
                        options,
                        workers,
                        number: i as i32 + 1,
                    };
                    let r = worker.run(session, shared);
                    if r.is_err() {
                        shared.stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut window = (
            Instant::now(),
            done.load(Ordering::Relaxed),
            blocking.load(Ordering::Relaxed),
        );
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            shown.show(
                (done.load(Ordering::Relaxed), run.targets),
                changed.load(Ordering::Relaxed),
                None,
                progress,
            );
            // The server's health, every 500 ms on the main session (which runs no batch): a
            // signal removes workers (auto), and pauses the batches once one is left (or with a
            // fixed number), up to the pause limit.
            if watch.due() && stopped_by_health.is_none() && !stop.load(Ordering::Relaxed) {
                let alone = controller.as_ref().is_none_or(|c| c.workers() == 1);
                let mut by_request = false;
                let looked = crate::store::runs::steering(main, run.run_id).and_then(|asked| {
                    if asked.paused.is_some() {
                        // Paused by a request: the pause is the user's, not the server's.
                        watch.rest();
                        by_request = true;
                        return Ok(false);
                    }
                    watch.look(main, &options.health, &tables, alone, progress)
                });
                // The CPU while the workers work (not while a request pauses them).
                crowded = None;
                if let (Some(w), false, true) = (cpu.as_mut(), by_request, looked.is_ok()) {
                    match w.look(main) {
                        Ok(why) => crowded = why,
                        Err(e) => {
                            progress(&unwatched_cpu(&e));
                            cpu = None;
                        }
                    }
                }
                match looked {
                    Ok(pause) => paused.store(pause, Ordering::Relaxed),
                    Err(e) => {
                        stopped_by_health = Some(e);
                        stop.store(true, Ordering::Relaxed);
                        paused.store(false, Ordering::Relaxed);
                    }
                }
            }
            let Some(c) = controller.as_mut() else {
                continue;
            };
            if window.0.elapsed() < WINDOW {
                continue;
            }
            let (now_done, now_blocking) = (
                done.load(Ordering::Relaxed),
                blocking.load(Ordering::Relaxed),
            );
            let throughput = (now_done - window.1) as f64 / window.0.elapsed().as_secs_f64();
            let observation = Observation {
                throughput,
                slow_down: watch.signal.clone().or_else(|| {
                    (now_blocking > window.2).then(|| {
                        format!(
                            "{} made the application's sessions wait",
                            crate::human::count((now_blocking - window.2) as i64, "batch|batches")
                        )
                    })
                }),
                crowded: crowded.clone(),
                windows_left: (throughput > 0.0)
                    .then(|| (run.targets - now_done) as f64 / (throughput * WINDOW.as_secs_f64())),
            };
            window = (Instant::now(), now_done, now_blocking);
            let before = c.workers();
            let unpaid_before = c.unpaid();
            let decision = c.observe(&observation);
            if let (Some(n), None) = (c.unpaid(), unpaid_before) {
                // Later runs of this process do not try it again, if every worker had a slice
                // all through the window: at a run's tail the worker added may have had none.
                if queue.lock().expect("queue").len() >= n {
                    controller::remember_unpaid(n);
                }
            }
            if observation.crowded.is_some() && c.ceiling() <= workers.jobs {
                // Later runs of this process start below it.
                crate::db::crowding::record_ceiling(c.ceiling());
            }
            active.store(c.workers(), Ordering::Relaxed);
            let why = match decision {
                Decision::Hold => continue,
                Decision::Add(why) | Decision::Remove(why) => why,
            };
            // The next window's probes are the new number's.
            if let Some(w) = cpu.as_mut() {
                w.forget();
            }
            shown.set_workers(c.workers());
            let line = format!("{name}: workers {before} -> {}: {why}", c.workers());
            progress(&line);
            decisions.push(line);
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
    if let Some(e) = stopped_by_health {
        return Err(e);
    }
    Ok(Tally {
        interrupted: crate::signals::requested().is_some(),
        times: times.into_inner().expect("times"),
        blocking: blocking.into_inner(),
        decisions,
    })
}

/// The line for a CPU probe that failed: the run goes on without that watch.
fn unwatched_cpu(e: &anyhow::Error) -> String {
    format!("note: the application's CPU is not watched in this run (--max-cpu-slowdown): {e:#}")
}

/// Nothing is left to walk: the queue is empty and no worker holds a slice (read under the
/// queue's lock, which every hand-back and every release of a slice takes).
fn nothing_left(shared: Shared) -> bool {
    let queue = shared.queue.lock().expect("queue");
    queue.is_empty() && shared.held.load(Ordering::Relaxed) == 0
}

/// Puts `slice` back at the front of the queue and lets go of it, in one hold of the lock.
fn hand_back(shared: Shared, slice: Slice) {
    let mut queue = shared.queue.lock().expect("queue");
    queue.push_front(slice);
    shared.held.fetch_sub(1, Ordering::Relaxed);
}

/// The workers' watch on the server's health ([`super::health`]).
#[derive(Default)]
struct Watch {
    last: Option<Instant>,
    /// The signal that says pause now, in words.
    signal: Option<String>,
    /// Since when the batches pause, and the signals announced.
    since: Option<Instant>,
    announced: Vec<super::health::Signal>,
}

impl Watch {
    /// The run is paused by a request: no health pause is counted meanwhile.
    fn rest(&mut self) {
        self.since = None;
        self.announced.clear();
        self.signal = None;
    }

    fn due(&mut self) -> bool {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(500))
        {
            return false;
        }
        self.last = Some(Instant::now());
        true
    }

    /// Reads the signals; returns whether the batches pause now (a signal says so and one
    /// worker is left: `alone`). A pause past the limit is an error ([`crate::error::Stopped`]).
    fn look(
        &mut self,
        main: &mut postgres::Client,
        health: &super::health::Health,
        tables: &[String],
        alone: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<bool> {
        let readings = super::health::readings(main, health, tables)?;
        let pause = super::health::verdict(health, &readings);
        self.signal = pause.as_ref().map(|p| p.words.clone());
        let Some(pause) = pause.filter(|_| alone) else {
            if let Some(since) = self.since.take() {
                progress(&format!(
                    "resuming after a pause of {}: the server's health signals are back under their thresholds",
                    crate::human::duration(since.elapsed())
                ));
                self.announced.clear();
            }
            return Ok(false);
        };
        let since = *self.since.get_or_insert_with(Instant::now);
        if !self.announced.contains(&pause.signal) {
            progress(&format!("pausing: {}", pause.words));
            self.announced.push(pause.signal);
        }
        if since.elapsed() >= health.pause_limit {
            return Err(crate::error::Stopped::error(format!(
                "the batches paused for {} on {}, the limit (--health-pause-limit {}): {}. Every batch so far committed with its checkpoint; rerun the same command to resume once the server recovers, or raise {} or --health-pause-limit",
                crate::human::duration(since.elapsed()),
                pause.signal.name(),
                crate::human::duration(health.pause_limit),
                pause.words,
                pause.signal.option()
            )));
        }
        Ok(true)
    }
}

/// How often `--jobs auto` decides.
const WINDOW: Duration = Duration::from_secs(2);

/// The workers' sessions, connected as the main session is: the first `now` at once (so that a
/// server that refuses them stops the run before its first batch), the others when they start.
fn connect(name: &str, workers: &Workers, now: usize) -> Result<Vec<Option<Session>>> {
    (0..workers.jobs)
        .map(|i| {
            if i >= now {
                return Ok(None);
            }
            open(name, workers).map(Some)
        })
        .collect()
}

fn open(name: &str, workers: &Workers) -> Result<Session> {
    crate::db::connect(&workers.params).map_err(|e| {
        e.context(format!(
            "opening a connection for a worker of {name} (--jobs {})",
            if workers.auto {
                "auto".to_string()
            } else {
                workers.jobs.to_string()
            }
        ))
    })
}

/// What the workers share: the queue of slices, the stop, how many work now (`active`: worker
/// `n` works while `n <= active`), how many slices are held by a worker, pgmend's backends, the
/// counts.
#[derive(Clone, Copy)]
struct Shared<'a> {
    queue: &'a Mutex<VecDeque<Slice>>,
    stop: &'a AtomicBool,
    active: &'a AtomicUsize,
    held: &'a AtomicUsize,
    /// A health signal pauses the batches ([`Watch`]).
    paused: &'a AtomicBool,
    ours: &'a RwLock<Vec<i32>>,
    counts: Counts<'a>,
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
    workers: &'a Workers,
    number: i32,
}

impl Worker<'_> {
    fn stopping(&self, shared: Shared) -> bool {
        shared.stop.load(Ordering::Relaxed) || crate::signals::requested().is_some()
    }

    fn working(&self, shared: Shared) -> bool {
        self.number as usize <= shared.active.load(Ordering::Relaxed)
    }

    /// Takes slices while it is one of the workers at work, until none is left (or a stop).
    /// A worker told to rest hands its slice back and closes its connection; it waits while
    /// another holds a slice, which may come back to the queue.
    fn run(&self, mut session: Option<Session>, shared: Shared) -> Result<()> {
        // One pace per worker, kept from slice to slice: a slice taken back from a worker
        // removed does not start again from batches of one target.
        let mut pace = Pace::new();
        loop {
            if self.stopping(shared) {
                return Ok(());
            }
            if !self.working(shared) {
                if let Some(s) = session.take() {
                    shared
                        .ours
                        .write()
                        .expect("ours")
                        .retain(|p| *p != s.backend_pid);
                }
                // Read under the queue's lock: a slice handed back is in the queue before its
                // holder lets go of it.
                if nothing_left(shared) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            let slice = {
                let mut queue = shared.queue.lock().expect("queue");
                let slice = queue.pop_front();
                if slice.is_some() {
                    shared.held.fetch_add(1, Ordering::Relaxed);
                }
                slice
            };
            let Some(slice) = slice else {
                if nothing_left(shared) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            if session.is_none() {
                match open(self.name, self.workers) {
                    Ok(s) => {
                        shared.ours.write().expect("ours").push(s.backend_pid);
                        session = Some(s);
                    }
                    Err(e) => {
                        hand_back(shared, slice);
                        if self.workers.auto {
                            // A worker `auto` added that the server will not serve now is no
                            // reason to stop the run: the others go on without it.
                            crate::say!(
                                "{}: worker {} could not connect, so the run goes on without it: {e:#}",
                                self.name,
                                self.number
                            );
                            return Ok(());
                        }
                        return Err(e);
                    }
                }
            }
            let client = &mut session.as_mut().expect("connected").client;
            let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.walk_slice(client, &slice, shared, &mut pace)
            }))
            .unwrap_or_else(|_| {
                Err(anyhow!(
                    "{}: batch worker {} panicked",
                    self.name,
                    self.number
                ))
            });
            match &walked {
                Ok(Some(checkpoint)) => hand_back(
                    shared,
                    Slice {
                        checkpoint: *checkpoint,
                        ..slice
                    },
                ),
                _ => {
                    let _queue = shared.queue.lock().expect("queue");
                    shared.held.fetch_sub(1, Ordering::Relaxed);
                }
            }
            walked?;
        }
    }

    /// Walks `slice` from its checkpoint; returns where it stopped when told to rest (None:
    /// done, or a stop).
    fn walk_slice(
        &self,
        client: &mut postgres::Client,
        slice: &Slice,
        shared: Shared,
        pace: &mut Pace,
    ) -> Result<Option<i64>> {
        let counts = shared.counts;
        let mut checkpoint = slice.checkpoint;
        while checkpoint < slice.hi {
            if self.stopping(shared) {
                return Ok(None);
            }
            if !self.working(shared) {
                return Ok(Some(checkpoint));
            }
            let stop = || self.stopping(shared);
            let options = &super::steer::before_batch(
                client,
                self.run_id,
                &format!(
                    "run {} of {} (worker {})",
                    self.run_id, self.name, self.number
                ),
                self.options,
                &stop,
                &mut |line| crate::say!("{line}"),
            )?;
            // A health pause, after the requests (as the single stream waits).
            while shared.paused.load(Ordering::Relaxed) && !self.stopping(shared) {
                std::thread::sleep(Duration::from_millis(100));
            }
            if self.stopping(shared) {
                return Ok(None);
            }
            let targets = Targets {
                lo: checkpoint,
                hi: (checkpoint + pace.size()).min(slice.hi),
                in_ranges: true,
                merge: false,
            };
            let ours = shared.ours.read().expect("ours").clone();
            let (targets, done) = batch::run_splitting(
                client,
                self.engine,
                self.name,
                self.run_id,
                options,
                Checkpoint::Slice {
                    slice: slice.slice,
                    worker: self.number,
                    lock_pid: self.workers.lock_pid,
                    ours: &ours,
                },
                targets,
                &mut |line| crate::say!("{line}"),
            )?;
            pace.at_most(targets.hi - targets.lo);
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
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::at_work_words;

    #[test]
    fn the_start_line_says_what_an_application_at_work_changed() {
        let ms100 = Some(Duration::from_millis(100));
        assert_eq!(at_work_words(false, 4, ms100), "");
        assert_eq!(
            at_work_words(true, 4, ms100),
            ", one to start with and batches of about 100ms while the application is at work"
        );
        assert_eq!(
            at_work_words(true, 4, None),
            ", one to start with while the application is at work"
        );
        assert_eq!(
            at_work_words(true, 1, ms100),
            ", batches of about 100ms while the application is at work"
        );
        assert_eq!(at_work_words(true, 1, None), "");
    }
}
