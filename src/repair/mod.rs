//! Repairs: definitions from `repairs/`, the two engines (void duplicates, rebuild
//! counter), the batch runner with its checkpoint and ledger, dry-run previews, and undo.
//!
//! `definition.rs`: the TOML definitions and their checks (every identifier a plain name).
//! `catalog.rs`: the column types a definition names. `void.rs` and `counter/`: the two engines
//! (`void_duplicates`, `rebuild_counter`), each as the SQL of its freeze, batch, preview and
//! reconciliation. `runner.rs`: the batch runner (resume or freeze, batches with checkpoint and
//! ledger, reconciliation). `workers.rs`: `--jobs N`. `neighbour.rs`: `--pause`, `--duty-cycle`,
//! the throttle on batches others wait for. `verdict.rs`: what a finished run means (exit 1 when
//! it stopped early, skipped keys or left differences), for `repair apply` and the release.
//! `preview.rs`: dry runs and their diffs. `guard.rs`: the trigger that marks late duplicates
//! while the unique index is built. `undo.rs`: undo runs.

pub mod catalog;
pub mod counter;
pub mod definition;
pub mod guard;
pub mod neighbour;
pub mod preview;
pub mod runner;
pub mod undo;
pub mod verdict;
pub mod void;
pub mod workers;
