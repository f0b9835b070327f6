//! `pgmend migrate validate NAME`: VALIDATE a NOT VALID check or foreign key once its census is
//! zero, and the time bound every `VALIDATE CONSTRAINT` runs under.
//!
//! VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE (reads and writes go on; a foreign key's
//! also ROW SHARE on the referenced table) but scans the whole table; it is run only when a
//! census has just shown that it will succeed.
//!
//! `run` looks the constraint up in `current_schema()`, returns at once if it is already
//! validated, refuses anything but a CHECK or a FOREIGN KEY, takes the census of
//! `census::validate` (resolved from the catalog by `evaluate`) with `check_before`, then runs
//! `ALTER TABLE ... VALIDATE CONSTRAINT` in a transaction through `with_lock_retry`, under
//! `--lock-timeout` and, instead of `--statement-timeout`, `--validate-timeout`
//! (`LockPolicy::for_validate`). A VALIDATE the server cancels at that bound becomes `Stopped`
//! (exit 1: rolled back, nothing changed; [`past_its_bound`], also used by `migrate::apply` for a
//! migration's VALIDATE). Returns `Validation` (constraint, table, already_valid, finding).

use anyhow::{bail, Result};
use serde::Serialize;

use super::census;
use super::evaluate::{self, Finding};
use crate::db::retry::{with_lock_retry, LockPolicy};
use crate::db::sql_text::Ident;
use crate::error::{sqlstate, PgContext, Stopped};

#[derive(Debug, Serialize)]
pub struct Validation {
    pub constraint: String,
    pub table: String,
    pub already_valid: bool,
    pub finding: Option<Finding>,
}

/// Finds the check or foreign key `name` in the current schema, takes its census, and
/// validates it when nothing breaks it; stops (exit 1) naming the rows otherwise.
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
    if kind != "c" && kind != "f" {
        bail!("{name} is neither a CHECK nor a FOREIGN KEY constraint ({definition}); pgmend validates only those");
    }
    let constraint = Ident::new(name);
    let mut census = census::validate(table.clone(), constraint.to_string(), None);
    census.name = name.to_string();
    let noun = if kind == "c" { "check" } else { "foreign key" };
    census.fix = format!("fix those rows and rerun, or accept them: leave the {noun} NOT VALID, which needs nothing more (it already refuses new violations); `pgmend migrate validate {name}` validates it once no row breaks it");
    let findings = evaluate::check_before(
        client,
        &format!("VALIDATE CONSTRAINT {name}"),
        std::slice::from_ref(&census),
    )?;
    let sql = format!("ALTER TABLE {table} VALIDATE CONSTRAINT {constraint}");
    let bounded = policy.for_validate();
    with_lock_retry(
        client,
        &bounded,
        &format!("validating {name}"),
        std::slice::from_ref(&table),
        |c| {
            let mut tx = c.transaction()?;
            tx.batch_execute(&bounded.set_local_sql())?;
            tx.batch_execute(&sql)
                .map_err(|e| past_its_bound(e, name, policy, "nothing was changed"))?;
            Ok(tx.commit()?)
        },
    )?;
    Ok(Validation {
        constraint: name.into(),
        table,
        already_valid: false,
        finding: findings.into_iter().next(),
    })
}

/// The error of a `VALIDATE CONSTRAINT name`: `Stopped` (exit 1) when the server cancelled it at
/// `--validate-timeout` (the transaction is rolled back, the constraint stays NOT VALID, and a
/// rerun with a longer bound is all it takes), the server's error otherwise. `kept` says what
/// the rollback leaves.
pub fn past_its_bound(
    error: postgres::Error,
    name: &str,
    policy: &LockPolicy,
    kept: &str,
) -> anyhow::Error {
    let timed_out = sqlstate(&error) == Some("57014")
        && error
            .as_db_error()
            .is_some_and(|db| db.message().contains("statement timeout"));
    if !timed_out {
        return error.into();
    }
    Stopped::error(format!(
        "VALIDATE CONSTRAINT {name} was still scanning when its bound, --validate-timeout {}, ran out: the server cancelled it and rolled its transaction back, so {kept}; {name} stays NOT VALID and still refuses new violations. Rerun with a longer --validate-timeout (the scan holds only SHARE UPDATE EXCLUSIVE: reads and writes go on)",
        crate::config::format_duration(policy.validate_timeout)
    ))
}
