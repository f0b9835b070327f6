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
//! frozen now, for the dry run (one function, `ranking`, writes the window for both). `reconcile_sql`: frozen groups that again hold more than one
//! unmarked row. The batch's groups are the frozen keys with `seq` in `($2, $3]`, reconciliation's
//! all of them: both from `store::runs::frozen_keys_sql`. A run in ranges (`range_by`, the first
//! column of an index on exactly the group columns) freezes ranges of that column instead
//! (`freeze_ranges_sql`); its batch finds its groups in its range (`range_batch_sql`) and its
//! reconciliation counts every group with duplicates (`range_reconcile_sql`).

use anyhow::Result;

use super::catalog::column_types;
use super::definition::{Order, VoidSpec};
use crate::db::sql_text::{
    all_not_null, column_list, key_match, Binds, BoundSql, Ident, KeyRange, Param, SeqRange,
    TypeName,
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
    /// `store::runs::ROWS_PER_RANGE` rows (see `store::runs::range_targets_sql`). The caller
    /// binds the run.
    pub fn freeze_ranges_sql(&self, sample: store::runs::RangeSample) -> String {
        let (column, _) = self
            .range_by
            .as_ref()
            .expect("a run in ranges has a range column");
        store::runs::column_range_targets_sql(&self.spec.table, column, sample)
    }

    /// The table a run in ranges cuts its ranges of.
    pub fn range_table(&self) -> &Ident {
        &self.spec.table
    }

    /// A batch of run `run_id` in ranges, with its values: [`Self::batch`] over the groups with
    /// more than one unmarked row whose range column lies after `after` and up to `up_to`.
    pub fn range_batch(&self, run_id: i64, after: Option<&str>, up_to: Option<&str>) -> BoundSql {
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let range = KeyRange::push(&mut binds, after, up_to);
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
        BoundSql {
            sql: self.batch_sql_over(run, &groups),
            binds,
        }
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

    /// The frozen groups: every group with more than one unmarked row. The caller binds the
    /// run.
    pub fn freeze_sql(&self) -> String {
        let [run] = Param::ordered();
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
             SELECT {run}, row_number() OVER (ORDER BY {cols}), ARRAY[{as_text}]
               FROM {table} t WHERE NOT t.{mark} AND {not_null}
              GROUP BY {cols} HAVING count(*) > 1",
            targets_insert = store::targets_insert(),
            table = s.table,
            mark = s.mark
        )
    }

    /// The groups of run `run`'s frozen keys with `seq` in `range`, cast back.
    fn batch_groups(&self, run: Param, range: SeqRange) -> String {
        store::runs::frozen_keys_sql(&self.spec.group_by, &self.group_types, run, range)
    }

    fn join_on(&self) -> String {
        key_match("t", "g", &self.spec.group_by)
    }

    /// The ranked unmarked rows of `groups`, as they are in the statement's snapshot (the
    /// preview's ranking): rn 1 is kept.
    fn ranked(&self, groups: &str) -> String {
        let s = &self.spec;
        ranking(
            s,
            "t",
            &format!(
                "{table} t JOIN ({groups}) g ON {on}
              WHERE NOT t.{mark}",
                table = &s.table,
                on = self.join_on(),
                mark = &s.mark,
            ),
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
    /// Over the frozen groups of run `run_id` with `seq` in `(lo, hi]`, with its values.
    pub fn batch(&self, run_id: i64, lo: i64, hi: i64) -> BoundSql {
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let range = SeqRange::Between {
            lo: binds.push(lo).number(),
            hi: binds.push(hi).number(),
        };
        BoundSql {
            sql: self.batch_sql_over(run, &self.batch_groups(run, range)),
            binds,
        }
    }

    /// [`Self::batch_sql`] over the groups `groups` selects (the group columns). The groups
    /// are a `MATERIALIZED` CTE, found once, and the rows are joined to them by the group
    /// columns alone, so each group is an index lookup. With the range's predicate on the rows
    /// too, a range the planner expected one row in (the last bucket of member_id's histogram
    /// spans `m0990805` to `m1000000` at 1,000,000 members) was scanned once per group: a
    /// batch of 43 ranges took 46 s; it takes 0.2 s this way (EXPLAIN ANALYZE, same range).
    fn batch_sql_over(&self, run: Param, groups: &str) -> String {
        let s = &self.spec;
        format!(
            "WITH g AS MATERIALIZED ({groups}),
             locked AS (
               SELECT t.* FROM {table} t JOIN g ON {on}
                WHERE NOT t.{mark}
                ORDER BY t.{key} FOR UPDATE OF t),
             ranked AS ({ranked}),
             changed AS (
               UPDATE {table} t SET {mark} = true,
                      {void} = CASE WHEN r.keep_value IS NULL THEN coalesce(t.{void}, now()) ELSE t.{void} END
                 FROM ranked r WHERE t.{key} = r.k AND r.rn > 1
               RETURNING t.{key} AS k, r.before_mark, r.before_void, t.{mark} AS after_mark, t.{void} AS after_void, r.rn, r.kept, r.keep_value)
             {ledger_insert}
             SELECT {run}, {shape}, jsonb_build_array(k), jsonb_build_array(before_mark, before_void{keep_arr}),
                    jsonb_build_array(after_mark, after_void{keep_arr}), jsonb_build_array(rn, kept)
               FROM changed",
            ledger_insert = store::ledger_compact_insert(),
            shape = VOID_SHAPE,
            on = self.join_on(),
            ranked = ranking(s, "l", "locked l"),
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

    /// The census of the repair (`verify`): every group with more than one unmarked row,
    /// NULL group columns left out, with how many it has (`rows`).
    pub fn duplicates_sql(&self) -> String {
        let s = &self.spec;
        let cols = self.group_cols("t");
        format!(
            "SELECT {cols}, count(*) AS rows FROM {table} t WHERE NOT t.{mark} AND {not_null} GROUP BY {cols} HAVING count(*) > 1",
            table = &s.table,
            mark = &s.mark,
            not_null = all_not_null("t", &s.group_by),
        )
    }

    /// After a run: how many of its frozen groups still hold more than one unmarked row.
    pub fn reconcile_sql(&self) -> String {
        let s = &self.spec;
        let [run] = Param::ordered();
        let groups = self.batch_groups(run, SeqRange::All);
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

/// The ranking of the unmarked rows `from` reads (a `FROM` list, with its `WHERE`), aliased
/// `alias`, by group, as the preview and the batch both rank them: each row's key (`k`), mark,
/// void and keep column before (`before_mark`, `before_void`, `keep_value`), its rank in its
/// group (`rn`, 1 is kept) and the kept row's key (`kept`).
fn ranking(spec: &VoidSpec, alias: &str, from: &str) -> String {
    let keep = spec
        .keep_when_not_null
        .as_ref()
        .map(|k| format!("{alias}.{k}"))
        .unwrap_or_else(|| "NULL".into());
    format!(
        "SELECT {alias}.{key} AS k, {alias}.{mark} AS before_mark, {alias}.{void} AS before_void, {keep} AS keep_value,
                row_number() OVER w AS rn, first_value({alias}.{key}) OVER w AS kept
           FROM {from}
         WINDOW w AS (PARTITION BY {cols} ORDER BY {order})",
        key = &spec.row_key,
        mark = &spec.mark,
        void = &spec.void,
        cols = column_list(alias, &spec.group_by),
        order = rank_order(spec, alias),
    )
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

#[cfg(test)]
mod tests {
    use super::VoidEngine;
    use crate::db::sql_text::{Ident, Param, SeqRange, TypeName};
    use crate::repair::definition::VoidSpec;
    use crate::store::runs::{frozen_keys_sql, RangeSample};

    /// The coupons' void as `prepare` makes it against the demo's schema: grouped by
    /// campaign and member, walked in ranges of `member_id`.
    fn coupons() -> VoidEngine {
        let spec: VoidSpec =
            toml::from_str(include_str!("../../repairs/void-duplicate-coupons.toml")).unwrap();
        VoidEngine {
            spec,
            group_types: vec![TypeName::for_tests("text"), TypeName::for_tests("text")],
            range_by: Some((Ident::new("member_id"), TypeName::for_tests("text"))),
        }
    }

    /// The store's frozen groups of run $1 in `range`, cast to the group columns' types.
    fn frozen_keys(range: SeqRange) -> String {
        let [run] = Param::ordered();
        let keys = frozen_keys_sql(&coupons().spec.group_by, &coupons().group_types, run, range);
        assert!(keys.starts_with(
            "SELECT key[1]::text AS \"campaign_id\", key[2]::text AS \"member_id\" FROM "
        ));
        flat(&keys)
    }

    fn flat(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The window both rankings use, over rows aliased `a`.
    fn window(a: &str) -> String {
        format!("row_number() OVER w AS rn, first_value({a}.\"coupon_id\") OVER w AS kept")
    }

    fn partition(a: &str) -> String {
        format!(
            "WINDOW w AS (PARTITION BY {a}.\"campaign_id\", {a}.\"member_id\" ORDER BY ({a}.\"redeemed_at\" IS NULL) ASC, {a}.\"issued_at\" ASC, {a}.\"coupon_id\" ASC)"
        )
    }

    #[test]
    fn a_batch_locks_its_groups_rows_ranks_them_and_writes_compact_records() {
        let batch = coupons().batch(7, 100, 250);
        assert_eq!(batch.binds.shown(), ["7", "100", "250"]);
        let sql = flat(&batch.sql);
        assert_eq!(
            sql,
            format!(
                "WITH g AS MATERIALIZED ({}), \
                 locked AS ( SELECT t.* FROM \"issued_coupons\" t JOIN g ON t.\"campaign_id\" = g.\"campaign_id\" AND t.\"member_id\" = g.\"member_id\" \
                 WHERE NOT t.\"legacy_duplicate\" ORDER BY t.\"coupon_id\" FOR UPDATE OF t), \
                 ranked AS (SELECT l.\"coupon_id\" AS k, l.\"legacy_duplicate\" AS before_mark, l.\"voided_at\" AS before_void, l.\"redeemed_at\" AS keep_value, \
                 {} FROM locked l {}), \
                 changed AS ( UPDATE \"issued_coupons\" t SET \"legacy_duplicate\" = true, \
                 \"voided_at\" = CASE WHEN r.keep_value IS NULL THEN coalesce(t.\"voided_at\", now()) ELSE t.\"voided_at\" END \
                 FROM ranked r WHERE t.\"coupon_id\" = r.k AND r.rn > 1 \
                 RETURNING t.\"coupon_id\" AS k, r.before_mark, r.before_void, t.\"legacy_duplicate\" AS after_mark, t.\"voided_at\" AS after_void, r.rn, r.kept, r.keep_value) \
                 INSERT INTO \"pgmend\".\"ledger_compact\" (run_id, shape, row_key, before, after, args) \
                 SELECT $1, 1, jsonb_build_array(k), jsonb_build_array(before_mark, before_void, keep_value), \
                 jsonb_build_array(after_mark, after_void, keep_value), jsonb_build_array(rn, kept) FROM changed",
                frozen_keys(SeqRange::Between { lo: 2, hi: 3 }),
                window("l"),
                partition("l")
            )
        );
    }

    #[test]
    fn without_a_keep_column_nothing_is_kept_from_voiding() {
        let mut e = coupons();
        e.spec.keep_when_not_null = None;
        let sql = flat(&e.batch(7, 0, 1).sql);
        assert!(
            sql.contains("l.\"voided_at\" AS before_void, NULL AS keep_value"),
            "{sql}"
        );
        assert!(sql.contains("jsonb_build_array(before_mark, before_void), jsonb_build_array(after_mark, after_void), "), "{sql}");
    }

    #[test]
    fn a_range_batch_finds_its_groups_in_its_range() {
        let e = coupons();
        let batch = e.range_batch(7, Some("m1"), Some("m9"));
        let (sql, binds) = (flat(&batch.sql), batch.binds);
        assert!(sql.starts_with(
            "WITH g AS MATERIALIZED (SELECT d.\"campaign_id\", d.\"member_id\" FROM \"issued_coupons\" d \
             WHERE NOT d.\"legacy_duplicate\" AND d.\"campaign_id\" IS NOT NULL AND d.\"member_id\" IS NOT NULL \
             AND d.\"member_id\" > $2::text::text AND d.\"member_id\" <= $3::text::text \
             GROUP BY d.\"campaign_id\", d.\"member_id\" HAVING count(*) > 1), locked AS ("
        ), "{sql}");
        assert!(sql.contains(&partition("l")), "{sql}");
        assert!(sql.contains("SELECT $1, 1, jsonb_build_array(k)"), "{sql}");
        assert_eq!(binds.shown(), ["7", "\"m1\"", "\"m9\""]);
    }

    #[test]
    fn the_preview_ranks_as_the_batch_does_over_every_group_with_duplicates() {
        let e = coupons();
        let sql = flat(&e.preview_sql());
        assert_eq!(
            sql,
            format!(
                "SELECT r.k::text, r.grp, r.before_mark, r.before_void::text, r.keep_value IS NULL AS voids, r.kept::text, r.rn, r.by, r.amount \
                 FROM (SELECT x.*, t.\"campaign_id\"::text || '/' || t.\"member_id\"::text AS grp, t.\"campaign_id\"::text AS by, t.\"amount_yen\"::bigint AS amount \
                 FROM (SELECT t.\"coupon_id\" AS k, t.\"legacy_duplicate\" AS before_mark, t.\"voided_at\" AS before_void, t.\"redeemed_at\" AS keep_value, \
                 {} FROM \"issued_coupons\" t JOIN (SELECT t.\"campaign_id\", t.\"member_id\" FROM \"issued_coupons\" t \
                 WHERE NOT t.\"legacy_duplicate\" AND t.\"campaign_id\" IS NOT NULL AND t.\"member_id\" IS NOT NULL \
                 GROUP BY t.\"campaign_id\", t.\"member_id\" HAVING count(*) > 1) g ON t.\"campaign_id\" = g.\"campaign_id\" AND t.\"member_id\" = g.\"member_id\" \
                 WHERE NOT t.\"legacy_duplicate\" {}) x JOIN \"issued_coupons\" t ON t.\"coupon_id\" = x.k) r \
                 WHERE r.rn > 1 ORDER BY r.grp, r.rn",
                window("t"),
                partition("t")
            )
        );
    }

    #[test]
    fn freeze_numbers_the_groups_with_duplicates() {
        assert_eq!(
            flat(&coupons().freeze_sql()),
            "INSERT INTO \"pgmend\".\"repair_targets\" (run_id, seq, key) \
             SELECT $1, row_number() OVER (ORDER BY t.\"campaign_id\", t.\"member_id\"), ARRAY[t.\"campaign_id\"::text, t.\"member_id\"::text] \
             FROM \"issued_coupons\" t WHERE NOT t.\"legacy_duplicate\" AND t.\"campaign_id\" IS NOT NULL AND t.\"member_id\" IS NOT NULL \
             GROUP BY t.\"campaign_id\", t.\"member_id\" HAVING count(*) > 1"
        );
        let ranges = flat(&coupons().freeze_ranges_sql(RangeSample::All));
        assert!(ranges.contains(
            "FROM (SELECT t.\"member_id\" AS k FROM \"issued_coupons\" t WHERE t.\"member_id\" IS NOT NULL) u"
        ), "{ranges}");
    }

    #[test]
    fn reconciliation_counts_groups_that_still_hold_duplicates() {
        let e = coupons();
        assert_eq!(
            flat(&e.reconcile_sql()),
            format!(
                "SELECT count(*) FROM (SELECT 1 FROM \"issued_coupons\" t JOIN ({}) g ON t.\"campaign_id\" = g.\"campaign_id\" AND t.\"member_id\" = g.\"member_id\" \
                 WHERE NOT t.\"legacy_duplicate\" GROUP BY t.\"campaign_id\", t.\"member_id\" HAVING count(*) > 1) v",
                frozen_keys(SeqRange::All)
            )
        );
        assert_eq!(
            flat(&e.range_reconcile_sql()),
            "SELECT count(*) FROM (SELECT 1 FROM \"issued_coupons\" t WHERE NOT t.\"legacy_duplicate\" \
             AND t.\"campaign_id\" IS NOT NULL AND t.\"member_id\" IS NOT NULL GROUP BY t.\"campaign_id\", t.\"member_id\" HAVING count(*) > 1) v"
        );
    }

    #[test]
    fn the_predicted_table_marks_and_voids_what_the_preview_changes() {
        let e = coupons();
        assert_eq!(
            flat(&e.predicted_sql(&[Ident::new("coupon_id")], "SELECT * FROM b", "P")),
            "SELECT t.\"coupon_id\", (t.\"legacy_duplicate\" OR p.k IS NOT NULL) AS \"legacy_duplicate\", \
             CASE WHEN p.voids AND t.\"voided_at\" IS NULL THEN now() ELSE t.\"voided_at\" END AS \"voided_at\" \
             FROM (SELECT * FROM b) t LEFT JOIN (P) p ON p.k = t.\"coupon_id\"::text"
        );
    }
}
