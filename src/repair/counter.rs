//! The rebuild-counter engine. Exact under concurrent writers in READ COMMITTED: each batch
//! first locks its counter rows, then sums the source in a new statement (whose snapshot
//! sees every writer that committed while we waited for the lock). A single
//! `UPDATE ... SET x = (SELECT sum ...)` takes its snapshot before it waits, and writes a
//! stale sum.

use anyhow::Result;
use postgres::types::ToSql;
use serde_json::json;

use super::definition::{Aggregate, CounterSpec, WhenNoSource};
use super::store::{column_types, q};
use super::void::lit;
use crate::error::PgContext;

pub struct CounterEngine {
    pub spec: CounterSpec,
    key_types: Vec<String>,
    counter_type: String,
    /// Every column of the counter table, for evaluating its checks on proposed values.
    columns: Vec<String>,
    /// CHECK expressions on the counter table (NOT VALID ones too: they check updates).
    checks: Vec<(String, String)>,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct BatchResult {
    pub changed: i64,
    pub skipped: Vec<serde_json::Value>,
}

impl CounterEngine {
    /// For previews, where the counter table may not exist yet: no catalog reads.
    pub fn preview_only(spec: CounterSpec) -> CounterEngine {
        CounterEngine {
            spec,
            key_types: Vec::new(),
            counter_type: String::new(),
            columns: Vec::new(),
            checks: Vec::new(),
        }
    }

    pub fn prepare(
        client: &mut impl postgres::GenericClient,
        spec: &CounterSpec,
    ) -> Result<CounterEngine> {
        let key_types = column_types(client, &spec.counter_table, &spec.key)?;
        let counter_type = column_types(
            client,
            &spec.counter_table,
            std::slice::from_ref(&spec.counter),
        )?
        .remove(0);
        column_types(client, &spec.source_table, &spec.key)?;
        if let Some(v) = &spec.value {
            column_types(client, &spec.source_table, std::slice::from_ref(v))?;
        }
        let columns: Vec<String> = client
            .query(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(quote_ident($1))
                    AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&spec.counter_table],
            )
            .doing("reading the counter table's columns")?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let checks = client
            .query(
                "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint
                  WHERE conrelid = to_regclass(quote_ident($1)) AND contype = 'c'",
                &[&spec.counter_table],
            )
            .doing("reading the counter table's checks")?
            .iter()
            .map(|r| {
                let def: String = r.get(1);
                let expr = def
                    .strip_prefix("CHECK ")
                    .unwrap_or(&def)
                    .trim_end_matches(" NOT VALID")
                    .to_string();
                (r.get(0), expr)
            })
            .collect();
        Ok(CounterEngine {
            spec: spec.clone(),
            key_types,
            counter_type,
            columns,
            checks,
        })
    }

    fn keys_text(&self, alias: &str) -> String {
        let parts: Vec<String> = self
            .spec
            .key
            .iter()
            .map(|k| format!("{alias}.{}::text", q(k)))
            .collect();
        format!("ARRAY[{}]", parts.join(", "))
    }

