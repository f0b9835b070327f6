//! What a role needs to read for `verify` and `report overruns`: USAGE on pgmend's schema and
//! SELECT on its tables and the tables the command reads (its release's that are tables; each
//! only when it exists). Checked before the snapshot, so that a reporting role without grants
//! is told every GRANT it lacks instead of a raw `permission denied` for the first table the
//! command reads (exit 2, nothing read).

use anyhow::{bail, Result};
use postgres::Client;

use super::privileges::{self, Kind, Need};
use crate::error::PgContext;

/// What reading `tables` for `command` needs.
fn needs(command: &str, tables: &[String]) -> Vec<Need> {
    let why = format!("`pgmend {command}`");
    let mut needs = vec![Need {
        kind: Kind::SchemaUsage(crate::store::SCHEMA.into()),
        why: why.clone(),
    }];
    let pgmend = crate::store::TABLE_PRIVILEGES
        .iter()
        .map(|(table, _)| crate::store::table(table).minimal());
    let read = tables
        .iter()
        .map(|t| crate::db::sql_text::Ident::new(t.as_str()).minimal());
    needs.extend(pgmend.chain(read).map(|table| Need {
        kind: Kind::Table(table, "SELECT"),
        why: why.clone(),
    }));
    needs
}

/// Of `tables`, those that are tables, or are not there (yet): a view, a sequence or a
/// materialized view that a release's migration drops or refreshes is locked by it, not read
/// by `verify` or the report.
const ONLY_TABLES_SQL: &str = "SELECT i::int FROM unnest($1::text[]) WITH ORDINALITY u (t, i)
  WHERE coalesce((SELECT c.relkind IN ('r', 'p') FROM pg_class c WHERE c.oid = to_regclass(t)), true)";

/// Refuses (exit 2), listing every GRANT, when the connected role may not read what `command`
/// (`verify`, `report overruns`) reads: pgmend's tables and those of `tables` that are tables.
pub fn check(client: &mut Client, command: &str, tables: &[String]) -> Result<()> {
    let spelled: Vec<String> = tables
        .iter()
        .map(|t| crate::db::sql_text::Ident::new(t.as_str()).minimal())
        .collect();
    let tables: Vec<String> = client
        .query(ONLY_TABLES_SQL, &[&spelled])
        .doing("reading which of the release's relations are tables")?
        .iter()
        .map(|row| tables[row.get::<_, i32>(0) as usize - 1].clone())
        .collect();
    let (me, missing) = privileges::missing(client, &needs(command, &tables))?;
    if !missing.is_empty() {
        bail!(
            "role {me} may not read what `pgmend {command}` reads; nothing was read:\n  - {}\nGrant them (docs/connecting.md, \"A role for verify and the report\"), or run pgmend as a role that has them, then rerun",
            missing.join("\n  - ")
        );
    }
    Ok(())
}
