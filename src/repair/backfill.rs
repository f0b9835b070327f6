//! The backfill engine: SQL for one batch (lock the rows of a range that `where` chooses,
//! evaluate each `set` expression on the locked version, write the rows whose value differs and
//! a compact ledger record for each), for the dry run's diff, for the table as a run would leave
//! it, and for reconciling; and, when a batch fails on a row, finding that row.
//!
//! A run walks ranges of `row_key` (`store::runs::range_targets_sql`), so `--jobs` workers take
//! disjoint rows. `range_batch`: one statement. Its `locked` CTE selects the range's rows where
//! `where` holds, `FOR UPDATE`, with each column's value before and each expression's value
//! cast to the column's type without its modifier (so a comparison neither rounds nor cuts);
//! in READ COMMITTED a row another session changed meanwhile is locked at its latest version and
//! `where` and the expressions are evaluated again on it (the row as it is then). The `UPDATE`
//! writes only the rows where some value differs, assigning each value with the column's own
//! rules (a modifier rounds or refuses it there), and the ledger keeps the rows whose stored value
//! changed, so a second run writes and records nothing. The table is named as written, never
//! aliased, so an expression may qualify a column by the table's name (a lookup subquery).

use anyhow::Result;

use super::catalog::column_type;
use super::definition::BackfillSpec;
use crate::db::retry::LockPolicy;
use crate::db::sql_text::{Binds, BoundSql, Ident, KeyRange, TypeName};
use crate::error::PgContext;
use crate::store;

/// The ledger shape of a backfill run's records.
const BACKFILL_SHAPE: i16 = 1;

pub struct BackfillEngine {
    pub spec: BackfillSpec,
    pub key_type: TypeName,
    /// Each `set` column with its expression and the type its value is compared as
    /// ([`TypeName::compared_of_column`]), in column order.
    set: Vec<(Ident, String, TypeName)>,
}

impl BackfillEngine {
    pub fn prepare(
        client: &mut impl postgres::GenericClient,
        spec: &BackfillSpec,
    ) -> Result<BackfillEngine> {
        let key_type = column_type(client, &spec.table, &spec.row_key)?;
        let mut set = Vec::new();
        for (column, expression) in &spec.set {
            let ty = TypeName::compared_of_column(client, &spec.table, column)
                .doing(format!("reading the type of {}.{}", spec.table.as_str(), column.as_str()))?
                .ok_or_else(|| anyhow::anyhow!("{}.{} does not exist; the repair definition does not match this database (has the migration that adds it been applied?)", spec.table.as_str(), column.as_str()))?;
            set.push((column.clone(), expression.clone(), ty));
        }
        Ok(BackfillEngine {
            spec: spec.clone(),
            key_type,
            set,
        })
    }

    /// For a preview on a database that may lack the columns pending migrations add: the
    /// types as `types` gives them (the shadows' own), in `spec.set`'s order.
    pub fn with_types(
        spec: &BackfillSpec,
        key_type: TypeName,
        types: Vec<TypeName>,
    ) -> BackfillEngine {
        BackfillEngine {
            set: spec
                .set
                .iter()
                .zip(types)
                .map(|((c, e), t)| (c.clone(), e.clone(), t))
                .collect(),
            spec: spec.clone(),
            key_type,
        }
    }

    fn table(&self) -> &Ident {
        &self.spec.table
    }

    /// `"table"."column"`.
    fn col(&self, column: &Ident) -> String {
        format!("{}.{column}", self.table())
    }

    /// The range freeze: ranges of `row_key` (see [`store::runs::range_targets_sql`]). The
    /// caller binds the run.
    pub fn freeze_ranges_sql(&self, sample: store::runs::RangeSample) -> String {
        store::runs::column_range_targets_sql(self.table(), &self.spec.row_key, sample)
    }

    /// Each row's values before (`b0`...) and as the expressions make them (`a0`...), over
    /// the table's rows where `where` holds and `filter`.
    fn values(&self, filter: &str) -> String {
        let mut cols = vec![format!("{} AS k", self.col(&self.spec.row_key))];
        for (i, (column, expression, ty)) in self.set.iter().enumerate() {
            cols.push(format!("{} AS b{i}", self.col(column)));
            cols.push(format!("(({expression}))::{ty} AS a{i}"));
        }
        format!(
            "SELECT {} FROM {table} WHERE ({predicate}) AND {filter}",
            cols.join(", "),
            table = self.table(),
            predicate = self.spec.predicate,
        )
    }

