//! The statements that write a counter batch, each with the ledger records of what it wrote.
//! `write_ctes` adds each key's drift to its counter row as the row is when the statement
//! writes it (`SET x = x + drift WHERE` the new value fits and passes the CHECKs: the server
//! evaluates that on the latest row version). `create_ctes` makes the missing rows with their
//! true values (`INSERT ... ON CONFLICT (key) DO UPDATE SET x = x + excluded.x` when asked, so
//! a row the application made meanwhile gets the drift added; a value refused by the range or a
//! CHECK, evaluated in SQL on the row being created, is created as 0 and reported). With
//! `merge` (the runner's second pass over keys the run already changed) `merge_sql` moves an
//! existing ledger record's `after` instead of adding a record. `write_sql` and `create_sql`
//! are a batch after the deploy gate (full ledger records); `batch_range_sql` is a whole batch
//! before it in one statement (compact records).

use super::{
    CounterEngine, Proposed, REASON_ADDED, REASON_CORRECTED, REASON_CREATED, SHAPE_ADDED,
    SHAPE_CORRECTED, SHAPE_CREATED,
};
use crate::db::sql_text::{column_list, Binds, BoundSql, Ident, KeyRange, Param};
use crate::repair::definition::WhenNoSource;
use crate::store;

impl CounterEngine {
    /// Adds each of `updates`' drift (true value - counter, as read) to its counter row as
    /// the row is now, where the result still fits and passes the table's CHECKs, with full
    /// ledger records (before and after as written). Returns one row: how many rows changed,
    /// and the numbers (`i`, from 1) of the updates not written.
    pub(super) fn write_sql(&self, run_id: i64, updates: &[Proposed], merge: bool) -> BoundSql {
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let unnest = self.unnest(updates, &mut binds);
        let sql = format!(
            "WITH {ctes}
             SELECT (SELECT count(*) FROM upd),
                    coalesce((SELECT array_agg(u.i) FROM u WHERE u.i NOT IN (SELECT i FROM upd)), '{{}}')",
            ctes = self.write_ctes(&format!("SELECT * FROM {unnest}"), run, merge, false),
        );
        BoundSql { sql, binds }
    }

