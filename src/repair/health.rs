//! Health signals: what the server says about its own load, each a reason for the batches to
//! pause, each with a default threshold and an option that sets it or switches it `off`.
//!
//! | signal | read from | default |
//! |---|---|---|
//! | replica lag (`--max-replica-lag`) | the largest `replay_lag` in `pg_stat_replication` | 30s |
//! | archive backlog (`--max-archive-backlog`) | `pg_stat_archiver` against `pg_current_wal_lsn()`, when `archive_mode` is on | 42 segments |
//! | autovacuum (`--autovacuum-pause`) | `pg_stat_progress_vacuum` joined to `pg_stat_activity`, on the repaired tables | `wraparound` |
//! | requested checkpoints (`--max-requested-checkpoints`) | `pg_stat_bgwriter.checkpoints_req` (`pg_stat_checkpointer.num_requested` from 17), counted over the last minute, only as many as the WAL written could cause ([`caused_by_wal`]) | 2 |
//! | lock waits (`--max-lock-wait`) | `pg_locks.waitstart` of sessions that are not pgmend's | 1s |
//!
//! The CPU, which none of these sees, is `db::crowding`'s (`--max-cpu-slowdown`): it only
//! removes workers under `--jobs auto`, never pauses.
//!
//! Why these defaults: 30 s of replay lag is past what a hot standby's readers tolerate and far
//! from a failover-safe margin, while pgmend's own batches cause seconds at most; 42 segments
//! (672 MiB of 16 MiB segments) is GitLab's bound for its batched migrations, a backlog that the
//! archiver no longer keeps up with; an anti-wraparound autovacuum cannot be cancelled by lock
//! conflicts and must finish before the server runs out of transaction IDs, and every batch adds
//! dead rows for it to clean, so it goes first; an ordinary autovacuum only competes for I/O and
//! can run for hours on a large table, which would stop every run at the pause limit (`any`
//! opts in, as GitLab does); more than 2 requested checkpoints a minute is the server's own
//! "checkpoints are occurring too frequently" (`checkpoint_warning`, 30 s) — WAL is written
//! faster than `max_wal_size` absorbs, and each checkpoint starts a storm of full-page writes
//! (a checkpoint a command asked for, `CHECKPOINT` or `DROP DATABASE`, counts in the same
//! counter and says nothing of that: [`caused_by_wal`] leaves out what the WAL cannot explain);
//! an application session that has waited more than a second for a lock already shows as
//! latency, and a duration (not a count) leaves the ordinary short waits on a hot row alone.
//! Lock waits count only the lock types that contention on data makes (advisory locks are
//! application mutexes such as leader elections, `virtualxid` the waits of concurrent index
//! builds) and no session whose `application_name` is pgmend's own (its workers wait for each
//! other on the run's row).
//!
//! How the archive backlog is counted: the segments finished and not yet archived, that is
//! the number of the segment being written (`pg_walfile_name(pg_current_wal_lsn())`) minus the
//! number of `last_archived_wal`, minus one; when the last failure is newer than the last
//! success, the failed segment still waits and counts (minus its number, not one more). A
//! segment's number is its log part times (4 GiB / `wal_segment_size`) plus its segment part,
//! so timelines do not matter. Nothing archived and nothing failed since the statistics'
//! reset reads 0.
//!
//! A role reads other sessions' rows of `pg_stat_replication` and `pg_stat_progress_vacuum`
//! only as a member of `pg_read_all_stats` (or `pg_monitor`, or a superuser): otherwise the lag
//! and the vacuumed table are NULL. [`check_readable`], before the first change, makes a signal
//! the role cannot read a one-line note when its threshold is the default (the signal is then
//! not watched; replica lag only when a replica is connected), and an error (exit 2) naming the
//! signal, the missing membership and the GRANT when the user set it. A replica whose lag is not
//! known (`replay_lag` NULL while it has not replayed everything) reads as unknown, which
//! pauses, never as 0.
//!
//! [`readings`] reads every signal that has a threshold, [`verdict`] (pure) says which one
//! says pause and why, and [`wait_until_healthy`] polls every 500 ms while one does, says
//! `pausing: ...` once per signal, and after `--health-pause-limit` (10 minutes) stops with
//! [`Stopped`] (exit 1) naming the signal and its last reading. Requested checkpoints need two
//! readings a minute apart: a process-wide [`Window`] of the counter's samples gives the count.
//! Lock waits and autovacuum are read in the run's own database: a session of another database
//! waits for nothing pgmend holds.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::config::{AutovacuumPause, Threshold};
use crate::error::{PgContext, Stopped};
use crate::human;

/// How often a paused stream reads the signals again.
const POLL: Duration = Duration::from_millis(500);

/// A signal's threshold, and whether the user set it (else it is pgmend's default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting<T> {
    /// None: the signal is not watched.
    pub limit: Option<T>,
    pub explicit: bool,
}

