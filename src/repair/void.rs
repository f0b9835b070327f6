//! The void-duplicates engine: SQL for freezing the groups, for one batch (lock, rank at
//! write time, mark and void, ledger), for the dry-run preview and for reconciling.
//!
//! `freeze_sql`: the groups with more than one unmarked row and no NULL group column, numbered by
//! `row_number()` over the group columns. `batch_sql`: a batch, one statement: lock every unmarked
//! row of the batch's groups `FOR UPDATE` in `row_key` order, rank the versions the locks return
//! with `row_number()` and `first_value()` over a window ordered by `rank_by`, update every row
//! after the first, and insert the ledger records from the `UPDATE ... RETURNING`. In READ
//! COMMITTED a lock that waited returns the row's latest committed version, so a coupon redeemed
//! meanwhile ranks as redeemed, and the `UPDATE` follows its snapshot's version to that same locked
//! one; it finds rows by `row_key`, so a row whose key changed during the wait is left alone and
//! reconciliation reports its group. `preview_sql`: the same ranking over every group that would be
//! frozen now, for the dry run. `reconcile_sql`: frozen groups that again hold more than one
//! unmarked row. The batch's groups are the frozen keys with `seq` in `($2, $3]`, reconciliation's
//! all of them: both from `store::runs::frozen_keys_sql`. A run in ranges (`range_by`, the first
//! column of an index on exactly the group columns) freezes ranges of that column instead
//! (`freeze_ranges_sql`); its batch finds its groups in its range (`range_batch_sql`) and its
//! reconciliation counts every group with duplicates (`range_reconcile_sql`).

use anyhow::Result;

use super::catalog::column_types;
use super::definition::{Order, VoidSpec};
use crate::db::sql_text::{
    all_not_null, column_list, key_match, Ident, KeyRange, Param, SeqRange, TypeName,
};
use crate::error::PgContext;
use crate::store;

/// The ledger shape of a void run's records.
const VOID_SHAPE: i16 = 1;

pub struct VoidEngine {
    pub spec: VoidSpec,
    group_types: Vec<TypeName>,
    /// The first column of a valid index on exactly the group columns, with its type: a run
    /// walks the groups in ranges of it ([`Self::freeze_ranges_sql`]). None: no such index,
    /// so a run freezes every group with duplicates instead.
    pub range_by: Option<(Ident, TypeName)>,
}

impl VoidEngine {
    /// For previews on a database that may lack the table's new columns: no catalog checks.
    pub fn preview_only(spec: VoidSpec) -> VoidEngine {
        VoidEngine {
            spec,
            group_types: Vec::new(),
            range_by: None,
        }
    }

    pub fn prepare(
        client: &mut impl postgres::GenericClient,
        spec: &VoidSpec,
    ) -> Result<VoidEngine> {
        let group_types = column_types(client, &spec.table, &spec.group_by)?;
        let mut needed = vec![spec.row_key.clone(), spec.mark.clone(), spec.void.clone()];
        needed.extend(spec.rank_by.iter().map(|r| r.column.clone()));
        needed.extend(spec.keep_when_not_null.clone());
        column_types(client, &spec.table, &needed)?;
        let range_by = match range_column(client, spec)? {
            Some(column) => {
                let ty = column_types(client, &spec.table, std::slice::from_ref(&column))?;
                Some((column, ty[0].clone()))
            }
            None => None,
        };
        Ok(VoidEngine {
            spec: spec.clone(),
            group_types,
            range_by,
        })
    }

    /// A run in ranges: the range column's rows, read as `sample` says, cut about every
    /// `store::runs::ROWS_PER_RANGE` rows (see `store::runs::range_targets_sql`).
    pub fn freeze_ranges_sql(&self, sample: store::runs::RangeSample) -> String {
        let (column, _) = self
            .range_by
            .as_ref()
            .expect("a run in ranges has a range column");
        store::runs::range_targets_sql(
            &format!(
                "SELECT t.{column} AS k FROM {table} t {sampled} WHERE t.{column} IS NOT NULL",
                table = &self.spec.table,
                sampled = sample.clause(),
            ),
            sample,
        )
    }

    /// The table a run in ranges cuts its ranges of.
    pub fn range_table(&self) -> &Ident {
        &self.spec.table
    }