    /// Creates the missing counter rows of `creates` with their true value (0 where it would
    /// not fit or pass a CHECK), copying `copy_on_create` from `keys_from`, with full ledger
    /// records. A row the new application created since the drift was read gets the drift
    /// added instead. Returns one row: how many rows changed, and the keys created as 0 (their
    /// parts joined by U+001F).
    pub(super) fn create_sql(&self, run_id: i64, creates: &[Proposed], merge: bool) -> BoundSql {
        let s = &self.spec;
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let unnest = self.unnest(creates, &mut binds);
        let u_keys = s
            .key
            .iter()
            .zip(&self.key_types)
            .enumerate()
            .map(|(i, (k, ty))| format!("u.k{i}::{ty} AS {}", k))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "WITH {ctes}
             SELECT (SELECT count(*) FROM l2 WHERE l2.created OR l2.added <> 0),
                    coalesce((SELECT array_agg(array_to_string(ARRAY[{okt}], chr(31))) FROM ok WHERE NOT ok.ok AND ok.value <> 0), '{{}}')",
            ctes = self.create_ctes(&format!("SELECT {u_keys}, u.after AS value FROM {unnest}"), run, merge, false, true),
            okt = self.keys_text_list("ok"),
        );
        BoundSql { sql, binds }
    }

    /// One batch of a run in ranges, as ONE statement (see [`Self::batch_range`]): the drift of
    /// every key whose first column is after `after` and up to `up_to` (None: open), read into
    /// a CTE that is whole before the first row is written (the window aggregate `count(*) OVER
    /// ()` emits nothing until its input has ended), then the updates and creates, with compact
    /// ledger records. `upsert`: see [`Self::create_ctes`]. Returns one row: how many rows
    /// changed; the updates not written (keys joined by U+001F, counters, true values); the
    /// rows created as 0 (keys, true values).
    pub(super) fn batch_range_sql(
        &self,
        run_id: i64,
        after: Option<&str>,
        up_to: Option<&str>,
        upsert: bool,
        staged: Option<&str>,
    ) -> BoundSql {
        let s = &self.spec;
        let mut binds = Binds::new();
        let run = binds.push(run_id);
        let range = KeyRange::push(&mut binds, after, up_to);
        let drift = match staged {
            Some(table) => format!("SELECT * FROM {table}"),
            None => self.drift_in_range_sql(range),
        };
        let keep = if s.when_no_source == WhenNoSource::Keep {
            " AND d.has_source"
        } else {
            ""
        };
        let updates = format!(
            "SELECT {ks}, d.now AS before, d.truth AS after, row_number() OVER () AS i
               FROM d WHERE d.now IS NOT NULL{keep}",
            ks = s
                .key
                .iter()
                .enumerate()
                .map(|(i, k)| format!("d.{k} AS k{i}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        // classify: with `when_no_source = "keep"` a key without a counter row gets none.
        let creates = format!(
            "SELECT {dk}, d.truth AS value FROM d WHERE d.now IS NULL{none}",
            dk = self.cols("d"),
            none = if s.when_no_source == WhenNoSource::Keep {
                " AND false"
            } else {
                ""
            },
        );
        let sql = format!(
            "WITH d AS MATERIALIZED ({drift}),
                  {write},
                  {create}
             SELECT (SELECT count(*) FROM upd) + (SELECT count(*) FROM l2 WHERE l2.created OR l2.added <> 0),
                    m.keys, m.befores, m.afters, r.keys, r.values
               FROM (SELECT array_agg(array_to_string(ARRAY[{ut}], chr(31))) AS keys,
                            array_agg(u.before) AS befores, array_agg(u.after) AS afters
                       FROM u WHERE u.i NOT IN (SELECT i FROM upd)) m,
                    (SELECT array_agg(array_to_string(ARRAY[{okt}], chr(31))) AS keys,
                            array_agg(ok.value::bigint) AS values
                       FROM ok WHERE NOT ok.ok AND ok.value <> 0) r",
            write = self.write_ctes(&updates, run, false, true),
            create = self.create_ctes(&creates, run, false, true, upsert),
            ut = (0..s.key.len())
                .map(|i| format!("u.k{i}::text"))
                .collect::<Vec<_>>()
                .join(", "),
            okt = self.keys_text_list("ok"),
        );
        BoundSql { sql, binds }
    }

    /// The drift a range batch writes: every key in `range` whose counter differs, with how
    /// many keys differ in it (`pgmend_whole`, which makes the CTE whole before the first write;
    /// named apart from any key column, since a staged table needs distinct names).
    fn drift_in_range_sql(&self, range: KeyRange) -> String {
        format!(
            "SELECT x.*, count(*) OVER () AS pgmend_whole FROM ({differing}) x",
            differing = self.differing_sql_in(true, range),
        )
    }

    /// [`Self::drift_in_range_sql`] over every key, with no parameter: what a batch over the
    /// whole key set stages (`batch_range`).
    pub(super) fn drift_of_range_sql(&self) -> String {
        self.drift_in_range_sql(KeyRange::ALL)
    }

    /// The CTEs that add each key's drift to its counter row (see [`Self::write_sql`]) from
    /// `input`, a `SELECT` of `k0`, `k1`, ... (the key columns, as text or native), `before`
    /// (the counter as read), `after` (the true value as read) and `i` (a number per row);
    /// `run` is the run's placeholder. They end in `u` (every proposed update), `upd` (the rows
    /// written, with `i`) and `wledger` (their ledger records; compact ones with `compact`).
    fn write_ctes(&self, input: &str, run: Param, merge: bool, compact: bool) -> String {
        let s = &self.spec;
        let typed = |i: usize, ty: &crate::db::sql_text::TypeName| format!("u.k{i}::{ty}");
        let row_key = if compact {
            let values: Vec<String> = self
                .key_types
                .iter()
                .enumerate()
                .map(|(i, ty)| typed(i, ty))
                .collect();
            format!("jsonb_build_array({})", values.join(", "))
        } else {
            let pairs: Vec<String> = s
                .key
                .iter()
                .zip(&self.key_types)
                .enumerate()
                .map(|(i, (k, ty))| format!("{}, {}", k.literal(), typed(i, ty)))
                .collect();
            format!("jsonb_build_object({})", pairs.join(", "))
        };
        let records = if compact {
            format!(
                "{} SELECT {run}, {SHAPE_CORRECTED}, u.row_key, jsonb_build_array(u.before), jsonb_build_array(u.after),
                           jsonb_build_array(u.before, u.after)",
                store::ledger_compact_insert()
            )
        } else {
            format!(
                "{} SELECT {run}, {}, u.row_key, 'update',
                      jsonb_build_object({cl}, u.before), jsonb_build_object({cl}, u.after),
                      format('{REASON_CORRECTED}', u.before, u.after)",
                store::ledger_insert(),
                s.counter_table.literal(),
                cl = s.counter.literal(),
            )
        };
        let (min, max) = self.range();
        let cn = &s.counter;
        let merged = self.merge_sql(run, merge, "upd");
        format!(
            "u AS (SELECT u.*, u.after - u.before AS drift, {row_key} AS row_key FROM ({input}) u),
             upd AS (UPDATE {counter} c SET {cn} = c.{cn} + u.drift FROM u
                      WHERE {m} AND u.after BETWEEN {min} AND {max}
                        AND c.{cn}::bigint + u.drift BETWEEN {min} AND {max} AND {passes}
                     RETURNING u.i, u.row_key, c.{cn}::bigint - u.drift AS before, c.{cn}::bigint AS after){merged},
             wledger AS (
               {records}
                 FROM upd u{not_merged}
               RETURNING 1)",
            counter = s.counter_table,
            m = self.u_match(),
            passes = self.checks_pass("c", &format!("c.{cn} + u.drift")),
            not_merged = if merge { " WHERE u.row_key NOT IN (SELECT row_key FROM merged)" } else { "" },
        )
    }

    /// The CTEs that create missing counter rows (see [`Self::create_sql`]) from `input`, a
    /// `SELECT` of the key columns (native types, named as the key) and `value`, the true
    /// value; `run` is the run's placeholder. They end in `ok` (every proposed row, `ok.ok`
    /// false where the value would not fit or pass a CHECK and 0 was created instead), `ins`
    /// and `l2` (the rows written: `created`, or `added` to a row the application made
    /// meanwhile) and `cledger` (their ledger records; compact ones with `compact`).
    /// With `upsert`, a key that has a counter row by the time the row is inserted (created
    /// by another session since the snapshot) gets its value added to that row; without, such
    /// a key fails the statement with a unique violation.
    fn create_ctes(
        &self,
        input: &str,
        run: Param,
        merge: bool,
        compact: bool,
        upsert: bool,
    ) -> String {
        let s = &self.spec;
        let counter = &s.counter_table;
        let keys_cols = column_list("", &s.key);
        let (copy_to, copy_from, join) = if s.copy_on_create.is_empty() {
            (String::new(), String::new(), String::new())
        } else {
            (
                s.copy_on_create
                    .keys()
                    .map(|c| format!(", {}", c))
                    .collect::<String>(),
                s.copy_on_create
                    .iter()
                    .map(|(to, from)| format!(", x.{} AS {}", from, to))
                    .collect::<String>(),
                format!(" JOIN {} x ON {}", &s.keys_from, self.keys_match("x", "v")),
            )
        };
        let created_cols: Vec<Ident> = s
            .key
            .iter()
            .chain(s.copy_on_create.keys())
            .cloned()
            .collect();
        let ok_cols = column_list("ok", &created_cols);
        let (min, max) = self.range();
        let key_obj = |alias: &str| {
            s.key
                .iter()
                .map(|k| format!("{}, {alias}.{}", k.literal(), k))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let merged = self.merge_sql(run, merge, "l2");
        format!(
            "v AS ({input}),
                  w AS (SELECT v.*{copy_from} FROM v{join}),
                  ok AS (SELECT w.*, w.value BETWEEN {min} AND {max} AND {passes} AS ok FROM w),
                  ins AS (
                    INSERT INTO {counter} AS t ({keys_cols}{copy_to}, {cn})
                    SELECT {ok_cols}, CASE WHEN ok.ok THEN ok.value ELSE 0 END FROM ok
                    {on_conflict}),
                  l2 AS (
                    SELECT ins.created, {row_key} AS row_key, {whole} AS whole,
                           ins.{cn}::bigint AS after, CASE WHEN ok.ok THEN ok.value ELSE 0 END AS added
                      FROM ins JOIN ok ON {im}){merged},
                  cledger AS (
                    {records}
                      FROM l2 WHERE (l2.created OR l2.added <> 0){not_merged}
                    RETURNING 1)",
            row_key = if compact { format!("jsonb_build_array({})", column_list("ins", &s.key)) } else { format!("jsonb_build_object({})", key_obj("ins")) },
            whole = if compact { format!("jsonb_build_array({})", column_list("ins", &self.columns)) } else { "to_jsonb(ins) - 'created'".to_string() },
            records = if compact {
                format!(
                    "{compact_insert}
                    SELECT {run}, CASE WHEN l2.created THEN {created} ELSE {added} END, l2.row_key,
                           CASE WHEN l2.created THEN NULL ELSE jsonb_build_array(l2.after - l2.added) END,
                           CASE WHEN l2.created THEN l2.whole ELSE jsonb_build_array(l2.after) END,
                           CASE WHEN l2.created THEN NULL ELSE jsonb_build_array(l2.added) END",
                    compact_insert = store::ledger_compact_insert(),
                    created = SHAPE_CREATED,
                    added = SHAPE_ADDED,
                )
            } else {
                format!(
                    "{ledger_insert}
                    SELECT {run}, {tl}, l2.row_key,
                           CASE WHEN l2.created THEN 'insert' ELSE 'update' END,
                           CASE WHEN l2.created THEN NULL ELSE jsonb_build_object({cl}, l2.after - l2.added) END,
                           CASE WHEN l2.created THEN l2.whole ELSE jsonb_build_object({cl}, l2.after) END,
                           CASE WHEN l2.created THEN '{created}' ELSE format('{added}', l2.added) END",
                    ledger_insert = store::ledger_insert(),
                    tl = s.counter_table.literal(),
                    cl = s.counter.literal(),
                    created = REASON_CREATED,
                    added = REASON_ADDED,
                )
            },
            on_conflict = if upsert {
                format!("ON CONFLICT ({keys_cols}) DO UPDATE SET {cn} = t.{cn} + excluded.{cn}
                    RETURNING t.*, t.xmax = 0 AS created", cn = &s.counter)
            } else {
                "RETURNING t.*, true AS created".to_string()
            },
            cn = &s.counter,
            passes = self.checks_pass_on_create(),
            im = self.keys_match("ins", "ok"),
            not_merged = if merge { " AND l2.row_key NOT IN (SELECT row_key FROM merged)" } else { "" },
        )
    }

    /// With `merge`: a CTE `merged` that gives an existing ledger record of run `run` for the
    /// same row (from an earlier pass) the new `after`, keeping its `before`.
    fn merge_sql(&self, run: Param, merge: bool, from: &str) -> String {
        if !merge {
            return String::new();
        }
        format!(
            ",
                  merged AS (
                    UPDATE {ledger} l
                       SET after = l.after || jsonb_build_object({cl}, m.after),
                           reason = l.reason || format('; corrected again to %s by a later pass of the run', m.after)
                      FROM {from} m
                     WHERE l.run_id = {run} AND l.target_table = {tl} AND l.row_key = m.row_key
                    RETURNING l.row_key)",
            ledger = store::ledger_full(),
            cl = self.spec.counter.literal(),
            tl = self.spec.counter_table.literal(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{budgets, flat, monthly, proposed};

    #[test]
    fn write_adds_the_drift_where_it_fits_and_passes_the_checks() {
        let e = budgets();
        let st = e.write_sql(
            7,
            &[proposed(&["c1"], 10, 15), proposed(&["c2"], 3, 1)],
            false,
        );
        let sql = flat(&st.sql);
        assert!(sql.starts_with(
            "WITH u AS (SELECT u.*, u.after - u.before AS drift, jsonb_build_object('campaign_id', u.k0::text) AS row_key \
             FROM (SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS u(k0, before, after, i)) u), \
             upd AS (UPDATE \"campaign_budgets\" c SET \"issued_yen\" = c.\"issued_yen\" + u.drift FROM u \
             WHERE c.\"campaign_id\" = u.k0::text AND u.after BETWEEN -2147483648 AND 2147483647 \
             AND c.\"issued_yen\"::bigint + u.drift BETWEEN -2147483648 AND 2147483647 AND NOT EXISTS"
        ), "{sql}");
        assert!(sql.contains(
            "INSERT INTO \"pgmend\".\"repair_ledger\" (run_id, target_table, row_key, action, before, after, reason) \
             SELECT $1, 'campaign_budgets', u.row_key, 'update', jsonb_build_object('issued_yen', u.before), \
             jsonb_build_object('issued_yen', u.after), format('counter was %s; the source sums to %s', u.before, u.after) \
             FROM upd u RETURNING 1)"
        ), "{sql}");
        assert!(sql.ends_with(
            "SELECT (SELECT count(*) FROM upd), coalesce((SELECT array_agg(u.i) FROM u WHERE u.i NOT IN (SELECT i FROM upd)), '{}')"
        ), "{sql}");
        assert!(!sql.contains("merged"));
        assert_eq!(
            st.binds.shown(),
            ["7", "[\"c1\", \"c2\"]", "[10, 3]", "[15, 1]"]
        );
    }

    #[test]
    fn a_merging_write_moves_the_runs_earlier_record_instead_of_adding_one() {
        let sql = flat(
            &budgets()
                .write_sql(7, &[proposed(&["c1"], 10, 15)], true)
                .sql,
        );
        assert!(sql.contains(
            "merged AS ( UPDATE \"pgmend\".\"repair_ledger\" l SET after = l.after || jsonb_build_object('issued_yen', m.after), \
             reason = l.reason || format('; corrected again to %s by a later pass of the run', m.after) \
             FROM upd m WHERE l.run_id = $1 AND l.target_table = 'campaign_budgets' AND l.row_key = m.row_key RETURNING l.row_key)"
        ), "{sql}");
        assert!(
            sql.contains(
                "FROM upd u WHERE u.row_key NOT IN (SELECT row_key FROM merged) RETURNING 1)"
            ),
            "{sql}"
        );
    }

    #[test]
    fn create_copies_columns_from_keys_from_and_creates_zero_where_refused() {
        let e = budgets();
        let st = e.create_sql(7, &[proposed(&["c1"], 0, 15)], false);
        let sql = flat(&st.sql);
        assert!(sql.starts_with(
            "WITH v AS (SELECT u.k0::text AS \"campaign_id\", u.after AS value FROM unnest($2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS u(k0, before, after, i)), \
             w AS (SELECT v.*, x.\"budget_yen\" AS \"budget_yen\", x.\"discount_yen\" AS \"discount_yen\" FROM v JOIN \"campaigns\" x ON x.\"campaign_id\" = v.\"campaign_id\"), \
             ok AS (SELECT w.*, w.value BETWEEN -2147483648 AND 2147483647 AND NOT EXISTS"
        ), "{sql}");
        assert!(sql.contains(
            "INSERT INTO \"campaign_budgets\" AS t (\"campaign_id\", \"budget_yen\", \"discount_yen\", \"issued_yen\") \
             SELECT ok.\"campaign_id\", ok.\"budget_yen\", ok.\"discount_yen\", CASE WHEN ok.ok THEN ok.value ELSE 0 END FROM ok \
             ON CONFLICT (\"campaign_id\") DO UPDATE SET \"issued_yen\" = t.\"issued_yen\" + excluded.\"issued_yen\" RETURNING t.*, t.xmax = 0 AS created)"
        ), "{sql}");
        assert!(sql.contains("SELECT $1, 'campaign_budgets', l2.row_key, CASE WHEN l2.created THEN 'insert' ELSE 'update' END"), "{sql}");
        assert!(sql.ends_with(
            "coalesce((SELECT array_agg(array_to_string(ARRAY[ok.\"campaign_id\"::text], chr(31))) FROM ok WHERE NOT ok.ok AND ok.value <> 0), '{}')"
        ), "{sql}");
        assert_eq!(st.binds.shown(), ["7", "[\"c1\"]", "[0]", "[15]"]);
    }

    #[test]
    fn a_range_batch_reads_its_range_and_writes_compact_records_in_one_statement() {
        let e = monthly();
        let st = e.batch_range_sql(7, Some("m1"), None, false, None);
        let sql = flat(&st.sql);
        assert!(sql.starts_with("WITH d AS MATERIALIZED (SELECT x.*, count(*) OVER () AS pgmend_whole FROM (SELECT coalesce("), "{sql}");
        assert!(sql.contains("s.\"member_id\" > $2::text::text"), "{sql}");
        assert!(!sql.contains("$3"), "{sql}");
        assert!(sql.contains(
            "u AS (SELECT u.*, u.after - u.before AS drift, jsonb_build_array(u.k0::text, u.k1::date) AS row_key \
             FROM (SELECT d.\"member_id\" AS k0, d.\"month\" AS k1, d.now AS before, d.truth AS after, row_number() OVER () AS i FROM d WHERE d.now IS NOT NULL) u)"
        ), "{sql}");
        assert!(sql.contains(
            "INSERT INTO \"pgmend\".\"ledger_compact\" (run_id, shape, row_key, before, after, args) SELECT $1, 2, u.row_key, \
             jsonb_build_array(u.before), jsonb_build_array(u.after), jsonb_build_array(u.before, u.after) FROM upd u RETURNING 1)"
        ), "{sql}");
        assert!(sql.contains("v AS (SELECT d.\"member_id\", d.\"month\", d.truth AS value FROM d WHERE d.now IS NULL), w AS (SELECT v.* FROM v)"), "{sql}");
        assert!(
            sql.contains("SELECT $1, CASE WHEN l2.created THEN 1 ELSE 3 END, l2.row_key"),
            "{sql}"
        );
        assert!(sql.contains("RETURNING t.*, true AS created)"), "{sql}");
        assert!(
            sql.contains(
                "jsonb_build_array(ins.\"member_id\", ins.\"month\", ins.\"used_yen\") AS whole"
            ),
            "{sql}"
        );
        assert_eq!(st.binds.shown(), ["7", "\"m1\""]);
        let upsert = flat(&e.batch_range_sql(7, None, Some("m9"), true, None).sql);
        assert!(upsert.contains("ON CONFLICT (\"member_id\", \"month\") DO UPDATE SET \"used_yen\" = t.\"used_yen\" + excluded.\"used_yen\" RETURNING t.*, t.xmax = 0 AS created)"), "{upsert}");
        assert!(
            upsert.contains("s.\"member_id\" <= $2::text::text"),
            "{upsert}"
        );
    }

    #[test]
    fn a_batch_over_the_whole_key_set_stages_its_drift_with_no_parameter_and_writes_from_it() {
        let e = budgets();
        let staged = e.drift_of_range_sql();
        assert!(!staged.contains('$'), "{staged}");
        assert!(
            flat(&staged)
                .starts_with("SELECT x.*, count(*) OVER () AS pgmend_whole FROM (SELECT coalesce("),
            "{staged}"
        );
        let st = e.batch_range_sql(7, None, None, false, Some("pg_temp.pgmend_drift"));
        let sql = flat(&st.sql);
        assert!(
            sql.starts_with("WITH d AS MATERIALIZED (SELECT * FROM pg_temp.pgmend_drift), "),
            "{sql}"
        );
        assert!(
            !sql.contains("issued_coupons"),
            "the drift is read once, staged: {sql}"
        );
        assert_eq!(st.binds.shown(), ["7"]);
    }

    #[test]
    fn keep_leaves_keys_without_a_counter_row_or_source_alone_in_a_range_batch() {
        let mut e = monthly();
        e.spec.when_no_source = crate::repair::definition::WhenNoSource::Keep;
        let sql = flat(&e.batch_range_sql(7, None, None, false, None).sql);
        assert!(
            sql.contains("FROM d WHERE d.now IS NOT NULL AND d.has_source) u)"),
            "{sql}"
        );
        assert!(
            sql.contains("FROM d WHERE d.now IS NULL AND false)"),
            "{sql}"
        );
    }
}
