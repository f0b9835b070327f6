//! Running a counter batch, and the rules that decide what it writes and what it reports.
//!
//! After the gate a batch is two parts:
//!
//! 1. `read_drift`, one statement outside the batch transaction (the runner calls it first): each
//!    key's counter (None: no row), true value and whether it has source rows. No lock is taken.
//! 2. `batch`, in the batch transaction: `classify` splits the keys into updates and creates (a
//!    true value that does not fit the column is skipped and reported, `does_not_fit`);
//!    `drop_rejected_by_checks` skips the updates a CHECK would refuse (`rejected_by_checks_sql`
//!    names the checks); then the creates and the updates are written (`create_sql`,
//!    `write_sql`), and the keys they did not write are reported.
//!
//! Before the gate `batch_range` runs a range's whole batch as one statement
//! (`batch_range_sql`); the keys it could not write come back and are explained as above. A
//! batch over the whole key set (the campaigns' budgets: a few keys summing every coupon) reads
//! the drift into a temporary table first, which the server may sum in parallel
//! (`crate::db::staged`), and the statement writes from it. After the gate, `freeze` reads the
//! differing keys the same way before it numbers them.

use postgres::error::SqlState;

use super::{BatchResult, CounterEngine, Drift, Proposed};
use crate::repair::definition::WhenNoSource;
use crate::store::Skipped;

/// Why an update that passed the checks beforehand was not written.
const REFUSED_WHEN_WRITTEN: &str = "when the batch wrote, the corrected value would not fit the column or pass a CHECK of the counter table";

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

