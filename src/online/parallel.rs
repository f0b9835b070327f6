//! How many parallel maintenance workers an index build may use (issue 36): half of the worker
//! processes the server has free when the build starts, at most [`MAX_WORKERS`], so that the
//! application's parallel queries keep the other half.
//!
//! Free means under both server limits: `max_worker_processes` less every background worker
//! running (any process whose `backend_type` is not one of the server's own kinds: parallel
//! workers, logical replication, extensions' workers), and `max_parallel_workers` less the
//! parallel workers running. The server plans a parallel build only while each participant
//! (the workers and the leader) gets 32 MB of `maintenance_work_mem`
//! (`plan_create_index_workers`); with its default of 64 MB that is one worker. So the build's
//! session raises `maintenance_work_mem` to 32 MB per participant where the server's setting is
//! lower, and never lowers it: at most 32 MB × 9 = 288 MB, for one build at a time. Without a
//! worker to ask for (none free, or `max_parallel_maintenance_workers` set to 0, which pgmend
//! keeps) the session keeps the server's settings. The server
//! may still use fewer (a small table, `min_parallel_table_scan_size`, or workers taken by others
//! meanwhile); a build without a worker free runs as before, on the leader alone.
//!
//! While the application is at work on the database (`db::crowding::app_at_work`) the
//! build takes nothing spare: it keeps the server's own settings, as the same statement run by
//! hand would, or no parallel worker at all when pgmend's workers crowded the application out
//! of the CPUs earlier in this process (`db::crowding::ceiling`). On two cores the
//! application's p99 under `bench_release --load` was 1.8x its baseline with builds on the
//! leader alone and 3-6x with three workers (docs/benchmark.md).
//!
//! Measured on the 2-core machine (docs/benchmark.md): a build of 1.1 million rows takes about
//! as long with 3 workers as with the default's 1 (0.56-0.60 s against 0.57 s; 0.67 s with
//! none), as two cores run two participants at most; the gain is on servers with cores to spare.

use anyhow::Result;

use crate::error::PgContext;

/// The most parallel maintenance workers one build asks for.
pub const MAX_WORKERS: i32 = 8;
/// `maintenance_work_mem` per participant below which the server plans fewer workers.
const MB_PER_PARTICIPANT: i64 = 32;

/// The server's process kinds that are not background workers (PostgreSQL 14 to 18).
const SERVER_PROCESSES: &[&str] = &[
    "client backend",
    "autovacuum launcher",
    "autovacuum worker",
    "background writer",
    "checkpointer",
    "walwriter",
    "archiver",
    "startup",
    "walreceiver",
    "walsender",
    "walsummarizer",
    "slotsync worker",
    "io worker",
    "standalone backend",
];

/// What the server has, as read before a build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// The server's (or the role's, the database's) setting: 0 is a choice pgmend keeps.
    pub max_parallel_maintenance_workers: i32,
    pub max_worker_processes: i32,
    pub max_parallel_workers: i32,
    pub background_workers: i32,
    pub parallel_workers: i32,
    pub maintenance_work_mem_mb: i64,
}

/// What a build asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildWorkers {
    pub workers: i32,
    pub free: i32,
    /// `maintenance_work_mem` for the build's session, in MB (the server's, or more).
    pub memory_mb: i64,
    /// The application's sessions at work before the build (0: none seen), which leave the
    /// server's settings as they are.
    pub app_sessions: i64,
    /// No parallel worker, whatever the server's setting.
    pub alone: bool,
}

impl BuildWorkers {
    /// When the server's worker processes could not be read: its own settings.
    pub const NONE: BuildWorkers = BuildWorkers {
        workers: 0,
        free: -1,
        memory_mb: 0,
        app_sessions: 0,
        alone: false,
    };

    pub fn choose(c: Capacity) -> BuildWorkers {
        let free = (c.max_worker_processes - c.background_workers)
            .min(c.max_parallel_workers - c.parallel_workers)
            .max(0);
        let workers = if c.max_parallel_maintenance_workers == 0 {
            0
        } else {
            (free / 2).min(MAX_WORKERS)
        };
        let needed = MB_PER_PARTICIPANT * (i64::from(workers) + 1);
        BuildWorkers {
            workers,
            free,
            memory_mb: if workers > 0 {
                c.maintenance_work_mem_mb.max(needed)
            } else {
                c.maintenance_work_mem_mb
            },
            app_sessions: 0,
            alone: false,
        }
    }

    /// The settings for the build's own session: none without a worker to ask for (the
    /// server's own settings then, as before).
    pub fn settings_sql(&self) -> String {
        if self.alone {
            return "SET max_parallel_maintenance_workers = 0".into();
        }
        if self.workers == 0 {
            return String::new();
        }
        format!(
            "SET max_parallel_maintenance_workers = {}; SET maintenance_work_mem = '{}MB'",
            self.workers, self.memory_mb
        )
    }

    /// While the application is at work (`db::crowding::app_at_work`, `sessions` of it seen
    /// running a statement): the server's own settings, nothing raised.
    /// With `crowded` (pgmend's workers crowded the application out of the CPUs earlier in this
    /// process, `db::crowding::ceiling`), no parallel worker at all: the build runs on its
    /// own backend.
    pub fn app_at_work(sessions: i64, crowded: bool) -> BuildWorkers {
        BuildWorkers {
            app_sessions: sessions.max(1),
            alone: crowded,
            ..BuildWorkers::NONE
        }
    }

