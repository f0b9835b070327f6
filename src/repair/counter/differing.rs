//! Which keys' counters differ from their source, as statements. `differing_sql` is the core:
//! every key whose counter differs, in one statement (one snapshot) with one pass over each
//! table: the source grouped by the key (`sum(value)` or `count(source key)`, filtered by
//! `source_filter_null`, 0 without source rows), joined to `keys_from`'s distinct keys when the
//! key set comes from another table, `FULL JOIN` the counter table, keeping rows where the
//! counter `IS DISTINCT FROM` the truth (no row counts as different; with `when_no_source =
//! keep`, keys without source rows are left out). `freeze_sql` numbers its keys in key order;
//! `freeze_ranges_sql` cuts ranges of the key's first column instead; `split_points_sql`,
//! `freeze_range_sql` and `differing_in_range_sql` split `freeze_sql` by ranges of that column,
//! listed on several sessions at once (`repair::split_freeze`); `preview_sql` lists them
//! for the dry run (with an empty counter side when the counter table does not exist yet);
//! `drift_sql` counts them for the reconciliation, over every key; `differing_keys_sql` lists
//! the first of them, for the release's check before a migration after the gate.
//!
//! After the gate a batch's keys are frozen in key order, so they span a narrow range of the
//! leading key column: `read_drift_sql` reads the source and the counter table only within that
//! range (`in_batch_range`, bounds from `batch_bounds_sql`), one index range scan each, instead
//! of a lookup per key or a hash of the whole counter table (which made batches slow down as the
//! table grew).

use super::CounterEngine;
use crate::db::sql_text::{
    all_not_null, between_text_params, column_list, Binds, BoundSql, KeyRange, Param, SeqRange,
    TypeName,
};
use crate::repair::definition::{Aggregate, WhenNoSource};
use crate::store;

impl CounterEngine {
    /// The source's aggregate over the rows joined as `s`: the true value of a key.
    pub(super) fn aggregate(&self) -> String {
        let s = &self.spec;
        let filter = s
            .source_filter_null
            .as_ref()
            .map(|f| format!("s.{} IS NULL", f))
            .unwrap_or_else(|| "true".into());
        let agg = match (s.aggregate, &s.value) {
            (Aggregate::Sum, Some(v)) => format!("sum(s.{}) FILTER (WHERE {filter})", v),
            _ => format!("count(s.{}) FILTER (WHERE {filter})", &s.key[0]),
        };
        format!("coalesce({agg}, 0)::bigint")
    }

    /// Every key whose counter differs from its source, in one statement (so counter and
    /// sum come from one snapshot), with one pass over the source and one over the counter
    /// table: columns are the key columns (native types), the counter now (NULL: no row),
    /// the true value and whether the key has source rows. The keys are those of `keys_from`
    /// (or of the source) and those already counted. `counter_exists` is false on a database
    /// where the counter table is still to be created (a dry run).
    pub(super) fn differing_sql(&self, counter_exists: bool) -> String {
        self.differing_sql_in(counter_exists, KeyRange::ALL)
    }

