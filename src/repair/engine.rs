//! The repair engines behind one face, for the batch path ([`super::batch`]), the runner
//! and the workers: how a run freezes its targets (keys, or ranges of one column's values), what
//! a batch reads before its transaction and what it writes in it, and the compact ledger records
//! it leaves. A new repair kind is one more variant here and one module of SQL builders beside
//! `void` and `counter`.

use anyhow::Result;

use super::backfill::BackfillEngine;
use super::counter::{BatchResult, CounterEngine, Drift};
use super::definition::{Repair, Spec};
use super::orphans::OrphansEngine;
use super::void::VoidEngine;
use crate::db::sql_text::Ident;
use crate::store;
use crate::store::runs::RangeSample;

pub enum Engine {
    Void(VoidEngine),
    Counter(CounterEngine),
    Backfill(BackfillEngine),
    Orphans(OrphansEngine),
}

impl Engine {
    pub fn prepare(client: &mut impl postgres::GenericClient, repair: &Repair) -> Result<Engine> {
        Ok(match &repair.spec {
            Spec::VoidDuplicates(v) => Engine::Void(VoidEngine::prepare(client, v)?),
            Spec::RebuildCounter(c) => Engine::Counter(CounterEngine::prepare(client, c)?),
            Spec::Backfill(b) => Engine::Backfill(BackfillEngine::prepare(client, b)?),
            Spec::Orphans(o) => Engine::Orphans(OrphansEngine::prepare(client, o)?),
        })
    }

    /// The shapes of the compact ledger records the engine's batches write.
    pub(super) fn ledger_shapes(&self) -> Vec<store::runs::LedgerShape> {
        match self {
            Engine::Void(e) => e.ledger_shapes(),
            Engine::Counter(e) => e.ledger_shapes(),
            Engine::Backfill(e) => e.ledger_shapes(),
            Engine::Orphans(e) => e.ledger_shapes(),
        }
    }

    /// Whether a new run walks ranges of keys rather than frozen keys: a counter run before
    /// the gate (nearly every key differs), a void run where an index covers its groups, every
    /// backfill and orphans run (ranges of the row key).
    pub(super) fn freezes_ranges(&self, after_gate: bool) -> bool {
        match self {
            Engine::Void(e) => e.range_by.is_some(),
            Engine::Counter(_) => !after_gate,
            Engine::Backfill(_) | Engine::Orphans(_) => true,
        }
    }

    /// The column a run in ranges cuts its ranges of.
    pub(super) fn range_column(&self) -> Option<&Ident> {
        match self {
            Engine::Void(e) => e.range_by.as_ref().map(|(column, _)| column),
            Engine::Counter(e) => e.spec.key.first(),
            Engine::Backfill(e) => Some(&e.spec.row_key),
            Engine::Orphans(e) => Some(&e.spec.row_key),
        }
    }

    /// The table whose rows a run in ranges is cut by.
    pub(super) fn range_table(&self) -> &Ident {
        match self {
            Engine::Void(e) => e.range_table(),
            Engine::Counter(e) => e.range_table(),
            Engine::Backfill(e) => &e.spec.table,
            Engine::Orphans(e) => &e.spec.table,
        }
    }

    /// The freeze: of ranges, read as `sample` says (`Some` for a run in ranges), or of every
    /// group or key.
    pub(super) fn freeze_sql(&self, sample: Option<RangeSample>) -> String {
        match (self, sample) {
            (Engine::Void(e), Some(sample)) => e.freeze_ranges_sql(sample),
            (Engine::Void(e), None) => e.freeze_sql(),
            (Engine::Counter(e), Some(sample)) => e.freeze_ranges_sql(sample),
            (Engine::Counter(e), None) => e.freeze_sql(),
            (Engine::Backfill(e), sample) => {
                e.freeze_ranges_sql(sample.unwrap_or(RangeSample::All))
            }
            (Engine::Orphans(e), sample) => e.freeze_ranges_sql(sample.unwrap_or(RangeSample::All)),
        }
    }

