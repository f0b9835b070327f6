//! The after-gate freeze of a counter run, split by ranges across sessions (issue 36). After
//! the deploy gate a counter run freezes every key whose counter differs from its source: one
//! aggregate over the whole source (at 300,000 members, 0.6 s of hashing 1.1 million coupons
//! into 300,000 member-months), which the server runs on one core whatever it has spare
//! (`INSERT ... SELECT` is never parallel, and the planner gives a plain `SELECT` of it no
//! parallel plan either: a partial aggregate of as many groups as rows buys nothing).
//!
//! With several workers (`--jobs N` above 1: N ranges, at most [`MAX_PARTS`]; `auto`: 2, the
//! number its controller starts with) and a key set whose table holds [`SPLIT_FROM_ROWS`] rows or
//! more by its statistics (a smaller one is compared faster than sessions open, and every range
//! reads the whole source for its part), the key's first column is cut into as many ranges of about equal
//! size (`split_points_sql`, on the key set's table, sampled as a range freeze samples it). Each range but the first is listed by a
//! session of its own, opened for it and closed after (`differing_in_range_sql`, in a read-only
//! transaction), to a temporary file of JSON lines, so that memory stays flat however many keys
//! differ; meanwhile the main session freezes the first range in the freeze's own transaction
//! (`freeze_range_sql`, numbered from 1), then appends the other ranges' keys from their files
//! in order, 10,000 a statement, numbered after the last. The targets are in key order as one
//! statement would number them; the run and its targets commit together or not at all.
//!
//! A range whose session fails (it cannot connect, say, or waits past its lock timeout) is
//! frozen by the main session instead, in the same transaction, after a note; the split only
//! ever saves time. A key set whose counter table allows NULL in the key's first column is not
//! split (such a row's key would fall in no range).
//!
//! Each range is read in its own snapshot, a moment apart: a key that starts or stops differing
//! in between is frozen or not as its range saw it. That changes nothing a run promises: a
//! batch reads each frozen key's drift when it corrects it, and a key that differs after the
//! run's freeze is what the reconciliation after the batches is for (it counts every key in one
//! snapshot and passes again over those that differ, as for writes during the run).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Seek, Write};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use postgres::{GenericClient, Transaction};

use super::counter::CounterEngine;
use crate::db::conninfo::ConnParams;
use crate::db::retry::LockPolicy;
use crate::db::sql_text::BoundSql;
use crate::error::PgContext;
use crate::store;
use crate::store::runs::RangeSample;

/// The most ranges one freeze is split into.
pub const MAX_PARTS: usize = 4;
/// The key set's table must hold this many rows by its statistics for the freeze to be split.
const SPLIT_FROM_ROWS: f64 = 10_000.0;
/// Keys appended per statement from a range's file.
const APPEND_CHUNK: usize = 10_000;

/// One range listed by a session of its own: its keys in a file, one JSON array a line.
struct Listed {
    file: File,
    keys: i64,
}

/// A range after the first: its bounds, and its session's listing.
struct Range {
    after: String,
    up_to: Option<String>,
    /// The listing session's backend, once connected (0 before), to cancel it.
    pid: Arc<AtomicI32>,
    listing: Option<JoinHandle<Result<Listed>>>,
    /// Once joined: the file, or why the session failed (the main session lists it then).
    outcome: Option<Result<Listed, String>>,
}

/// The ranges after the first, being listed; dropping it waits for their sessions.
pub struct Split {
    /// The first range's upper bound.
    first_up_to: String,
    ranges: Vec<Range>,
    pub parts: usize,
}

