//! The orphans engine: SQL for one batch (the rows of a range whose reference has no row to
//! refer to, set to NULL or quarantined, each with its ledger record), for the quarantine table,
//! for the dry run, for the table as a run would leave it, and for reconciling.
//!
//! An orphan is what the foreign key from `columns` to `references` would refuse under its match
//! rule ([`OrphansEngine::orphan`]): with MATCH SIMPLE a row with a NULL in its reference is not
//! checked, with MATCH FULL a row with some but not all of them NULL is refused too. A run walks
//! ranges of `row_key`, as a backfill does. A batch is two statements in its transaction: the
//! first locks the range's orphans (`FOR UPDATE`, waiting for the application's writers), the
//! second, whose snapshot is taken once every lock is held, finds them again and changes only
//! those that are still orphans: a row the application pointed at a parent, or whose parent it
//! inserted, in the transaction the lock waited for, is left alone. (A parent committed after the
//! second statement began is not seen: its row is changed, and its record undoes it.)
//!
//! `set_null` writes a compact ledger record per row (the columns before, NULL after, and the
//! reference as the reason's argument). `quarantine` deletes the row and copies it, in the same
//! statement, into the quarantine table (the table's columns, then `pgmend_run_id`,
//! `pgmend_reason`, `pgmend_quarantined_at`; created `LIKE` the table in the table's schema when
//! the run starts: [`OrphansEngine::create_quarantine_sql`]), and writes a full ledger record
//! with the whole row as its before-image (`delete`), from which undo puts it back.

use anyhow::Result;

use super::catalog::{column_type, column_types};
use super::definition::{MatchRule, OrphanAction, OrphansSpec};
use crate::db::sql_text::{
    all_not_null, column_list, names, Binds, BoundSql, Ident, KeyRange, Literal, TypeName,
};
use crate::error::PgContext;
use crate::store;

/// The ledger shape of a `set_null` run's compact records.
const SET_NULL_SHAPE: i16 = 1;

pub struct OrphansEngine {
    pub spec: OrphansSpec,
    pub key_type: TypeName,
    /// For `quarantine`: the quarantine table (in the table's schema) and the table's columns.
    pub quarantine: Option<(Ident, Vec<Ident>)>,
}

