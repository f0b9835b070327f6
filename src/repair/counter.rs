//! The rebuild-counter engine. Exact under concurrent writers in READ COMMITTED: a batch reads
//! each key's drift (true value minus counter) in one snapshot without locking anything, then
//! adds that drift to the counter row as it is when the batch writes (`SET x = x + drift`). A
//! writer that changes a counter and its source together moves both sides of the drift alike, so
//! it stays right; a single `UPDATE ... SET x = (SELECT sum ...)` takes its snapshot before it
//! waits for the row, and writes a stale sum.
//!
//! `prepare` reads the key and counter types, the counter table's columns and its CHECK constraints
//! (`pg_get_constraintdef`, `NOT VALID` ones included). `differing_sql` is the core: every key
//! whose counter differs from its source, in one statement (one snapshot) with one pass over each
//! table: the source grouped by the key (`sum(value)` or `count(source key)`, filtered by
//! `source_filter_null`, 0 without source rows), joined to `keys_from`'s distinct keys when the key
//! set comes from another table, `FULL JOIN` the counter table, keeping rows where the counter `IS
//! DISTINCT FROM` the truth (no row counts as different; with `when_no_source = keep`, keys without
//! source rows are left out). `freeze_sql` numbers its keys in key order; `preview_sql` lists them
//! for the dry run (with an empty counter side when the counter table does not exist yet);
//! `drift_sql` counts them for the reconciliation, over every key; `differing_keys` lists the first
//! of them, for the release's check before a migration after the gate.
//!
//! Before the deploy gate a run walks ranges of the key's first column (nearly every key
//! differs: the first pass fills the counter tables). Such a batch is one statement on the
//! server, `batch_range`: it reads the range's drift in its snapshot into a CTE that is whole
//! before the first row is written (a window aggregate over it), then updates, creates and
//! writes the ledger from it, so no key travels to pgmend and back; the keys it could not
//! write come back and are explained as below. Its ledger records are compact (`ledger_shapes`:
//! a created row, a corrected counter, a row the application created meanwhile), the records
//! after the gate full, as before (a second pass merges into them).
//!
//! After the gate a run walks the keys that differ, frozen in key order, so a batch's keys span
//! a narrow range of the leading key column, and a batch reads the source and the counter table
//! only within that range (`in_batch_range`), one index range scan each, instead of a lookup per
//! key or a hash of the whole counter table (which made batches slow down as the table grew).
//! Such a batch is two parts:
//!
//! 1. `read_drift`, one statement outside the batch transaction (the runner calls it first): each
//!    key's counter (None: no row), true value and whether it has source rows. No lock is taken.
//! 2. `batch`, in the batch transaction: `classify` splits the keys into updates and creates (a
//!    true value that does not fit the column is skipped and reported, `does_not_fit`);
//!    `drop_rejected_by_checks` skips the updates a CHECK would refuse (`rejected_by_checks` names
//!    the checks); `create` makes the missing rows with their true values (`INSERT ... ON CONFLICT
//!    (key) DO UPDATE SET x = x + excluded.x`, so a row the application made meanwhile gets the
//!    drift added; a value refused by the range or a CHECK, evaluated in SQL on the row being
//!    created, is created as 0 and `explain_refused_creates` reports it); `write` adds each drift
//!    to its row as the row is now (`SET x = x + drift WHERE` the new value fits and `checks_pass`:
//!    the server evaluates that on the latest row version), with `update` ledger records from its
//!    `RETURNING`. With `merge` (the runner's second pass over keys the run already changed)
//!    `merge_sql` moves an existing ledger record's `after` instead of adding a record.

use anyhow::Result;
use postgres::types::ToSql;
use serde_json::json;

use super::catalog::column_types;
use super::definition::{Aggregate, CounterSpec, WhenNoSource};
use crate::db::sql_text::{
    all_not_null, between_text_params, column_list, key_match, CheckBody, Ident, KeyRange, Literal,
    SeqRange, TypeName,
};
use crate::error::PgContext;
use crate::store;

pub struct CounterEngine {
    pub spec: CounterSpec,
    key_types: Vec<TypeName>,
    counter_type: TypeName,
    /// Every column of the counter table, for evaluating its checks on proposed values.
    columns: Vec<Ident>,
    /// CHECK expressions on the counter table (NOT VALID ones too: they check updates).
    checks: Vec<(String, CheckBody)>,
}