/// Cuts the key set into `parts` ranges and starts listing all but the first, each on a new
/// session; `None` when the freeze is better not split (see the module's docs).
pub fn start(
    client: &mut postgres::Client,
    engine: &CounterEngine,
    parts: usize,
    params: &ConnParams,
    policy: &LockPolicy,
) -> Result<Option<Split>> {
    let table = engine.range_table().to_string();
    let (rows, first_not_null) = key_set(client, engine)?;
    // A small key set (the campaigns' three) is compared in less time than the sessions take to
    // open, and every range reads the whole source for its part.
    if rows < SPLIT_FROM_ROWS || !first_not_null {
        return Ok(None);
    }
    let sample = RangeSample::of(client, &table)?;
    let cut = engine.split_points_sql(parts.min(MAX_PARTS), sample);
    let mut points: Vec<String> = client
        .query_one(&cut.sql, &cut.binds.params())
        .doing("cutting the key set into ranges for the freeze")?
        .get(0);
    points.dedup();
    if points.is_empty() {
        return Ok(None);
    }
    let timeout = policy.statement_timeout;
    let lock_timeout = policy.lock_timeout;
    let ranges = points
        .iter()
        .enumerate()
        .map(|(i, after)| {
            let up_to = points.get(i + 1).cloned();
            let listing = engine.differing_in_range_sql(Some(after), up_to.as_deref());
            let params = params.clone();
            let pid = Arc::new(AtomicI32::new(0));
            let shown = pid.clone();
            Range {
                after: after.clone(),
                up_to,
                pid,
                listing: Some(std::thread::spawn(move || {
                    list(&params, listing, timeout, lock_timeout, &shown)
                })),
                outcome: None,
            }
        })
        .collect();
    Ok(Some(Split {
        parts: points.len() + 1,
        first_up_to: points[0].clone(),
        ranges,
    }))
}

/// The key set's rows by its table's statistics (0 when unknown, -1 when never counted), and
/// whether the counter table's key's first column is NOT NULL.
fn key_set(client: &mut impl GenericClient, engine: &CounterEngine) -> Result<(f64, bool)> {
    let row = client
        .query_one(
            "SELECT coalesce((SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass($1)), 0),
                    coalesce((SELECT attnotnull FROM pg_attribute
                               WHERE attrelid = to_regclass($2) AND attname = $3 AND NOT attisdropped), false)",
            &[
                &engine.range_table().to_string(),
                &engine.spec.counter_table.to_string(),
                &engine.spec.key[0].as_str(),
            ],
        )
        .doing("reading the key set's size for the freeze")?;
    Ok((row.get(0), row.get(1)))
}

/// Whether the key set is one a freeze is not split for by its size (fewer than
/// [`SPLIT_FROM_ROWS`] rows by its statistics, the campaigns' three): its sums are few groups,
/// which the server runs in parallel when the freeze reads them apart
/// (`CounterEngine::freeze`).
pub fn few_keys(client: &mut impl GenericClient, engine: &CounterEngine) -> Result<bool> {
    Ok(key_set(client, engine)?.0 < SPLIT_FROM_ROWS)
}

/// Lists one range's differing keys on a session of its own, into a temporary file.
fn list(
    params: &ConnParams,
    listing: BoundSql,
    timeout: Duration,
    lock_timeout: Duration,
    pid: &AtomicI32,
) -> Result<Listed> {
    // As long as the statement may rightly take, and no longer.
    let _bound = crate::db::deadline::within(timeout + Duration::from_secs(30));
    let mut session = crate::db::connect(params)?;
    let backend: i32 = session
        .client
        .query_one("SELECT pg_backend_pid()", &[])
        .doing("reading the listing session's pid")?
        .get(0);
    pid.store(backend, Ordering::SeqCst);
    let mut tx = session
        .client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a session to list a range of the freeze")?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = '{}ms'; SET LOCAL lock_timeout = '{}ms'",
        timeout.as_millis().max(1),
        lock_timeout.as_millis().max(1)
    ))
    .doing("bounding the listing of a range of the freeze")?;
    tx.batch_execute(crate::db::connect::RAISE_WORK_MEM)
        .doing("raising work_mem to list a range of the freeze")?;
    let mut out = BufWriter::new(
        tempfile::tempfile().context("creating a temporary file for a range of the freeze")?,
    );
    let mut keys = 0;
    let rows = tx
        .query_raw(&listing.sql, listing.binds.params())
        .doing("listing a range of the freeze")?;
    for row in postgres::fallible_iterator::FallibleIterator::iterator(rows) {
        // A key column other than the first may be NULL: JSON null, NULL again when appended.
        let key: Vec<Option<String>> = row.doing("listing a range of the freeze")?.get(0);
        serde_json::to_writer(&mut out, &key)?;
        out.write_all(b"\n")?;
        keys += 1;
    }
    tx.commit()
        .doing("closing the listing of a range of the freeze")?;
    let mut file = out.into_inner().map_err(|e| e.into_error())?;
    file.rewind()?;
    Ok(Listed { file, keys })
}