impl OrphansEngine {
    pub fn prepare(
        client: &mut impl postgres::GenericClient,
        spec: &OrphansSpec,
    ) -> Result<OrphansEngine> {
        let key_type = column_type(client, &spec.table, &spec.row_key)?;
        column_types(client, &spec.table, &spec.columns)?;
        column_types(client, &spec.references.table, &spec.references.columns)?;
        let quarantine = match spec.quarantine() {
            None => None,
            Some(name) => {
                let row = client
                    .query_one(
                        "SELECT n.nspname::text, array(SELECT attname::text FROM pg_attribute
                                                     WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum)
                           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.oid = to_regclass(quote_ident($1))",
                        &[&spec.table.as_str()],
                    )
                    .doing(format!("reading the columns of {}", spec.table.as_str()))?;
                let schema: String = row.get(0);
                let columns: Vec<String> = row.get(1);
                Some((
                    Ident::qualified(schema, name.as_str()),
                    columns.into_iter().map(Ident::new).collect(),
                ))
            }
        };
        Ok(OrphansEngine {
            spec: spec.clone(),
            key_type,
            quarantine,
        })
    }

    /// For a preview: no catalog read (a quarantine's table is not needed there).
    pub fn preview_only(spec: &OrphansSpec) -> OrphansEngine {
        OrphansEngine {
            spec: spec.clone(),
            key_type: TypeName::text(),
            quarantine: None,
        }
    }

    /// Whether the row aliased `alias` is an orphan: what the foreign key would refuse.
    pub fn orphan(&self, alias: &str) -> String {
        let s = &self.spec;
        let on = s
            .columns
            .iter()
            .zip(&s.references.columns)
            .map(|(c, r)| format!("pgmend_parent.{r} = {alias}.{c}"))
            .collect::<Vec<_>>()
            .join(" AND ");
        let missing = format!(
            "{not_null} AND NOT EXISTS (SELECT 1 FROM {parent} pgmend_parent WHERE {on})",
            not_null = all_not_null(alias, &s.columns),
            parent = s.references.table,
        );
        match s.match_rule {
            MatchRule::Full if s.columns.len() > 1 => format!(
                "(num_nonnulls({cols}) BETWEEN 1 AND {partial} OR {missing})",
                cols = column_list(alias, &s.columns),
                partial = s.columns.len() - 1,
            ),
            _ => format!("({missing})"),
        }
    }

    /// The range freeze: ranges of `row_key`. The caller binds the run.
    pub fn freeze_ranges_sql(&self, sample: store::runs::RangeSample) -> String {
        store::runs::column_range_targets_sql(&self.spec.table, &self.spec.row_key, sample)
    }

    /// Creates the quarantine table when it is missing (in the transaction that freezes the
    /// run): the table's columns `LIKE` it (types and `NOT NULL`, no defaults, constraints or
    /// indexes), then pgmend's.
    pub fn create_quarantine_sql(&self) -> Option<String> {
        let (table, _) = self.quarantine.as_ref()?;
        Some(format!(
            "CREATE TABLE IF NOT EXISTS {table} (LIKE {source}, pgmend_run_id bigint NOT NULL, pgmend_reason text NOT NULL,
                                                pgmend_quarantined_at timestamptz NOT NULL DEFAULT now())",
            source = &self.spec.table,
        ))
    }

    /// The orphans of a range, `FOR UPDATE`, as the first statement of a batch; with
    /// `columns`, each row's key (`k`) and referencing columns (`b0`...).
    fn locked(&self, range: KeyRange, columns: bool) -> String {
        let s = &self.spec;
        let mut cols = vec![format!("t.{} AS k", s.row_key)];
        if columns {
            cols.extend(
                s.columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("t.{c} AS b{i}")),
            );
        }
        format!(
            "SELECT {cols} FROM {table} t WHERE {in_range} AND {orphan} ORDER BY t.{key} FOR UPDATE OF t",
            cols = cols.join(", "),
            table = &s.table,
            in_range = range.predicate(&s.row_key.of("t"), &self.key_type),
            orphan = self.orphan("t"),
            key = &s.row_key,
        )
    }

    /// The first statement of a batch over `(after, up_to]`: lock its orphans.
    pub fn lock_batch(&self, after: Option<&str>, up_to: Option<&str>) -> BoundSql {
        let mut binds = Binds::new();
        let range = KeyRange::push(&mut binds, after, up_to);
        BoundSql {
            sql: format!("SELECT count(*) FROM ({}) x", self.locked(range, false)),
            binds,
        }
    }

    /// The reference of row `alias` and where it points, for a reason:
    /// `no row of products has (product_id) = (17)`.
    fn reason(&self, alias: &str) -> String {
        let s = &self.spec;
        format!(
            "format('no row of %s has (%s) = (%s)', {parent}, {parent_cols}, concat_ws(', ', {values}))",
            parent = s.references.table.literal(),
            parent_cols = Literal::new(
                names(&s.references.columns, ", ")
            ),
            values = column_list(alias, &s.columns),
        )
    }

    /// The second statement of a batch of run `run_id` over `(after, up_to]`: the orphans found
    /// again (still orphans once every lock is held) set to NULL or quarantined, with their
    /// ledger records.
    pub fn range_batch(&self, run_id: i64, after: Option<&str>, up_to: Option<&str>) -> BoundSql {
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let range = KeyRange::push(&mut binds, after, up_to);
        let s = &self.spec;
        let sql = match (&self.quarantine, s.action) {
            (Some((quarantine, columns)), OrphanAction::Quarantine) => format!(
                "WITH o AS ({locked}),
                 gone AS (DELETE FROM {table} t USING o WHERE t.{key} = o.k RETURNING t.*),
                 kept AS (INSERT INTO {quarantine} ({cols}, pgmend_run_id, pgmend_reason)
                          SELECT {g_cols}, {run}, {reason} || '; quarantined' FROM gone g)
                 {ledger_insert}
                 SELECT {run}, {table_literal}, jsonb_build_object({key_literal}, g.{key}), 'delete', to_jsonb(g), NULL,
                        {reason} || '; quarantined into ' || {quarantine_literal}
                   FROM gone g",
                locked = self.locked(range, false),
                table = &s.table,
                key = &s.row_key,
                cols = column_list("", columns),
                g_cols = column_list("g", columns),
                reason = self.reason("g"),
                ledger_insert = store::ledger_insert(),
                table_literal = s.table.literal(),
                key_literal = s.row_key.literal(),
                quarantine_literal = Literal::new(quarantine.as_str()),
            ),
            _ => {
                let nulls = s
                    .columns
                    .iter()
                    .map(|c| format!("{c} = NULL"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let before = (0..s.columns.len())
                    .map(|i| format!("c.b{i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let after = vec!["NULL"; s.columns.len()].join(", ");
                format!(
                    "WITH o AS ({locked}),
                     changed AS (UPDATE {table} t SET {nulls} FROM o WHERE t.{key} = o.k RETURNING o.*)
                     {ledger_insert}
                     SELECT {run}, {shape}, jsonb_build_array(c.k), jsonb_build_array({before}), jsonb_build_array({after}),
                            jsonb_build_array(concat_ws(', ', {before}))
                       FROM changed c",
                    locked = self.locked(range, true),
                    table = &s.table,
                    key = &s.row_key,
                    ledger_insert = store::ledger_compact_insert(),
                    shape = SET_NULL_SHAPE,
                )
            }
        };
        BoundSql { sql, binds }
    }

    /// The shape of a `set_null` run's compact records; a quarantine writes full ones.
    pub fn ledger_shapes(&self) -> Vec<store::runs::LedgerShape> {
        let s = &self.spec;
        if s.action == OrphanAction::Quarantine {
            return Vec::new();
        }
        vec![store::runs::LedgerShape {
            shape: SET_NULL_SHAPE,
            target_table: s.table.as_str().to_string(),
            action: "update",
            key_columns: vec![s.row_key.as_str().to_string()],
            columns: s.columns.iter().map(|c| c.as_str().to_string()).collect(),
            reason: format!(
                "no row of {} has ({}) = (%s): set to NULL",
                s.references.table.as_str(),
                names(&s.references.columns, ", ")
            ),
        }]
    }

    /// For the dry run and `verify`: every orphan, as text: its key, then its referencing
    /// columns.
    pub fn preview_sql(&self) -> String {
        let s = &self.spec;
        let cols = s
            .columns
            .iter()
            .map(|c| format!("t.{c}::text"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "SELECT t.{key}::text, {cols} FROM {table} t WHERE {orphan} ORDER BY t.{key}",
            key = &s.row_key,
            table = &s.table,
            orphan = self.orphan("t"),
        )
    }

    /// The table as a run would leave it on a quiet database, as the body of a CTE named like
    /// the table: `base`'s rows, orphans without their reference (`columns`: the table's other
    /// columns) or gone.
    pub fn predicted_sql(&self, columns: &[Ident], base: &str) -> String {
        let s = &self.spec;
        match s.action {
            OrphanAction::Quarantine => format!(
                "SELECT t.* FROM ({base}) t WHERE NOT {orphan}",
                orphan = self.orphan("t")
            ),
            OrphanAction::SetNull => {
                let mut cols: Vec<String> = columns.iter().map(|c| c.of("t")).collect();
                cols.extend(s.columns.iter().map(|c| {
                    format!(
                        "CASE WHEN {orphan} THEN NULL ELSE t.{c} END AS {c}",
                        orphan = self.orphan("t")
                    )
                }));
                format!("SELECT {} FROM ({base}) t", cols.join(", "))
            }
        }
    }

    /// After a run: how many orphans the table holds now.
    pub fn reconcile_sql(&self) -> String {
        format!(
            "SELECT count(*) FROM {} t WHERE {}",
            &self.spec.table,
            self.orphan("t")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::OrphansEngine;
    use crate::db::sql_text::{Ident, TypeName};
    use crate::repair::definition::OrphansSpec;

    fn spec(action: &str, extra: &str) -> OrphansSpec {
        toml::from_str(&format!(
            "kind = \"orphans\"\ndescription = \"d\"\ntable = \"order_lines\"\nrow_key = \"line_id\"\ncolumns = [\"product_id\"]\nreferences = {{ table = \"products\", columns = [\"product_id\"] }}\naction = \"{action}\"\n{extra}"
        ))
        .unwrap()
    }

    fn flat(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    fn engine(action: &str) -> OrphansEngine {
        let s = spec(action, "");
        let quarantine = s.quarantine().map(|q| {
            (
                Ident::qualified("public", q.as_str()),
                vec![Ident::new("line_id"), Ident::new("product_id")],
            )
        });
        OrphansEngine {
            spec: s,
            key_type: TypeName::for_tests("bigint"),
            quarantine,
        }
    }

    const ORPHAN: &str = "(t.\"product_id\" IS NOT NULL AND NOT EXISTS (SELECT 1 FROM \"products\" pgmend_parent WHERE pgmend_parent.\"product_id\" = t.\"product_id\"))";

    #[test]
    fn an_orphan_is_what_the_foreign_key_refuses_under_its_match_rule() {
        assert_eq!(engine("set_null").orphan("t"), ORPHAN);
        let mut full = spec("set_null", "match = \"full\"\n");
        full.columns.push(Ident::new("shop_id"));
        full.references.columns.push(Ident::new("shop_id"));
        let e = OrphansEngine::preview_only(&full);
        assert_eq!(
            e.orphan("t"),
            "(num_nonnulls(t.\"product_id\", t.\"shop_id\") BETWEEN 1 AND 1 OR t.\"product_id\" IS NOT NULL AND t.\"shop_id\" IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM \"products\" pgmend_parent WHERE pgmend_parent.\"product_id\" = t.\"product_id\" AND pgmend_parent.\"shop_id\" = t.\"shop_id\"))"
        );
    }

    #[test]
    fn a_set_null_batch_locks_then_clears_what_is_still_an_orphan() {
        let e = engine("set_null");
        let lock = e.lock_batch(Some("10"), None);
        assert_eq!(lock.binds.shown(), ["\"10\""]);
        assert_eq!(
            flat(&lock.sql),
            format!("SELECT count(*) FROM (SELECT t.\"line_id\" AS k FROM \"order_lines\" t WHERE t.\"line_id\" > $1::text::bigint AND {ORPHAN} ORDER BY t.\"line_id\" FOR UPDATE OF t) x")
        );
        let batch = e.range_batch(7, Some("10"), None);
        assert_eq!(batch.binds.shown(), ["7", "\"10\""]);
        assert_eq!(
            flat(&batch.sql),
            format!(
                "WITH o AS (SELECT t.\"line_id\" AS k, t.\"product_id\" AS b0 FROM \"order_lines\" t WHERE t.\"line_id\" > $2::text::bigint AND {ORPHAN} ORDER BY t.\"line_id\" FOR UPDATE OF t), \
                 changed AS (UPDATE \"order_lines\" t SET \"product_id\" = NULL FROM o WHERE t.\"line_id\" = o.k RETURNING o.*) \
                 INSERT INTO \"pgmend\".\"ledger_compact\" (run_id, shape, row_key, before, after, args) \
                 SELECT $1, 1, jsonb_build_array(c.k), jsonb_build_array(c.b0), jsonb_build_array(NULL), jsonb_build_array(concat_ws(', ', c.b0)) FROM changed c"
            )
        );
    }

    #[test]
    fn a_quarantine_batch_moves_the_row_and_records_it_whole() {
        let e = engine("quarantine");
        assert_eq!(
            flat(&e.create_quarantine_sql().unwrap()),
            "CREATE TABLE IF NOT EXISTS \"public\".\"order_lines_quarantine\" (LIKE \"order_lines\", pgmend_run_id bigint NOT NULL, pgmend_reason text NOT NULL, pgmend_quarantined_at timestamptz NOT NULL DEFAULT now())"
        );
        let sql = flat(&e.range_batch(7, None, Some("20")).sql);
        assert!(sql.contains("gone AS (DELETE FROM \"order_lines\" t USING o WHERE t.\"line_id\" = o.k RETURNING t.*)"), "{sql}");
        assert!(sql.contains("INSERT INTO \"public\".\"order_lines_quarantine\" (\"line_id\", \"product_id\", pgmend_run_id, pgmend_reason) SELECT g.\"line_id\", g.\"product_id\", $1,"), "{sql}");
        assert!(sql.contains("SELECT $1, 'order_lines', jsonb_build_object('line_id', g.\"line_id\"), 'delete', to_jsonb(g), NULL,"), "{sql}");
        assert!(e.ledger_shapes().is_empty());
    }
}
