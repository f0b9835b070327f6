//! The SQL a definition file holds (a backfill's `set` expressions and `where` predicate), and
//! the checks every definition of the kinds that name tables by hand (backfill, orphans) passes
//! before the first change.
//!
//! `definition::check_text` runs when the file is read, without a server: one expression, no `;` outside
//! quotes and comments, not empty. [`check`] runs in the caller's `READ ONLY` transaction,
//! against the schema as the earlier pending steps leave it (columns pending migrations add are
//! shadows, read as their defaults), each query in a savepoint: the tables and columns exist;
//! each expression is parsed and typed by the server (`prepare`, which parses, analyzes and
//! describes without executing), its type can be assigned to its column (the same type, a
//! binary-coercible, implicit or assignment cast in `pg_cast`, or an untyped literal), the
//! predicate is a boolean; every name the expressions call as a function is looked up in
//! `pg_proc`: a volatile one is refused unless `allow_volatile` lists it, a `SECURITY DEFINER`
//! one always. For orphans: the referencing and referenced columns compare, `set_null` is not
//! asked of a `NOT NULL` column, and a quarantine's table, when it exists, has the table's
//! columns and pgmend's three; a table other tables reference with `ON DELETE` actions, or with
//! user triggers on `DELETE`, is not quarantined (what they would do is not in the ledger).
//! Every refusal names the file and the key (exit 2). A table an earlier pending migration
//! creates is checked when the repair runs (its run prepares the engine, which checks again).

use anyhow::{bail, Result};

use super::definition::{BackfillSpec, OrphanAction, OrphansSpec, Repair, Spec};
use crate::db::sql_text::Ident;
use crate::online::census::{with_shadows, AddedColumn};

/// The columns pgmend adds to a quarantine table after the quarantined table's own.
pub const QUARANTINE_COLUMNS: [(&str, &str); 3] = [
    ("pgmend_run_id", "bigint"),
    ("pgmend_reason", "text"),
    ("pgmend_quarantined_at", "timestamp with time zone"),
];

/// Checks `repair` against the database in `tx` (read-only), with `shadows` (columns pending
/// migrations add) and `created` (tables pending migrations create): nothing for the kinds
/// whose engines read the catalog themselves.
pub fn check(
    tx: &mut postgres::Transaction<'_>,
    repair: &Repair,
    shadows: &[AddedColumn],
    created: &[String],
) -> Result<()> {
    let mut savepoint = tx.transaction()?;
    let result = match &repair.spec {
        Spec::Backfill(b) => backfill(&mut savepoint, &repair.origin, b, shadows, created),
        Spec::Orphans(o) => orphans(&mut savepoint, &repair.origin, o, shadows, created),
        Spec::VoidDuplicates(_) | Spec::RebuildCounter(_) => Ok(()),
    };
    savepoint.rollback()?;
    result
}

/// A table's columns as the earlier pending steps leave them: (name, type oid), shadows last.
struct Columns {
    table: String,
    columns: Vec<(String, u32)>,
    shadows: Vec<AddedColumn>,
}

impl Columns {
    /// None: no such table (yet).
    fn read(
        tx: &mut postgres::Transaction<'_>,
        table: &Ident,
        shadows: &[AddedColumn],
    ) -> Result<Option<Columns>> {
        let exists: bool = tx
            .query_one(
                "SELECT to_regclass(quote_ident($1)) IS NOT NULL",
                &[&table.as_str()],
            )?
            .get(0);
        if !exists {
            return Ok(None);
        }
        let mut columns: Vec<(String, u32)> = tx
            .query(
                "SELECT attname::text, atttypid FROM pg_attribute
                  WHERE attrelid = to_regclass(quote_ident($1)) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&table.as_str()],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut active = Vec::new();
        for s in shadows
            .iter()
            .filter(|s| s.table.trim_matches('"') == table.as_str())
        {
            let name = s.column.trim_matches('"').to_string();
            if columns.iter().any(|(c, _)| *c == name) {
                continue;
            }
            let oid: Option<u32> = tx
                .query_one("SELECT to_regtype($1)::oid", &[&s.type_sql])?
                .get(0);
            columns.push((name, oid.unwrap_or(0)));
            active.push(s.clone());
        }
        Ok(Some(Columns {
            table: table.as_str().to_string(),
            columns,
            shadows: active,
        }))
    }