impl Split {
    /// Freezes the first range in `tx`, then appends the others' keys in order (a range whose
    /// session failed is frozen here instead, after a note); returns how many targets. Run
    /// again after a retried transaction, it reads the same files again.
    pub fn freeze(
        &mut self,
        tx: &mut Transaction<'_>,
        engine: &CounterEngine,
        run_id: i64,
        progress: &mut dyn FnMut(&str),
    ) -> Result<i64> {
        let first = engine.freeze_range_sql(run_id, 0, None, Some(&self.first_up_to));
        let mut targets = tx.execute(&first.sql, &first.binds.params())? as i64;
        self.join();
        for range in &mut self.ranges {
            match range.outcome.as_mut().expect("joined above") {
                Ok(listed) => {
                    listed.file.rewind()?;
                    let mut chunk = Vec::with_capacity(APPEND_CHUNK);
                    for line in BufReader::new(&listed.file).lines() {
                        chunk.push(line?);
                        if chunk.len() == APPEND_CHUNK {
                            targets += append(tx, run_id, targets, &chunk)?;
                            chunk.clear();
                        }
                    }
                    if !chunk.is_empty() {
                        targets += append(tx, run_id, targets, &chunk)?;
                    }
                }
                Err(why) => {
                    progress(&format!(
                        "the session listing the keys after {} failed ({why}); the main session compares that range itself",
                        range.after
                    ));
                    let own = engine.freeze_range_sql(
                        run_id,
                        targets,
                        Some(&range.after),
                        range.up_to.as_deref(),
                    );
                    targets += tx.execute(&own.sql, &own.binds.params())? as i64;
                }
            }
        }
        Ok(targets)
    }

    /// Waits for every listing session and keeps what each left: a session's failure is kept
    /// as words, never as an error the freeze's lock retry would take for its own.
    fn join(&mut self) {
        for range in &mut self.ranges {
            if let Some(handle) = range.listing.take() {
                range.outcome = Some(match handle.join() {
                    Ok(Ok(listed)) => Ok(listed),
                    Ok(Err(e)) => Err(format!("{e:#}")),
                    Err(_) => Err("it panicked".to_string()),
                });
            }
        }
    }

    /// Cancels the listing sessions still at work (the freeze failed), on `client`.
    pub fn cancel(&mut self, client: &mut postgres::Client) {
        for range in &self.ranges {
            let pid = range.pid.load(Ordering::SeqCst);
            if range.listing.is_some() && pid != 0 {
                let _ = client.execute("SELECT pg_cancel_backend($1)", &[&pid]);
            }
        }
        self.join();
    }

    /// Keys the other sessions listed (for the progress line).
    pub fn listed_elsewhere(&self) -> i64 {
        self.ranges
            .iter()
            .filter_map(|r| r.outcome.as_ref()?.as_ref().ok())
            .map(|l| l.keys)
            .sum()
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        // Their sessions end with their read (bounded by the statement timeout), or at once
        // where `cancel` came first.
        self.join();
    }
}

/// Appends keys (JSON arrays of text or null) to the run's targets, numbered after `from`.
fn append(tx: &mut Transaction<'_>, run_id: i64, from: i64, keys: &[String]) -> Result<i64> {
    let json = format!("[{}]", keys.join(","));
    Ok(tx.execute(
        &format!(
            "{} SELECT $1, $2 + k.n, ARRAY(SELECT e.v FROM jsonb_array_elements_text(k.key) WITH ORDINALITY AS e(v, i) ORDER BY e.i)
               FROM jsonb_array_elements($3::text::jsonb) WITH ORDINALITY AS k(key, n)",
            store::targets_insert()
        ),
        &[&run_id, &from, &json],
    )? as i64)
}
