//! pgmend's own tables, in schema `pgmend`, and the one module that reads and writes them:
//! repair runs, their frozen targets, the audit ledger, confirmed gates, finished release
//! steps, the saved plans applied and the table shapes their steps left, the released schema,
//! the legacy counter recorded at the deploy gate, and the schema's version ([`schema`]).
//! Other modules call these functions; the engines, whose batch statements write the ledger
//! inside their own CTEs, take the table names and the ledger's column list from here.
//!
//! `table` and `ledger` name the tables as `sql_text::Ident`s; `ledger_insert` and `targets_insert`
//! are the column lists the engines' CTEs insert with; `exists` says whether the schema exists
//! (refusing a newer one), for read-only callers. `runs.rs` owns runs, targets, checkpoints and the
//! ledger's reads; `records.rs` the release's records.

pub mod records;
pub mod runs;
pub mod schema;
pub mod slices;

use anyhow::Result;
use postgres::GenericClient;

use crate::db::sql_text::Ident;

pub use records::gates_passed;
pub use runs::{run, Run, RunKind, RunState};
pub use schema::ensure;

/// The schema that holds pgmend's tables.
pub const SCHEMA: &str = "pgmend";

/// A table (or function) of pgmend's, schema-qualified.
pub fn table(name: &str) -> Ident {
    Ident::qualified(SCHEMA, name)
}

/// The audit ledger.
pub fn ledger() -> Ident {
    table("repair_ledger")
}

/// `INSERT INTO <ledger> (<columns>)`: the head of a statement that writes ledger records
/// (an engine's batch writes them in the CTE that changes the rows).
pub fn ledger_insert() -> String {
    format!(
        "INSERT INTO {} (run_id, target_table, row_key, action, before, after, reason)",
        ledger()
    )
}

/// `INSERT INTO <targets> (run_id, seq, key)`: the head of a statement that freezes targets.
pub fn targets_insert() -> String {
    format!("INSERT INTO {} (run_id, seq, key)", table("repair_targets"))
}

/// pgmend's tables with the privileges pgmend's role needs on each, for the pre-flight.
pub const TABLE_PRIVILEGES: [(&str, &[&str]); 10] = [
    ("repair_runs", &["SELECT", "INSERT", "UPDATE"]),
    ("repair_targets", &["SELECT", "INSERT"]),
    // UPDATE: a counter row a batch creates and then corrects has its 'insert' record
    // updated (the server checks the privilege even when no record is).
    ("repair_ledger", &["SELECT", "INSERT", "UPDATE"]),
    ("gates", &["SELECT", "INSERT"]),
    ("release_steps", &["SELECT", "INSERT"]),
    ("legacy_counter_at_deploy", &["SELECT", "INSERT"]),
    ("schema_version", &["SELECT"]),
    ("applied_plans", &["SELECT", "INSERT"]),
    ("plan_steps", &["SELECT", "INSERT", "UPDATE"]),
    ("run_slices", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
];

/// Whether pgmend's schema exists yet (read-only commands must not create it).
/// A schema made by a newer pgmend is refused here too (exit 2).
pub fn exists(client: &mut impl GenericClient) -> Result<bool> {
    let found = schema::version(client)?;
    schema::refuse_newer(found)?;
    Ok(found.is_some())
}
