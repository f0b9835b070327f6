//! Crowding: whether pgmend takes CPU the application is waiting for (issue 36, `--load`).
//!
//! No health signal of [`super::health`] sees CPU: on a server whose cores pgmend's workers
//! and index builds fill, the application's statements wait for a core, and its latency grows
//! while every lock, replica and WAL signal stays quiet. PostgreSQL cannot say how many cores it
//! has, so pgmend measures two things on its main session:
//!
//! - **the application at work**: client backends of the run's database that are not pgmend's
//!   (another `application_name`) running a statement now (`pg_stat_activity.state = 'active'`)
//!   or done with one less than a second ago (`state_change`);
//!   a role without `pg_read_all_stats` sees other roles' sessions without their state, and such a
//!   session counts as possibly at work ([`AppSessions::maybe_active`]);
//! - **the probe**: the server's own execution time of a fixed statement that is pure CPU in one
//!   backend (`SELECT count(*) FROM generate_series(1, 50000)`, about 4 ms on a free core, read from
//!   `EXPLAIN (ANALYZE, TIMING OFF)`'s `Execution Time` line, so the network is not in it). Measured
//!   before the workers start (the least of five) and again every half second.
//!
//! [`crowded`] (pure) says "slow down" when the application was seen at work in the last
//! [`APP_RECENT`] and half of the last [`PROBES`] probes or more took at least
//! `--max-cpu-slowdown` (default 1.5) times the baseline. Half, not the median's average: the
//! scheduler runs a backend that wakes up at once most of the time, and a full server shows as
//! some probes held for a whole time slice (2 ms becoming 10 ms), which is what the
//! application's slowest statements meet too. `--jobs auto` then removes a worker and never adds it back
//! in this process ([`ceiling`]): on a server with cores to spare the probe does not slow down
//! and nothing changes; on one whose cores the workers fill it does, and one worker fewer gives
//! the application a core back. It never pauses a run: one worker leaves the other cores free.
//! Without the application at work (a maintenance window, the benchmark without `--load`) the
//! probe is not consulted, so workers that fill an idle server's cores are kept. With the
//! application at work as a walk starts ([`Watch::app_at_start`]), `--jobs auto` starts with
//! one worker instead of two, and adds the second only when the probes show room for it (two
//! workers for the first window crowded out as many of the application's statements as the
//! rest of the void, `docs/benchmark.md`).
//!
//! An index build asks for parallel maintenance workers only while no application session is
//! at work ([`app_at_work`]: seen so right before the build, or by a walk or an earlier build
//! in the last [`APP_RECENT`]): otherwise it runs with the server's own
//! settings, as the same statement run by hand would, or with no parallel worker at all when
//! the workers crowded the application out earlier in this process (`online::parallel`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::error::PgContext;

/// How long a session of the application seen at work counts as the application at work.
pub const APP_RECENT: Duration = Duration::from_secs(10);
/// The probes whose upper median is compared with the baseline.
pub const PROBES: usize = 4;

/// The probe: pure CPU in one backend, about 4 ms on a free core.
const PROBE_SQL: &str =
    "EXPLAIN (ANALYZE, TIMING OFF) SELECT count(*) FROM generate_series(1, 50000)";

/// The application's sessions of this database, as one reading saw them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppSessions {
    /// Running a statement now, or done with one less than a second ago (`state_change`: a
    /// session busy a tenth of the time is seen by one reading, where the state alone would
    /// miss it nine times in ten).
    pub active: i64,
    /// Sessions of other roles whose state this role may not read.
    pub hidden: i64,
}

impl AppSessions {
    /// At work, or perhaps at work (a session whose state is hidden).
    pub fn maybe_active(&self) -> bool {
        self.active > 0 || self.hidden > 0
    }
}

/// Reads the application's sessions of the current database on `client`.
pub fn app_sessions(client: &mut postgres::Client) -> Result<AppSessions> {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'active' OR state_change > clock_timestamp() - interval '1 second'),
                    count(*) FILTER (WHERE state IS NULL)
               FROM pg_stat_activity
              WHERE datname = current_database() AND backend_type = 'client backend'
                AND pid <> pg_backend_pid()
                AND application_name IS DISTINCT FROM current_setting('application_name')",
            &[],
        )
        .doing("reading the application's sessions (pg_stat_activity)")?;
    Ok(AppSessions {
        active: row.get(0),
        hidden: row.get(1),
    })
}