impl CounterEngine {
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
        let bounds = self.batch_bounds_sql(run_id, lo, hi);
        let row = client.query_one(&bounds.sql, &bounds.binds.params())?;
        let st = self.read_drift_sql(run_id, (lo, hi), (row.get(0), row.get(1)));
        Ok(client
            .query(&st.sql, &st.binds.params())?
            .iter()
            .map(Drift::from_row)
            .collect())
    }

    /// Up to `limit` keys whose counter differs from the source now, in key order (one
    /// statement, one snapshot).
    pub fn differing_keys(
        &self,
        client: &mut impl postgres::GenericClient,
        limit: i64,
    ) -> Result<Vec<Vec<String>>, postgres::Error> {
        let st = self.differing_keys_sql(limit);
        Ok(client
            .query(&st.sql, &st.binds.params())?
            .iter()
            .map(|r| r.get(0))
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
            let st = self.create_sql(run_id, &creates, merge);
            let row = tx.query_one(&st.sql, &st.binds.params())?;
            result.changed += row.get::<_, i64>(0);
            let refused: Vec<Vec<String>> = row
                .get::<_, Vec<String>>(1)
                .iter()
                .map(|k| split_key(k))
                .collect();
            if !refused.is_empty() {
                self.explain_refused_creates(tx, &creates, &refused, &mut result.skipped)?;
            }
        }
        if !updates.is_empty() {
            let st = self.write_sql(run_id, &updates, merge);
            let row = tx.query_one(&st.sql, &st.binds.params())?;
            result.changed += row.get::<_, i64>(0);
            let missed: Vec<i64> = row.get(1);
            for (u, _) in updates
                .iter()
                .zip(1_i64..)
                .filter(|(_, i)| missed.contains(i))
            {
                result.skipped.push(u.skipped(REFUSED_WHEN_WRITTEN));
            }
        }
        Ok(result)
    }

    /// Freezes every key whose counter differs now as run `run_id`'s targets, numbered in key
    /// order (after the gate, on one session); returns how many. With `few_keys` (a key set of
    /// few rows summing its source, the campaigns' budgets) the keys are read apart first
    /// (`crate::db::staged`): the server's parallel workers then sum the source, which no
    /// `INSERT ... SELECT` gets (a key set of many rows gets no parallel plan for its sums).
    pub fn freeze(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        few_keys: bool,
    ) -> Result<i64, postgres::Error> {
        let differing = self.differing_sql(true);
        let staged = if few_keys {
            crate::db::staged::stage(tx, "pgmend_differing", &differing)?
        } else {
            None
        };
        let from = staged
            .map(|table| table.to_string())
            .unwrap_or_else(|| format!("({differing})"));
        Ok(tx.execute(&self.freeze_from_sql(&from), &[&run_id])? as i64)
    }

    /// One batch of a run in ranges (the first pass, before the deploy gate, where nearly
    /// every key differs): the keys whose first column is after `after` (from the first when
    /// None) and up to `up_to` (to the last when None), read and written by ONE statement on
    /// the server (`batch_range_sql`), so no key travels to pgmend and back. The statement
    /// reads each key's drift in its snapshot, then adds it to the counter row as the row is
    /// when the statement writes it, as [`Self::batch`] does with a drift read beforehand: a
    /// writer that changes counter and source together while it runs moves both sides alike
    /// (the update re-reads a row changed since the snapshot; a row created since gets the
    /// drift added). Every sum is finished before the first row is written, so no counter row
    /// is held while a range is summed. The keys not written (a value that does not fit or
    /// that a CHECK refuses) come back, with their values, and are reported as
    /// [`Self::batch`] reports them.
    pub fn batch_range(
        &self,
        tx: &mut postgres::Transaction<'_>,
        run_id: i64,
        after: Option<&str>,
        up_to: Option<&str>,
    ) -> Result<BatchResult, postgres::Error> {
        // The keys the batch creates had no counter row in its snapshot, so it inserts them
        // plainly: an `ON CONFLICT` insert costs about a third more (scripts/profile-counters.sh,
        // M5 against M4). A row another session created since (the new application deployed
        // early) fails the plain insert; the batch then runs again, from a savepoint, in
        // READ COMMITTED's next snapshot, merging through `ON CONFLICT` as before.
        // Over the whole key set no bound is bound, so the drift can be read apart (staged)
        // with the server's parallel workers; the statement then adds what was read.
        let staged = match (after, up_to) {
            (None, None) => {
                crate::db::staged::stage(tx, "pgmend_drift", &self.drift_of_range_sql())?
                    .map(|table| table.to_string())
            }
            _ => None,
        };
        let staged = staged.as_deref();
        let plain_sql = self.batch_range_sql(run_id, after, up_to, false, staged);
        let mut plain = tx.savepoint("plain_insert")?;
        let row = match plain.query_one(&plain_sql.sql, &plain_sql.binds.params()) {
            Ok(row) => {
                plain.commit()?;
                row
            }
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                plain.rollback()?;
                let upsert = self.batch_range_sql(run_id, after, up_to, true, staged);
                tx.query_one(&upsert.sql, &upsert.binds.params())?
            }
            Err(e) => return Err(e),
        };
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
            .zip(numbers(2))
            .zip(numbers(3))
            .map(|((k, counter), truth)| Proposed {
                key: split_key(k),
                counter,
                truth,
            })
            .collect();
        self.explain_missed_updates(tx, missed, &mut result.skipped)?;
        let creates: Vec<Proposed> = list(4)
            .iter()
            .zip(numbers(5))
            .map(|(k, truth)| Proposed {
                key: split_key(k),
                counter: 0,
                truth,
            })
            .collect();
        if !creates.is_empty() {
            let refused: Vec<Vec<String>> = creates.iter().map(|c| c.key.clone()).collect();
            self.explain_refused_creates(tx, &creates, &refused, &mut result.skipped)?;
        }
        Ok(result)
    }

    /// The rules, before any statement: which keys get their counter row updated and which
    /// get one created; a true value that does not fit the column is skipped and reported.
    fn classify(
        &self,
        drift: &[Drift],
        skipped: &mut Vec<Skipped>,
    ) -> (Vec<Proposed>, Vec<Proposed>) {
        let s = &self.spec;
        let (min, max) = self.range();
        let mut updates: Vec<Proposed> = Vec::new();
        let mut creates: Vec<Proposed> = Vec::new();
        let proposed = |d: &Drift, counter| Proposed {
            key: d.key.clone(),
            counter,
            truth: d.truth,
        };
        for d in drift {
            match d.counter {
                None if s.when_no_source == WhenNoSource::Zero => creates.push(proposed(d, 0)),
                None => {}
                Some(_) if !d.has_source && s.when_no_source == WhenNoSource::Keep => {}
                Some(now) if now == d.truth => {}
                Some(now) if d.truth < min || d.truth > max => {
                    skipped.push(proposed(d, now).skipped(self.does_not_fit(d.truth)));
                }
                Some(now) => updates.push(proposed(d, now)),
            }
        }
        (updates, creates)
    }

    /// Which proposed values a CHECK on the counter table would refuse (checked before
    /// writing, so nothing is written for them): (index into `rows`, check names).
    fn rejected_by_checks(
        &self,
        tx: &mut postgres::Transaction<'_>,
        rows: &[Proposed],
    ) -> Result<Vec<(i64, String)>, postgres::Error> {
        let st = self.rejected_by_checks_sql(rows);
        Ok(tx
            .query(&st.sql, &st.binds.params())?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    /// The updates a CHECK of the counter table would refuse are skipped and reported; the
    /// others are returned.
    fn drop_rejected_by_checks(
        &self,
        tx: &mut postgres::Transaction<'_>,
        updates: Vec<Proposed>,
        skipped: &mut Vec<Skipped>,
    ) -> Result<Vec<Proposed>, postgres::Error> {
        let rejected = self.rejected_by_checks(tx, &updates)?;
        let mut kept = Vec::new();
        for (i, u) in updates.into_iter().enumerate() {
            match rejected.iter().find(|(idx, _)| *idx == i as i64) {
                Some((_, names)) => {
                    skipped.push(u.skipped(format!("writing it would break {names}")))
                }
                None => kept.push(u),
            }
        }
        Ok(kept)
    }

    /// Updates a range batch did not write, each with the reason [`Self::batch`] would give:
    /// the true value does not fit the column, a CHECK refuses it on the row as it is, or
    /// (neither now) the row as it was when the batch wrote refused it.
    fn explain_missed_updates(
        &self,
        tx: &mut postgres::Transaction<'_>,
        missed: Vec<Proposed>,
        skipped: &mut Vec<Skipped>,
    ) -> Result<(), postgres::Error> {
        let (min, max) = self.range();
        let (fits, too_big): (Vec<_>, Vec<_>) = missed
            .into_iter()
            .partition(|u| u.truth >= min && u.truth <= max);
        for u in &too_big {
            skipped.push(u.skipped(self.does_not_fit(u.truth)));
        }
        let fits = if fits.is_empty() || self.checks.is_empty() {
            fits
        } else {
            self.drop_rejected_by_checks(tx, fits, skipped)?
        };
        for u in fits {
            skipped.push(u.skipped(REFUSED_WHEN_WRITTEN));
        }
        Ok(())
    }

    /// Rows created as 0 because their true value would not fit or pass a CHECK: say why
    /// for each.
    fn explain_refused_creates(
        &self,
        tx: &mut postgres::Transaction<'_>,
        creates: &[Proposed],
        refused: &[Vec<String>],
        skipped: &mut Vec<Skipped>,
    ) -> Result<(), postgres::Error> {
        let (min, max) = self.range();
        let (fits, too_big): (Vec<_>, Vec<_>) = creates
            .iter()
            .filter(|c| refused.contains(&c.key))
            .map(|c| Proposed {
                counter: 0,
                ..c.clone()
            })
            .partition(|c| c.truth >= min && c.truth <= max);
        let reasons = if self.checks.is_empty() || fits.is_empty() {
            Vec::new()
        } else {
            self.rejected_by_checks(tx, &fits)?
        };
        for (i, u) in fits.iter().chain(&too_big).enumerate() {
            let reason = match reasons.iter().find(|(idx, _)| *idx == i as i64) {
                Some((_, names)) => format!("writing it would break {names}"),
                None => self.does_not_fit(u.truth),
            };
            skipped.push(u.skipped(reason));
        }
        Ok(())
    }
}

/// A key's parts, joined by U+001F in the statements' results.
fn split_key(joined: &str) -> Vec<String> {
    joined.split('\u{1f}').map(str::to_string).collect()
}
