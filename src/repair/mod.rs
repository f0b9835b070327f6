//! Repairs: definitions from `repairs/`, the two engines (void duplicates, rebuild
//! counter), the batch runner with its checkpoint and ledger, dry-run previews, and undo.

pub mod batch;
pub mod catalog;
pub mod counter;
pub mod definition;
pub mod engine;
pub mod guard;
pub mod neighbour;
pub mod options;
pub mod preview;
pub mod runner;
pub mod undo;
pub mod verdict;
pub mod void;
pub mod workers;
