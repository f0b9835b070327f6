//! Adopting an existing database: prove the live schema has everything V1 defines, then
//! record V1 as applied without running it.
//!
//! What V1 defines is learned by running V1 into this session's temporary schema inside a
//! transaction that is rolled back: temporary tables lock nothing anyone else uses, and
//! the comparison is then catalog against catalog, not text against text.
//!
//! Adoption of an existing database. `compare` reads the catalog facts (columns with type, NOT NULL
//! and default; primary key, unique, foreign key and check constraints; tables) of the schema
//! `current_schema()` names, and compares them with the facts of V1 run into `pg_temp` in a
//! rolled-back transaction. Missing and different facts refuse the baseline; extra columns,
//! constraints and tables are allowed and reported; extra indexes are listed too. A database with
//! none of V1's tables is refused with a pointer to `migrate apply`. `record` creates the history
//! table and writes V1's row in one retried transaction.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use postgres::GenericClient;
use serde::Serialize;

use super::history;
use super::source::Migration;
use crate::db::retry::{with_lock_retry, LockPolicy};
use crate::error::PgContext;

/// What baseline found when comparing V1 with the live schema.
#[derive(Debug, Default, Serialize)]
pub struct Comparison {
    pub schema: String,
    /// Defined by V1 and absent from the database.
    pub missing: Vec<String>,
    /// Defined by V1 and present with another definition.
    pub different: Vec<String>,
    /// In the database and not in V1: allowed (production grows indexes and columns).
    pub extra: Vec<String>,
}

/// (table, what) -> definition, e.g. ("issued_coupons", "column amount_yen") -> "integer NOT NULL".
type Facts = BTreeMap<(String, String), String>;

const FACTS_SQL: &str = "
WITH t AS (
  SELECT c.oid, c.relname FROM pg_class c
   WHERE c.relnamespace = $1::oid AND c.relkind IN ('r', 'p')
     AND ($2::text[] IS NULL OR c.relname = ANY ($2))
)
SELECT t.relname, 'column ' || a.attname,
       format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
  FROM t JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = t.oid AND d.adnum = a.attnum
UNION ALL
SELECT t.relname,
       CASE con.contype WHEN 'p' THEN 'primary key'
                        WHEN 'u' THEN 'unique ' || cols.list
                        WHEN 'f' THEN 'foreign key ' || cols.list
                        ELSE 'check ' || pg_get_constraintdef(con.oid) END,
       CASE con.contype WHEN 'p' THEN cols.list
                        WHEN 'f' THEN 'REFERENCES ' || rt.relname || ' ' || fcols.list
                        ELSE 'present' END
  FROM t JOIN pg_constraint con ON con.conrelid = t.oid AND con.contype IN ('p', 'u', 'f', 'c')
  LEFT JOIN pg_class rt ON rt.oid = con.confrelid
  CROSS JOIN LATERAL (
    SELECT '(' || string_agg(quote_ident(a.attname), ', ' ORDER BY k.n) || ')' AS list
      FROM unnest(con.conkey) WITH ORDINALITY k(attnum, n)
      JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum) cols
  CROSS JOIN LATERAL (
    SELECT '(' || string_agg(quote_ident(a.attname), ', ' ORDER BY k.n) || ')' AS list
      FROM unnest(con.confkey) WITH ORDINALITY k(attnum, n)
      JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum) fcols
UNION ALL
SELECT t.relname, 'table', 'present' FROM t";

fn facts(
    client: &mut impl GenericClient,
    schema_oid: u32,
    tables: Option<&[String]>,
) -> Result<Facts> {
    let tables: Option<Vec<String>> = tables.map(<[String]>::to_vec);
    let rows = client
        .query(FACTS_SQL, &[&schema_oid, &tables])
        .doing("reading the schema from the catalog")?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                (r.get::<_, String>(0), r.get::<_, String>(1)),
                r.get::<_, String>(2),
            )
        })
        .collect())
}