impl<T> Setting<T> {
    /// What the command line gave (None: not given, so the default).
    pub fn given(given: Option<Threshold<T>>, default: T) -> Setting<T> {
        match given {
            None => Setting {
                limit: Some(default),
                explicit: false,
            },
            Some(t) => Setting {
                limit: t.value(),
                explicit: true,
            },
        }
    }

    fn default_at(value: T) -> Setting<T> {
        Setting::given(None, value)
    }
}

/// Every signal's threshold, and how long a pause may last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub replica_lag: Setting<Duration>,
    pub archive_backlog: Setting<i64>,
    pub autovacuum: Setting<AutovacuumPause>,
    /// Requested checkpoints in the last minute.
    pub requested_checkpoints: Setting<i64>,
    /// The longest another session may wait for a lock.
    pub lock_wait: Setting<Duration>,
    /// With `--jobs auto`: the probe's slowdown, in hundredths, at which the workers crowd the
    /// application out (`db::crowding`). It removes workers and never pauses.
    pub cpu_slowdown: Setting<u32>,
    pub pause_limit: Duration,
}

pub const DEFAULT_REPLICA_LAG: Duration = Duration::from_secs(30);
pub const DEFAULT_ARCHIVE_BACKLOG: i64 = 42;
pub const DEFAULT_REQUESTED_CHECKPOINTS: i64 = 2;
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(1);
/// `--max-cpu-slowdown`'s default, in hundredths (1.5: `db::crowding`).
pub const DEFAULT_CPU_SLOWDOWN: u32 = 150;
pub const DEFAULT_PAUSE_LIMIT: Duration = Duration::from_secs(600);

impl Default for Health {
    fn default() -> Self {
        Health {
            replica_lag: Setting::default_at(DEFAULT_REPLICA_LAG),
            archive_backlog: Setting::default_at(DEFAULT_ARCHIVE_BACKLOG),
            autovacuum: Setting::default_at(AutovacuumPause::Wraparound),
            requested_checkpoints: Setting::default_at(DEFAULT_REQUESTED_CHECKPOINTS),
            lock_wait: Setting::default_at(DEFAULT_LOCK_WAIT),
            cpu_slowdown: Setting::default_at(DEFAULT_CPU_SLOWDOWN),
            pause_limit: DEFAULT_PAUSE_LIMIT,
        }
    }
}

/// One health signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    ReplicaLag,
    ArchiveBacklog,
    Autovacuum,
    RequestedCheckpoints,
    LockWaits,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::ReplicaLag => "replica lag",
            Signal::ArchiveBacklog => "WAL waiting to be archived",
            Signal::Autovacuum => "autovacuum on a repaired table",
            Signal::RequestedCheckpoints => "requested checkpoints",
            Signal::LockWaits => "the application's lock waits",
        }
    }

    pub fn option(self) -> &'static str {
        match self {
            Signal::ReplicaLag => "--max-replica-lag",
            Signal::ArchiveBacklog => "--max-archive-backlog",
            Signal::Autovacuum => "--autovacuum-pause",
            Signal::RequestedCheckpoints => "--max-requested-checkpoints",
            Signal::LockWaits => "--max-lock-wait",
        }
    }
}

/// The replica furthest behind: its name (`application_name`, else its address) and its
/// replay lag, None when it is not known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaLag {
    pub replica: String,
    pub lag: Option<Duration>,
}

/// An autovacuum working on one of the repaired tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autovacuum {
    pub table: String,
    pub wraparound: bool,
}

/// Sessions (not pgmend's) waiting for a lock, and the longest wait among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockWaits {
    pub sessions: i64,
    pub longest: Duration,
}

/// What the signals read at one moment; None where a signal was not read (off, not
/// readable by the role and only pgmend's default, or nothing to read: no replica, archiving
/// off).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readings {
    pub replica_lag: Option<ReplicaLag>,
    pub archive_backlog: Option<i64>,
    pub autovacuum: Vec<Autovacuum>,
    /// Requested checkpoints in the last minute.
    pub requested_checkpoints: Option<i64>,
    pub lock_waits: Option<LockWaits>,
}

impl Readings {
    /// Why the batches should slow down now, if a signal says so: [`verdict`]'s words.
    pub fn says_slow_down(&self, health: &Health) -> Option<String> {
        verdict(health, self).map(|p| p.words)
    }
}

/// A signal that says pause, and what it read, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pause {
    pub signal: Signal,
    pub words: String,
}