    fn keys_match(&self, a: &str, b: &str) -> String {
        self.spec
            .key
            .iter()
            .map(|k| format!("{a}.{k} = {b}.{k}", k = q(k)))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    fn cols(&self, alias: &str) -> String {
        self.spec
            .key
            .iter()
            .map(|k| format!("{alias}.{}", q(k)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The source's aggregate over the rows joined as `s`: the true value of a key.
    fn aggregate(&self) -> String {
        let s = &self.spec;
        let filter = s
            .source_filter_null
            .as_ref()
            .map(|f| format!("s.{} IS NULL", q(f)))
            .unwrap_or_else(|| "true".into());
        let agg = match (s.aggregate, &s.value) {
            (Aggregate::Sum, Some(v)) => format!("sum(s.{}) FILTER (WHERE {filter})", q(v)),
            _ => format!("count(s.{}) FILTER (WHERE {filter})", q(&s.key[0])),
        };
        format!("coalesce({agg}, 0)::bigint")
    }

    /// Every key whose counter differs from its source, in one statement (so counter and
    /// sum come from one snapshot), with one pass over the source and one over the counter
    /// table: columns are the key columns (native types), the counter now (NULL: no row)
    /// and the true value. The keys are those of `keys_from` (or of the source) and those
    /// already counted. `counter_exists` is false on a database where the counter table is
    /// still to be created (a dry run).
    fn differing_sql(&self, counter_exists: bool) -> String {
        let s = &self.spec;
        let key_cols = s.key.iter().map(|k| q(k)).collect::<Vec<_>>().join(", ");
        let not_null = |alias: &str| {
            s.key
                .iter()
                .map(|k| format!("{alias}.{} IS NOT NULL", q(k)))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        let grouped = format!(
            "SELECT {sk}, {agg} AS truth FROM {source} s WHERE {nn} GROUP BY {sk}",
            sk = self.cols("s"),
            agg = self.aggregate(),
            source = q(&s.source_table),
            nn = not_null("s"),
        );
        // The true value of every key of the key set; has_source: whether any source row
        // (filtered or not) has the key.
        let truth = if s.keys_from == "source" {
            format!("SELECT a.*, true AS has_source FROM ({grouped}) a")
        } else {
            format!(
                "SELECT {xk}, coalesce(a.truth, 0) AS truth, a.{first} IS NOT NULL AS has_source
                   FROM (SELECT DISTINCT {xk} FROM {from} x WHERE {nn}) x
                   LEFT JOIN ({grouped}) a ON {m}",
                xk = self.cols("x"),
                first = q(&s.key[0]),
                from = q(&s.keys_from),
                nn = not_null("x"),
                m = self.keys_match("a", "x"),
            )
        };
        let counter = if counter_exists {
            format!(
                "SELECT {key_cols}, {cn}::bigint AS now FROM {counter}",
                cn = q(&s.counter),
                counter = q(&s.counter_table)
            )
        } else {
            let nulls = s
                .key
                .iter()
                .map(|k| format!("NULL AS {}", q(k)))
                .collect::<Vec<_>>()
                .join(", ");
            format!("SELECT {nulls}, NULL::bigint AS now WHERE false")
        };
        let coalesced = s
            .key
            .iter()
            .map(|k| format!("coalesce(t.{k}, c.{k}) AS {k}", k = q(k)))
            .collect::<Vec<_>>()
            .join(", ");
        // A key with no source row and `when_no_source = "keep"` keeps its counter.
        let keep = if s.when_no_source == WhenNoSource::Keep {
            " AND t.has_source"
        } else {
            ""
        };
        format!(
            "SELECT {coalesced}, c.now, coalesce(t.truth, 0) AS truth
               FROM ({truth}) t FULL JOIN ({counter}) c ON {m}
              WHERE c.now IS DISTINCT FROM coalesce(t.truth, 0){keep}",
            m = self.keys_match("c", "t"),
        )
    }

    /// The frozen targets: every key whose counter differs from its source now, in key
    /// order (so that a batch's keys are a narrow range of the source's leading key column).
    pub fn freeze_sql(&self) -> String {
        format!(
            "INSERT INTO pgmend.repair_targets (run_id, seq, key)
             SELECT $1, row_number() OVER (ORDER BY {dk}), {dt} FROM ({differing}) d",
            dk = self.cols("d"),
            dt = self.keys_text("d"),
            differing = self.differing_sql(true),
        )
    }

    fn batch_keys(&self) -> String {
        super::store::frozen_batch_sql(&self.spec.key, &self.key_types)
    }

    /// Whether `alias`'s leading key column lies between a batch's first and last key ($4
    /// and $5, as text). The frozen keys are in key order, so the source rows of a batch
    /// are one index range scan where the source is indexed on that column, rather than a
    /// lookup per key or a scan of the whole source; the counter table is read this way
    /// too, or the planner hashes all of it for every batch (it cannot estimate the frozen
    /// keys' join) and batches slow down as it grows.
    fn in_batch_range(&self, alias: &str) -> String {
        format!(
            "{alias}.{first} BETWEEN $4::text::{ty} AND $5::text::{ty}",
            first = q(&self.spec.key[0]),
            ty = self.key_types[0],
        )
    }

    /// The first and last value of the leading key column among a batch's frozen keys.
    fn batch_bounds(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        lo: i64,
        hi: i64,
    ) -> Result<(Option<String>, Option<String>), postgres::Error> {
        let first = q(&self.spec.key[0]);
        let row = tx.query_one(
            &format!(
                "SELECT min(g.{first})::text, max(g.{first})::text FROM ({}) g",
                self.batch_keys()
            ),
            &[&run_id, &lo, &hi],
        )?;
        Ok((row.get(0), row.get(1)))
    }

    /// The true value per key of `keys` (SQL yielding the key columns): key text array,
    /// truth, whether any source row exists.
    fn truth_sql(&self, keys: &str) -> String {
        let s = &self.spec;
        let g_cols = self.cols("g");
        let first = q(&s.key[0]);
        format!(
            "SELECT {gk}, {agg}, count(s.{first}) > 0
               FROM ({keys}) g LEFT JOIN {source} s ON {m}
              GROUP BY {g_cols}",
            gk = self.keys_text("g"),
            agg = self.aggregate(),
            source = q(&s.source_table),
            m = self.keys_match("s", "g"),
        )
    }

    /// The values the counter column can hold.
    fn range(&self) -> (i64, i64) {
        match self.counter_type.as_str() {
            "smallint" => (i64::from(i16::MIN), i64::from(i16::MAX)),
            "integer" => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => (i64::MIN, i64::MAX),
        }
    }

    /// One batch: create missing counter rows, lock them, sum, check, write, ledger.
    pub fn batch(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        lo: i64,
        hi: i64,
    ) -> Result<BatchResult, postgres::Error> {
        let s = &self.spec;
        let counter = q(&s.counter_table);
        let mut result = BatchResult::default();
        let (first, last) = self.batch_bounds(tx, run_id, lo, hi)?;
        // The first ledger record of the rows this batch creates, if it creates any.
        let mut first_insert_record: Option<i64> = None;
        if s.when_no_source == WhenNoSource::Zero {
            let (copy_to, copy_from, join) = if s.copy_on_create.is_empty() {
                (String::new(), String::new(), String::new())
            } else {
                let to: Vec<String> = s
                    .copy_on_create
                    .keys()
                    .map(|c| format!(", {}", q(c)))
                    .collect();
                let from: Vec<String> = s
                    .copy_on_create
                    .values()
                    .map(|c| format!(", x.{}", q(c)))
                    .collect();
                (
                    to.concat(),
                    from.concat(),
                    format!(
                        " JOIN {} x ON {}",
                        q(&s.keys_from),
                        self.keys_match("x", "g")
                    ),
                )
            };
            let keys_cols = s.key.iter().map(|k| q(k)).collect::<Vec<_>>().join(", ");
            let g_cols = s
                .key
                .iter()
                .map(|k| format!("g.{}", q(k)))
                .collect::<Vec<_>>()
                .join(", ");
            let key_obj = s
                .key
                .iter()
                .map(|k| format!("{}, i.{}", lit(k), q(k)))
                .collect::<Vec<_>>()
                .join(", ");
            // A missing row is created with the source's sum at once: whoever issues a coupon
            // for that key creates the row first, so a concurrent issuer either waits for this
            // insert (and adds on top of it) or made the row already (and the key takes the
            // lock-then-sum path below). A value that would not fit, or that a CHECK would
            // refuse, is created as 0 and left to that path, which reports it.
            let (min, max) = self.range();
            let check_row: Vec<String> = s
                .key
                .iter()
                .map(|k| format!("g.{k} AS {k}", k = q(k)))
                .chain(
                    s.copy_on_create
                        .iter()
                        .map(|(to, from)| format!("x.{} AS {}", q(from), q(to))),
                )
                .chain(std::iter::once(format!("g.truth AS {}", q(&s.counter))))
                .collect();
            let passes = if self.checks.is_empty() {
                "true".to_string()
            } else {
                let tests = self
                    .checks
                    .iter()
                    .map(|(_, e)| format!("({e}) IS FALSE"))
                    .collect::<Vec<_>>()
                    .join(" OR ");
                format!(
                    "NOT EXISTS (SELECT 1 FROM (SELECT {}) r WHERE {tests})",
                    check_row.join(", ")
                )
            };
            let counter_exists = format!(
                "EXISTS (SELECT 1 FROM {counter} c WHERE {} AND {})",
                self.keys_match("c", "g"),
                self.in_batch_range("c")
            );
            let inserted = tx.query_one(
                &format!(
                    "WITH i AS (
                       INSERT INTO {counter} ({keys_cols}{copy_to}, {cn})
                       SELECT {g_cols}{copy_from},
                              CASE WHEN g.truth BETWEEN {min} AND {max} AND {passes} THEN g.truth ELSE 0 END
                         FROM (SELECT {g_cols}, {agg} AS truth
                                 FROM ({keys}) g LEFT JOIN {source} s ON {sm} AND {range}
                                WHERE NOT {counter_exists}
                                GROUP BY {g_cols}) g{join}
                       ON CONFLICT DO NOTHING RETURNING *),
                     l AS (
                       INSERT INTO pgmend.repair_ledger (run_id, target_table, row_key, action, before, after, reason)
                       SELECT $1, {tl}, jsonb_build_object({key_obj}), 'insert', NULL, to_jsonb(i),
                              'the key had no counter row; created with the sum of its source rows'
                         FROM i
                       RETURNING ledger_id)
                     SELECT count(*), min(ledger_id) FROM l",
                    cn = q(&s.counter),
                    keys = self.batch_keys(),
                    agg = self.aggregate(),
                    source = q(&s.source_table),
                    range = self.in_batch_range("s"),
                    sm = self.keys_match("s", "g"),
                    tl = lit(&s.counter_table),
                ),
                &[&run_id, &lo, &hi, &first, &last],
            )?;
            result.changed += inserted.get::<_, i64>(0);
            first_insert_record = inserted.get(1);
        }
        // The frozen keys differed from their source when the run began; the application,
        // which keeps counter and source in step, cannot make them agree again, so every one
        // is locked and summed again below. Rows this batch has just created hold their true
        // sum: a writer that committed before the insert's snapshot is in it, and one that
        // commits after waited for the insert and added on top. They are not summed a second
        // time; a row created as 0 (a value that would not fit or pass a CHECK) still is, so
        // that it gets reported. (xmin is this transaction's id only for rows it inserted.)
        let differing: Vec<Vec<String>> = tx
            .query(
                &format!(
                    "SELECT {gk} FROM ({keys}) g WHERE EXISTS (
                       SELECT 1 FROM {counter} c
                        WHERE {m} AND {range} AND NOT (c.xmin = (SELECT pg_current_xact_id()::xid) AND c.{cn} <> 0))",
                    gk = self.keys_text("g"),
                    keys = self.batch_keys(),
                    range = self.in_batch_range("c"),
                    m = self.keys_match("c", "g"),
                    cn = q(&s.counter),
                ),
                &[&run_id, &lo, &hi, &first, &last],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if differing.is_empty() {
            return Ok(result);
        }
        let n = s.key.len();
        let mut columns: Vec<Vec<String>> = vec![Vec::new(); n];
        for key in &differing {
            for (i, part) in key.iter().enumerate() {
                columns[i].push(part.clone());
            }
        }
        let params: Vec<&(dyn ToSql + Sync)> =
            columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        let differing_keys = format!(
            "SELECT {} FROM unnest({}) AS u({})",
            s.key
                .iter()
                .zip(&self.key_types)
                .enumerate()
                .map(|(i, (k, ty))| format!("u.k{i}::{ty} AS {}", q(k)))
                .collect::<Vec<_>>()
                .join(", "),
            (1..=n)
                .map(|i| format!("${i}::text[]"))
                .collect::<Vec<_>>()
                .join(", "),
            (0..n)
                .map(|i| format!("k{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // Lock first ...
        let locked = tx.query(
            &format!(
                "SELECT {ck}, c.{cn}::bigint FROM {counter} c JOIN ({keys}) g ON {m} ORDER BY 1 FOR UPDATE OF c",
                ck = self.keys_text("c"),
                cn = q(&s.counter),
                keys = differing_keys,
                m = self.keys_match("c", "g"),
            ),
            &params,
        )?;
        let current: std::collections::HashMap<Vec<String>, i64> =
            locked.iter().map(|r| (r.get(0), r.get(1))).collect();
        // ... then sum, in a new statement.
        let truths = tx.query(&self.truth_sql(&differing_keys), &params)?;
        let (min, max) = self.range();
        let mut updates: Vec<(Vec<String>, i64, i64)> = Vec::new();
        for row in &truths {
            let key: Vec<String> = row.get(0);
            let truth: i64 = row.get(1);
            let has_source: bool = row.get(2);
            let Some(&before) = current.get(&key) else {
                continue;
            };
            if !has_source && s.when_no_source == WhenNoSource::Keep {
                continue;
            }
            if truth == before {
                continue;
            }
            if truth < min || truth > max {
                result.skipped.push(json!({
                    "key": key, "counter": before, "true_value": truth,
                    "reason": format!("the true value {truth} does not fit {}.{} ({})", s.counter_table, s.counter, self.counter_type)
                }));
                continue;
            }
            updates.push((key, before, truth));
        }
        if !updates.is_empty() && !self.checks.is_empty() {
            let rejected = self.rejected_by_checks(tx, &updates)?;
            let mut kept = Vec::new();
            for (i, u) in updates.into_iter().enumerate() {
                match rejected.iter().find(|(idx, _)| *idx == i as i64) {
                    Some((_, names)) => result.skipped.push(json!({
                        "key": u.0, "counter": u.1, "true_value": u.2,
                        "reason": format!("writing it would break {names}")
                    })),
                    None => kept.push(u),
                }
            }
            updates = kept;
        }
        if !updates.is_empty() {
            result.changed += self.write(tx, run_id, first_insert_record, &updates)? as i64;
        }
        Ok(result)
    }

    /// Unnest parameters: one text[] per key column, then before and after bigint[].
    fn unnest(
        &self,
        updates: &[(Vec<String>, i64, i64)],
        first_param: usize,
    ) -> (String, Vec<Vec<String>>, Vec<i64>, Vec<i64>) {
        let n = self.spec.key.len();
        let mut cols: Vec<Vec<String>> = vec![Vec::new(); n];
        for (key, _, _) in updates {
            for (i, part) in key.iter().enumerate() {
                cols[i].push(part.clone());
            }
        }
        let befores = updates.iter().map(|u| u.1).collect();
        let afters = updates.iter().map(|u| u.2).collect();
        let params: Vec<String> = (0..n)
            .map(|i| format!("${}::text[]", first_param + i))
            .collect();
        let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let sql = format!(
            "unnest({}, ${}::bigint[], ${}::bigint[]) WITH ORDINALITY AS u({}, before, after, i)",
            params.join(", "),
            first_param + n,
            first_param + n + 1,
            names.join(", ")
        );
        (sql, cols, befores, afters)
    }

    fn u_match(&self) -> String {
        self.spec
            .key
            .iter()
            .zip(&self.key_types)
            .enumerate()
            .map(|(i, (k, ty))| format!("c.{} = u.k{i}::{ty}", q(k)))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// Which proposed values a CHECK on the counter table would refuse (checked before
    /// writing, so nothing is written for them): (index into updates, check names).
    fn rejected_by_checks(
        &self,
        tx: &mut postgres::Transaction<'_>,
        updates: &[(Vec<String>, i64, i64)],
    ) -> Result<Vec<(i64, String)>, postgres::Error> {
        let (unnest, cols, befores, afters) = self.unnest(updates, 1);
        let row_cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if *c == self.spec.counter {
                    format!("u.after::{} AS {}", self.counter_type, q(c))
                } else {
                    format!("c.{}", q(c))
                }
            })
            .collect();
        let tests: Vec<String> = self
            .checks
            .iter()
            .map(|(name, expr)| format!("CASE WHEN EXISTS (SELECT 1 FROM (SELECT {}) x WHERE ({expr}) IS FALSE) THEN {} END", row_cols.join(", "), lit(name)))
            .collect();
        let sql = format!(
            "SELECT u.i - 1, concat_ws(', ', {}) FROM {unnest} JOIN {} c ON {} WHERE concat_ws(', ', {}) <> ''",
            tests.join(", "),
            q(&self.spec.counter_table),
            self.u_match(),
            tests.join(", ")
        );
        let mut params: Vec<&(dyn ToSql + Sync)> =
            cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        params.push(&befores);
        params.push(&afters);
        Ok(tx
            .query(&sql, &params)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    /// Writes the true values and their ledger records; returns how many rows it changed
    /// that this batch had not created. A row this batch created already has its 'insert'
    /// record (from `first_insert_record` on): that record takes the final value, so a run
    /// keeps one record per row.
    fn write(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        first_insert_record: Option<i64>,
        updates: &[(Vec<String>, i64, i64)],
    ) -> Result<u64, postgres::Error> {
        let s = &self.spec;
        let (unnest, cols, befores, afters) = self.unnest(updates, 3);
        let key_obj = s
            .key
            .iter()
            .zip(&self.key_types)
            .enumerate()
            .map(|(i, (k, ty))| format!("{}, u.k{i}::{ty}", lit(k)))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "WITH u AS (SELECT *, jsonb_build_object({key_obj}) AS row_key FROM {unnest}),
             upd AS (UPDATE {counter} c SET {cn} = u.after FROM u WHERE {m} RETURNING u.*),
             created AS (
               UPDATE pgmend.repair_ledger l
                  SET after = l.after || jsonb_build_object({cl}, u.after),
                      reason = 'the key had no counter row; ' || format('counter was %s; the source sums to %s', u.before, u.after)
                 FROM upd u
                WHERE $2::bigint IS NOT NULL AND l.run_id = $1 AND l.ledger_id >= $2
                  AND l.target_table = {tl} AND l.action = 'insert' AND l.row_key = u.row_key
               RETURNING l.row_key)
             INSERT INTO pgmend.repair_ledger (run_id, target_table, row_key, action, before, after, reason)
             SELECT $1, {tl}, u.row_key, 'update',
                    jsonb_build_object({cl}, u.before), jsonb_build_object({cl}, u.after),
                    format('counter was %s; the source sums to %s', u.before, u.after)
               FROM upd u WHERE u.row_key NOT IN (SELECT row_key FROM created)",
            counter = q(&s.counter_table),
            cn = q(&s.counter),
            m = self.u_match(),
            tl = lit(&s.counter_table),
            cl = lit(&s.counter),
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run_id, &first_insert_record];
        params.extend(cols.iter().map(|c| c as &(dyn ToSql + Sync)));
        params.push(&befores);
        params.push(&afters);
        // Rows created earlier in this batch already count as changed.
        tx.execute(&sql, &params)
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

    /// After a run: how many keys' counters differ from the source now (the invariant, over
    /// every key; writes by an application that does not maintain the counter yet show here).
    pub fn drift_sql(&self) -> String {
        format!("SELECT count(*) FROM ({}) d", self.differing_sql(true))
    }
}