    fn type_of(&self, origin: &str, key: &str, column: &Ident) -> Result<u32> {
        match self.columns.iter().find(|(c, _)| c == column.as_str()) {
            Some((_, oid)) => Ok(*oid),
            None => bail!(
                "{origin}: {key}: table {} has no column {:?} (nor does an earlier pending migration add it)",
                self.table,
                column.as_str()
            ),
        }
    }

    /// `sql` with the shadows of this table in place.
    fn shadowed(&self, sql: &str) -> String {
        with_shadows(sql, &self.shadows)
    }
}

/// The table `table` names, or None when an earlier pending migration creates it (checked when
/// the repair runs).
fn table_columns(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    key: &str,
    table: &Ident,
    shadows: &[AddedColumn],
    created: &[String],
) -> Result<Option<Columns>> {
    match Columns::read(tx, table, shadows)? {
        Some(c) => Ok(Some(c)),
        None if created
            .iter()
            .any(|t| t.trim_matches('"') == table.as_str()) =>
        {
            Ok(None)
        }
        None => bail!(
            "{origin}: {key}: table {:?} does not exist in this database, and no pending migration of the release creates it",
            table.as_str()
        ),
    }
}

/// Asks the server to parse and type `sql` (nothing runs); a refusal names `key`.
fn typed(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    key: &str,
    sql: &str,
) -> Result<Vec<u32>> {
    let mut savepoint = tx.transaction()?;
    let prepared = savepoint.prepare(sql);
    let out = match prepared {
        Ok(statement) => Ok(statement
            .columns()
            .iter()
            .map(|c| c.type_().oid())
            .collect()),
        Err(e) => {
            let failure = crate::error::describe(&e);
            Err(anyhow::anyhow!(
                "{origin}: {key}: the server refuses it: {failure}; nothing was changed"
            ))
        }
    };
    savepoint.rollback()?;
    out
}

/// Whether a value of type `from` can be assigned to a column of type `to`, by the server's
/// rules for an `UPDATE`'s `SET`: the same type (a domain by its base type), an untyped literal,
/// any type to a string type (its output function), a cast in `pg_cast` allowed in
/// assignment, or arrays whose elements are.
fn assignable(tx: &mut postgres::Transaction<'_>, from: u32, to: u32) -> Result<bool> {
    Ok(tx
        .query_one(
            "WITH t AS (SELECT (SELECT CASE WHEN typtype = 'd' THEN typbasetype ELSE oid END FROM pg_type WHERE oid = $1) AS f,
                               (SELECT CASE WHEN typtype = 'd' THEN typbasetype ELSE oid END FROM pg_type WHERE oid = $2) AS c)
             SELECT f = c OR $1 = 'unknown'::regtype::oid OR c IN (SELECT oid FROM pg_type WHERE typcategory = 'S')
                 OR EXISTS (SELECT 1 FROM pg_cast WHERE castsource = f AND casttarget = c AND castcontext IN ('a', 'i'))
                 OR EXISTS (SELECT 1 FROM pg_type a JOIN pg_type b ON true
                             WHERE a.oid = f AND b.oid = c AND a.typelem <> 0 AND b.typelem <> 0 AND a.typlen = -1 AND b.typlen = -1
                               AND (a.typelem = b.typelem OR EXISTS (SELECT 1 FROM pg_cast WHERE castsource = a.typelem AND casttarget = b.typelem AND castcontext IN ('a', 'i'))))
               FROM t",
            &[&from, &to],
        )?
        .get::<_, Option<bool>>(0)
        .unwrap_or(false))
}

/// Refuses a `row_key` that does not find one row: a batch finds rows by it, so it must be a
/// `NOT NULL` column with a valid unique index of its own (the primary key, usually).
fn unique_key(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    table: &Ident,
    key: &Ident,
) -> Result<()> {
    let unique: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                             WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisunique AND i.indisvalid
                               AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = 1
                               AND a.attname = $2 AND a.attnotnull)",
            &[&table.as_str(), &key.as_str()],
        )?
        .get(0);
    if !unique {
        bail!(
            "{origin}: row_key: {} of {} is not a NOT NULL column with a unique index of its own: the batches find rows by it, so two rows sharing a key would share one ledger record, and a NULL key would never be reached. Name the primary key",
            key.as_str(),
            table.as_str()
        );
    }
    Ok(())
}