/// The first signal whose reading is past its threshold (in the order of [`Signal`]).
pub fn verdict(health: &Health, readings: &Readings) -> Option<Pause> {
    let pause = |signal: Signal, words: String| {
        Some(Pause {
            signal,
            words: format!(
                "{words} ({} {})",
                signal.option(),
                threshold_text(health, signal)
            ),
        })
    };
    if let (Some(max), Some(r)) = (health.replica_lag.limit, &readings.replica_lag) {
        match r.lag {
            None => {
                return pause(
                    Signal::ReplicaLag,
                    format!("a replica ({}) has not reported its replay lag", r.replica),
                )
            }
            Some(lag) if lag > max => {
                return pause(
                    Signal::ReplicaLag,
                    format!(
                        "a replica is {} behind ({})",
                        human::duration(lag),
                        r.replica
                    ),
                )
            }
            Some(_) => {}
        }
    }
    if let (Some(max), Some(n)) = (health.archive_backlog.limit, readings.archive_backlog) {
        if n > max {
            return pause(
                Signal::ArchiveBacklog,
                format!("{} wait to be archived", human::count(n, "WAL segment")),
            );
        }
    }
    if let Some(which) = health.autovacuum.limit {
        let hit = readings
            .autovacuum
            .iter()
            .find(|a| a.wraparound || which == AutovacuumPause::Any);
        if let Some(a) = hit {
            let kind = if a.wraparound {
                "an autovacuum to prevent wraparound"
            } else {
                "an autovacuum"
            };
            return pause(Signal::Autovacuum, format!("{kind} works on {}", a.table));
        }
    }
    if let (Some(max), Some(n)) = (
        health.requested_checkpoints.limit,
        readings.requested_checkpoints,
    ) {
        if n > max {
            return pause(
                Signal::RequestedCheckpoints,
                format!(
                    "the server requested {} in the last minute",
                    human::count(n, "checkpoint")
                ),
            );
        }
    }
    if let (Some(max), Some(w)) = (health.lock_wait.limit, readings.lock_waits) {
        if w.longest > max {
            return pause(
                Signal::LockWaits,
                format!(
                    "{} of the application wait for a lock, the longest for {}",
                    human::count(w.sessions, "session"),
                    human::duration(w.longest)
                ),
            );
        }
    }
    None
}

fn threshold_text(health: &Health, signal: Signal) -> String {
    match signal {
        Signal::ReplicaLag => health.replica_lag.limit.map(human::duration),
        Signal::ArchiveBacklog => health.archive_backlog.limit.map(|n| n.to_string()),
        Signal::Autovacuum => health.autovacuum.limit.map(|a| match a {
            AutovacuumPause::Wraparound => "wraparound".to_string(),
            AutovacuumPause::Any => "any".to_string(),
        }),
        Signal::RequestedCheckpoints => health.requested_checkpoints.limit.map(|n| n.to_string()),
        Signal::LockWaits => health.lock_wait.limit.map(human::duration),
    }
    .unwrap_or_else(|| "off".to_string())
}

/// One reading of the checkpointer: its requested-checkpoints counter and the WAL position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointSample {
    pub requested: i64,
    /// Bytes of WAL since `0/0` (`pg_current_wal_lsn()`).
    pub wal: i64,
}

/// Samples of the server's requested-checkpoints counter, for the count over the last minute.
#[derive(Debug, Default)]
pub struct Window {
    samples: VecDeque<(Instant, CheckpointSample)>,
}

const MINUTE: Duration = Duration::from_secs(60);

impl Window {
    /// Adds the sample read at `at`; returns how much the counter and the WAL position grew
    /// over the samples of the last minute (zeros at the first sample; a reset counter or a
    /// position that went back, a new cluster behind the same address, restarts the window).
    pub fn add(&mut self, at: Instant, now: CheckpointSample) -> CheckpointSample {
        if self
            .samples
            .back()
            .is_some_and(|&(_, last)| now.requested < last.requested || now.wal < last.wal)
        {
            self.samples.clear();
        }
        self.samples.push_back((at, now));
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| at.saturating_duration_since(t) > MINUTE)
        {
            self.samples.pop_front();
        }
        let first = self.samples.front().map_or(now, |&(_, s)| s);
        CheckpointSample {
            requested: now.requested - first.requested,
            wal: now.wal - first.wal,
        }
    }
}

/// Of `grown.requested` checkpoints requested in a window, those the WAL written in it could
/// have caused. The server requests one when a finished segment is `N - 1` segments past the
/// last checkpoint's start, `N` being `max_wal_size` in segments divided by `1 +
/// checkpoint_completion_target`, rounded down, at least 1 (`CalculateCheckpointSegments`,
/// `XLogCheckpointNeeded`): so every `distance` bytes (`max(N - 1, 1)` segments, see
/// [`checkpoint_distance`]) at most, and `grown.wal` bytes cause at most
/// `grown.wal / distance + 1`. The others were asked for by a command (`CHECKPOINT`, `CREATE`
/// or `DROP DATABASE`, a base backup), which says nothing of the load pgmend's batches put on
/// the server.
pub fn caused_by_wal(grown: CheckpointSample, distance: i64) -> i64 {
    let by_wal = if distance <= 0 {
        grown.requested
    } else if grown.wal <= 0 {
        0
    } else {
        grown.wal / distance + 1
    };
    grown.requested.min(by_wal).max(0)
}