/// One key of a batch as [`CounterEngine::read_drift`] found it: the counter (None: no row)
/// and the true value, from one snapshot.
#[derive(Debug, Clone)]
pub struct Drift {
    pub key: Vec<String>,
    pub counter: Option<i64>,
    pub truth: i64,
    pub has_source: bool,
}

impl Drift {
    /// A row of (key as text[], counter, true value, has source).
    fn from_row(r: &postgres::Row) -> Drift {
        Drift {
            key: r.get(0),
            counter: r.get(1),
            truth: r.get(2),
            has_source: r.get(3),
        }
    }
}

/// The ledger shapes of a counter run's compact records (written by its batches before the
/// deploy gate, `batch_range`), and the reasons full records give for the same changes.
const SHAPE_CREATED: i16 = 1;
const SHAPE_CORRECTED: i16 = 2;
const SHAPE_ADDED: i16 = 3;
const REASON_CREATED: &str = "the key had no counter row; created with the sum of its source rows";
const REASON_CORRECTED: &str = "counter was %s; the source sums to %s";
const REASON_ADDED: &str = "the key had no counter row when its drift was read; the new application created it since, and the drift %s was added";

/// A value a batch proposes for one key: (key, counter now, true value).
type Proposed = (Vec<String>, i64, i64);

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
            counter_type: TypeName::text(),
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
        // Missing rows are created with `INSERT ... ON CONFLICT (key) DO UPDATE`, which needs
        // the key to be unique.
        let key_names: Vec<&str> = spec.key.iter().map(Ident::as_str).collect();
        let unique: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisunique
                    AND i.indpred IS NULL AND i.indexprs IS NULL
                    AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                          WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x))",
                &[&spec.counter_table.as_str(), &key_names],
            )
            .doing("looking for the counter table's unique key")?
            .get(0);
        if !unique {
            anyhow::bail!(
                "counter_table {} has no unique index or primary key on exactly its key ({}): a counter table holds one row per key. Add one (for example ALTER TABLE {} ADD PRIMARY KEY ({})), or fix key = [...] in the definition; nothing was changed",
                spec.counter_table.as_str(),
                key_names.join(", "),
                spec.counter_table.as_str(),
                key_names.join(", ")
            );
        }
        let columns: Vec<Ident> = client
            .query(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(quote_ident($1))
                    AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&spec.counter_table.as_str()],
            )
            .doing("reading the counter table's columns")?
            .iter()
            .map(|r| Ident::new(r.get::<_, String>(0)))
            .collect();
        let checks = CheckBody::of_table(client, &spec.counter_table)
            .doing("reading the counter table's checks")?;
        Ok(CounterEngine {
            spec: spec.clone(),
            key_types,
            counter_type,
            columns,
            checks,
        })
    }

    /// The shapes of the compact ledger records [`Self::batch_range`] writes: a created row
    /// (every column after), a corrected counter (before and after), and a row the new
    /// application created after the drift was read (the drift added).
    pub fn ledger_shapes(&self) -> Vec<store::runs::LedgerShape> {
        let s = &self.spec;
        let names = |cols: &[Ident]| {
            cols.iter()
                .map(|c| c.as_str().to_string())
                .collect::<Vec<_>>()
        };
        let shape = |shape, action, columns: Vec<String>, reason: &str| store::runs::LedgerShape {
            shape,
            target_table: s.counter_table.as_str().to_string(),
            action,
            key_columns: names(&s.key),
            columns,
            reason: reason.to_string(),
        };
        let counter = names(std::slice::from_ref(&s.counter));
        vec![
            shape(
                SHAPE_CREATED,
                "insert",
                names(&self.columns),
                REASON_CREATED,
            ),
            shape(SHAPE_CORRECTED, "update", counter.clone(), REASON_CORRECTED),
            shape(SHAPE_ADDED, "update", counter, REASON_ADDED),
        ]
    }

    fn keys_text(&self, alias: &str) -> String {
        let parts: Vec<String> = self
            .spec
            .key
            .iter()
            .map(|k| format!("{alias}.{}::text", k))
            .collect();
        format!("ARRAY[{}]", parts.join(", "))
    }

    fn keys_match(&self, a: &str, b: &str) -> String {
        key_match(a, b, &self.spec.key)
    }

    fn cols(&self, alias: &str) -> String {
        column_list(alias, &self.spec.key)
    }

    /// The source's aggregate over the rows joined as `s`: the true value of a key.
    fn aggregate(&self) -> String {
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
    /// table: columns are the key columns (native types), the counter now (NULL: no row)
    /// and the true value. The keys are those of `keys_from` (or of the source) and those
    /// already counted. `counter_exists` is false on a database where the counter table is
    /// still to be created (a dry run).
    fn differing_sql(&self, counter_exists: bool) -> String {
        self.differing_sql_in(counter_exists, KeyRange::ALL)
    }

    /// [`Self::differing_sql`] over the keys whose first column lies in `range`.
    fn differing_sql_in(&self, counter_exists: bool, range: KeyRange) -> String {
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
    pub fn freeze_sql(&self) -> String {
        format!(
            "{targets_insert}
             SELECT $1, row_number() OVER (ORDER BY {dk}), {dt} FROM ({differing}) d",
            targets_insert = store::targets_insert(),
            dk = self.cols("d"),
            dt = self.keys_text("d"),
            differing = self.differing_sql(true),
        )
    }

    /// The frozen targets of a run before the deploy gate: ranges of about
    /// `store::runs::ROWS_PER_RANGE` rows of the key's first column (over the key set's rows
    /// and the counter table's, each read as `sample` says; see
    /// `store::runs::range_targets_sql`). Cheaper than freezing every key that differs, which
    /// sums the whole source once more; a batch then reads the drift of every key in its
    /// ranges ([`Self::batch_range`]).
    pub fn freeze_ranges_sql(&self, sample: store::runs::RangeSample) -> String {
        let s = &self.spec;
        let first = &s.key[0];
        store::runs::range_targets_sql(
            &format!(
                "SELECT s.{first} AS k FROM {table} s {sampled} WHERE s.{first} IS NOT NULL
                 UNION ALL SELECT c.{first} FROM {counter} c {sampled}",
                table = self.range_table(),
                counter = &s.counter_table,
                sampled = sample.clause(),
            ),
            sample,
        )
    }

    /// The table whose rows size a run's ranges: the key set's.
    pub fn range_table(&self) -> &Ident {
        let s = &self.spec;
        if s.keys_from.as_str() == "source" {
            &s.source_table
        } else {
            &s.keys_from
        }
    }

    /// One batch of a run in ranges (the first pass, before the deploy gate, where nearly
    /// every key differs): the keys whose first column is after `after` (from the first when
    /// None) and up to `up_to` (to the last when None), read and written by ONE statement on
    /// the server, so no key travels to pgmend and back. The statement reads each key's drift
    /// (true value minus counter, `differing_sql_in`) in its snapshot, then adds it to the
    /// counter row as the row is when the statement writes it, as [`Self::batch`] does with
    /// a drift read beforehand: a writer that changes counter and source together while it
    /// runs moves both sides alike (the update re-reads a row changed since the snapshot;
    /// a row created since gets the drift added). Every sum is finished before the first row
    /// is written, so no counter row is held while a range is summed: the window aggregate
    /// over the whole drift (`count(*) OVER ()`) emits nothing until its input has ended.
    /// The keys not written (a value that does not fit or that a CHECK refuses) come back,
    /// with their values, and are reported as [`Self::batch`] reports them.
    pub fn batch_range(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        after: Option<&str>,
        up_to: Option<&str>,
    ) -> Result<BatchResult, postgres::Error> {
        let s = &self.spec;
        let (range, values) = KeyRange::bind(after, up_to, 2);
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
        let sql = |upsert: bool| {
            format!(
            "WITH d AS MATERIALIZED (SELECT x.*, count(*) OVER () AS whole FROM ({differing}) x),
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
            differing = self.differing_sql_in(true, range),
            write = self.write_ctes(&updates, false, true),
            create = self.create_ctes(&creates, false, true, upsert),
            ut = (0..s.key.len())
                .map(|i| format!("u.k{i}::text"))
                .collect::<Vec<_>>()
                .join(", "),
            okt = self.keys_text_list("ok"),
        )
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run_id];
        params.extend(values.iter().map(|v| v as &(dyn ToSql + Sync)));
        // The keys the batch creates had no counter row in its snapshot, so it inserts them
        // plainly: an `ON CONFLICT` insert costs about a third more (scripts/profile-counters.sh,
        // M5 against M4). A row another session created since (the new application deployed
        // early) fails the plain insert; the batch then runs again, from a savepoint, in
        // READ COMMITTED's next snapshot, merging through `ON CONFLICT` as before.
        let mut plain = tx.savepoint("plain_insert")?;
        let row = match plain.query_one(&sql(false), &params) {
            Ok(row) => {
                plain.commit()?;
                row
            }
            Err(e) if e.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION) => {
                plain.rollback()?;
                tx.query_one(&sql(true), &params)?
            }
            Err(e) => return Err(e),
        };
        let split = |k: &String| -> Vec<String> { k.split('\u{1f}').map(str::to_string).collect() };
        let list =
            |i: usize| -> Vec<String> { row.get::<_, Option<Vec<String>>>(i).unwrap_or_default() };
        let numbers =
            |i: usize| -> Vec<i64> { row.get::<_, Option<Vec<i64>>>(i).unwrap_or_default() };
        let mut result = BatchResult {
            changed: row.get(0),
            skipped: Vec::new(),
        };
        let missed: Vec<Proposed> = list(1)
            .iter()
            .map(split)
            .zip(numbers(2))
            .zip(numbers(3))
            .map(|((k, now), truth)| (k, now, truth))
            .collect();
        self.explain_missed_updates(tx, missed, &mut result.skipped)?;
        let creates: Vec<Proposed> = list(4)
            .iter()
            .map(split)
            .zip(numbers(5))
            .map(|(k, truth)| (k, 0, truth))
            .collect();
        if !creates.is_empty() {
            let refused: Vec<Vec<String>> = creates.iter().map(|c| c.0.clone()).collect();
            self.explain_refused_creates(tx, &creates, &refused, &mut result.skipped)?;
        }
        Ok(result)
    }

    /// Updates a range batch did not write, each with the reason [`Self::batch`] would give:
    /// the true value does not fit the column, a CHECK refuses it on the row as it is, or
    /// (neither now) the row as it was when the batch wrote refused it.
    fn explain_missed_updates(
        &self,
        tx: &mut postgres::Transaction<'_>,
        missed: Vec<Proposed>,
        skipped: &mut Vec<serde_json::Value>,
    ) -> Result<(), postgres::Error> {
        let (min, max) = self.range();
        let (fits, too_big): (Vec<_>, Vec<_>) =
            missed.into_iter().partition(|u| u.2 >= min && u.2 <= max);
        for u in &too_big {
            skipped.push(json!({
                "key": u.0, "counter": u.1, "true_value": u.2, "reason": self.does_not_fit(u.2)
            }));
        }
        let fits = if fits.is_empty() || self.checks.is_empty() {
            fits
        } else {
            self.drop_rejected_by_checks(tx, fits, skipped)?
        };
        for u in fits {
            skipped.push(json!({
                "key": u.0, "counter": u.1, "true_value": u.2,
                "reason": "when the batch wrote, the corrected value would not fit the column or pass a CHECK of the counter table"
            }));
        }
        Ok(())
    }

    fn batch_keys(&self) -> String {
        store::runs::frozen_keys_sql(
            &self.spec.key,
            &self.key_types,
            SeqRange::Between { lo: 2, hi: 3 },
        )
    }

    /// Whether `alias`'s leading key column lies between a batch's first and last key ($4
    /// and $5, as text). The frozen keys are in key order, so the source rows of a batch
    /// are one index range scan where the source is indexed on that column, rather than a
    /// lookup per key or a scan of the whole source; the counter table is read this way
    /// too, or the planner hashes all of it for every batch (it cannot estimate the frozen
    /// keys' join) and batches slow down as it grows.
    fn in_batch_range(&self, alias: &str) -> String {
        between_text_params(&self.spec.key[0].of(alias), 4, 5, &self.key_types[0])
    }

    /// The values the counter column can hold.
    fn range(&self) -> (i64, i64) {
        match self.counter_type.as_str() {
            "smallint" => (i64::from(i16::MIN), i64::from(i16::MAX)),
            "integer" => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => (i64::MIN, i64::MAX),
        }
    }

    /// What a batch's keys differ by, read in ONE statement and outside the batch's write
    /// transaction, without locking anything: each key's counter now (None: no row), its
    /// true value and whether any source row has it. Every writer that keeps the counter and
    /// the source in step (the new application: one transaction changes both) moves both
    /// sides of `truth - counter` alike, so that difference, read from one snapshot, stays
    /// right while they write; [`Self::batch`] then adds it to the counter as it is when the
    /// batch writes. The sum of a hot campaign's coupons takes as long as it takes, and holds
    /// no row lock meanwhile.
    pub fn read_drift(
        &self,
        client: &mut impl postgres::GenericClient,
        run_id: i64,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<Drift>, postgres::Error> {
        let s = &self.spec;
        let first = &s.key[0];
        let row = client.query_one(
            &format!(
                "SELECT min(g.{first})::text, max(g.{first})::text FROM ({}) g",
                self.batch_keys()
            ),
            &[&run_id, &lo, &hi],
        )?;
        let (min_key, max_key): (Option<String>, Option<String>) = (row.get(0), row.get(1));
        let g_cols = self.cols("g");
        let sql = format!(
            "WITH g AS MATERIALIZED ({keys}),
                  t AS (SELECT {g_cols}, {agg} AS truth, count(s.{first}) > 0 AS has_source
                          FROM g LEFT JOIN {source} s ON {sm} AND {srange}
                         GROUP BY {g_cols})
             SELECT {gk}, c.{cn}::bigint, t.truth, t.has_source
               FROM g JOIN t ON {tm}
               LEFT JOIN {counter} c ON {cm} AND {crange}",
            keys = self.batch_keys(),
            agg = self.aggregate(),
            source = &s.source_table,
            sm = self.keys_match("s", "g"),
            srange = self.in_batch_range("s"),
            gk = self.keys_text("g"),
            cn = &s.counter,
            tm = self.keys_match("t", "g"),
            counter = &s.counter_table,
            cm = self.keys_match("c", "g"),
            crange = self.in_batch_range("c"),
        );
        Ok(client
            .query(&sql, &[&run_id, &lo, &hi, &min_key, &max_key])?
            .iter()
            .map(Drift::from_row)
            .collect())
    }

    /// One batch's write, in the batch's transaction: each key's counter moves by the drift
    /// [`Self::read_drift`] found (`SET x = x + drift`, on the row as it is now: the row is
    /// held for this statement's microseconds only), a missing row is created with its true
    /// value (or, if the new application created it meanwhile, has the drift added), and the
    /// server checks the new values against the table's CHECKs (NOT VALID ones included). A
    /// value that would not fit or pass a CHECK is not written and is reported. With `merge`
    /// (a second pass over keys this run already changed), a key's existing ledger record
    /// takes the new value, so that a run keeps one record per row.
    pub fn batch(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        drift: &[Drift],
        merge: bool,
    ) -> Result<BatchResult, postgres::Error> {
        let mut result = BatchResult::default();
        let (mut updates, creates) = self.classify(drift, &mut result.skipped);
        if !updates.is_empty() && !self.checks.is_empty() {
            updates = self.drop_rejected_by_checks(tx, updates, &mut result.skipped)?;
        }
        if !creates.is_empty() {
            let (changed, refused) = self.create(tx, run_id, &creates, merge)?;
            result.changed += changed;
            if !refused.is_empty() {
                self.explain_refused_creates(tx, &creates, &refused, &mut result.skipped)?;
            }
        }
        if !updates.is_empty() {
            let (changed, missed) = self.write(tx, run_id, &updates, merge)?;
            result.changed += changed;
            for u in updates.iter().filter(|u| missed.contains(&u.0)) {
                result.skipped.push(json!({
                    "key": u.0, "counter": u.1, "true_value": u.2,
                    "reason": "when the batch wrote, the corrected value would not fit the column or pass a CHECK of the counter table"
                }));
            }
        }
        Ok(result)
    }

    /// The rules, before any statement: which keys get their counter row updated and which
    /// get one created, as (key, counter now, true value); a true value that does not fit the
    /// column is skipped and reported.
    fn classify(
        &self,
        drift: &[Drift],
        skipped: &mut Vec<serde_json::Value>,
    ) -> (Vec<Proposed>, Vec<Proposed>) {
        let s = &self.spec;
        let (min, max) = self.range();
        let mut updates: Vec<Proposed> = Vec::new();
        let mut creates: Vec<Proposed> = Vec::new();
        for d in drift {
            match d.counter {
                None if s.when_no_source == WhenNoSource::Zero => {
                    creates.push((d.key.clone(), 0, d.truth));
                }
                None => {}
                Some(_) if !d.has_source && s.when_no_source == WhenNoSource::Keep => {}
                Some(now) if now == d.truth => {}
                Some(now) if d.truth < min || d.truth > max => {
                    skipped.push(json!({
                        "key": d.key, "counter": now, "true_value": d.truth,
                        "reason": self.does_not_fit(d.truth)
                    }));
                }
                Some(now) => updates.push((d.key.clone(), now, d.truth)),
            }
        }
        (updates, creates)
    }

    /// Why a true value was not written: it does not fit the counter column.
    fn does_not_fit(&self, truth: i64) -> String {
        format!(
            "the true value {} does not fit {}.{} ({})",
            truth,
            self.spec.counter_table.as_str(),
            self.spec.counter.as_str(),
            self.counter_type
        )
    }

    /// The updates a CHECK of the counter table would refuse are skipped and reported; the
    /// others are returned.
    fn drop_rejected_by_checks(
        &self,
        tx: &mut postgres::Transaction<'_>,
        updates: Vec<(Vec<String>, i64, i64)>,
        skipped: &mut Vec<serde_json::Value>,
    ) -> Result<Vec<(Vec<String>, i64, i64)>, postgres::Error> {
        let rejected = self.rejected_by_checks(tx, &updates)?;
        let mut kept = Vec::new();
        for (i, u) in updates.into_iter().enumerate() {
            match rejected.iter().find(|(idx, _)| *idx == i as i64) {
                Some((_, names)) => skipped.push(json!({
                    "key": u.0, "counter": u.1, "true_value": u.2,
                    "reason": format!("writing it would break {names}")
                })),
                None => kept.push(u),
            }
        }
        Ok(kept)
    }

    /// Rows created as 0 because their true value would not fit or pass a CHECK: say why
    /// for each.
    fn explain_refused_creates(
        &self,
        tx: &mut postgres::Transaction<'_>,
        creates: &[(Vec<String>, i64, i64)],
        refused: &[Vec<String>],
        skipped: &mut Vec<serde_json::Value>,
    ) -> Result<(), postgres::Error> {
        let (min, max) = self.range();
        let (fits, too_big): (Vec<_>, Vec<_>) = creates
            .iter()
            .filter(|c| refused.contains(&c.0))
            .map(|c| (c.0.clone(), 0, c.2))
            .partition(|c| c.2 >= min && c.2 <= max);
        let reasons = if self.checks.is_empty() || fits.is_empty() {
            Vec::new()
        } else {
            self.rejected_by_checks(tx, &fits)?
        };
        for (i, u) in fits.iter().chain(&too_big).enumerate() {
            let reason = match reasons.iter().find(|(idx, _)| *idx == i as i64) {
                Some((_, names)) => format!("writing it would break {names}"),
                None => self.does_not_fit(u.2),
            };
            skipped.push(json!({
                "key": u.0, "counter": 0, "true_value": u.2, "reason": reason
            }));
        }
        Ok(())
    }

    /// The `SELECT` of a counter-table row with `value` (SQL) in the counter column and the
    /// other columns from `alias`: for evaluating the table's CHECKs on a proposed value.
    fn checks_pass(&self, alias: &str, value: &str) -> String {
        if self.checks.is_empty() {
            return "true".into();
        }
        let row_cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if *c == self.spec.counter {
                    self.fitted(value)
                } else {
                    format!("{alias}.{c}", c = c)
                }
            })
            .collect();
        self.no_check_fails(&row_cols)
    }

    /// `value` as the counter column (NULL, not an error, where it does not fit: the range
    /// test beside the checks refuses it).
    fn fitted(&self, value: &str) -> String {
        let (min, max) = self.range();
        format!(
            "(CASE WHEN ({value}) BETWEEN {min} AND {max} THEN ({value}) END)::{} AS {}",
            self.counter_type, &self.spec.counter
        )
    }

    /// True when no CHECK of the counter table is false on the row `columns` make.
    fn no_check_fails(&self, columns: &[String]) -> String {
        let tests = self
            .checks
            .iter()
            .map(|(_, e)| format!("({e}) IS FALSE"))
            .collect::<Vec<_>>()
            .join(" OR ");
        format!(
            "NOT EXISTS (SELECT 1 FROM (SELECT {}) r WHERE {tests})",
            columns.join(", ")
        )
    }

    /// The table's CHECKs on a row about to be created from CTE `w`: its key, the columns
    /// `copy_on_create` fills and the counter (`w.value`); other columns take no part.
    fn checks_pass_on_create(&self) -> String {
        if self.checks.is_empty() {
            return "true".into();
        }
        let s = &self.spec;
        let row: Vec<String> = s
            .key
            .iter()
            .chain(s.copy_on_create.keys())
            .map(|c| format!("w.{c}", c = c))
            .chain(std::iter::once(self.fitted("w.value")))
            .collect();
        self.no_check_fails(&row)
    }

    /// Creates missing counter rows with their true value (0 where it would not fit or pass a
    /// CHECK), copying `copy_on_create` from `keys_from`. A row the new application created
    /// since the drift was read gets the drift added instead. Returns how many rows changed
    /// and the keys created as 0.
    fn create(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        creates: &[(Vec<String>, i64, i64)],
        merge: bool,
    ) -> Result<(i64, Vec<Vec<String>>), postgres::Error> {
        let s = &self.spec;
        let (unnest, cols, befores, afters) = self.unnest(creates, 2);
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
            ctes = self.create_ctes(&format!("SELECT {u_keys}, u.after AS value FROM {unnest}"), merge, false, true),
            okt = self.keys_text_list("ok"),
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run_id];
        params.extend(cols.iter().map(|c| c as &(dyn ToSql + Sync)));
        params.push(&befores);
        params.push(&afters);
        let row = tx.query_one(&sql, &params)?;
        let refused: Vec<String> = row.get(1);
        Ok((
            row.get(0),
            refused
                .iter()
                .map(|k| k.split('\u{1f}').map(str::to_string).collect())
                .collect(),
        ))
    }

    /// The CTEs that create missing counter rows (see [`Self::create`]) from `input`, a
    /// `SELECT` of the key columns (native types, named as the key) and `value`, the true
    /// value; `$1` is the run. They end in `ok` (every proposed row, `ok.ok` false where the
    /// value would not fit or pass a CHECK and 0 was created instead), `ins` and `l2` (the
    /// rows written: `created`, or `added` to a row the application made meanwhile) and
    /// `cledger` (their ledger records).
    /// With `upsert`, a key that has a counter row by the time the row is inserted (created
    /// by another session since the snapshot) gets its value added to that row; without, such
    /// a key fails the statement with a unique violation.
    fn create_ctes(&self, input: &str, merge: bool, compact: bool, upsert: bool) -> String {
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
        let merged = self.merge_sql(merge, "l2");
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
                    SELECT $1, CASE WHEN l2.created THEN {created} ELSE {added} END, l2.row_key,
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
                    SELECT $1, {tl}, l2.row_key,
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

    /// `alias`'s key columns as text, comma-separated (for `ARRAY[...]`).
    fn keys_text_list(&self, alias: &str) -> String {
        self.spec
            .key
            .iter()
            .map(|k| format!("{alias}.{k}::text"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// With `merge`: a CTE `merged` that gives an existing ledger record of this run for the
    /// same row (from an earlier pass) the new `after`, keeping its `before`.
    fn merge_sql(&self, merge: bool, from: &str) -> String {
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
                     WHERE l.run_id = $1 AND l.target_table = {tl} AND l.row_key = m.row_key
                    RETURNING l.row_key)",
            ledger = store::ledger_full(),
            cl = self.spec.counter.literal(),
            tl = self.spec.counter_table.literal(),
        )
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
            .map(|(i, (k, ty))| format!("c.{} = u.k{i}::{ty}", k))
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
                    format!("u.after::{} AS {}", self.counter_type, c)
                } else {
                    format!("c.{}", c)
                }
            })
            .collect();
        let tests: Vec<String> = self
            .checks
            .iter()
            .map(|(name, expr)| format!("CASE WHEN EXISTS (SELECT 1 FROM (SELECT {}) x WHERE ({expr}) IS FALSE) THEN {} END", row_cols.join(", "), Literal::new(name)))
            .collect();
        let sql = format!(
            "SELECT u.i - 1, concat_ws(', ', {}) FROM {unnest} JOIN {} c ON {} WHERE concat_ws(', ', {}) <> ''",
            tests.join(", "),
            &self.spec.counter_table,
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

    /// Adds each key's drift (after - before, as read) to its counter row as the row is now,
    /// where the result still fits and passes the table's CHECKs, and writes the ledger
    /// records (before and after as written). Returns how many rows changed and the keys
    /// that were not written.
    fn write(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        updates: &[(Vec<String>, i64, i64)],
        merge: bool,
    ) -> Result<(i64, Vec<Vec<String>>), postgres::Error> {
        let (unnest, cols, befores, afters) = self.unnest(updates, 2);
        let sql = format!(
            "WITH {ctes}
             SELECT (SELECT count(*) FROM upd),
                    coalesce((SELECT array_agg(u.i) FROM u WHERE u.i NOT IN (SELECT i FROM upd)), '{{}}')",
            ctes = self.write_ctes(&format!("SELECT * FROM {unnest}"), merge, false),
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run_id];
        params.extend(cols.iter().map(|c| c as &(dyn ToSql + Sync)));
        params.push(&befores);
        params.push(&afters);
        let row = tx.query_one(&sql, &params)?;
        let missed: Vec<i64> = row.get(1);
        Ok((
            row.get(0),
            missed
                .iter()
                .map(|i| updates[(*i - 1) as usize].0.clone())
                .collect(),
        ))
    }

    /// The CTEs that add each key's drift to its counter row (see [`Self::write`]) from
    /// `input`, a `SELECT` of `k0`, `k1`, ... (the key columns, as text or native), `before`
    /// (the counter as read), `after` (the true value as read) and `i` (a number per row);
    /// `$1` is the run. They end in `u` (every proposed update), `upd` (the rows written,
    /// with `i`) and `wledger` (their ledger records).
    fn write_ctes(&self, input: &str, merge: bool, compact: bool) -> String {
        let s = &self.spec;
        let typed = |i: usize, ty: &TypeName| format!("u.k{i}::{ty}");
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
                "{} SELECT $1, {SHAPE_CORRECTED}, u.row_key, jsonb_build_array(u.before), jsonb_build_array(u.after),
                           jsonb_build_array(u.before, u.after)",
                store::ledger_compact_insert()
            )
        } else {
            format!(
                "{} SELECT $1, {}, u.row_key, 'update',
                      jsonb_build_object({cl}, u.before), jsonb_build_object({cl}, u.after),
                      format('{REASON_CORRECTED}', u.before, u.after)",
                store::ledger_insert(),
                s.counter_table.literal(),
                cl = s.counter.literal(),
            )
        };
        let (min, max) = self.range();
        let cn = &s.counter;
        let merged = self.merge_sql(merge, "upd");
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

    /// Up to `limit` keys whose counter differs from the source now, in key order (one
    /// statement, one snapshot).
    pub fn differing_keys(
        &self,
        client: &mut impl postgres::GenericClient,
        limit: i64,
    ) -> Result<Vec<Vec<String>>, postgres::Error> {
        Ok(client
            .query(
                &format!(
                    "SELECT {dt} FROM ({differing}) d ORDER BY {dk} LIMIT $1",
                    dt = self.keys_text("d"),
                    dk = self.cols("d"),
                    differing = self.differing_sql(true),
                ),
                &[&limit],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// After a run: how many keys' counters differ from the source now (the invariant, over
    /// every key; writes by an application that does not maintain the counter yet show here).
    pub fn drift_sql(&self) -> String {
        format!("SELECT count(*) FROM ({}) d", self.differing_sql(true))
    }
}
