//! The rebuild-counter engine. Exact under concurrent writers in READ COMMITTED: a batch reads
//! each key's drift (true value minus counter) in one snapshot without locking anything, then
//! adds that drift to the counter row as it is when the batch writes (`SET x = x + drift`). A
//! writer that changes a counter and its source together moves both sides of the drift alike, so
//! it stays right; a single `UPDATE ... SET x = (SELECT sum ...)` takes its snapshot before it
//! waits for the row, and writes a stale sum.
//!
//! Before the deploy gate a run walks ranges of the key's first column (nearly every key
//! differs: the first pass fills the counter tables), each batch one statement on the server
//! that reads its range's drift and writes it, with compact ledger records
//! ([`CounterEngine::ledger_shapes`]). After the gate a run walks the keys that differ, frozen in
//! key order: it reads their drift outside the batch transaction, then writes it inside, with
//! full ledger records (merged into on a second pass).
//!
//! The parts, each with its own `//!` docs:
//! - `prepare.rs`: what the engine reads from the catalog (types, columns, CHECKs, the unique key).
//! - `differing.rs`: which keys differ (the freeze, the preview, the reconciliation's count, the
//!   drift a batch reads), as statements.
//! - `checks.rs`: whether a value fits the counter column and passes the table's CHECKs, as SQL.
//! - `writes.rs`: the statements that write a batch (update, create, ledger, a range's batch).
//! - `batch.rs`: running them: a batch, its rules, and the reasons for the keys it skipped.
//!
//! Every statement builder is a pure function of the engine's data that returns the SQL text with
//! the values it binds ([`crate::db::sql_text::BoundSql`]); the functions that run them are in
//! `batch.rs`.

mod batch;
mod checks;
mod differing;
mod prepare;
mod writes;

use super::definition::CounterSpec;
use crate::db::sql_text::{column_list, key_match, Binds, CheckBody, Ident, TypeName};
use crate::store::{self, Skipped};

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

/// A value a batch proposes for one key: the counter as read (0 for a row to create) and the
/// true value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposed {
    pub key: Vec<String>,
    pub counter: i64,
    pub truth: i64,
}

impl Proposed {
    /// This key, not written, and why.
    fn skipped(&self, reason: impl Into<String>) -> Skipped {
        Skipped {
            counter: self.counter,
            key: self.key.clone(),
            reason: reason.into(),
            true_value: self.truth,
        }
    }
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct BatchResult {
    pub changed: i64,
    pub skipped: Vec<Skipped>,
}

/// The ledger shapes of a counter run's compact records (written by its batches before the
/// deploy gate, `batch_range`), and the reasons full records give for the same changes.
const SHAPE_CREATED: i16 = 1;
const SHAPE_CORRECTED: i16 = 2;
const SHAPE_ADDED: i16 = 3;
const REASON_CREATED: &str = "the key had no counter row; created with the sum of its source rows";
const REASON_CORRECTED: &str = "counter was %s; the source sums to %s";
const REASON_ADDED: &str = "the key had no counter row when its drift was read; the new application created it since, and the drift %s was added";

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

    /// The table whose rows size a run's ranges: the key set's.
    pub fn range_table(&self) -> &Ident {
        let s = &self.spec;
        if s.keys_from.as_str() == "source" {
            &s.source_table
        } else {
            &s.keys_from
        }
    }

    /// `ARRAY[alias."k0"::text, ...]`: a key as text[].
    fn keys_text(&self, alias: &str) -> String {
        format!("ARRAY[{}]", self.keys_text_list(alias))
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

    /// `unnest(...) WITH ORDINALITY AS u(k0, k1, ..., before, after, i)`: `rows` as a
    /// relation, one text[] per key column, then the counters and true values as bigint[],
    /// their values pushed to `binds`.
    fn unnest(&self, rows: &[Proposed], binds: &mut Binds) -> String {
        let n = self.spec.key.len();
        let mut keys: Vec<Vec<String>> = vec![Vec::new(); n];
        for row in rows {
            for (i, part) in row.key.iter().enumerate() {
                keys[i].push(part.clone());
            }
        }
        let keys: Vec<String> = keys
            .into_iter()
            .map(|k| format!("{}::text[]", binds.push(k)))
            .collect();
        let before = binds.push(rows.iter().map(|r| r.counter).collect::<Vec<i64>>());
        let after = binds.push(rows.iter().map(|r| r.truth).collect::<Vec<i64>>());
        let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        format!(
            "unnest({}, {before}::bigint[], {after}::bigint[]) WITH ORDINALITY AS u({}, before, after, i)",
            keys.join(", "),
            names.join(", ")
        )
    }

    /// The counter row `c` of the unnested row `u`: `c."k" = u.k0::type AND ...`.
    fn u_match(&self) -> String {
        self.spec
            .key
            .iter()
            .zip(&self.key_types)
            .enumerate()
            .map(|(i, (k, ty))| format!("c.{k} = u.k{i}::{ty}"))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    fn keys_match(&self, a: &str, b: &str) -> String {
        key_match(a, b, &self.spec.key)
    }

    fn cols(&self, alias: &str) -> String {
        column_list(alias, &self.spec.key)
    }
}

/// Engines as `prepare` would make them against the demo's schema, for the builders' tests.
#[cfg(test)]
mod fixtures {
    use super::{CounterEngine, Proposed};
    use crate::db::sql_text::{CheckBody, Ident, TypeName};
    use crate::repair::definition::CounterSpec;

    fn spec(toml_text: &str) -> CounterSpec {
        toml::from_str(toml_text).expect("a counter definition")
    }

    /// A value proposed for `key`: the counter as read and the true value.
    pub fn proposed(key: &[&str], counter: i64, truth: i64) -> Proposed {
        Proposed {
            key: key.iter().map(|k| k.to_string()).collect(),
            counter,
            truth,
        }
    }

    /// `sql` with every run of white space one space: the builders indent their text.
    pub fn flat(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// `campaign_budgets`: one key column, keys from `campaigns`, two columns copied on
    /// create, a CHECK (NOT VALID) on the budget.
    pub fn budgets() -> CounterEngine {
        CounterEngine {
            spec: spec(include_str!(
                "../../../repairs/rebuild-campaign-budgets.toml"
            )),
            key_types: vec![TypeName::for_tests("text")],
            counter_type: TypeName::for_tests("integer"),
            columns: ["campaign_id", "discount_yen", "budget_yen", "issued_yen"]
                .into_iter()
                .map(Ident::new)
                .collect(),
            checks: vec![(
                "issued_within_budget".into(),
                CheckBody::for_tests(
                    "CHECK (((issued_yen >= 0) AND (issued_yen <= budget_yen))) NOT VALID",
                ),
            )],
        }
    }

    /// `member_monthly_usage`: two key columns (the month a date here, to tell the two casts
    /// apart), keys from the source, an integer counter with a CHECK.
    pub fn monthly() -> CounterEngine {
        CounterEngine {
            spec: spec(include_str!(
                "../../../repairs/rebuild-member-monthly-usage.toml"
            )),
            key_types: vec![TypeName::for_tests("text"), TypeName::for_tests("date")],
            counter_type: TypeName::for_tests("integer"),
            columns: ["member_id", "month", "used_yen"]
                .into_iter()
                .map(Ident::new)
                .collect(),
            checks: vec![(
                "member_monthly_usage_used_yen_check".into(),
                CheckBody::for_tests("CHECK ((used_yen >= 0))"),
            )],
        }
    }
}