/// Whether the application is at work, for an index build: its sessions that
/// [`app_sessions`] sees at work, or 1 when a walk's watch or an earlier build saw it in the
/// last [`APP_RECENT`]. Sessions whose state is hidden do not count here: a build by a role
/// without `pg_read_all_stats` takes the spare worker processes as before.
pub fn app_at_work(client: &mut postgres::Client) -> Result<Option<i64>> {
    let seen = app_sessions(client)?.active;
    if seen > 0 {
        note_app_seen();
        return Ok(Some(seen));
    }
    Ok(app_seen_recently().then_some(1))
}

/// When this process last saw the application at work.
static APP_SEEN: Mutex<Option<Instant>> = Mutex::new(None);

fn note_app_seen() {
    *APP_SEEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
}

fn app_seen_recently() -> bool {
    APP_SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|t| t.elapsed() < APP_RECENT)
}

/// The probe's execution time on the server, in milliseconds.
pub fn probe_ms(client: &mut postgres::Client) -> Result<f64> {
    let lines = client
        .query(PROBE_SQL, &[])
        .doing("timing the CPU probe (EXPLAIN ANALYZE)")?;
    Ok(lines
        .iter()
        .filter_map(|row| execution_ms(row.get(0)))
        .next()
        .unwrap_or(0.0))
}

/// The milliseconds of EXPLAIN ANALYZE's `Execution Time: 1.234 ms` line.
fn execution_ms(line: &str) -> Option<f64> {
    line.trim()
        .strip_prefix("Execution Time:")?
        .trim()
        .strip_suffix("ms")?
        .trim()
        .parse()
        .ok()
}

/// Why the workers crowd the application out, if they do: it was seen at work recently and
/// half of the last probes or more (`slow`, their upper median) took at least `limit` times
/// the `baseline`.
pub fn crowded(limit: f64, baseline: f64, slow: f64, app_recent: bool) -> Option<String> {
    if !app_recent || baseline <= 0.0 || slow < baseline * limit {
        return None;
    }
    Some(format!(
        "the application is at work and the server's CPUs are full (half of the last probes ran {:.1}x as long as before the batches or longer; --max-cpu-slowdown {})",
        slow / baseline,
        limit
    ))
}

/// The probe's readings during a walk, and when the application was last seen at work.
#[derive(Debug)]
pub struct Watch {
    limit: f64,
    baseline: f64,
    recent: VecDeque<f64>,
    app_seen: Option<Instant>,
    app_at_start: bool,
}

impl Watch {
    /// Measures the baseline (the least of five probes) before the workers start, and whether
    /// the application is at work then (sessions seen at work: one whose state this role may
    /// not read, an idle pool's as likely as not, does not count here).
    pub fn start(client: &mut postgres::Client, limit: f64) -> Result<Watch> {
        let app_at_start = app_sessions(client)?.active > 0;
        if app_at_start {
            note_app_seen();
        }
        let mut baseline = f64::MAX;
        for _ in 0..5 {
            baseline = baseline.min(probe_ms(client)?);
        }
        Ok(Watch {
            limit,
            baseline,
            recent: VecDeque::new(),
            app_seen: app_at_start.then(Instant::now),
            app_at_start,
        })
    }

    /// Whether the application was at work as the watch started.
    pub fn app_at_start(&self) -> bool {
        self.app_at_start
    }

    /// Forgets the probes taken before the number of workers changed (the next window is
    /// measured afresh).
    pub fn forget(&mut self) {
        self.recent.clear();
    }

    /// One reading (every half second): the application's sessions and the probe. Returns why
    /// the workers crowd the application out, if they do ([`crowded`]).
    pub fn look(&mut self, client: &mut postgres::Client) -> Result<Option<String>> {
        if app_sessions(client)?.maybe_active() {
            self.app_seen = Some(Instant::now());
            note_app_seen();
        }
        self.recent.push_back(probe_ms(client)?);
        while self.recent.len() > PROBES {
            self.recent.pop_front();
        }
        let app_recent = self.app_seen.is_some_and(|t| t.elapsed() < APP_RECENT);
        Ok(crowded(
            self.limit,
            self.baseline,
            upper_median(&self.recent),
            app_recent,
        ))
    }
}