    /// [`Self::differing_sql`] over the keys whose first column lies in `range`.
    pub(super) fn differing_sql_in(&self, counter_exists: bool, range: KeyRange) -> String {
        let s = &self.spec;
        let first = &s.key[0];
        // A preview's engine has no types; it reads every key (KeyRange::ALL).
        let text = TypeName::text();
        let ty = self.key_types.first().unwrap_or(&text);
        let in_range = |column: String| range.predicate(&column, ty);
        let key_cols = column_list("", &s.key);
        let not_null = |alias: &str| all_not_null(alias, &s.key);
        let grouped = format!(
            "SELECT {sk}, {agg} AS truth FROM {source} s WHERE {nn} AND {r} GROUP BY {sk}",
            sk = self.cols("s"),
            agg = self.aggregate(),
            source = &s.source_table,
            nn = not_null("s"),
            r = in_range(first.of("s")),
        );
        // The true value of every key of the key set; has_source: whether any source row
        // (filtered or not) has the key.
        let truth = if s.keys_from.as_str() == "source" {
            format!("SELECT a.*, true AS has_source FROM ({grouped}) a")
        } else {
            format!(
                "SELECT {xk}, coalesce(a.truth, 0) AS truth, a.{first} IS NOT NULL AS has_source
                   FROM (SELECT DISTINCT {xk} FROM {from} x WHERE {nn} AND {r}) x
                   LEFT JOIN ({grouped}) a ON {m}",
                xk = self.cols("x"),
                first = &s.key[0],
                from = &s.keys_from,
                nn = not_null("x"),
                m = self.keys_match("a", "x"),
                r = in_range(first.of("x")),
            )
        };
        let counter = if counter_exists {
            format!(
                "SELECT {key_cols}, {cn}::bigint AS now FROM {counter} WHERE {r}",
                cn = &s.counter,
                counter = &s.counter_table,
                r = in_range(first.to_string()),
            )
        } else {
            let nulls = s
                .key
                .iter()
                .map(|k| format!("NULL AS {}", k))
                .collect::<Vec<_>>()
                .join(", ");
            format!("SELECT {nulls}, NULL::bigint AS now WHERE false")
        };
        let coalesced = s
            .key
            .iter()
            .map(|k| format!("coalesce(t.{k}, c.{k}) AS {k}", k = k))
            .collect::<Vec<_>>()
            .join(", ");
        // A key with no source row and `when_no_source = "keep"` keeps its counter.
        let keep = if s.when_no_source == WhenNoSource::Keep {
            " AND t.has_source"
        } else {
            ""
        };
        format!(
            "SELECT {coalesced}, c.now, coalesce(t.truth, 0) AS truth, coalesce(t.has_source, false) AS has_source
               FROM ({truth}) t FULL JOIN ({counter}) c ON {m}
              WHERE c.now IS DISTINCT FROM coalesce(t.truth, 0){keep}",
            m = self.keys_match("c", "t"),
        )
    }

    /// The frozen targets: every key whose counter differs from its source now, in key
    /// order (so that a batch's keys are a narrow range of the source's leading key column).
    /// The caller binds the run.
    pub fn freeze_sql(&self) -> String {
        self.freeze_from_sql(&format!("({})", self.differing_sql(true)))
    }

    /// [`Self::freeze_sql`] from `from`: the differing keys as a subquery, or a table holding
    /// what [`Self::differing_sql`] read (`CounterEngine::freeze`).
    pub(super) fn freeze_from_sql(&self, from: &str) -> String {
        let [run] = Param::ordered();
        format!(
            "{targets_insert}
             SELECT {run}, row_number() OVER (ORDER BY {dk}), {dt} FROM {from} d",
            targets_insert = store::targets_insert(),
            dk = self.cols("d"),
            dt = self.keys_text("d"),
        )
    }

    /// Cut points of the key's first column, as text in the column's order (repeated where
    /// values are), that split the source into `parts` ranges of about equal size, read as
    /// `sample` says: the after-gate freeze lists the ranges on several sessions at once
    /// (`repair::split_freeze`). Any points would do for coverage: the ranges `(-inf, p1]`,
    /// `(p1, p2]`, ..., `(pn, +inf)` hold every key whose first column is not NULL.
    pub fn split_points_sql(&self, parts: usize, sample: store::runs::RangeSample) -> BoundSql {
        let mut binds = Binds::new();
        let fractions: Vec<f64> = (1..parts).map(|i| i as f64 / parts as f64).collect();
        let first = &self.spec.key[0];
        let sql = format!(
            "SELECT coalesce((percentile_disc({f}::float8[]) WITHIN GROUP (ORDER BY s.{first}))::text[], '{{}}')
               FROM {source} s {sampled} WHERE s.{first} IS NOT NULL",
            f = binds.push(fractions),
            source = self.range_table(),
            sampled = sample.clause(),
        );
        BoundSql { sql, binds }
    }

    /// [`Self::freeze_sql`] over the keys whose first column lies in `(after, up_to]` (None:
    /// open), numbered from `offset + 1` in key order.
    pub fn freeze_range_sql(
        &self,
        run_id: i64,
        offset: i64,
        after: Option<&str>,
        up_to: Option<&str>,
    ) -> BoundSql {
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let offset = binds.push(offset);
        let range = KeyRange::push(&mut binds, after, up_to);
        let sql = format!(
            "{targets_insert}
             SELECT {run}, {offset} + row_number() OVER (ORDER BY {dk}), {dt} FROM ({differing}) d",
            targets_insert = store::targets_insert(),
            dk = self.cols("d"),
            dt = self.keys_text("d"),
            differing = self.differing_sql_in(true, range),
        );
        BoundSql { sql, binds }
    }

