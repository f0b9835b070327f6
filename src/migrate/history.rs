//! refinery's history table, read without creating it and written in refinery's format
//! (`applied_on` RFC 3339 text, `checksum` a decimal u64), so refinery could read it too.
//!
//! refinery's history table, `refinery_schema_history`. `read` returns the applied rows, or none
//! when the table does not exist, without creating it. `ensure_table` creates it as refinery would
//! (checking first, so no NOTICE is raised); `record` inserts a row in the caller's transaction, in
//! refinery's format (`applied_on` RFC 3339 UTC, `checksum` decimal text).

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use super::source::Migration;
use crate::error::PgContext;

pub const TABLE: &str = "refinery_schema_history";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub version: i32,
    pub name: String,
    pub applied_on: String,
    pub checksum: String,
}

/// The applied migrations, or none when the history table does not exist yet. Creates
/// nothing.
pub fn read(client: &mut impl GenericClient) -> Result<Vec<Applied>> {
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&TABLE])
        .doing("looking for the history table")?
        .get(0);
    if !exists {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            &format!(
                "SELECT version, coalesce(name, ''), coalesce(applied_on, ''), coalesce(checksum, '')
                   FROM {TABLE} ORDER BY version"
            ),
            &[],
        )
        .doing(format!("reading {TABLE}"))?;
    Ok(rows
        .iter()
        .map(|r| Applied {
            version: r.get(0),
            name: r.get(1),
            applied_on: r.get(2),
            checksum: r.get(3),
        })
        .collect())
}

/// Creates the history table if needed, exactly as refinery would.
pub const CREATE_SQL: &str = "CREATE TABLE IF NOT EXISTS refinery_schema_history(
    version int4 PRIMARY KEY,
    name VARCHAR(255),
    applied_on VARCHAR(255),
    checksum VARCHAR(255))";

/// Creates the history table unless it exists (checked first, so no NOTICE is raised).
pub fn ensure_table(client: &mut impl GenericClient) -> Result<(), postgres::Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&TABLE])?
        .get(0);
    if !exists {
        client.batch_execute(CREATE_SQL)?;
    }
    Ok(())
}

/// Records `migration` as applied, inside the caller's transaction.
pub fn record(
    client: &mut impl GenericClient,
    migration: &Migration,
) -> Result<(), postgres::Error> {
    client.execute(
        &format!(
            "INSERT INTO {TABLE} (version, name, applied_on, checksum) VALUES ($1, $2, $3, $4)"
        ),
        &[
            &migration.version,
            &migration.name,
            &chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            &migration.checksum.to_string(),
        ],
    )?;
    Ok(())
}