/// Refuses the functions `text` calls that are volatile (unless `allowed`) or `SECURITY
/// DEFINER`, as `pg_proc` has them for the names the text calls (every overload of a name on the
/// search path, or in the schema it is qualified with).
fn functions(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    key: &str,
    text: &str,
    allowed: &[String],
) -> Result<()> {
    let calls = crate::statements::expression_text(text).calls;
    if calls.is_empty() {
        return Ok(());
    }
    let rows = tx.query(
        "SELECT c.name, bool_or(p.provolatile = 'v'), bool_or(p.prosecdef)
           FROM unnest($1::text[]) AS c(name)
           JOIN pg_proc p ON p.proname = split_part(c.name, '.', (CASE WHEN strpos(c.name, '.') > 0 THEN 2 ELSE 1 END))
           JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE CASE WHEN strpos(c.name, '.') > 0 THEN n.nspname = split_part(c.name, '.', 1)
                     ELSE n.nspname = ANY (current_schemas(true)) END
          GROUP BY c.name ORDER BY c.name",
        &[&calls],
    )?;
    for r in rows {
        let (name, volatile, definer): (String, bool, bool) = (r.get(0), r.get(1), r.get(2));
        if definer {
            bail!("{origin}: {key} calls {name}(), a SECURITY DEFINER function: it would run with its owner's rights inside every batch. Write the expression without it");
        }
        let bare = name.rsplit('.').next().unwrap_or(&name);
        if volatile && !allowed.iter().any(|a| a == bare || *a == name) {
            bail!("{origin}: {key} calls {name}(), which is VOLATILE: it may give another value each time (a preview would not show what a batch writes, and a rerun would change the rows again). Write it without, or list it: allow_volatile = [\"{bare}\"]");
        }
    }
    Ok(())
}

fn backfill(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    spec: &BackfillSpec,
    shadows: &[AddedColumn],
    created: &[String],
) -> Result<()> {
    let Some(columns) = table_columns(tx, origin, "table", &spec.table, shadows, created)? else {
        return Ok(());
    };
    columns.type_of(origin, "row_key", &spec.row_key)?;
    unique_key(tx, origin, &spec.table, &spec.row_key)?;
    let table = &spec.table;
    // A batch evaluates the text row by row on the rows it locks: an aggregate, a window or a
    // set-returning function cannot be there, and the server says so of a `WHERE` too.
    let row_by_row = |tx: &mut postgres::Transaction<'_>, key: &str, text: &str| {
        typed(
            tx,
            origin,
            key,
            &columns.shadowed(&format!("SELECT 1 FROM {table} WHERE (({text}) IS NULL)")),
        )
    };
    let predicate = typed(
        tx,
        origin,
        "where",
        &columns.shadowed(&format!("SELECT ({}) FROM {table}", spec.predicate)),
    )?;
    row_by_row(tx, "where", &spec.predicate)?;
    if predicate.first() != Some(&postgres::types::Type::BOOL.oid()) {
        bail!("{origin}: where is not a boolean predicate; write a condition that chooses the rows, such as `total_cents IS NULL`");
    }
    functions(tx, origin, "where", &spec.predicate, &spec.allow_volatile)?;
    for (column, expression) in &spec.set {
        let key = format!("set.{}", column.as_str());
        let to = columns.type_of(origin, &key, column)?;
        let from = typed(
            tx,
            origin,
            &key,
            &columns.shadowed(&format!("SELECT ({expression}) FROM {table}")),
        )?;
        row_by_row(tx, &key, expression)?;
        let from = from.first().copied().unwrap_or(0);
        let literal = crate::statements::expression_text(expression).untyped_literal;
        if !literal && !assignable(tx, from, to)? {
            let names = tx.query_one(
                "SELECT format_type($1, NULL), format_type($2, NULL)",
                &[&from, &to],
            )?;
            bail!(
                "{origin}: {key}: the expression is of type {}, which column {} ({}) does not take; cast it in the expression",
                names.get::<_, String>(0),
                column.as_str(),
                names.get::<_, String>(1)
            );
        }
        functions(tx, origin, &key, expression, &spec.allow_volatile)?;
    }
    Ok(())
}