    /// A batch of a run in ranges: [`Self::batch_sql`] over the groups with more than one
    /// unmarked row whose range column lies in `range` (parameters from $2; $1 is the run).
    pub fn range_batch_sql(&self, range: KeyRange) -> String {
        let s = &self.spec;
        let (column, ty) = self
            .range_by
            .as_ref()
            .expect("a run in ranges has a range column");
        let groups = format!(
            "SELECT {cols} FROM {table} d
              WHERE NOT d.{mark} AND {not_null} AND {in_range}
              GROUP BY {cols} HAVING count(*) > 1",
            cols = self.group_cols("d"),
            table = &s.table,
            mark = &s.mark,
            not_null = all_not_null("d", &s.group_by),
            in_range = range.predicate(&column.of("d"), ty),
        );
        self.batch_sql_over(&groups)
    }

    /// After a run in ranges: how many groups hold more than one unmarked row now (those
    /// that received a duplicate after their batch, and any new one).
    pub fn range_reconcile_sql(&self) -> String {
        let s = &self.spec;
        format!(
            "SELECT count(*) FROM (SELECT 1 FROM {table} t WHERE NOT t.{mark} AND {not_null}
                                     GROUP BY {cols} HAVING count(*) > 1) v",
            table = &s.table,
            mark = &s.mark,
            not_null = all_not_null("t", &s.group_by),
            cols = self.group_cols("t"),
        )
    }

    fn group_cols(&self, alias: &str) -> String {
        column_list(alias, &self.spec.group_by)
    }

    fn rank_order(&self) -> String {
        rank_order(&self.spec, "t")
    }

    /// The frozen groups: every group with more than one unmarked row.
    pub fn freeze_sql(&self) -> String {
        let s = &self.spec;
        let cols = self.group_cols("t");
        let as_text = s
            .group_by
            .iter()
            .map(|c| format!("t.{}::text", c))
            .collect::<Vec<_>>()
            .join(", ");
        let not_null = all_not_null("t", &s.group_by);
        format!(
            "{targets_insert}
             SELECT $1, row_number() OVER (ORDER BY {cols}), ARRAY[{as_text}]
               FROM {table} t WHERE NOT t.{mark} AND {not_null}
              GROUP BY {cols} HAVING count(*) > 1",
            targets_insert = store::targets_insert(),
            table = s.table,
            mark = s.mark
        )
    }

    /// The groups of one batch: frozen keys `seq` in ($2, $3] of run $1, cast back.
    fn batch_groups(&self, range: SeqRange) -> String {
        let [run] = Param::ordered();
        store::runs::frozen_keys_sql(&self.spec.group_by, &self.group_types, run, range)
    }

    fn join_on(&self) -> String {
        key_match("t", "g", &self.spec.group_by)
    }

    /// The ranked unmarked rows of `groups`: rn 1 is kept.
    fn ranked(&self, groups: &str) -> String {
        let s = &self.spec;
        let keep = s
            .keep_when_not_null
            .as_ref()
            .map(|k| format!("t.{}", k))
            .unwrap_or_else(|| "NULL".into());
        format!(
            "SELECT t.{key} AS k, t.{mark} AS before_mark, t.{void} AS before_void, {keep} AS keep_value,
                    row_number() OVER w AS rn, first_value(t.{key}) OVER w AS kept
               FROM {table} t JOIN ({groups}) g ON {on}
              WHERE NOT t.{mark}
             WINDOW w AS (PARTITION BY {cols} ORDER BY {order})",
            key = &s.row_key,
            mark = &s.mark,
            void = &s.void,
            table = &s.table,
            on = self.join_on(),
            cols = self.group_cols("t"),
            order = self.rank_order(),
        )
    }

    /// One batch, in one statement: lock every unmarked row of the batch's groups, rank
    /// them by the values the locks return, mark and void, write the ledger (a compact record
    /// per changed row, [`Self::ledger_shapes`]). Returns the number of rows changed.
    ///
    /// In READ COMMITTED, `FOR UPDATE` returns a row's latest committed version after
    /// waiting for its lock (a coupon redeemed meanwhile is ranked as redeemed), and the
    /// `UPDATE`, which finds the version of the statement's snapshot, follows it to that
    /// same locked version. Rows are locked in `row_key` order (one order for every batch);
    /// the window sorts them again, as locking does not keep an order. The `UPDATE` finds
    /// rows by `row_key` as the snapshot saw it: a row whose key changed while the batch
    /// waited is left unchanged, and reconciliation reports its group.
    pub fn batch_sql(&self) -> String {
        self.batch_sql_over(&self.batch_groups(SeqRange::Between { lo: 2, hi: 3 }))
    }

    /// [`Self::batch_sql`] over the groups `groups` selects (the group columns). The groups
    /// are a `MATERIALIZED` CTE, found once, and the rows are joined to them by the group
    /// columns alone, so each group is an index lookup. With the range's predicate on the rows
    /// too, a range the planner expected one row in (the last bucket of member_id's histogram
    /// spans `m0990805` to `m1000000` at 1,000,000 members) was scanned once per group: a
    /// batch of 43 ranges took 46 s; it takes 0.2 s this way (EXPLAIN ANALYZE, same range).
    fn batch_sql_over(&self, groups: &str) -> String {
        let s = &self.spec;
        let keep = s
            .keep_when_not_null
            .as_ref()
            .map(|k| format!("l.{}", k))
            .unwrap_or_else(|| "NULL".into());
        format!(
            "WITH g AS MATERIALIZED ({groups}),
             locked AS (
               SELECT t.* FROM {table} t JOIN g ON {on}
                WHERE NOT t.{mark}
                ORDER BY t.{key} FOR UPDATE OF t),
             ranked AS (
               SELECT l.{key} AS k, l.{mark} AS before_mark, l.{void} AS before_void, {keep} AS keep_value,
                      row_number() OVER w AS rn, first_value(l.{key}) OVER w AS kept
                 FROM locked l
               WINDOW w AS (PARTITION BY {lcols} ORDER BY {lorder})),
             changed AS (
               UPDATE {table} t SET {mark} = true,
                      {void} = CASE WHEN r.keep_value IS NULL THEN coalesce(t.{void}, now()) ELSE t.{void} END
                 FROM ranked r WHERE t.{key} = r.k AND r.rn > 1
               RETURNING t.{key} AS k, r.before_mark, r.before_void, t.{mark} AS after_mark, t.{void} AS after_void, r.rn, r.kept, r.keep_value)
             {ledger_insert}
             SELECT $1, {shape}, jsonb_build_array(k), jsonb_build_array(before_mark, before_void{keep_arr}),
                    jsonb_build_array(after_mark, after_void{keep_arr}), jsonb_build_array(rn, kept)
               FROM changed",
            ledger_insert = store::ledger_compact_insert(),
            shape = VOID_SHAPE,
            on = self.join_on(),
            lcols = self.group_cols("l"),
            lorder = rank_order(s, "l"),
            table = &s.table,
            mark = &s.mark,
            void = &s.void,
            key = &s.row_key,
            // The column that keeps a row from being voided (redeemed_at) is recorded too, so
            // undo can see a coupon redeemed after it was voided.
            keep_arr = if s.keep_when_not_null.is_some() { ", keep_value" } else { "" },
        )
    }

    /// The shape of the compact ledger records a batch writes (one per changed row): the
    /// key, mark, void and keep columns before and after, and the reason `rank 2 in its
    /// group; coupon_id ... is kept` from the rank and the kept row's key.
    pub fn ledger_shapes(&self) -> Vec<store::runs::LedgerShape> {
        let s = &self.spec;
        vec![store::runs::LedgerShape {
            shape: VOID_SHAPE,
            target_table: s.table.as_str().to_string(),
            action: "update",
            key_columns: vec![s.row_key.as_str().to_string()],
            columns: [Some(&s.mark), Some(&s.void), s.keep_when_not_null.as_ref()]
                .into_iter()
                .flatten()
                .map(|c| c.as_str().to_string())
                .collect(),
            reason: format!("rank %s in its group; {} %s is kept", s.row_key.as_str()),
        }]
    }

    /// For the dry run: every row that would change, with its before and after, over all
    /// groups that would be frozen now. Columns: key, group (text), before, after (text),
    /// kept.
    pub fn preview_sql(&self) -> String {
        let s = &self.spec;
        let cols = self.group_cols("t");
        let not_null = all_not_null("t", &s.group_by);
        let groups = format!(
            "SELECT {cols} FROM {table} t WHERE NOT t.{mark} AND {not_null} GROUP BY {cols} HAVING count(*) > 1",
            table = &s.table,
            mark = &s.mark
        );
        let group_text = s
            .group_by
            .iter()
            .map(|c| format!("t.{}::text", c))
            .collect::<Vec<_>>()
            .join(" || '/' || ");
        let by = s
            .report_by
            .as_ref()
            .map(|c| format!("t.{}::text", c))
            .unwrap_or_else(|| "NULL::text".into());
        let sum = s
            .report_sum
            .as_ref()
            .map(|c| format!("t.{}::bigint", c))
            .unwrap_or_else(|| "0::bigint".into());
        format!(
            "SELECT r.k::text, r.grp, r.before_mark, r.before_void::text, r.keep_value IS NULL AS voids, r.kept::text, r.rn, r.by, r.amount
               FROM (SELECT x.*, {group_text} AS grp, {by} AS by, {sum} AS amount
                       FROM ({ranked}) x JOIN {table} t ON t.{key} = x.k) r
              WHERE r.rn > 1
              ORDER BY r.grp, r.rn",
            ranked = self.ranked(&groups),
            table = &s.table,
            key = &s.row_key,
        )
    }

    /// The table as a run of this repair would leave it on a quiet database, as the body of a
    /// CTE named like the table: every row of `base` (the table, with the columns pending
    /// migrations add) with `mark` and `void` as `preview` (this engine's [`Self::preview_sql`]
    /// over that same base) says the batches set them. `columns` are the table's other columns.
    pub fn predicted_sql(&self, columns: &[Ident], base: &str, preview: &str) -> String {
        let s = &self.spec;
        let kept: Vec<String> = columns.iter().map(|c| format!("t.{c}")).collect();
        format!(
            "SELECT {kept}{sep}(t.{mark} OR p.k IS NOT NULL) AS {mark},
                    CASE WHEN p.voids AND t.{void} IS NULL THEN now() ELSE t.{void} END AS {void}
               FROM ({base}) t LEFT JOIN ({preview}) p ON p.k = t.{key}::text",
            kept = kept.join(", "),
            sep = if kept.is_empty() { "" } else { ", " },
            mark = &s.mark,
            void = &s.void,
            key = &s.row_key,
        )
    }

    /// After a run: how many of its frozen groups still hold more than one unmarked row.
    pub fn reconcile_sql(&self) -> String {
        let s = &self.spec;
        let groups = self.batch_groups(SeqRange::All);
        format!(
            "SELECT count(*) FROM (SELECT 1 FROM {table} t JOIN ({groups}) g ON {on} WHERE NOT t.{mark}
                                     GROUP BY {cols} HAVING count(*) > 1) v",
            table = &s.table,
            on = self.join_on(),
            mark = &s.mark,
            cols = self.group_cols("t"),
        )
    }
}