    /// For the progress line before the build.
    pub fn describe(&self) -> String {
        if self.app_sessions > 0 {
            let seen = crate::human::count(self.app_sessions, "session");
            return if self.alone {
                format!("no parallel maintenance worker: the application is at work ({seen} of it seen) and pgmend's workers crowded it out of the CPUs earlier")
            } else {
                format!("the server's own parallel settings: the application is at work ({seen} of it seen), so no spare worker process is taken from it")
            };
        }
        match self.workers {
            0 if self.free < 0 => {
                "the server's own parallel settings (its worker processes could not be read)".into()
            }
            0 => format!(
                "no parallel maintenance worker ({} worker processes free)",
                self.free
            ),
            n => format!(
                "up to {} parallel maintenance worker{} (half of the {} worker processes free), maintenance_work_mem {} MB",
                n,
                if n == 1 { "" } else { "s" },
                self.free,
                self.memory_mb
            ),
        }
    }
}

/// Reads the server's worker processes and `maintenance_work_mem` on the main session.
pub fn capacity(main: &mut postgres::Client) -> Result<Capacity> {
    let kinds: Vec<String> = SERVER_PROCESSES.iter().map(|s| s.to_string()).collect();
    let row = main
        .query_one(
            "SELECT current_setting('max_parallel_maintenance_workers')::int,
                    current_setting('max_worker_processes')::int,
                    current_setting('max_parallel_workers')::int,
                    (SELECT count(*) FROM pg_stat_activity
                      WHERE backend_type IS NOT NULL AND backend_type <> ALL ($1))::int,
                    (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker')::int,
                    pg_size_bytes(current_setting('maintenance_work_mem')) / 1048576",
            &[&kinds],
        )
        .doing("reading the server's free worker processes for a parallel build")?;
    Ok(Capacity {
        max_parallel_maintenance_workers: row.get(0),
        max_worker_processes: row.get(1),
        max_parallel_workers: row.get(2),
        background_workers: row.get(3),
        parallel_workers: row.get(4),
        maintenance_work_mem_mb: row.get(5),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(
        processes: i32,
        parallel: i32,
        background: i32,
        busy: i32,
        memory: i64,
    ) -> Capacity {
        Capacity {
            max_parallel_maintenance_workers: 2,
            max_worker_processes: processes,
            max_parallel_workers: parallel,
            background_workers: background,
            parallel_workers: busy,
            maintenance_work_mem_mb: memory,
        }
    }

    #[test]
    fn half_of_the_free_worker_processes_with_32_mb_for_each_participant() {
        // The defaults: 8 processes, 8 parallel, the logical replication launcher running.
        let w = BuildWorkers::choose(capacity(8, 8, 1, 0, 64));
        assert_eq!(
            w,
            BuildWorkers {
                workers: 3,
                free: 7,
                memory_mb: 128,
                app_sessions: 0,
                alone: false
            }
        );
        assert_eq!(
            w.settings_sql(),
            "SET max_parallel_maintenance_workers = 3; SET maintenance_work_mem = '128MB'"
        );
    }

    #[test]
    fn the_tighter_limit_counts_and_busy_parallel_workers_are_not_free() {
        // Six of eight processes taken by background workers, four of them parallel workers.
        let w = BuildWorkers::choose(capacity(8, 8, 6, 4, 64));
        assert_eq!((w.free, w.workers), (2, 1));
        // max_parallel_workers lower than the processes left.
        let w = BuildWorkers::choose(capacity(16, 2, 1, 0, 64));
        assert_eq!((w.free, w.workers, w.memory_mb), (2, 1, 64));
    }

    #[test]
    fn none_free_asks_for_no_worker_and_keeps_the_servers_memory() {
        for c in [
            capacity(8, 8, 8, 8, 64),
            capacity(8, 0, 1, 0, 16),
            capacity(4, 8, 5, 0, 64),
            capacity(8, 8, 7, 0, 64),
        ] {
            let w = BuildWorkers::choose(c);
            assert_eq!(w.workers, 0, "{c:?}");
            assert_eq!(w.memory_mb, c.maintenance_work_mem_mb);
            assert!(w.describe().starts_with("no parallel maintenance worker"));
            assert_eq!(w.settings_sql(), "", "the server's settings stay");
        }
    }

    #[test]
    fn a_setting_of_0_is_kept() {
        let mut c = capacity(8, 8, 1, 0, 64);
        c.max_parallel_maintenance_workers = 0;
        let w = BuildWorkers::choose(c);
        assert_eq!((w.workers, w.free, w.settings_sql()), (0, 7, String::new()));
    }

    #[test]
    fn at_most_eight_workers_and_a_larger_setting_of_the_server_is_kept() {
        let w = BuildWorkers::choose(capacity(64, 64, 2, 0, 1024));
        assert_eq!((w.workers, w.memory_mb), (8, 1024));
        let w = BuildWorkers::choose(capacity(64, 64, 2, 0, 64));
        assert_eq!((w.workers, w.memory_mb), (8, 288));
    }
}
