//! Repairs: definitions from `repairs/`, the four engines (void duplicates, rebuild counter,
//! backfill, orphans), the batch runner with its checkpoint and ledger, dry-run previews, and
//! undo.
//!
//! `definition.rs`: the TOML definitions and their checks (every identifier a plain name).
//! `catalog.rs`: the column types a definition names. `expression.rs`: the server's checks of
//! the SQL a definition holds, and of the tables an orphans repair names, before the first
//! change. `void.rs`, `counter/`, `backfill.rs` and `orphans.rs`: the four engines, each as the
//! SQL of its freeze, batch, preview and reconciliation; `engine.rs` puts them behind one face. `batch.rs`: the one batch (a
//! transaction with its rows, ledger records and checkpoint) for the single stream and every
//! worker, its sizing and its progress line. `options.rs`: a run's options, `--jobs` included.
//! `runner.rs`: a run (resume or freeze, one stream or the workers, reconciliation, a counter's
//! passes after the gate); `split_freeze.rs`: a counter's freeze after the gate compared in ranges
//! on several sessions when the run has workers. `workers.rs`: `--jobs N`, and
//! `--jobs auto` with the decisions of `controller.rs` (pure: observations in, decisions out)
//! and `db::crowding` (the application at work and a CPU probe: workers and index builds leave
//! it its cores). `neighbour.rs`: `--pause`, `--duty-cycle`,
//! the throttle on batches others wait for. `health.rs`: the server's health signals (replica lag,
//! WAL waiting to be archived, autovacuum, requested checkpoints, the application's lock waits)
//! that pause the batches, with their defaults and the bound on a pause. `steer.rs`: pause, resume and throttle requests from
//! another session, read before each batch. `verdict.rs`: what a finished run means (exit 1 when
//! it stopped early, skipped keys or left differences), for `repair apply` and the release.
//! `preview.rs`: dry runs and their diffs. `guard.rs`: the trigger that marks late duplicates
//! while the unique index is built. `undo.rs`: undo runs.
//!
//! A new repair kind writes its definition (a `Spec` variant and its checks in `definition.rs`),
//! an engine module of pure SQL builders beside `void.rs` and `counter/` (freeze, batch, preview,
//! reconciliation, ledger shapes, each unit-tested) and its arms in `engine.rs`. It gets the
//! rest: frozen targets walked in keyset pages, the batch transaction with the lease's fence,
//! lock retries and the good-neighbour throttle, checkpoints and resumption after a kill,
//! `--jobs` over ranges, progress, the ledger and its view, undo, and the verdict.

pub mod backfill;
pub mod batch;
pub mod catalog;
pub mod controller;
pub mod counter;
pub mod definition;
pub mod engine;
pub mod expression;
pub mod guard;
pub mod health;
pub mod neighbour;
pub mod options;
pub mod orphans;
pub mod preview;
pub mod runner;
pub mod split_freeze;
pub mod steer;
pub mod undo;
pub mod verdict;
pub mod void;
pub mod workers;