    /// The keys whose first column lies in `(after, up_to]` and whose counter differs now, in
    /// key order, as text[]: what another session lists for the freeze.
    pub fn differing_in_range_sql(&self, after: Option<&str>, up_to: Option<&str>) -> BoundSql {
        let mut binds = Binds::new();
        let range = KeyRange::push(&mut binds, after, up_to);
        let sql = format!(
            "SELECT {dt} FROM ({differing}) d ORDER BY {dk}",
            dt = self.keys_text("d"),
            dk = self.cols("d"),
            differing = self.differing_sql_in(true, range),
        );
        BoundSql { sql, binds }
    }

    /// The frozen targets of a run before the deploy gate: ranges of about
    /// `store::runs::ROWS_PER_RANGE` rows of the key's first column (over the key set's rows
    /// and the counter table's, each read as `sample` says; see
    /// `store::runs::range_targets_sql`). Cheaper than freezing every key that differs, which
    /// sums the whole source once more; a batch then reads the drift of every key in its
    /// ranges ([`Self::batch_range`]). The caller binds the run.
    pub fn freeze_ranges_sql(&self, sample: store::runs::RangeSample) -> String {
        let s = &self.spec;
        let first = &s.key[0];
        let [run] = Param::ordered();
        store::runs::range_targets_sql(
            &format!(
                "SELECT s.{first} AS k FROM {table} s {sampled} WHERE s.{first} IS NOT NULL
                 UNION ALL SELECT c.{first} FROM {counter} c {sampled}",
                table = self.range_table(),
                counter = &s.counter_table,
                sampled = sample.clause(),
            ),
            run,
            sample,
        )
    }

    /// For the dry run: every key whose counter would change. Columns: key (text), the
    /// counter now (NULL: no row yet), the true value. `counter_exists` is false on a
    /// database where the counter table is still to be created.
    pub fn preview_sql(&self, counter_exists: bool) -> String {
        format!(
            "SELECT array_to_string({dt}, '/'), d.now, d.truth FROM ({differing}) d ORDER BY {dk}",
            dt = self.keys_text("d"),
            dk = self.cols("d"),
            differing = self.differing_sql(counter_exists),
        )
    }

    /// Up to `limit` keys whose counter differs from the source now, in key order, as text[]
    /// (one statement, one snapshot).
    pub(super) fn differing_keys_sql(&self, limit: i64) -> BoundSql {
        let mut binds = Binds::new();
        let sql = format!(
            "SELECT {dt} FROM ({differing}) d ORDER BY {dk} LIMIT {limit}",
            dt = self.keys_text("d"),
            dk = self.cols("d"),
            differing = self.differing_sql(true),
            limit = binds.push(limit),
        );
        BoundSql { sql, binds }
    }

    /// After a run: how many keys' counters differ from the source now (the invariant, over
    /// every key; writes by an application that does not maintain the counter yet show here).
    pub fn drift_sql(&self) -> String {
        format!("SELECT count(*) FROM ({}) d", self.differing_sql(true))
    }

    /// The frozen keys of a batch: run `run`'s targets with `seq` in `(lo, hi]`.
    fn batch_keys(&self, run: Param, lo: Param, hi: Param) -> String {
        store::runs::frozen_keys_sql(
            &self.spec.key,
            &self.key_types,
            run,
            SeqRange::Between {
                lo: lo.number(),
                hi: hi.number(),
            },
        )
    }

    /// The first and last value of the leading key column among a batch's frozen keys (run
    /// `run_id`, `seq` in `(lo, hi]`), as text: the range [`Self::read_drift_sql`] reads.
    pub(super) fn batch_bounds_sql(&self, run_id: i64, lo: i64, hi: i64) -> BoundSql {
        let mut binds = Binds::new();
        let keys = self.batch_keys(binds.push(run_id), binds.push(lo), binds.push(hi));
        let first = &self.spec.key[0];
        let sql = format!("SELECT min(g.{first})::text, max(g.{first})::text FROM ({keys}) g");
        BoundSql { sql, binds }
    }

    /// Whether `alias`'s leading key column lies between a batch's first and last key
    /// (`lo` and `hi`, as text). The frozen keys are in key order, so the source rows of a
    /// batch are one index range scan where the source is indexed on that column, rather than
    /// a lookup per key or a scan of the whole source; the counter table is read this way
    /// too, or the planner hashes all of it for every batch (it cannot estimate the frozen
    /// keys' join) and batches slow down as it grows.
    fn in_batch_range(&self, alias: &str, lo: Param, hi: Param) -> String {
        between_text_params(
            &self.spec.key[0].of(alias),
            lo.number(),
            hi.number(),
            &self.key_types[0],
        )
    }

