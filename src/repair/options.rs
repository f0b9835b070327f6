//! How a run's batches are run, as the command's options say: the lock policy, the batch
//! target, replica lag, the good-neighbour pauses, and the workers of `--jobs`.

use std::time::Duration;

use super::health::Health;
use super::neighbour::Neighbour;
use crate::db::conninfo::ConnParams;
use crate::db::retry::LockPolicy;

/// `--batch-target`'s default.
pub const BATCH_TARGET: Duration = Duration::from_millis(200);

/// The batch target of a run under `--jobs auto` that finds the application at work as it
/// starts, without `--batch-target`: each batch holds its row locks half as long, and fewer
/// of the application's writes wait for one (measured: docs/benchmark.md).
pub const BATCH_TARGET_AT_WORK: Duration = Duration::from_millis(100);

/// The options of a run's batches.
#[derive(Clone)]
pub struct RunOptions {
    pub policy: LockPolicy,
    /// Aim for batches that take about this long.
    pub batch_target: Duration,
    /// Whether `--batch-target` was given: without it, a run under `--jobs auto` that finds
    /// the application at work as it starts aims at [`BATCH_TARGET_AT_WORK`] instead.
    pub batch_target_given: bool,
    /// The server's health signals that pause the batches, and the bound on a pause.
    pub health: Health,
    /// Several workers for a run in ranges (`--jobs`); None: one stream on the main session.
    pub workers: Option<Workers>,
    /// Pauses between batches and the throttle on batches that make sessions wait.
    pub neighbour: Neighbour,
    /// A later step asks at once what the run's final reconciliation would (set by the release:
    /// V4's census after the void; the same counter's rebuild after the deploy gate, before
    /// it). The run then ends without that pass over the table (`left_over` is `None`), unless
    /// the reconciliation decides the run's outcome (a counter after the gate).
    pub checked_later: bool,
}

/// How the command lets a run use several workers: how many, where to connect them, and the
/// backend that holds the runner lock (the lease's session), which every worker's batch checks
/// before it commits.
#[derive(Clone)]
pub struct Workers {
    /// How many workers at most (with `auto`), or always.
    pub jobs: usize,
    /// `--jobs auto`: the controller keeps between one and `jobs` at work
    /// ([`super::controller`]).
    pub auto: bool,
    pub params: ConnParams,
    pub lock_pid: i32,
}