/// The upper median: the value that half of `values` or more reach (of four, the second
/// slowest), 0 for none.
fn upper_median(values: &VecDeque<f64>) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The fewest of the numbers of workers recorded in this process: what a later run of
/// `--jobs auto` stays below. Kept for the process because the release's runs work on the same
/// server one after the other; `repair::controller` keeps one too, for workers that did not pay.
#[derive(Debug, Default)]
pub struct Fewest(AtomicUsize);

impl Fewest {
    /// Nothing recorded yet (0 stands for that: a number of workers is at least 1).
    pub const fn new() -> Fewest {
        Fewest(AtomicUsize::new(0))
    }

    /// Keeps `workers` if fewer than what is kept (0 is no number of workers: ignored).
    pub fn record(&self, workers: usize) {
        if workers == 0 {
            return;
        }
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(match now {
                    0 => workers,
                    now => now.min(workers),
                })
            });
    }

    pub fn get(&self) -> Option<usize> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

/// The number of workers that crowded the application out in this process: a later run's
/// `--jobs auto` stays below it, and index builds and sums take no parallel workers.
static CEILING: Fewest = Fewest::new();

pub fn ceiling() -> Option<usize> {
    CEILING.get()
}

/// Records that `workers` crowded the application out.
pub fn record_ceiling(workers: usize) {
    CEILING.record(workers);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_keeps_the_fewest_number_recorded() {
        let fewest = Fewest::new();
        assert_eq!(fewest.get(), None);
        fewest.record(0);
        assert_eq!(fewest.get(), None, "0 is no number of workers");
        fewest.record(3);
        fewest.record(4);
        assert_eq!(fewest.get(), Some(3));
        fewest.record(2);
        fewest.record(0);
        assert_eq!(fewest.get(), Some(2));
    }

    #[test]
    fn the_workers_crowd_only_an_application_at_work_on_a_slowed_probe() {
        // No application seen: a probe three times slower is pgmend's own cores, kept.
        assert_eq!(crowded(1.5, 1.0, 3.0, false), None);
        // The application at work, the probe under the limit: cores to spare.
        assert_eq!(crowded(1.5, 1.0, 1.4, true), None);
        let why = crowded(1.5, 1.0, 1.5, true).expect("at the limit");
        assert!(
            why.contains("ran 1.5x as long as before the batches or longer"),
            "{why}"
        );
        assert!(why.contains("--max-cpu-slowdown 1.5"), "{why}");
        // A baseline that could not be measured says nothing.
        assert_eq!(crowded(1.5, 0.0, 3.0, true), None);
    }

    #[test]
    fn one_slow_probe_of_four_is_noise_two_are_a_crowd() {
        let v: VecDeque<f64> = [1.0, 9.0, 1.2, 1.1].into_iter().collect();
        assert_eq!(upper_median(&v), 1.2);
        let v: VecDeque<f64> = [1.0, 9.0, 1.2, 3.0].into_iter().collect();
        assert_eq!(upper_median(&v), 3.0);
        let v: VecDeque<f64> = [1.0, 9.0, 1.2].into_iter().collect();
        assert_eq!(upper_median(&v), 1.2);
        assert_eq!(upper_median(&VecDeque::new()), 0.0);
    }

    #[test]
    fn the_execution_time_line_gives_the_probe() {
        assert_eq!(execution_ms("Execution Time: 1.234 ms"), Some(1.234));
        assert_eq!(execution_ms("Planning Time: 0.1 ms"), None);
        assert_eq!(
            execution_ms("Aggregate  (cost=0.00..1.00 rows=1 width=8)"),
            None
        );
    }

    #[test]
    fn hidden_sessions_may_be_at_work() {
        assert!(!AppSessions::default().maybe_active());
        assert!(AppSessions {
            active: 0,
            hidden: 2
        }
        .maybe_active());
        assert!(AppSessions {
            active: 1,
            hidden: 0
        }
        .maybe_active());
    }
}