/// The fewest bytes of WAL between two checkpoints the WAL makes the server request (see
/// [`caused_by_wal`]), from `max_wal_size` and `wal_segment_size` in bytes and
/// `checkpoint_completion_target`.
pub fn checkpoint_distance(max_wal_size: i64, segment_size: i64, completion_target: f64) -> i64 {
    if segment_size <= 0 {
        return 0;
    }
    let segments = ((max_wal_size / segment_size) as f64 / (1.0 + completion_target)) as i64;
    (segments.max(1) - 1).max(1) * segment_size
}

/// One window for the process: the counter is the server's, so every stream's samples count.
static CHECKPOINTS: Mutex<Window> = Mutex::new(Window {
    samples: VecDeque::new(),
});

/// A WAL file name's segment number (its first 24 hex digits: timeline, log, segment), for
/// segments of `segment_size` bytes; None for a name that is no segment's (a `.history` file).
pub fn segment_number(name: &str, segment_size: i64) -> Option<i64> {
    let hex = name.get(..24)?;
    if segment_size <= 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let log = i64::from_str_radix(&hex[8..16], 16).ok()?;
    let seg = i64::from_str_radix(&hex[16..24], 16).ok()?;
    Some(log * (0x1_0000_0000 / segment_size) + seg)
}

/// What `pg_stat_archiver` and the current WAL position say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Archiver {
    pub segment_size: i64,
    /// The segment being written.
    pub current: String,
    pub last_archived: Option<String>,
    pub last_failed: Option<String>,
    /// Whether the last failure is newer than the last success.
    pub failing: bool,
}

/// The segments finished and not yet archived (see the module's docs); None when a name is
/// no segment's.
pub fn archive_backlog(a: &Archiver) -> Option<i64> {
    let current = segment_number(&a.current, a.segment_size)?;
    let waiting_from = match (&a.last_failed, &a.last_archived) {
        (Some(failed), _) if a.failing => segment_number(failed, a.segment_size)?,
        (_, Some(archived)) => segment_number(archived, a.segment_size)? + 1,
        (_, None) => return Some(0),
    };
    Some((current - waiting_from).max(0))
}

/// Whether the role reads other sessions' statistics (`pg_read_all_stats`, which `pg_monitor`
/// and superusers have).
fn reads_all_stats(client: &mut postgres::Client) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')",
            &[],
        )
        .doing("asking whether the role reads other sessions' statistics")?
        .get(0))
}

fn replica_lag(client: &mut postgres::Client) -> Result<Option<ReplicaLag>> {
    // A replica that has replayed everything reports no lag once the primary is idle: that is
    // 0. One that has not and reports none (it has just connected) is not known. A walsender
    // that replays nothing (pg_receivewal, pg_basebackup's WAL stream: no replay position) is
    // no replica: its `replay_lag` grows for ever, and would pause every run.
    let row = client
        .query_opt(
            "SELECT coalesce(nullif(application_name, ''), host(client_addr), pid::text),
                    CASE WHEN replay_lsn >= pg_current_wal_lsn() THEN 0
                         ELSE (extract(epoch FROM replay_lag) * 1000)::bigint END AS lag_ms
               FROM pg_stat_replication
              WHERE replay_lsn IS NOT NULL
              ORDER BY lag_ms DESC NULLS FIRST
              LIMIT 1",
            &[],
        )
        .doing("reading the replicas' replay lag (pg_stat_replication)")?;
    Ok(row.map(|r| ReplicaLag {
        replica: r.get(0),
        lag: r
            .get::<_, Option<i64>>(1)
            .map(|ms| Duration::from_millis(ms.max(0) as u64)),
    }))
}

fn replicas_connected(client: &mut postgres::Client) -> Result<bool> {
    Ok(client
        .query_one("SELECT EXISTS (SELECT FROM pg_stat_replication)", &[])
        .doing("counting the replicas (pg_stat_replication)")?
        .get(0))
}

fn archive(client: &mut postgres::Client) -> Result<Option<i64>> {
    let row = client
        .query_one(
            "SELECT current_setting('archive_mode') <> 'off',
                    (SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'),
                    pg_walfile_name(pg_current_wal_lsn()),
                    last_archived_wal, last_failed_wal,
                    coalesce(last_failed_time > last_archived_time, last_failed_time IS NOT NULL)
               FROM pg_stat_archiver",
            &[],
        )
        .doing("reading the WAL archiver's progress (pg_stat_archiver)")?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    Ok(archive_backlog(&Archiver {
        segment_size: row.get(1),
        current: row.get(2),
        last_archived: row.get(3),
        last_failed: row.get(4),
        failing: row.get(5),
    }))
}

fn autovacuums(client: &mut postgres::Client, tables: &[String]) -> Result<Vec<Autovacuum>> {
    let rows = client
        .query(
            "SELECT p.relid::regclass::text, a.query LIKE '%(to prevent wraparound)%'
               FROM pg_stat_progress_vacuum p JOIN pg_stat_activity a ON a.pid = p.pid
              WHERE a.backend_type = 'autovacuum worker' AND a.datname = current_database()
                AND p.relid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)",
            &[&tables],
        )
        .doing("reading autovacuum's progress (pg_stat_progress_vacuum)")?;
    Ok(rows
        .iter()
        .map(|r| Autovacuum {
            table: r.get(0),
            wraparound: r.get(1),
        })
        .collect())
}

