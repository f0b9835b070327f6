//! `--jobs auto`: how many batch workers a run in ranges keeps, decided every window from what
//! the workers did in it. Pure: it takes observations and returns decisions, so its rules are
//! unit-tested on sequences of measurements ([`Controller::observe`]).
//!
//! The rules, in order, once per window (a window right after a change only warms up: its
//! throughput is not counted, as new workers start with small batches):
//! 1. A health signal (a session waited on a batch, or `repair::health` says slow down) removes
//!    a worker, down to one, and no worker is added for [`COOLDOWN`] windows. The workers
//!    crowding the application out of the CPUs (`db::crowding`) removes one too, and that
//!    number becomes the ceiling: it is not tried again.
//! 2. A throughput below [`FALL`] of the best seen at this number of workers, two windows in
//!    a row, removes a worker (the server is busier than it was), and every measure taken
//!    before is forgotten (a slower server is measured again, so it does not make the number
//!    swing). Windows without progress (a paused run) are not counted, and after
//!    [`MAX_CHANGES`] changes the number stays.
//! 3. The first measure at a number of workers that is not above the one before it by at least
//!    [`GAIN`] (the worker added did not pay for its connection) removes that worker again, and
//!    that number becomes the ceiling.
//! 4. Otherwise, below the ceiling and the maximum, a worker is added, when more than
//!    [`TRIAL_WINDOWS`] windows of work would be left at the new number's best throughput (the
//!    last window's, times `(n + 1) / n`): a worker added later could not be judged before the
//!    run ends.
//!
//! Throughput is targets per second (ranges of about the same number of rows each), smoothed
//! over the windows at the same number of workers.
//!
//! A number of workers that did not pay (rule 3), three or more, is remembered for the process
//! ([`remember_unpaid`]): the release's later runs work on the same server, and a trial costs
//! two windows at the slower number (about a second of a 10-s step on two cores). Their
//! controllers start with it as their ceiling ([`remembered_unpaid`]). A second worker is
//! always tried again.

use std::collections::BTreeMap;

use crate::db::crowding::Fewest;

/// What a worker added must bring: 10% more throughput than one fewer gave.
pub const GAIN: f64 = 0.10;
/// A throughput below 70% of the best at the same number of workers is a fall.
pub const FALL: f64 = 0.70;
/// Windows without adding a worker after a health signal removed one.
pub const COOLDOWN: u32 = 5;
/// What a worker added costs before it is judged: a window to warm up and one to measure. With
/// no more than this left at the number of workers it makes (at best as much faster as it adds
/// workers), it could only finish the run unmeasured (on a full server, slower).
pub const TRIAL_WINDOWS: f64 = 2.0;
/// Changes after which the number of workers stays where it is (a run whose server keeps
/// changing speed does not swing for ever).
pub const MAX_CHANGES: u32 = 16;

/// What the workers did in one window.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Targets per second in the window.
    pub throughput: f64,
    /// A reason to slow down, in words, if the server gave one.
    pub slow_down: Option<String>,
    /// Why the workers crowd the application out of the CPUs, if they do
    /// (`db::crowding::crowded`).
    pub crowded: Option<String>,
    /// How many windows the targets left would take at this window's throughput (None:
    /// unknown). A worker is added only when more than [`TRIAL_WINDOWS`] would be left at one
    /// more worker's best (rule 4).
    pub windows_left: Option<f64>,
}

/// What the controller decided after a window: the number of workers to keep, and why it
/// changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Hold,
    Add(String),
    Remove(String),
}

#[derive(Debug, Clone)]
pub struct Controller {
    max: usize,
    workers: usize,
    /// Smoothed throughput per number of workers (measured windows only).
    seen: BTreeMap<usize, f64>,
    /// The best smoothed throughput per number of workers.
    best: BTreeMap<usize, f64>,
    /// No number of workers at or above this is tried (the maximum plus one, until a worker
    /// added did not pay).
    ceiling: usize,
    /// The number of workers whose measure did not pay for the worker added (rule 3), if one
    /// did in this run.
    unpaid: Option<usize>,
    warming: bool,
    cooldown: u32,
    falls: u32,
    changes: u32,
}

