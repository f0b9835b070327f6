//! `pgmend migrate validate NAME`: VALIDATE a NOT VALID check once its census is zero.
//!
//! VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE (reads and writes go on) but scans the
//! whole table; it is run only when a census has just shown that it will succeed.
//!
//! `pgmend migrate validate NAME`: looks the constraint up in `current_schema()`, returns at once
//! if it is already validated, refuses anything but a CHECK, builds a `check` census from
//! `pg_get_constraintdef`, takes it with `check_before`, then runs `ALTER TABLE ... VALIDATE
//! CONSTRAINT` in a transaction under `SET LOCAL` timeouts through `with_lock_retry`. Returns
//! `Validation` (constraint, table, already_valid, finding).

use anyhow::{bail, Result};
use serde::Serialize;

use super::census::{Census, Guard};
use super::evaluate::{self, Finding};
use crate::db::retry::{execute_with_lock_retry, LockPolicy};
use crate::error::PgContext;

#[derive(Debug, Serialize)]
pub struct Validation {
    pub constraint: String,
    pub table: String,
    pub already_valid: bool,
    pub finding: Option<Finding>,
}

/// Finds the check `name` in the current schema, takes its census, and validates it when
/// nothing breaks it; stops (exit 1) naming the rows otherwise.
pub fn run(client: &mut postgres::Client, name: &str, policy: &LockPolicy) -> Result<Validation> {
    let row = client
        .query_opt(
            "SELECT c.conrelid::regclass::text, c.contype::text, c.convalidated, pg_get_constraintdef(c.oid)
               FROM pg_constraint c
              WHERE c.conname = $1 AND c.connamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())",
            &[&name],
        )
        .doing(format!("looking up constraint {name}"))?;
    let Some(row) = row else {
        bail!("there is no constraint named {name:?} in the current schema; `pgmend migrate status` and `pgmend migrate plan` show which migrations add constraints");
    };
    let (table, kind, validated, definition): (String, String, bool, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if validated {
        return Ok(Validation {
            constraint: name.into(),
            table,
            already_valid: true,
            finding: None,
        });
    }
    if kind != "c" {
        bail!("{name} is not a CHECK constraint ({definition}); pgmend validates only checks");
    }
    let expression = definition
        .strip_prefix("CHECK ")
        .and_then(|d| d.strip_suffix(" NOT VALID"))
        .unwrap_or(&definition)
        .to_string();
    let census = Census {
        guard: Guard::Check,
        name: name.to_string(),
        counts: format!("rows of {table} that break {expression}"),
        fix: format!("fix those rows and rerun, or accept them: leave the check NOT VALID, which needs nothing more (it already refuses new violations); `pgmend migrate validate {name}` validates it once no row breaks it"),
        violators_sql: format!("SELECT * FROM {table} WHERE NOT {expression}"),
        tables: vec![table.clone()],
    };
    let findings = evaluate::check_before(
        client,
        &format!("VALIDATE CONSTRAINT {name}"),
        std::slice::from_ref(&census),
    )?;
    let sql = format!(
        "ALTER TABLE {table} VALIDATE CONSTRAINT {}",
        crate::db::sql_text::Ident::new(name)
    );
    execute_with_lock_retry(
        client,
        policy,
        &format!("validating {name}"),
        std::slice::from_ref(&table),
        &sql,
    )?;
    Ok(Validation {
        constraint: name.into(),
        table,
        already_valid: false,
        finding: findings.into_iter().next(),
    })
}