/// The requested-checkpoints counter, the WAL position, and the WAL that makes the server
/// request a checkpoint (see [`caused_by_wal`]).
fn checkpoints_requested(client: &mut postgres::Client) -> Result<(CheckpointSample, i64)> {
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .doing("reading the server's version")?
        .get(0);
    // PostgreSQL 17 moved the checkpointer's counters out of pg_stat_bgwriter.
    let counter = if version >= 170_000 {
        "(SELECT num_requested FROM pg_stat_checkpointer)"
    } else {
        "(SELECT checkpoints_req FROM pg_stat_bgwriter)"
    };
    // On a standby (where no batch runs) the position is the replayed one.
    let row = client
        .query_one(
            &format!(
                "SELECT {counter},
                        pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                             ELSE pg_current_wal_lsn() END, '0/0')::bigint,
                        pg_size_bytes(current_setting('max_wal_size')),
                        pg_size_bytes(current_setting('wal_segment_size')),
                        current_setting('checkpoint_completion_target')::float8"
            ),
            &[],
        )
        .doing("reading the requested checkpoints")?;
    Ok((
        CheckpointSample {
            requested: row.get(0),
            wal: row.get::<_, Option<i64>>(1).unwrap_or(0),
        },
        checkpoint_distance(row.get(2), row.get(3), row.get(4)),
    ))
}

fn lock_waits(client: &mut postgres::Client) -> Result<Option<LockWaits>> {
    let row = client
        .query_one(
            "SELECT count(DISTINCT l.pid),
                    (extract(epoch FROM max(now() - l.waitstart)) * 1000)::bigint
               FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE NOT l.granted AND l.locktype NOT IN ('advisory', 'virtualxid')
                AND l.pid <> pg_backend_pid() AND a.datname = current_database()
                AND a.application_name IS DISTINCT FROM current_setting('application_name')",
            &[],
        )
        .doing("reading the sessions that wait for a lock (pg_locks)")?;
    let sessions: i64 = row.get(0);
    Ok((sessions > 0).then(|| LockWaits {
        sessions,
        longest: Duration::from_millis(row.get::<_, Option<i64>>(1).unwrap_or(0).max(0) as u64),
    }))
}

/// Reads every signal that has a threshold, for the repaired `tables`.
pub fn readings(
    client: &mut postgres::Client,
    health: &Health,
    tables: &[String],
) -> Result<Readings> {
    let mut r = Readings::default();
    let needs_stats = health.replica_lag.limit.is_some() || health.autovacuum.limit.is_some();
    // Without the membership, only pgmend's defaults are left here (check_readable refused
    // the rest): they are not watched.
    let all_stats = needs_stats && reads_all_stats(client)?;
    if health.replica_lag.limit.is_some() && all_stats {
        r.replica_lag = replica_lag(client)?;
    }
    if health.autovacuum.limit.is_some() && all_stats {
        r.autovacuum = autovacuums(client, tables)?;
    }
    if health.archive_backlog.limit.is_some() {
        r.archive_backlog = archive(client)?;
    }
    if health.requested_checkpoints.limit.is_some() {
        let (sample, distance) = checkpoints_requested(client)?;
        let mut window = CHECKPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        let grown = window.add(Instant::now(), sample);
        r.requested_checkpoints = Some(caused_by_wal(grown, distance));
    }
    if health.lock_wait.limit.is_some() {
        r.lock_waits = lock_waits(client)?;
    }
    Ok(r)
}

