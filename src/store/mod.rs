//! pgmend's own tables, in schema `pgmend`, and the one module that reads and writes them:
//! repair runs, their frozen targets, the audit ledger, confirmed gates, finished release
//! steps, the saved plans applied and the table shapes their steps left, the released schema,
//! the legacy counter recorded at the deploy gate, and the schema's version ([`schema`]).
//! Other modules call these functions; the engines, whose batch statements write the ledger
//! inside their own CTEs, take the table names and the ledger's column list from here.
//!
//! `table` and `ledger` name the tables as `sql_text::Ident`s (`ledger` is the view over the full
//! and the compact records, `ledger_full` the full records' table); `ledger_insert`, `ledger_compact_insert` and `targets_insert` are
//! the column lists the engines' CTEs insert with; `exists` says whether the schema exists
//! (refusing a newer one), for read-only callers. `runs.rs` owns runs, targets, checkpoints and the
//! ledger's reads; `records.rs` the release's records.

pub mod records;
pub mod releases;
pub mod runs;
pub mod schema;
pub mod slices;

use anyhow::Result;
use postgres::GenericClient;
use serde::{Deserialize, Serialize};

use crate::db::sql_text::Ident;
use crate::error::PgContext;

pub use records::gates_passed;
pub use runs::{run, Run, RunKind, RunState};
pub use schema::ensure;

/// The schema that holds pgmend's tables.
pub const SCHEMA: &str = "pgmend";

/// A table (or function) of pgmend's, schema-qualified.
pub fn table(name: &str) -> Ident {
    Ident::qualified(SCHEMA, name)
}

/// The audit ledger, every record of it: the view over the full records and the compact ones
/// rendered as full (schema version 6). Read it; write with [`ledger_insert`] or
/// [`ledger_compact_insert`].
pub fn ledger() -> Ident {
    table("ledger_records")
}

/// The ledger for a reader that may find a schema older than version 6 (a read-only command
/// does not upgrade it): [`ledger`], or before the view existed the one table of records.
pub fn ledger_to_read(client: &mut impl GenericClient) -> Result<Ident> {
    let view = client
        .query_one(
            "SELECT to_regclass('pgmend.ledger_records') IS NOT NULL",
            &[],
        )
        .doing("looking for pgmend.ledger_records")?
        .get(0);
    Ok(if view { ledger() } else { ledger_full() })
}

/// The table of the ledger's records written in full (every record before schema version 6,
/// and since then the rare kinds: a counter corrected after the gate, the guard's, undo's).
pub fn ledger_full() -> Ident {
    table("repair_ledger")
}

/// `INSERT INTO <ledger> (<columns>)`: the head of a statement that writes full ledger records
/// (an engine's batch writes them in the CTE that changes the rows).
pub fn ledger_insert() -> String {
    format!(
        "INSERT INTO {} (run_id, target_table, row_key, action, before, after, reason)",
        ledger_full()
    )
}

/// `INSERT INTO <compact ledger> (<columns>)`: the head of a statement that writes compact
/// ledger records: `(run_id, shape, row_key, before, after, args)`, the last four `jsonb`
/// arrays of values in the order of the run's shape ([`runs::LedgerShape`]).
pub fn ledger_compact_insert() -> String {
    format!(
        "INSERT INTO {} (run_id, shape, row_key, before, after, args)",
        table("ledger_compact")
    )
}

/// `INSERT INTO <targets> (run_id, seq, key)`: the head of a statement that freezes targets.
pub fn targets_insert() -> String {
    format!("INSERT INTO {} (run_id, seq, key)", table("repair_targets"))
}

/// pgmend's tables with the privileges pgmend's role needs on each, for the pre-flight.
pub const TABLE_PRIVILEGES: [(&str, &[&str]); 14] = [
    ("repair_runs", &["SELECT", "INSERT", "UPDATE"]),
    ("repair_targets", &["SELECT", "INSERT"]),
    // UPDATE: a counter row a batch creates and then corrects has its 'insert' record
    // updated (the server checks the privilege even when no record is).
    ("repair_ledger", &["SELECT", "INSERT", "UPDATE"]),
    // The view over repair_ledger and ledger_compact (schema version 6).
    ("ledger_records", &["SELECT"]),
    ("ledger_compact", &["SELECT", "INSERT"]),
    ("ledger_shapes", &["SELECT", "INSERT"]),
    ("gates", &["SELECT", "INSERT"]),
    ("release_steps", &["SELECT", "INSERT"]),
    ("legacy_counter_at_deploy", &["SELECT", "INSERT"]),
    ("schema_version", &["SELECT"]),
    ("applied_plans", &["SELECT", "INSERT"]),
    ("plan_steps", &["SELECT", "INSERT", "UPDATE"]),
    ("run_slices", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    // Release identities (schema version 7).
    ("releases", &["SELECT", "INSERT", "UPDATE"]),
];

/// Whether pgmend's schema exists yet (read-only commands must not create it).
/// A schema made by a newer pgmend is refused here too (exit 2).
pub fn exists(client: &mut impl GenericClient) -> Result<bool> {
    let found = schema::version(client)?;
    schema::refuse_newer(found)?;
    Ok(found.is_some())
}

/// A key a batch could not write, with its counter, its true value and why; the run's
/// `skipped` column holds a JSON array of these. The fields are in alphabetical order, the
/// order the column's JSON has always been printed in (`repair status --format json`, the
/// exit-1 message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub counter: i64,
    pub key: Vec<String>,
    pub reason: String,
    pub true_value: i64,
}

/// `skipped` as the jsonb text `skipped || $n::text::jsonb` appends.
pub(crate) fn skipped_json(skipped: &[Skipped]) -> String {
    serde_json::to_string(skipped).expect("skipped keys serialize")
}

#[cfg(test)]
mod tests {
    use super::{skipped_json, Skipped};

    #[test]
    fn skipped_keys_keep_the_columns_json_shape() {
        let skipped = Skipped {
            counter: 3000,
            key: vec!["C-ON".into()],
            reason: "writing it would break issued_within_budget".into(),
            true_value: 4000,
        };
        assert_eq!(
            skipped_json(std::slice::from_ref(&skipped)),
            r#"[{"counter":3000,"key":["C-ON"],"reason":"writing it would break issued_within_budget","true_value":4000}]"#
        );
        // As the server prints the jsonb column back (keys by length, then bytes).
        let stored = r#"[{"key": ["C-ON"], "reason": "writing it would break issued_within_budget", "counter": 3000, "true_value": 4000}]"#;
        assert_eq!(
            serde_json::from_str::<Vec<Skipped>>(stored).unwrap(),
            [skipped]
        );
    }
}