/// Runs V1 into the temporary schema, reads what it defines, and rolls everything back.
fn expected_facts(
    client: &mut postgres::Client,
    v1: &Migration,
    policy: &LockPolicy,
) -> Result<Facts> {
    let mut tx = client
        .transaction()
        .doing("opening the comparison transaction")?;
    tx.batch_execute(&policy.set_local_sql())
        .doing("setting timeouts")?;
    tx.batch_execute("SET LOCAL search_path = pg_temp")
        .doing("switching to the temporary schema")?;
    tx.batch_execute(&v1.sql).doing(format!(
        "running {} into a temporary schema to learn what it defines",
        v1.origin
    ))?;
    let temp_oid: u32 = tx
        .query_one("SELECT pg_my_temp_schema()::oid", &[])
        .doing("finding the temporary schema")?
        .get(0);
    let expected = facts(&mut tx, temp_oid, None)?;
    tx.rollback()
        .doing("rolling back the comparison transaction")?;
    Ok(expected)
}

/// Compares V1 with the live schema (the session's `current_schema()`).
pub fn compare(
    client: &mut postgres::Client,
    v1: &Migration,
    policy: &LockPolicy,
) -> Result<Comparison> {
    let row = client
        .query_one(
            "SELECT nspname::text, oid FROM pg_namespace WHERE nspname = current_schema()",
            &[],
        )
        .doing("finding the current schema")
        .context("is search_path empty? set it to the schema that holds the legacy tables")?;
    let (schema, schema_oid): (String, u32) = (row.get(0), row.get(1));
    let expected = expected_facts(client, v1, policy)?;
    let tables: Vec<String> = expected
        .keys()
        .filter(|(_, what)| what == "table")
        .map(|(t, _)| t.clone())
        .collect();
    let live = facts(client, schema_oid, Some(&tables))?;
    let mut cmp = Comparison {
        schema,
        ..Comparison::default()
    };
    for ((table, what), definition) in &expected {
        let missing_table = !live.contains_key(&(table.clone(), "table".into()));
        match live.get(&(table.clone(), what.clone())) {
            None if what == "table" => cmp.missing.push(format!("table {table}")),
            None if missing_table => {}
            None => cmp.missing.push(format!("{table}: {what} {definition}")),
            Some(found) if found != definition => cmp.different.push(format!(
                "{table}: {what} is {found:?}; V1 defines {definition:?}"
            )),
            Some(_) => {}
        }
    }
    for ((table, what), definition) in &live {
        if !expected.contains_key(&(table.clone(), what.clone())) {
            cmp.extra.push(format!("{table}: {what} {definition}"));
        }
    }
    let other_tables: Vec<String> = client
        .query(
            "SELECT relname::text FROM pg_class WHERE relnamespace = $1::oid AND relkind IN ('r', 'p')
                AND relname <> ALL ($2) AND relname <> $3 ORDER BY 1",
            &[&schema_oid, &tables, &history::TABLE],
        )
        .doing("listing the other tables")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    cmp.extra.extend(
        other_tables
            .into_iter()
            .map(|t| format!("table {t} (not in V1)")),
    );
    let indexes = client
        .query(
            "SELECT t.relname::text, i.relname::text, pg_get_indexdef(i.oid)
               FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
              WHERE t.relnamespace = $1::oid AND t.relname = ANY ($2)
                AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
              ORDER BY 1, 2",
            &[&schema_oid, &tables],
        )
        .doing("listing the indexes")?;
    cmp.extra.extend(indexes.iter().map(|r| {
        format!(
            "{}: index {} ({})",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2)
        )
    }));
    if cmp.missing.len() == tables.len() && cmp.missing.iter().all(|m| m.starts_with("table ")) {
        bail!(
            "schema {:?} of this database has none of the legacy tables ({}): nothing to adopt. Check that --database-url names the production database and that search_path finds its schema; for a new, empty database run `pgmend migrate apply` instead",
            cmp.schema,
            tables.join(", ")
        );
    }
    Ok(cmp)
}

/// Records V1 as applied, creating the history table if needed, in one transaction.
pub fn record(client: &mut postgres::Client, v1: &Migration, policy: &LockPolicy) -> Result<()> {
    with_lock_retry(client, policy, "recording the baseline", &[], |c| {
        let mut tx = c.transaction()?;
        tx.batch_execute(&policy.set_local_sql())?;
        history::ensure_table(&mut tx)?;
        history::record(&mut tx, v1)?;
        Ok(tx.commit()?)
    })
}