/// Tries every signal that has a threshold before the first change: returns a one-line note
/// for each one the role cannot read that is pgmend's default (it is not watched), and an
/// error (exit 2) for one the user set.
pub fn check_readable(
    client: &mut postgres::Client,
    health: &Health,
    tables: &[String],
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    let role: String = client
        .query_one("SELECT current_user::text", &[])
        .doing("reading the role's name")?
        .get(0);
    let all_stats = reads_all_stats(client)?;
    let lacking = |signal: Signal, view: &str, explicit: bool| {
        let why = format!(
            "the role {role} cannot read {view} of other sessions (only members of pg_read_all_stats or pg_monitor can)"
        );
        if explicit {
            Err(anyhow::anyhow!(
                "{} {}: {why}; nothing was changed. Grant it (GRANT pg_monitor TO {role};) or leave {} out",
                signal.option(),
                threshold_text(health, signal),
                signal.option()
            ))
        } else {
            Ok(format!(
                "note: {} is not watched: {why}; GRANT pg_monitor TO {role} to watch it, or {} off to silence this note",
                signal.name(),
                signal.option()
            ))
        }
    };
    if health.replica_lag.limit.is_some()
        && !all_stats
        && (health.replica_lag.explicit || replicas_connected(client)?)
    {
        notes.push(lacking(
            Signal::ReplicaLag,
            "the replay lag in pg_stat_replication",
            health.replica_lag.explicit,
        )?);
    }
    if health.autovacuum.limit.is_some() && !all_stats {
        notes.push(lacking(
            Signal::Autovacuum,
            "the table autovacuum works on in pg_stat_progress_vacuum",
            health.autovacuum.explicit,
        )?);
    }
    if health.autovacuum.limit.is_some() && all_stats {
        autovacuums(client, tables)?;
    }
    let others: [(Signal, bool, bool); 3] = [
        (
            Signal::ArchiveBacklog,
            health.archive_backlog.limit.is_some(),
            health.archive_backlog.explicit,
        ),
        (
            Signal::RequestedCheckpoints,
            health.requested_checkpoints.limit.is_some(),
            health.requested_checkpoints.explicit,
        ),
        (
            Signal::LockWaits,
            health.lock_wait.limit.is_some(),
            health.lock_wait.explicit,
        ),
    ];
    for (signal, on, explicit) in others {
        if !on {
            continue;
        }
        let read = match signal {
            Signal::ArchiveBacklog => archive(client).map(drop),
            Signal::RequestedCheckpoints => checkpoints_requested(client).map(drop),
            _ => lock_waits(client).map(drop),
        };
        if let Err(e) = read {
            if explicit {
                bail!(
                    "{} {}: the role {role} cannot read {}: {e:#}; nothing was changed. Grant what it lacks or leave {} out",
                    signal.option(),
                    threshold_text(health, signal),
                    signal.name(),
                    signal.option()
                );
            }
            notes.push(format!(
                "note: {} is not watched: the role {role} cannot read it ({e:#}); {} off silences this note",
                signal.name(),
                signal.option()
            ));
        }
    }
    Ok(notes)
}

/// The same `health` with the signals `notes` said are not watched switched off, so that a
/// run does not try them again.
pub fn without_unreadable(health: &Health, notes: &[String]) -> Health {
    let mut h = health.clone();
    let off = |s: Signal| {
        notes
            .iter()
            .any(|n| n.starts_with(&format!("note: {} ", s.name())))
    };
    if off(Signal::ArchiveBacklog) {
        h.archive_backlog.limit = None;
    }
    if off(Signal::RequestedCheckpoints) {
        h.requested_checkpoints.limit = None;
    }
    if off(Signal::LockWaits) {
        h.lock_wait.limit = None;
    }
    h
}

