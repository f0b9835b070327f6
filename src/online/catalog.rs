//! What the catalog says about indexes: INVALID ones anywhere in the database.
//!
//! `invalid_indexes`: every index in the database with `NOT indisvalid OR NOT indisready`, with its
//! definition and whether a build is running on its table (`pg_stat_progress_create_index`).
//! `InvalidIndex::describe` is the line `status` prints, with the `DROP INDEX CONCURRENTLY` to run.

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use crate::error::PgContext;

/// An index left INVALID (or not ready) by a failed or running concurrent build.
#[derive(Debug, Clone, Serialize)]
pub struct InvalidIndex {
    pub schema: String,
    pub index: String,
    pub table: String,
    pub definition: String,
    /// A CREATE/REINDEX CONCURRENTLY on this table is running right now.
    pub build_in_progress: bool,
}

impl InvalidIndex {
    pub fn describe(&self) -> String {
        if self.build_in_progress {
            format!(
                "index {}.{} on {} is not valid yet: a concurrent build is running on that table",
                self.schema, self.index, self.table
            )
        } else {
            format!(
                "index {s}.{i} on {t} is INVALID (a failed concurrent build): it costs every write and serves no read, and a unique one still rejects duplicates. If a pending migration builds it, drop it with: DROP INDEX CONCURRENTLY {s}.{i}; then rerun that step. If the migration that built it is already applied (the index broke later), do not drop it: rebuild it in place with REINDEX INDEX CONCURRENTLY {s}.{i}; (runbooks/failed-concurrent-index-build.md)",
                s = self.schema,
                i = self.index,
                t = self.table
            )
        }
    }
}

pub fn invalid_indexes(client: &mut impl GenericClient) -> Result<Vec<InvalidIndex>> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text, t.relname::text, pg_get_indexdef(c.oid),
                    EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.relid = t.oid)
               FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_class t ON t.oid = i.indrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE NOT i.indisvalid OR NOT i.indisready
              ORDER BY 1, 2",
            &[],
        )
        .doing("looking for INVALID indexes")?;
    Ok(rows
        .iter()
        .map(|r| InvalidIndex {
            schema: r.get(0),
            index: r.get(1),
            table: r.get(2),
            definition: r.get(3),
            build_in_progress: r.get(4),
        })
        .collect())
}