/// The ORDER BY of the ranking, over rows aliased `alias`: rank 1 first.
pub fn rank_order(spec: &VoidSpec, alias: &str) -> String {
    spec.rank_by
        .iter()
        .map(|r| match r.order {
            Order::Asc => format!("{alias}.{} ASC", &r.column),
            Order::Desc => format!("{alias}.{} DESC", &r.column),
            Order::NotNullFirst => format!("({alias}.{} IS NULL) ASC", &r.column),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first column of a valid, non-partial index whose columns are exactly the group columns
/// (V3's `issued_coupons_by_member` for the coupons: `member_id`), the column a run walks the
/// groups by.
fn range_column(
    client: &mut impl postgres::GenericClient,
    spec: &VoidSpec,
) -> Result<Option<Ident>> {
    let names: Vec<&str> = spec.group_by.iter().map(Ident::as_str).collect();
    Ok(client
        .query_opt(
            "SELECT a.attname::text FROM pg_index i
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
              WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisvalid AND i.indisready
                AND i.indpred IS NULL AND i.indexprs IS NULL
                AND (SELECT array_agg(c.attname::text ORDER BY c.attname) FROM pg_attribute c
                      WHERE c.attrelid = i.indrelid AND c.attnum = ANY (i.indkey))
                    = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x)
              ORDER BY i.indexrelid LIMIT 1",
            &[&spec.table.as_str(), &names],
        )
        .doing("looking for an index on the group columns")?
        .map(|r| Ident::new(r.get::<_, String>(0))))
}