/// Waits while a signal says pause, polling every 500 ms and saying `pausing: ...` once per
/// signal; returns when every signal is back under its threshold or when `stop()` says so,
/// and stops with [`Stopped`] (exit 1) once the pause has lasted `health.pause_limit`.
pub fn wait_until_healthy(
    client: &mut postgres::Client,
    health: &Health,
    tables: &[String],
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut since: Option<Instant> = None;
    let mut announced: Vec<Signal> = Vec::new();
    loop {
        if stop() {
            return Ok(());
        }
        let Some(pause) = verdict(health, &readings(client, health, tables)?) else {
            if let Some(since) = since {
                progress(&format!(
                    "resuming after a pause of {}: the server's health signals are back under their thresholds",
                    human::duration(since.elapsed())
                ));
            }
            return Ok(());
        };
        let started = *since.get_or_insert_with(Instant::now);
        if !announced.contains(&pause.signal) {
            progress(&format!("pausing: {}", pause.words));
            announced.push(pause.signal);
        }
        if started.elapsed() >= health.pause_limit {
            return Err(Stopped::error(format!(
                "the batches paused for {} on {}, the limit (--health-pause-limit {}): {}. Every batch so far committed with its checkpoint; rerun the same command to resume once the server recovers, or raise {} or --health-pause-limit",
                human::duration(started.elapsed()),
                pause.signal.name(),
                human::duration(health.pause_limit),
                pause.words,
                pause.signal.option()
            )));
        }
        let until = Instant::now() + POLL;
        while Instant::now() < until && !stop() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn healthy_readings_and_switched_off_signals_say_nothing() {
        let h = Health::default();
        assert_eq!(verdict(&h, &Readings::default()), None);
        let quiet = Readings {
            replica_lag: Some(ReplicaLag {
                replica: "r1".into(),
                lag: Some(s(30)),
            }),
            archive_backlog: Some(42),
            autovacuum: vec![Autovacuum {
                table: "t".into(),
                wraparound: false,
            }],
            requested_checkpoints: Some(2),
            lock_waits: Some(LockWaits {
                sessions: 9,
                longest: Duration::from_millis(1000),
            }),
        };
        assert_eq!(
            verdict(&h, &quiet),
            None,
            "at the thresholds, not past them"
        );
        let loud = Readings {
            replica_lag: Some(ReplicaLag {
                replica: "r1".into(),
                lag: None,
            }),
            archive_backlog: Some(1000),
            autovacuum: vec![Autovacuum {
                table: "t".into(),
                wraparound: true,
            }],
            requested_checkpoints: Some(10),
            lock_waits: Some(LockWaits {
                sessions: 2,
                longest: s(60),
            }),
        };
        let off = Health {
            replica_lag: Setting::given(Some(Threshold::Off), s(1)),
            archive_backlog: Setting::given(Some(Threshold::Off), 1),
            autovacuum: Setting::given(Some(Threshold::Off), AutovacuumPause::Any),
            requested_checkpoints: Setting::given(Some(Threshold::Off), 1),
            lock_wait: Setting::given(Some(Threshold::Off), s(1)),
            cpu_slowdown: Setting::given(Some(Threshold::Off), 150),
            pause_limit: s(1),
        };
        assert_eq!(verdict(&off, &loud), None);
        assert!(off.replica_lag.explicit && off.replica_lag.limit.is_none());
    }

    #[test]
    fn each_signal_past_its_threshold_says_pause_in_words_naming_its_option() {
        let h = Health::default();
        let cases: Vec<(Readings, Signal, &str)> = vec![
            (
                Readings {
                    replica_lag: Some(ReplicaLag {
                        replica: "standby1".into(),
                        lag: Some(s(31)),
                    }),
                    ..Readings::default()
                },
                Signal::ReplicaLag,
                "a replica is 31s behind (standby1) (--max-replica-lag 30s)",
            ),
            (
                Readings {
                    replica_lag: Some(ReplicaLag {
                        replica: "standby1".into(),
                        lag: None,
                    }),
                    ..Readings::default()
                },
                Signal::ReplicaLag,
                "a replica (standby1) has not reported its replay lag (--max-replica-lag 30s)",
            ),
            (
                Readings {
                    archive_backlog: Some(43),
                    ..Readings::default()
                },
                Signal::ArchiveBacklog,
                "43 WAL segments wait to be archived (--max-archive-backlog 42)",
            ),
            (
                Readings {
                    autovacuum: vec![Autovacuum {
                        table: "issued_coupons".into(),
                        wraparound: true,
                    }],
                    ..Readings::default()
                },
                Signal::Autovacuum,
                "an autovacuum to prevent wraparound works on issued_coupons (--autovacuum-pause wraparound)",
            ),
            (
                Readings {
                    requested_checkpoints: Some(3),
                    ..Readings::default()
                },
                Signal::RequestedCheckpoints,
                "the server requested 3 checkpoints in the last minute (--max-requested-checkpoints 2)",
            ),
            (
                Readings {
                    lock_waits: Some(LockWaits {
                        sessions: 2,
                        longest: Duration::from_millis(1500),
                    }),
                    ..Readings::default()
                },
                Signal::LockWaits,
                "2 sessions of the application wait for a lock, the longest for 1.5s (--max-lock-wait 1s)",
            ),
        ];
        for (readings, signal, words) in cases {
            let pause = verdict(&h, &readings).expect(words);
            assert_eq!(pause.signal, signal);
            assert_eq!(pause.words, words);
            assert_eq!(readings.says_slow_down(&h).as_deref(), Some(words));
        }
    }

    #[test]
    fn an_ordinary_autovacuum_pauses_only_with_any() {
        let r = Readings {
            autovacuum: vec![Autovacuum {
                table: "t".into(),
                wraparound: false,
            }],
            ..Readings::default()
        };
        assert_eq!(verdict(&Health::default(), &r), None);
        let any = Health {
            autovacuum: Setting::given(
                Some(Threshold::At(AutovacuumPause::Any)),
                AutovacuumPause::Wraparound,
            ),
            ..Health::default()
        };
        assert_eq!(verdict(&any, &r).unwrap().signal, Signal::Autovacuum);
    }

    #[test]
    fn a_sequence_of_readings_pauses_while_a_signal_is_high_and_names_the_first() {
        let h = Health::default();
        let lag = |secs| Readings {
            replica_lag: Some(ReplicaLag {
                replica: "r".into(),
                lag: Some(s(secs)),
            }),
            archive_backlog: Some(50),
            ..Readings::default()
        };
        let seen: Vec<Option<Signal>> = [lag(40), lag(10), lag(0)]
            .iter()
            .map(|r| verdict(&h, r).map(|p| p.signal))
            .collect();
        assert_eq!(
            seen,
            [
                Some(Signal::ReplicaLag),
                Some(Signal::ArchiveBacklog),
                Some(Signal::ArchiveBacklog)
            ]
        );
        let healthy = Readings {
            archive_backlog: Some(3),
            ..lag(0)
        };
        assert_eq!(verdict(&h, &healthy), None);
    }

    #[test]
    fn requested_checkpoints_are_counted_over_the_last_minute() {
        let t0 = Instant::now();
        let at = |requested, wal| CheckpointSample { requested, wal };
        let mut w = Window::default();
        assert_eq!(
            w.add(t0, at(100, 1000)),
            at(0, 0),
            "one reading counts nothing"
        );
        assert_eq!(w.add(t0 + s(10), at(101, 1500)), at(1, 500));
        assert_eq!(w.add(t0 + s(50), at(103, 4000)), at(3, 3000));
        // The sample at 0 s is more than a minute old at 65 s: counted from the one at 10 s.
        assert_eq!(w.add(t0 + s(65), at(104, 4500)), at(3, 3000));
        assert_eq!(w.add(t0 + s(200), at(104, 4500)), at(0, 0));
        // A reset of the statistics restarts the window, and so does a WAL position that went
        // back (another cluster behind the same address).
        assert_eq!(w.add(t0 + s(201), at(2, 4600)), at(0, 0));
        assert_eq!(w.add(t0 + s(202), at(5, 4700)), at(3, 100));
        assert_eq!(w.add(t0 + s(203), at(6, 10)), at(0, 0));
    }

    #[test]
    fn only_the_checkpoints_the_wal_could_cause_count() {
        let mb = 1024 * 1024;
        let grown = |requested, wal| CheckpointSample { requested, wal };
        // 1 GB of max_wal_size at 0.9, 16 MB segments: N = 64 / 1.9 = 33, a request every
        // 32 segments (512 MB) at the most.
        let distance = checkpoint_distance(1024 * mb, 16 * mb, 0.9);
        assert_eq!(distance, 512 * mb);
        // Five DROP DATABASEs and no WAL: none of them is the batches' doing; with a little
        // WAL, one may be.
        assert_eq!(caused_by_wal(grown(5, 0), distance), 0);
        assert_eq!(caused_by_wal(grown(5, 16 * mb), distance), 1);
        // 1.05 GB of WAL in a minute can cause three.
        assert_eq!(caused_by_wal(grown(3, 1075 * mb), distance), 3);
        assert_eq!(caused_by_wal(grown(9, 2048 * mb), distance), 5);
        assert_eq!(caused_by_wal(grown(0, 2048 * mb), distance), 0);
        // The least max_wal_size (two segments): N is 1, a request every segment.
        assert_eq!(checkpoint_distance(32 * mb, 16 * mb, 0.9), 16 * mb);
        assert_eq!(checkpoint_distance(96 * mb, 16 * mb, 0.9), 32 * mb);
        // A setting that reads as nothing leaves the counter as it is.
        assert_eq!(checkpoint_distance(32 * mb, 0, 0.9), 0);
        assert_eq!(caused_by_wal(grown(3, 0), 0), 3);
    }

    #[test]
    fn segment_numbers_and_the_archive_backlog() {
        let mb16 = 16 * 1024 * 1024;
        assert_eq!(segment_number("000000010000000000000001", mb16), Some(1));
        // 256 segments of 16 MiB to a log file: 0x1/0x05 is 261.
        assert_eq!(segment_number("000000020000000100000005", mb16), Some(261));
        assert_eq!(
            segment_number("000000010000000100000005", 1024 * 1024 * 1024),
            Some(9)
        );
        assert_eq!(
            segment_number("000000010000000000000003.00000028.backup", mb16),
            Some(3)
        );
        assert_eq!(segment_number("00000002.history", mb16), None);
        let a = |archived: Option<&str>, failed: Option<&str>, failing| Archiver {
            segment_size: mb16,
            current: "00000001000000000000002E".into(),
            last_archived: archived.map(Into::into),
            last_failed: failed.map(Into::into),
            failing,
        };
        // Writing 0x2E (46); 0x2D (45) archived: nothing finished waits.
        assert_eq!(
            archive_backlog(&a(Some("00000001000000000000002D"), None, false)),
            Some(0)
        );
        assert_eq!(
            archive_backlog(&a(Some("000000010000000000000003"), None, false)),
            Some(42)
        );
        // 0x04 failed after 0x03 was archived: 0x04 to 0x2D wait.
        assert_eq!(
            archive_backlog(&a(
                Some("000000010000000000000003"),
                Some("000000010000000000000004"),
                true
            )),
            Some(42)
        );
        // A failure that was retried successfully since does not count.
        assert_eq!(
            archive_backlog(&a(
                Some("00000001000000000000002D"),
                Some("000000010000000000000004"),
                false
            )),
            Some(0)
        );
        assert_eq!(archive_backlog(&a(None, None, false)), Some(0));
        assert_eq!(
            archive_backlog(&a(None, Some("000000010000000000000001"), true)),
            Some(45)
        );
        assert_eq!(
            archive_backlog(&a(Some("00000002.history"), None, false)),
            None
        );
    }

    #[test]
    fn notes_switch_off_only_the_signals_they_name() {
        let h = Health::default();
        let note = format!(
            "note: {} is not watched: the role r cannot read it",
            Signal::LockWaits.name()
        );
        let off = without_unreadable(&h, &[note]);
        assert_eq!(off.lock_wait.limit, None);
        assert_eq!(off.archive_backlog, h.archive_backlog);
        assert_eq!(without_unreadable(&h, &[]), h);
    }
}