    /// What the run creates before it freezes its targets, in the same transaction: an orphans
    /// quarantine's table.
    pub(super) fn before_freeze_sql(&self) -> Option<String> {
        match self {
            Engine::Orphans(e) => e.create_quarantine_sql(),
            _ => None,
        }
    }

    /// What a batch reads before its transaction: for counters, each key's drift (the sum
    /// of a hot campaign's coupons is read without holding its counter row), over the keys
    /// of targets ($lo, $hi], or over the key ranges they bound.
    pub(super) fn read(
        &self,
        client: &mut postgres::Client,
        run_id: i64,
        (lo, hi): (i64, i64),
        bounds: Option<&Bounds>,
    ) -> Result<Vec<Drift>, postgres::Error> {
        match (self, bounds) {
            // A batch over ranges of keys reads and writes in one statement (`batch_range`).
            (Engine::Void(_) | Engine::Backfill(_) | Engine::Orphans(_), _)
            | (Engine::Counter(_), Some(_)) => Ok(Vec::new()),
            (Engine::Counter(e), None) => e.read_drift(client, run_id, lo, hi),
        }
    }

    pub(super) fn batch(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        (lo, hi): (i64, i64),
        bounds: Option<&Bounds>,
        drift: &[Drift],
        merge: bool,
    ) -> Result<BatchResult, postgres::Error> {
        let changed = match (self, bounds) {
            (Engine::Counter(e), Some((after, up_to))) => {
                return e.batch_range(tx, run_id, after.as_deref(), up_to.as_deref())
            }
            (Engine::Counter(e), None) => return e.batch(tx, run_id, drift, merge),
            (Engine::Void(e), Some((after, up_to))) => {
                let batch = e.range_batch(run_id, after.as_deref(), up_to.as_deref());
                tx.execute(&batch.sql, &batch.binds.params())?
            }
            (Engine::Void(e), None) => {
                let batch = e.batch(run_id, lo, hi);
                tx.execute(&batch.sql, &batch.binds.params())?
            }
            (Engine::Backfill(e), Some((after, up_to))) => {
                let batch = e.range_batch(run_id, after.as_deref(), up_to.as_deref());
                by_key(tx, |tx| tx.execute(&batch.sql, &batch.binds.params()))?
            }
            (Engine::Orphans(e), Some((after, up_to))) => {
                let lock = e.lock_batch(after.as_deref(), up_to.as_deref());
                tx.query_one(&lock.sql, &lock.binds.params())?;
                let batch = e.range_batch(run_id, after.as_deref(), up_to.as_deref());
                by_key(tx, |tx| tx.execute(&batch.sql, &batch.binds.params()))?
            }
            (Engine::Backfill(_) | Engine::Orphans(_), None) => {
                unreachable!("backfill and orphans runs walk ranges of their row key")
            }
        };
        Ok(BatchResult {
            changed: changed as i64,
            skipped: Vec::new(),
        })
    }
}

/// Runs `statement` (a backfill's or orphans' batch, which joins the rows it locked back to the
/// table by `row_key`) with hash and merge joins off, then on again: the planner cannot size a
/// range of a key within one histogram bucket (a uuid's), so at about 10,000 expected rows it
/// hashed the whole table for each batch (914 ms for a batch of 7,906 rows, 149 ms through the
/// key's index: docs/benchmark.md, "The backfill kind against one UPDATE"). The key has a
/// unique (btree) index, which `expression::check` requires, so the lookup is always there.
fn by_key<T>(
    tx: &mut postgres::Transaction<'_>,
    statement: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T, postgres::Error>,
) -> Result<T, postgres::Error> {
    tx.batch_execute("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off")?;
    let out = statement(tx)?;
    tx.batch_execute("RESET enable_hashjoin; RESET enable_mergejoin")?;
    Ok(out)
}

/// The bounds of a batch of a run in ranges: after the first (None: from the first value) and
/// up to the second (None: to the last), as text.
pub(super) type Bounds = (Option<String>, Option<String>);