    /// Some value differs, as text (equal is not the same: `1.5 = 1.50`, citext's case, json
    /// that has no `=`): `x.b0::text IS DISTINCT FROM x.a0::text OR ...`.
    fn differs(&self, alias: &str) -> String {
        (0..self.set.len())
            .map(|i| format!("{alias}.b{i}::text IS DISTINCT FROM {alias}.a{i}::text"))
            .collect::<Vec<_>>()
            .join(" OR ")
    }

    fn list(&self, alias: &str, prefix: &str) -> String {
        (0..self.set.len())
            .map(|i| format!("{alias}.{prefix}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One batch of run `run_id`, the rows with `row_key` after `after` and up to `up_to`
    /// (None: open), with its values. See the module's docs.
    pub fn range_batch(&self, run_id: i64, after: Option<&str>, up_to: Option<&str>) -> BoundSql {
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let range = KeyRange::push(&mut binds, after, up_to);
        let key = self.col(&self.spec.row_key);
        let in_range = range.predicate(&key, &self.key_type);
        let sets = self
            .set
            .iter()
            .enumerate()
            .map(|(i, (c, _, _))| format!("{c} = l.a{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "WITH locked AS ({values} ORDER BY {key} FOR UPDATE OF {table}),
             changed AS (
               UPDATE {table} SET {sets} FROM locked l
                WHERE {key} = l.k AND ({differs})
               RETURNING l.k, jsonb_build_array({before}) AS before, jsonb_build_array({after_cols_only}) AS after)
             {ledger_insert}
             SELECT {run}, {shape}, jsonb_build_array(k), before, after, NULL FROM changed
              WHERE before::text IS DISTINCT FROM after::text",
            values = self.values(&in_range),
            table = self.table(),
            differs = self.differs("l"),
            before = self.list("l", "b"),
            after_cols_only = self
                .set
                .iter()
                .map(|(c, _, _)| self.col(c))
                .collect::<Vec<_>>()
                .join(", "),
            ledger_insert = store::ledger_compact_insert(),
            shape = BACKFILL_SHAPE,
        );
        BoundSql { sql, binds }
    }

    /// The shape of the compact ledger records a batch writes: the key, the `set` columns
    /// before and after.
    pub fn ledger_shapes(&self) -> Vec<store::runs::LedgerShape> {
        vec![store::runs::LedgerShape {
            shape: BACKFILL_SHAPE,
            target_table: self.table().as_str().to_string(),
            action: "update",
            key_columns: vec![self.spec.row_key.as_str().to_string()],
            columns: self
                .set
                .iter()
                .map(|(c, _, _)| c.as_str().to_string())
                .collect(),
            reason: "backfilled: the set expressions where the row matches where".into(),
        }]
    }

    /// For the dry run and `verify`: every row that would change, as text: the key, then for
    /// each `set` column its value before and after.
    pub fn preview_sql(&self) -> String {
        let text = |prefix: &str| {
            (0..self.set.len())
                .map(|i| format!("x.{prefix}{i}::text"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "SELECT x.k::text, {before}, {after} FROM ({values}) x WHERE {differs} ORDER BY x.k",
            values = self.values("true"),
            before = text("b"),
            after = text("a"),
            differs = self.differs("x"),
        )
    }

    /// The table as a run would leave it on a quiet database, as the body of a CTE named like
    /// the table: every row of `base` (the table, with the columns pending migrations add), each
    /// `set` column its expression's value where `where` holds. `columns`: the table's other
    /// columns. `base` is aliased with the table's name, so the expressions read as they do in
    /// a batch.
    pub fn predicted_sql(&self, columns: &[Ident], base: &str) -> String {
        let mut cols: Vec<String> = columns.iter().map(|c| self.col(c)).collect();
        for (column, expression, ty) in &self.set {
            cols.push(format!(
                "CASE WHEN ({predicate}) THEN (({expression}))::{ty} ELSE {col} END AS {column}",
                predicate = self.spec.predicate,
                col = self.col(column),
            ));
        }
        format!(
            "SELECT {} FROM ({base}) AS {}",
            cols.join(", "),
            self.table()
        )
    }

    /// After a run: how many rows `where` chooses still differ from their expressions.
    pub fn reconcile_sql(&self) -> String {
        format!(
            "SELECT count(*) FROM ({values}) x WHERE {differs}",
            values = self.values("true"),
            differs = self.differs("x"),
        )
    }

    /// The keys of a range's rows, in order, as text: where a failed batch's row is looked for.
    fn keys_sql(&self, range: KeyRange) -> String {
        let key = self.col(&self.spec.row_key);
        format!(
            "SELECT {key}::text FROM {table} WHERE {in_range} ORDER BY {key}",
            table = self.table(),
            in_range = range.predicate(&key, &self.key_type),
        )
    }

    /// Evaluates `where` and the expressions on rows `$1` (keys as text), every value used.
    fn probe_sql(&self, which: Probe) -> String {
        let key = self.col(&self.spec.row_key);
        let value = match which {
            Probe::All => {
                let mut parts = vec![format!("({})::text", self.spec.predicate)];
                parts.extend(self.set.iter().map(|(_, e, ty)| {
                    format!(
                        "CASE WHEN ({}) THEN (({e}))::{ty}::text END",
                        self.spec.predicate
                    )
                }));
                parts.join(" || ',' || ")
            }
            Probe::Where => format!("({})::text", self.spec.predicate),
            Probe::Set(i) => {
                let (_, e, ty) = &self.set[i];
                format!("(({e}))::{ty}::text")
            }
        };
        format!(
            "SELECT max(length(coalesce({value}, ''))) FROM {table} WHERE {key} = ANY ($1::text[]::{kt}[])",
            table = self.table(),
            kt = self.key_type,
        )
    }

    /// After a batch over `(after, up_to]` failed with a data error: the first row whose
    /// `where` or expression raises, with what raised, as `(key, key of the definition, error)`.
    /// Read in a `READ ONLY` transaction, halving the range's keys; when every value computes,
    /// the row whose write the table refuses ([`Self::find_refused_write`]).
    pub fn find_failing_row(
        &self,
        client: &mut postgres::Client,
        policy: &LockPolicy,
        after: Option<&str>,
        up_to: Option<&str>,
    ) -> Result<Option<(String, String, String)>> {
        let mut tx = crate::db::connect::read_only(client)?;
        let mut binds = Binds::new();
        let range = KeyRange::push(&mut binds, after, up_to);
        let keys: Vec<String> = tx
            .query(&self.keys_sql(range), &binds.params())
            .doing("listing the keys of the failed batch")?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let fails = |tx: &mut postgres::Transaction<'_>,
                     which: Probe,
                     keys: &[String]|
         -> Result<Option<String>> {
            let mut sp = tx.transaction().doing("opening a savepoint")?;
            let out = match sp.query_one(&self.probe_sql(which), &[&keys]) {
                Ok(_) => None,
                Err(e) => Some(crate::error::describe(&e).to_string()),
            };
            sp.rollback().doing("closing a savepoint")?;
            Ok(out)
        };
        let mut slice: &[String] = &keys;
        if fails(&mut tx, Probe::All, slice)?.is_none() {
            let _ = tx.rollback();
            return self.find_refused_write(client, policy, &keys);
        }
        while slice.len() > 1 {
            let (left, right) = slice.split_at(slice.len() / 2);
            slice = if fails(&mut tx, Probe::All, left)?.is_some() {
                left
            } else {
                right
            };
        }
        let mut found = None;
        if let Some(e) = fails(&mut tx, Probe::Where, slice)? {
            found = Some(("where".to_string(), e));
        } else {
            for (i, (column, _, _)) in self.set.iter().enumerate() {
                if let Some(e) = fails(&mut tx, Probe::Set(i), slice)? {
                    found = Some((format!("set.{}", column.as_str()), e));
                    break;
                }
            }
        }
        let _ = tx.rollback();
        Ok(found.map(|(key, e)| (slice[0].clone(), key, e)))
    }
}

impl BackfillEngine {
    /// When every value computes but the table refuses one as it is written (too long for
    /// its column, a `CHECK`, `NOT NULL` or foreign key, a trigger that raises): the row, found
    /// by writing halves of `keys` as a batch would (the rows whose values differ), each in a
    /// savepoint, in a transaction under the run's `policy` (its lock and statement timeouts,
    /// fenced like a batch) that is rolled back at the end, so nothing stays written; and the
    /// `set` column that alone fails the same way (`set` when only their combination does).
    /// None when no half fails alone (two rows that clash only together), or a deferred
    /// constraint (checked at a commit the search never reaches).
    fn find_refused_write(
        &self,
        client: &mut postgres::Client,
        policy: &LockPolicy,
        keys: &[String],
    ) -> Result<Option<(String, String, String)>> {
        let mut tx = client
            .transaction()
            .doing("opening a transaction to find the refused row")?;
        tx.batch_execute(&policy.set_local_sql())
            .doing("setting the search's timeouts")?;
        let fails = |tx: &mut postgres::Transaction<'_>,
                     columns: &[usize],
                     keys: &[String]|
         -> Result<Option<Refused>> {
            let mut sp = tx.transaction().doing("opening a savepoint")?;
            let out = match sp.execute(&self.write_probe_sql(columns), &[&keys]) {
                Ok(_) => None,
                // A lock timeout, a lost session: no row's doing, so no row is named.
                Err(e) if !e.code().is_some_and(|c| raised_by_a_row(c.code())) => {
                    return Err(e)
                        .doing("writing the failed batch's rows again to find the refused one")
                }
                Err(e) => Some(Refused {
                    same: e.as_db_error().map(|d| {
                        (
                            d.code().code().to_string(),
                            d.constraint().map(String::from),
                        )
                    }),
                    words: crate::error::describe(&e).to_string(),
                }),
            };
            sp.rollback().doing("closing a savepoint")?;
            Ok(out)
        };
        let every: Vec<usize> = (0..self.set.len()).collect();
        let mut slice = keys;
        let Some(mut raised) = fails(&mut tx, &every, slice)? else {
            return Ok(None);
        };
        while slice.len() > 1 {
            let (left, right) = slice.split_at(slice.len() / 2);
            if let Some(r) = fails(&mut tx, &every, left)? {
                (slice, raised) = (left, r);
            } else if let Some(r) = fails(&mut tx, &every, right)? {
                (slice, raised) = (right, r);
            } else {
                return Ok(None);
            }
        }
        let mut part = "set".to_string();
        if self.set.len() > 1 {
            for (i, (column, _, _)) in self.set.iter().enumerate() {
                // A column alone names the part only when it fails as the whole write did
                // (the same SQLSTATE and constraint): `CHECK (a <= b)` over two columns
                // fails with one of them alone for another reason.
                if let Some(r) = fails(&mut tx, &[i], slice)? {
                    if r.same == raised.same {
                        part = format!("set.{}", column.as_str());
                        break;
                    }
                }
            }
        } else if let Some((column, _, _)) = self.set.first() {
            part = format!("set.{}", column.as_str());
        }
        let _ = tx.rollback();
        Ok(Some((slice[0].clone(), part, raised.words)))
    }

    /// The batch's write (without its ledger) of the `set` columns numbered `columns`, on rows
    /// `$1` (keys as text) where `where` holds and a value differs, as `range_batch` writes.
    fn write_probe_sql(&self, columns: &[usize]) -> String {
        let key = self.col(&self.spec.row_key);
        let sets = columns
            .iter()
            .map(|&i| format!("{} = l.a{i}", self.set[i].0))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "UPDATE {table} SET {sets} FROM ({values}) l WHERE {key} = l.k AND ({differs})",
            table = self.table(),
            values = self.values(&format!("{key} = ANY ($1::text[]::{}[])", self.key_type)),
            differs = self.differs("l"),
        )
    }
}

/// A write the table refused: its SQLSTATE and constraint, and the server's words.
struct Refused {
    same: Option<(String, Option<String>)>,
    words: String,
}

/// Whether an error of SQLSTATE `state` comes of what a row holds: a data exception, an
/// integrity violation, an error raised by a function (classes 22, 23, 2F, 38, 39 and P0).
pub fn raised_by_a_row(state: &str) -> bool {
    ["22", "23", "2F", "38", "39", "P0"].contains(&state.get(..2).unwrap_or(""))
}

#[derive(Clone, Copy)]
enum Probe {
    All,
    Where,
    Set(usize),
}

#[cfg(test)]
mod tests {
    use super::BackfillEngine;
    use crate::db::sql_text::TypeName;
    use crate::repair::definition::BackfillSpec;

    fn lines() -> BackfillEngine {
        let spec: BackfillSpec = toml::from_str(
            "kind = \"backfill\"\ndescription = \"d\"\ntable = \"order_lines\"\nrow_key = \"line_id\"\nset = { total_cents = \"quantity * unit_cents\" }\nwhere = \"total_cents IS NULL\"\n",
        )
        .unwrap();
        BackfillEngine::with_types(
            &spec,
            TypeName::for_tests("bigint"),
            vec![TypeName::for_tests("bigint")],
        )
    }

    fn flat(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn a_batch_locks_the_chosen_rows_of_its_range_and_writes_only_what_differs() {
        let batch = lines().range_batch(7, Some("10"), Some("20"));
        assert_eq!(batch.binds.shown(), ["7", "\"10\"", "\"20\""]);
        assert_eq!(
            flat(&batch.sql),
            "WITH locked AS (SELECT \"order_lines\".\"line_id\" AS k, \"order_lines\".\"total_cents\" AS b0, ((quantity * unit_cents))::bigint AS a0 \
             FROM \"order_lines\" WHERE (total_cents IS NULL) AND \"order_lines\".\"line_id\" > $2::text::bigint AND \"order_lines\".\"line_id\" <= $3::text::bigint \
             ORDER BY \"order_lines\".\"line_id\" FOR UPDATE OF \"order_lines\"), \
             changed AS ( UPDATE \"order_lines\" SET \"total_cents\" = l.a0 FROM locked l WHERE \"order_lines\".\"line_id\" = l.k AND (l.b0::text IS DISTINCT FROM l.a0::text) \
             RETURNING l.k, jsonb_build_array(l.b0) AS before, jsonb_build_array(\"order_lines\".\"total_cents\") AS after) \
             INSERT INTO \"pgmend\".\"ledger_compact\" (run_id, shape, row_key, before, after, args) \
             SELECT $1, 1, jsonb_build_array(k), before, after, NULL FROM changed WHERE before::text IS DISTINCT FROM after::text"
        );
    }

    #[test]
    fn the_preview_and_the_prediction_evaluate_as_the_batch_does() {
        let e = lines();
        assert_eq!(
            flat(&e.preview_sql()),
            "SELECT x.k::text, x.b0::text, x.a0::text FROM (SELECT \"order_lines\".\"line_id\" AS k, \"order_lines\".\"total_cents\" AS b0, \
             ((quantity * unit_cents))::bigint AS a0 FROM \"order_lines\" WHERE (total_cents IS NULL) AND true) x WHERE x.b0::text IS DISTINCT FROM x.a0::text ORDER BY x.k"
        );
        assert_eq!(
            flat(&e.predicted_sql(&[crate::db::sql_text::Ident::new("line_id")], "SELECT * FROM b")),
            "SELECT \"order_lines\".\"line_id\", CASE WHEN (total_cents IS NULL) THEN ((quantity * unit_cents))::bigint ELSE \"order_lines\".\"total_cents\" END AS \"total_cents\" \
             FROM (SELECT * FROM b) AS \"order_lines\""
        );
    }

    #[test]
    fn a_failed_batch_is_probed_with_every_value_used() {
        let e = lines();
        assert_eq!(
            flat(&e.probe_sql(super::Probe::All)),
            "SELECT max(length(coalesce((total_cents IS NULL)::text || ',' || CASE WHEN (total_cents IS NULL) THEN ((quantity * unit_cents))::bigint::text END, ''))) \
             FROM \"order_lines\" WHERE \"order_lines\".\"line_id\" = ANY ($1::text[]::bigint[])"
        );
    }
}