    /// What a batch's keys (run `run_id`, `seq` in `(lo, hi]`, their leading column between
    /// `min_key` and `max_key`) differ by, in one statement: each key as text[], its counter
    /// now (NULL: no row), its true value and whether any source row has it.
    pub(super) fn read_drift_sql(
        &self,
        run_id: i64,
        (lo, hi): (i64, i64),
        (min_key, max_key): (Option<String>, Option<String>),
    ) -> BoundSql {
        let s = &self.spec;
        let first = &s.key[0];
        let mut binds = Binds::new();
        let keys = self.batch_keys(binds.push(run_id), binds.push(lo), binds.push(hi));
        let (min_key, max_key) = (binds.push(min_key), binds.push(max_key));
        let g_cols = self.cols("g");
        let sql = format!(
            "WITH g AS MATERIALIZED ({keys}),
                  t AS (SELECT {g_cols}, {agg} AS truth, count(s.{first}) > 0 AS has_source
                          FROM g LEFT JOIN {source} s ON {sm} AND {srange}
                         GROUP BY {g_cols})
             SELECT {gk}, c.{cn}::bigint, t.truth, t.has_source
               FROM g JOIN t ON {tm}
               LEFT JOIN {counter} c ON {cm} AND {crange}",
            agg = self.aggregate(),
            source = &s.source_table,
            sm = self.keys_match("s", "g"),
            srange = self.in_batch_range("s", min_key, max_key),
            gk = self.keys_text("g"),
            cn = &s.counter,
            tm = self.keys_match("t", "g"),
            counter = &s.counter_table,
            cm = self.keys_match("c", "g"),
            crange = self.in_batch_range("c", min_key, max_key),
        );
        BoundSql { sql, binds }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{budgets, flat, monthly};
    use crate::db::sql_text::{Binds, KeyRange, Param, SeqRange};
    use crate::repair::definition::WhenNoSource;
    use crate::store::runs::frozen_keys_sql;
    use crate::store::runs::RangeSample;

    #[test]
    fn differing_sums_the_source_per_key_and_keeps_keys_whose_counter_differs() {
        let sql = flat(&monthly().differing_sql(true));
        assert_eq!(
            sql,
            "SELECT coalesce(t.\"member_id\", c.\"member_id\") AS \"member_id\", coalesce(t.\"month\", c.\"month\") AS \"month\", \
             c.now, coalesce(t.truth, 0) AS truth, coalesce(t.has_source, false) AS has_source \
             FROM (SELECT a.*, true AS has_source FROM (SELECT s.\"member_id\", s.\"month\", \
             coalesce(sum(s.\"amount_yen\") FILTER (WHERE s.\"voided_at\" IS NULL), 0)::bigint AS truth \
             FROM \"issued_coupons\" s WHERE s.\"member_id\" IS NOT NULL AND s.\"month\" IS NOT NULL AND true \
             GROUP BY s.\"member_id\", s.\"month\") a) t \
             FULL JOIN (SELECT \"member_id\", \"month\", \"used_yen\"::bigint AS now FROM \"member_monthly_usage\" WHERE true) c \
             ON c.\"member_id\" = t.\"member_id\" AND c.\"month\" = t.\"month\" \
             WHERE c.now IS DISTINCT FROM coalesce(t.truth, 0)"
        );
    }

    #[test]
    fn differing_reads_the_key_set_from_keys_from_and_keep_leaves_keys_without_source() {
        let mut e = budgets();
        e.spec.when_no_source = WhenNoSource::Keep;
        let sql = flat(&e.differing_sql(true));
        assert!(sql.contains(
            "FROM (SELECT DISTINCT x.\"campaign_id\" FROM \"campaigns\" x WHERE x.\"campaign_id\" IS NOT NULL AND true) x \
             LEFT JOIN (SELECT s.\"campaign_id\", "
        ));
        assert!(sql.contains("a.\"campaign_id\" IS NOT NULL AS has_source"));
        assert!(sql.ends_with("WHERE c.now IS DISTINCT FROM coalesce(t.truth, 0) AND t.has_source"));
    }

    #[test]
    fn differing_without_a_counter_table_has_an_empty_counter_side() {
        let sql = flat(&monthly().differing_sql(false));
        assert!(sql.contains(
            "FULL JOIN (SELECT NULL AS \"member_id\", NULL AS \"month\", NULL::bigint AS now WHERE false) c"
        ));
        assert!(!sql.contains("\"member_monthly_usage\""));
    }

    #[test]
    fn differing_in_a_range_bounds_every_table_by_the_leading_key() {
        let e = budgets();
        let mut binds = Binds::new();
        binds.push(1_i64);
        let range = KeyRange::push(&mut binds, Some("c1"), Some("c9"));
        let sql = flat(&e.differing_sql_in(true, range));
        for column in ["s.\"campaign_id\"", "x.\"campaign_id\"", "\"campaign_id\""] {
            assert!(
                sql.contains(&format!(
                    "{column} > $2::text::text AND {column} <= $3::text::text"
                )),
                "{column} in {sql}"
            );
        }
        assert_eq!(binds.shown(), ["1", "\"c1\"", "\"c9\""]);
    }

    #[test]
    fn a_count_counts_the_key_of_the_source_rows() {
        let mut e = budgets();
        e.spec.aggregate = crate::repair::definition::Aggregate::Count;
        e.spec.source_filter_null = None;
        assert_eq!(
            e.aggregate(),
            "coalesce(count(s.\"campaign_id\") FILTER (WHERE true), 0)::bigint"
        );
    }

    #[test]
    fn freeze_numbers_the_differing_keys_in_key_order() {
        let sql = flat(&monthly().freeze_sql());
        assert!(sql.starts_with("INSERT INTO \"pgmend\".\"repair_targets\" (run_id, seq, key) SELECT $1, row_number() OVER (ORDER BY d.\"member_id\", d.\"month\"), ARRAY[d.\"member_id\"::text, d.\"month\"::text] FROM (SELECT coalesce("), "{sql}");
    }

    #[test]
    fn a_staged_freeze_numbers_the_keys_read_apart() {
        let e = monthly();
        assert_eq!(
            flat(&e.freeze_from_sql("pg_temp.pgmend_differing")),
            "INSERT INTO \"pgmend\".\"repair_targets\" (run_id, seq, key) SELECT $1, row_number() OVER (ORDER BY d.\"member_id\", d.\"month\"), ARRAY[d.\"member_id\"::text, d.\"month\"::text] FROM pg_temp.pgmend_differing d"
        );
        assert!(!e.differing_sql(true).contains('$'));
    }

    #[test]
    fn a_split_freeze_cuts_the_key_set_at_even_fractions_and_numbers_each_range_after_the_last() {
        let points = monthly().split_points_sql(4, RangeSample::Percent(10.0));
        assert_eq!(
            flat(&points.sql),
            "SELECT coalesce((percentile_disc($1::float8[]) WITHIN GROUP (ORDER BY s.\"member_id\"))::text[], '{}') \
             FROM \"issued_coupons\" s TABLESAMPLE BERNOULLI (10) REPEATABLE (0) WHERE s.\"member_id\" IS NOT NULL"
        );
        assert_eq!(points.binds.shown(), ["[0.25, 0.5, 0.75]"]);
        // The campaigns' counter cuts its key set, the campaigns table.
        assert!(flat(&budgets().split_points_sql(2, RangeSample::All).sql)
            .contains("FROM \"campaigns\" s WHERE"));

        let e = monthly();
        let middle = e.freeze_range_sql(7, 1200, Some("m1"), Some("m5"));
        let sql = flat(&middle.sql);
        assert!(sql.starts_with("INSERT INTO \"pgmend\".\"repair_targets\" (run_id, seq, key) SELECT $1, $2 + row_number() OVER (ORDER BY d.\"member_id\", d.\"month\"), ARRAY[d.\"member_id\"::text, d.\"month\"::text] FROM (SELECT coalesce("), "{sql}");
        assert!(
            sql.contains("s.\"member_id\" > $3::text::text AND s.\"member_id\" <= $4::text::text"),
            "{sql}"
        );
        assert_eq!(middle.binds.shown(), ["7", "1200", "\"m1\"", "\"m5\""]);
        // The first range is open below, the last above.
        let first = flat(&e.freeze_range_sql(7, 0, None, Some("m1")).sql);
        assert!(
            first.contains("s.\"member_id\" <= $3::text::text") && !first.contains(" > $"),
            "{first}"
        );
        let last = e.differing_in_range_sql(Some("m5"), None);
        let sql = flat(&last.sql);
        assert!(
            sql.starts_with(
                "SELECT ARRAY[d.\"member_id\"::text, d.\"month\"::text] FROM (SELECT coalesce("
            ),
            "{sql}"
        );
        assert!(
            sql.ends_with("ORDER BY d.\"member_id\", d.\"month\""),
            "{sql}"
        );
        assert!(
            sql.contains("s.\"member_id\" > $1::text::text") && !sql.contains("<= $"),
            "{sql}"
        );
        assert_eq!(last.binds.shown(), ["\"m5\""]);
    }

    #[test]
    fn freeze_ranges_reads_the_key_sets_and_the_counter_tables_leading_column() {
        let sql = flat(&budgets().freeze_ranges_sql(RangeSample::All));
        assert!(sql.contains(
            "SELECT s.\"campaign_id\" AS k FROM \"campaigns\" s WHERE s.\"campaign_id\" IS NOT NULL \
             UNION ALL SELECT c.\"campaign_id\" FROM \"campaign_budgets\" c"
        ), "{sql}");
        let sampled = flat(&monthly().freeze_ranges_sql(RangeSample::Percent(1.0)));
        assert!(
            sampled.contains(
                "FROM \"issued_coupons\" s TABLESAMPLE BERNOULLI (1) REPEATABLE (0) WHERE"
            ),
            "{sampled}"
        );
    }

    #[test]
    fn preview_drift_and_differing_keys_read_the_differing_keys() {
        let e = monthly();
        let preview = flat(&e.preview_sql(false));
        assert!(preview.starts_with("SELECT array_to_string(ARRAY[d.\"member_id\"::text, d.\"month\"::text], '/'), d.now, d.truth FROM (SELECT"));
        assert!(preview.ends_with(") d ORDER BY d.\"member_id\", d.\"month\""));
        assert!(preview.contains("NULL::bigint AS now WHERE false"));
        let drift = flat(&e.drift_sql());
        assert!(drift.starts_with("SELECT count(*) FROM (SELECT coalesce("));
        assert!(drift.contains("FROM \"member_monthly_usage\" WHERE true"));
        let keys = e.differing_keys_sql(10);
        assert!(flat(&keys.sql).ends_with(") d ORDER BY d.\"member_id\", d.\"month\" LIMIT $1"));
        assert_eq!(keys.binds.shown(), ["10"]);
    }

    #[test]
    fn read_drift_reads_the_frozen_keys_within_their_leading_columns_range() {
        let e = monthly();
        // The store's frozen keys of run $1, `seq` in ($2, $3].
        let [run, lo, hi] = Param::ordered();
        let range = SeqRange::Between {
            lo: lo.number(),
            hi: hi.number(),
        };
        let keys = frozen_keys_sql(&e.spec.key, &e.key_types, run, range);
        assert!(keys
            .starts_with("SELECT key[1]::text AS \"member_id\", key[2]::date AS \"month\" FROM "));
        let bounds = e.batch_bounds_sql(7, 100, 200);
        assert_eq!(
            flat(&bounds.sql),
            format!(
                "SELECT min(g.\"member_id\")::text, max(g.\"member_id\")::text FROM ({keys}) g"
            )
        );
        assert_eq!(bounds.binds.shown(), ["7", "100", "200"]);
        let st = e.read_drift_sql(7, (100, 200), (Some("m1".into()), Some("m9".into())));
        let sql = flat(&st.sql);
        assert!(sql.starts_with(&format!("WITH g AS MATERIALIZED ({keys}), t AS (SELECT g.\"member_id\", g.\"month\", coalesce(sum(s.\"amount_yen\")")), "{sql}");
        assert!(sql.contains("FROM g LEFT JOIN \"issued_coupons\" s ON s.\"member_id\" = g.\"member_id\" AND s.\"month\" = g.\"month\" AND s.\"member_id\" BETWEEN $4::text::text AND $5::text::text"), "{sql}");
        assert!(sql.ends_with("LEFT JOIN \"member_monthly_usage\" c ON c.\"member_id\" = g.\"member_id\" AND c.\"month\" = g.\"month\" AND c.\"member_id\" BETWEEN $4::text::text AND $5::text::text"), "{sql}");
        assert!(sql.contains("SELECT ARRAY[g.\"member_id\"::text, g.\"month\"::text], c.\"used_yen\"::bigint, t.truth, t.has_source FROM g JOIN t ON t.\"member_id\" = g.\"member_id\" AND t.\"month\" = g.\"month\""), "{sql}");
        assert_eq!(
            st.binds.shown(),
            ["7", "100", "200", "Some(\"m1\")", "Some(\"m9\")"]
        );
    }
}