fn orphans(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    spec: &OrphansSpec,
    shadows: &[AddedColumn],
    created: &[String],
) -> Result<()> {
    let Some(columns) = table_columns(tx, origin, "table", &spec.table, shadows, created)? else {
        return Ok(());
    };
    let Some(referenced) = table_columns(
        tx,
        origin,
        "references.table",
        &spec.references.table,
        shadows,
        created,
    )?
    else {
        return Ok(());
    };
    columns.type_of(origin, "row_key", &spec.row_key)?;
    unique_key(tx, origin, &spec.table, &spec.row_key)?;
    for c in &spec.columns {
        columns.type_of(origin, "columns", c)?;
    }
    for c in &spec.references.columns {
        referenced.type_of(origin, "references.columns", c)?;
    }
    let on = spec
        .columns
        .iter()
        .zip(&spec.references.columns)
        .map(|(c, r)| format!("t.{c} = r.{r}"))
        .collect::<Vec<_>>()
        .join(" AND ");
    let mut all_shadows = columns.shadows.clone();
    all_shadows.extend(referenced.shadows.iter().cloned());
    typed(
        tx,
        origin,
        "references",
        &with_shadows(
            &format!(
                "SELECT 1 FROM {} t JOIN {} r ON {on}",
                spec.table, spec.references.table
            ),
            &all_shadows,
        ),
    )?;
    match spec.action {
        OrphanAction::SetNull => {
            let not_null: Vec<String> = tx
                .query(
                    "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(quote_ident($1))
                        AND attname = ANY ($2) AND attnotnull ORDER BY attnum",
                    &[
                        &spec.table.as_str(),
                        &spec.columns.iter().map(Ident::as_str).collect::<Vec<_>>(),
                    ],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if !not_null.is_empty() {
                bail!(
                    "{origin}: action = \"set_null\": {} of {} is NOT NULL, so it cannot be cleared; quarantine the rows instead (action = \"quarantine\")",
                    not_null.join(", "),
                    spec.table.as_str()
                );
            }
        }
        OrphanAction::Quarantine => quarantine(tx, origin, spec, &columns)?,
    }
    Ok(())
}

/// The quarantine's refusals: the table's delete would do more than the ledger records, or the
/// quarantine table exists with other columns.
fn quarantine(
    tx: &mut postgres::Transaction<'_>,
    origin: &str,
    spec: &OrphansSpec,
    columns: &Columns,
) -> Result<()> {
    if let Some(table) = spec.quarantine() {
        let key = if spec.quarantine_table.is_some() {
            "quarantine_table"
        } else {
            "the quarantine table (<table>_quarantine by default)"
        };
        if let Some(existing) = Columns::read(tx, &table, &[])? {
            let mut expected: Vec<(String, u32)> = columns.columns.clone();
            for (name, ty) in QUARANTINE_COLUMNS {
                let oid: u32 = tx
                    .query_one("SELECT $1::text::regtype::oid", &[&ty])?
                    .get(0);
                expected.push((name.to_string(), oid));
            }
            if existing.columns != expected {
                let show = |cols: &[(String, u32)]| {
                    cols.iter()
                        .map(|(c, _)| c.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                bail!(
            "{origin}: {key}: table {:?} exists with other columns ({}) than a quarantine of {} has ({}, in that order and with the same types); name another table with quarantine_table, or rename that one",
            table.as_str(),
            show(&existing.columns),
            spec.table.as_str(),
            show(&expected)
        );
            }
        }
    }
    let actions: Vec<String> = tx
        .query(
            "SELECT format('%s (constraint %s, ON DELETE %s)', c.conrelid::regclass, c.conname,
                           CASE c.confdeltype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' ELSE 'SET DEFAULT' END)
               FROM pg_constraint c
              WHERE c.contype = 'f' AND c.confrelid = to_regclass(quote_ident($1)) AND c.confdeltype IN ('c', 'n', 'd')
              ORDER BY 1",
            &[&spec.table.as_str()],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !actions.is_empty() {
        bail!(
            "{origin}: action = \"quarantine\": other tables reference {} with ON DELETE actions, which would change their rows outside the ledger: {}. Repair those references first, or set the orphans' references to NULL (action = \"set_null\")",
            spec.table.as_str(),
            actions.join("; ")
        );
    }
    let triggers: Vec<String> = tx
        .query(
            "SELECT tgname::text FROM pg_trigger
              WHERE tgrelid = to_regclass(quote_ident($1)) AND NOT tgisinternal AND (tgtype & 8) <> 0 ORDER BY 1",
            &[&spec.table.as_str()],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !triggers.is_empty() {
        bail!(
            "{origin}: action = \"quarantine\": {} has triggers on DELETE ({}), whose work would not be in the ledger; set the references to NULL instead (action = \"set_null\"), or quarantine by hand",
            spec.table.as_str(),
            triggers.join(", ")
        );
    }
    Ok(())
}