/// The fewest workers that did not pay in an earlier run of this process.
static UNPAID: Fewest = Fewest::new();

/// Remembers for the process's later runs that `workers` did not pay ([`Controller::unpaid`]),
/// measured while every one of them had work (the caller's to know: at a run's tail the worker
/// added may have had none).
pub fn remember_unpaid(workers: usize) {
    remember_in(&UNPAID, workers);
}

/// Only three or more: a later run can always try a second worker.
fn remember_in(memory: &Fewest, workers: usize) {
    if workers >= 3 {
        memory.record(workers);
    }
}

/// The fewest workers that did not pay in an earlier run of this process.
pub fn remembered_unpaid() -> Option<usize> {
    UNPAID.get()
}

impl Controller {
    /// Starts at `start` workers (at most `max`), below `ceiling` when one is given (a number
    /// of workers that crowded the application out, or did not pay, earlier in this process).
    pub fn new(start: usize, max: usize, ceiling: Option<usize>) -> Controller {
        let max = max.max(1);
        let ceiling = ceiling.map_or(max + 1, |c| c.clamp(2, max + 1));
        Controller {
            max,
            workers: start.clamp(1, max).min(ceiling - 1),
            seen: BTreeMap::new(),
            best: BTreeMap::new(),
            ceiling,
            unpaid: None,
            warming: true,
            cooldown: 0,
            falls: 0,
            changes: 0,
        }
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// No number of workers at or above this is tried.
    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// The number of workers that did not pay for the worker added in this run (rule 3).
    pub fn unpaid(&self) -> Option<usize> {
        self.unpaid
    }

    /// Takes one window's observation and returns the decision; the number of workers is
    /// changed by it ([`Self::workers`]).
    pub fn observe(&mut self, o: &Observation) -> Decision {
        let n = self.workers;
        if self.changes >= MAX_CHANGES {
            return Decision::Hold;
        }
        // A window without progress and without a signal measured nothing (the run was paused
        // by a request, or every worker waited): it is not counted.
        if o.throughput <= 0.0 && o.slow_down.is_none() {
            return Decision::Hold;
        }
        if o.crowded.is_some() {
            // Never back to this number in this run (nor, through
            // `db::crowding::record_ceiling`, in the process's later runs).
            self.ceiling = self.ceiling.min(n.max(2));
        }
        if let (None, Some(why)) = (&o.slow_down, &o.crowded) {
            self.cooldown = COOLDOWN;
            if n > 1 {
                return self.change(n - 1, Decision::Remove(format!("{why}: one worker fewer")));
            }
            return Decision::Hold;
        }
        if let Some(why) = &o.slow_down {
            self.cooldown = COOLDOWN;
            if n > 1 {
                return self.change(n - 1, Decision::Remove(format!("{why}: one worker fewer")));
            }
            return Decision::Hold;
        }
        if self.warming {
            self.warming = false;
            return Decision::Hold;
        }
        let smoothed = match self.seen.get(&n) {
            Some(before) => (before + o.throughput) / 2.0,
            None => o.throughput,
        };
        let first_here = !self.seen.contains_key(&n);
        self.seen.insert(n, smoothed);
        let best = self.best.entry(n).or_insert(smoothed);
        *best = best.max(smoothed);
        let best = *best;
        if o.throughput < best * FALL && n > 1 {
            self.falls += 1;
            if self.falls >= 2 {
                // The server is slower than when the measures were taken: they are forgotten,
                // and every number of workers is measured again from here.
                self.seen.clear();
                self.best.clear();
                return self.change(
                    n - 1,
                    Decision::Remove(format!(
                        "throughput fell to {} targets/s from {} at {n} workers: one worker fewer",
                        round(o.throughput),
                        round(best)
                    )),
                );
            }
        } else {
            self.falls = 0;
        }
        if first_here && n > 1 {
            if let Some(&fewer) = self.seen.get(&(n - 1)) {
                if smoothed < fewer * (1.0 + GAIN) {
                    self.ceiling = n;
                    self.unpaid = Some(n);
                    return self.change(
                        n - 1,
                        Decision::Remove(format!(
                            "{n} workers gave {} targets/s, {} gave {}: less than {}% more for the worker added, so back to {}",
                            round(smoothed),
                            n - 1,
                            round(fewer),
                            (GAIN * 100.0).round(),
                            n - 1
                        )),
                    );
                }
            }
        }
        if self.cooldown > 0 {
            self.cooldown -= 1;
            return Decision::Hold;
        }
        // At n + 1 workers the run goes at most (n + 1) / n as fast (a worker that pays
        // shortens it): that many windows must still be left then.
        let time_to_judge = o
            .windows_left
            .is_none_or(|w| w * n as f64 / (n + 1) as f64 > TRIAL_WINDOWS);
        if n + 1 < self.ceiling && time_to_judge {
            return self.change(
                n + 1,
                Decision::Add(format!(
                    "{} targets/s at {n} workers: trying one more",
                    round(smoothed)
                )),
            );
        }
        Decision::Hold
    }

    fn change(&mut self, to: usize, decision: Decision) -> Decision {
        self.changes += 1;
        self.workers = to.clamp(1, self.max);
        self.warming = true;
        self.falls = 0;
        decision
    }
}

fn round(x: f64) -> String {
    crate::human::int(x.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::{Controller, Decision, Fewest, Observation};

    fn at(throughput: f64) -> Observation {
        Observation {
            throughput,
            slow_down: None,
            crowded: None,
            windows_left: None,
        }
    }

    fn kind(d: &Decision) -> &'static str {
        match d {
            Decision::Hold => "hold",
            Decision::Add(_) => "add",
            Decision::Remove(_) => "remove",
        }
    }

    /// Feeds `throughput(workers)` window after window; returns the decisions' kinds and the
    /// workers after each.
    fn run(
        c: &mut Controller,
        windows: usize,
        throughput: impl Fn(usize) -> f64,
    ) -> Vec<(&'static str, usize)> {
        (0..windows)
            .map(|_| {
                let d = c.observe(&at(throughput(c.workers())));
                (kind(&d), c.workers())
            })
            .collect()
    }

    #[test]
    fn it_climbs_while_a_worker_pays_and_stays_where_the_next_one_does_not() {
        // Two cores: 2 workers twice as fast as one, 3 no faster than 2.
        let mut c = Controller::new(2, 8, None);
        let speed = |n: usize| match n {
            1 => 100.0,
            2 => 190.0,
            _ => 185.0,
        };
        let decisions = run(&mut c, 12, speed);
        assert_eq!(decisions[0], ("hold", 2), "the first window warms up");
        assert_eq!(decisions[1], ("add", 3));
        assert_eq!(decisions[2], ("hold", 3), "warming up at 3");
        assert_eq!(decisions[3].0, "remove");
        assert_eq!(c.workers(), 2);
        assert!(decisions[4..].iter().all(|(_, n)| *n == 2), "{decisions:?}");
        assert_eq!(c.unpaid(), Some(3));
        // A later run of the process starts with 3 as its ceiling: it never tries 3 again.
        let mut later = Controller::new(2, 8, Some(3));
        let decisions = run(&mut later, 12, speed);
        assert!(decisions.iter().all(|d| *d == ("hold", 2)), "{decisions:?}");
    }

    #[test]
    fn no_worker_is_added_that_could_not_be_judged_before_the_run_ends() {
        let mut c = Controller::new(2, 8, None);
        let near_the_end = |windows_left: f64| Observation {
            windows_left: Some(windows_left),
            ..at(200.0)
        };
        assert_eq!(c.observe(&near_the_end(10.0)), Decision::Hold, "warming up");
        // Three windows left at two workers: a third that paid in full would leave two, and
        // finish the run before its measure.
        assert_eq!(c.observe(&near_the_end(3.0)), Decision::Hold);
        assert_eq!(c.workers(), 2);
        // More left (a run whose rate fell, say): it is tried.
        assert!(matches!(c.observe(&near_the_end(3.5)), Decision::Add(_)));
        assert_eq!(c.workers(), 3);
    }

    #[test]
    fn only_three_workers_or_more_that_did_not_pay_are_remembered() {
        // The process-wide memory (one of its own here): a later run can always try a second
        // worker; the fewest unpaid number is kept.
        use super::remember_in;
        let memory = Fewest::new();
        remember_in(&memory, 2);
        assert_eq!(memory.get(), None);
        remember_in(&memory, 5);
        assert_eq!(memory.get(), Some(5));
        remember_in(&memory, 3);
        assert_eq!(memory.get(), Some(3));
        remember_in(&memory, 4);
        assert_eq!(memory.get(), Some(3));
        remember_in(&memory, 2);
        assert_eq!(memory.get(), Some(3));
    }

    #[test]
    fn on_many_cores_it_climbs_to_the_best_number() {
        let mut c = Controller::new(2, 16, None);
        // Throughput grows to 8 workers, then falls.
        let speed = |n: usize| {
            if n <= 8 {
                100.0 * n as f64
            } else {
                800.0 - 50.0 * (n - 8) as f64
            }
        };
        run(&mut c, 40, speed);
        assert_eq!(c.workers(), 8);
    }

    #[test]
    fn never_above_the_maximum() {
        let mut c = Controller::new(2, 3, None);
        run(&mut c, 20, |n| 100.0 * n as f64);
        assert_eq!(c.workers(), 3);
        let mut one = Controller::new(2, 1, None);
        assert_eq!(one.workers(), 1);
        run(&mut one, 5, |_| 100.0);
        assert_eq!(one.workers(), 1);
    }

    #[test]
    fn a_health_signal_removes_workers_down_to_one_and_holds_a_while() {
        let mut c = Controller::new(4, 8, None);
        let slow = Observation {
            throughput: 400.0,
            slow_down: Some("3 sessions waited on a batch".into()),
            crowded: None,
            windows_left: None,
        };
        for expect in [3, 2, 1, 1] {
            let d = c.observe(&slow);
            assert_eq!(c.workers(), expect, "{d:?}");
        }
        if let Decision::Remove(why) = Controller::new(3, 8, None).observe(&slow) {
            assert!(why.starts_with("3 sessions waited on a batch"), "{why}");
        } else {
            panic!("a signal removes a worker");
        }
        // Healthy again: no worker added during the cooldown.
        let quiet = run(&mut c, super::COOLDOWN as usize, |n| 100.0 * n as f64);
        assert!(quiet.iter().all(|(k, _)| *k == "hold"), "{quiet:?}");
        let later = run(&mut c, 3, |n| 100.0 * n as f64);
        assert!(later.iter().any(|(k, _)| *k == "add"), "{later:?}");
    }

    #[test]
    fn a_server_that_got_slower_for_good_does_not_make_it_swing() {
        let mut c = Controller::new(2, 4, None);
        run(&mut c, 6, |n| 100.0 * n as f64);
        let top = c.workers();
        // From now on every number of workers gives half of what it did.
        let later = run(&mut c, 40, |n| 50.0 * n as f64);
        let changes = later.iter().filter(|(k, _)| *k != "hold").count();
        assert!(changes <= 2, "{top} workers, then {later:?}");
    }

    #[test]
    fn windows_without_progress_are_not_counted() {
        let mut c = Controller::new(2, 4, None);
        run(&mut c, 2, |n| 100.0 * n as f64);
        let n = c.workers();
        for _ in 0..20 {
            assert_eq!(c.observe(&at(0.0)), Decision::Hold);
        }
        assert_eq!(c.workers(), n);
    }

    #[test]
    fn it_stops_changing_after_the_most_changes() {
        let mut c = Controller::new(2, 3, None);
        let slow = Observation {
            throughput: 100.0,
            slow_down: Some("a signal".into()),
            crowded: None,
            windows_left: None,
        };
        let mut changes = 0;
        for i in 0..200 {
            let d = if i % 10 < 3 {
                c.observe(&slow)
            } else {
                c.observe(&at(100.0 * c.workers() as f64))
            };
            changes += usize::from(d != Decision::Hold);
        }
        assert!(changes <= super::MAX_CHANGES as usize, "{changes}");
    }

    #[test]
    fn a_throughput_that_falls_two_windows_in_a_row_removes_a_worker() {
        let mut c = Controller::new(2, 2, None);
        run(&mut c, 3, |_| 200.0);
        assert_eq!(
            c.observe(&at(100.0)),
            Decision::Hold,
            "one bad window is noise"
        );
        assert_eq!(kind(&c.observe(&at(100.0))), "remove");
        assert_eq!(c.workers(), 1);
    }

    #[test]
    fn crowding_the_application_out_removes_a_worker_for_good() {
        // Two cores: 2 workers twice as fast as one; the application at work from window 3.
        let mut c = Controller::new(2, 4, None);
        let crowded = |n: usize| Observation {
            throughput: 100.0 * n as f64,
            slow_down: None,
            crowded: Some("the application is at work and the server's CPUs are full".into()),
            windows_left: None,
        };
        run(&mut c, 2, |n| 100.0 * n as f64);
        let d = c.observe(&crowded(c.workers()));
        assert_eq!(kind(&d), "remove", "{d:?}");
        let at_most = c.workers();
        assert_eq!(c.ceiling(), at_most + 1);
        // The application gone, throughput alone would add the worker back: it is not.
        let later = run(&mut c, 30, |n| 100.0 * n as f64);
        assert!(later.iter().all(|(_, n)| *n <= at_most), "{later:?}");
        // A health signal in the same window removes the worker in its own words, and the
        // crowd still sets the ceiling.
        let mut both = Controller::new(3, 4, None);
        let d = both.observe(&Observation {
            slow_down: Some("2 batches made the application's sessions wait".into()),
            ..crowded(3)
        });
        assert!(
            matches!(&d, Decision::Remove(why) if why.starts_with("2 batches")),
            "{d:?}"
        );
        assert_eq!(both.ceiling(), 3);
        // Crowded at one worker: nothing to remove, and no worker added.
        let mut one = Controller::new(1, 4, None);
        assert_eq!(one.observe(&crowded(1)), Decision::Hold);
        run(&mut one, 20, |n| 100.0 * n as f64);
        assert_eq!(one.workers(), 1);
    }

    #[test]
    fn started_at_one_worker_it_grows_only_where_the_cpus_have_room() {
        // The application at work as the run starts: one worker. Probes that show room (no
        // crowd) let throughput add workers as from two.
        let mut roomy = Controller::new(1, 4, None);
        run(&mut roomy, 12, |n| 100.0 * n as f64);
        assert_eq!(roomy.workers(), 4);
        // Probes that show the CPUs full at one worker: it stays at one, never tries two.
        let mut full = Controller::new(1, 4, None);
        let crowded = Observation {
            throughput: 100.0,
            slow_down: None,
            crowded: Some("the application is at work and the server's CPUs are full".into()),
            windows_left: None,
        };
        assert_eq!(full.observe(&crowded), Decision::Hold);
        assert_eq!(full.ceiling(), 2);
        let later = run(&mut full, 20, |n| 100.0 * n as f64);
        assert!(later.iter().all(|(_, n)| *n == 1), "{later:?}");
    }

    #[test]
    fn a_ceiling_from_an_earlier_run_caps_the_start() {
        let mut c = Controller::new(2, 4, Some(2));
        assert_eq!(c.workers(), 1);
        run(&mut c, 20, |n| 100.0 * n as f64);
        assert_eq!(c.workers(), 1);
        assert_eq!(Controller::new(2, 8, Some(4)).workers(), 2);
    }
}
