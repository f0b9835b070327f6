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
//! Each range is read in its own snapshot, a moment apart: a key that starts or stops differing
//! in between is frozen or not as its range saw it. That changes nothing a run promises: a
//! batch reads each frozen key's drift when it corrects it, and a key that differs after the
//! run's freeze is what the reconciliation after the batches is for (it counts every key in one
//! snapshot and passes again over those that differ, as for writes during the run).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Seek, Write};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use postgres::Transaction;

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

/// The ranges after the first, being listed; dropping it waits for their sessions.
pub struct Split {
    /// The first range's upper bound (None: the cut found a single range).
    first_up_to: Option<String>,
    pending: Vec<JoinHandle<Result<Listed>>>,
    listed: Option<Vec<Listed>>,
    pub parts: usize,
}

/// Cuts the key set into `parts` ranges and starts listing all but the first, each on a new
/// session; `None` when the cut finds a single range (an empty or one-valued key set).
pub fn start(
    client: &mut postgres::Client,
    engine: &CounterEngine,
    parts: usize,
    params: &ConnParams,
    policy: &LockPolicy,
) -> Result<Option<Split>> {
    let table = engine.range_table().to_string();
    // A small key set (the campaigns' three) is compared in less time than the sessions take to
    // open, and every range reads the whole source for its part.
    let rows: f64 = client
        .query_one(
            "SELECT coalesce((SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass($1)), 0)",
            &[&table],
        )
        .doing("reading the key set's size for the freeze")?
        .get(0);
    if rows < SPLIT_FROM_ROWS {
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
    let mut pending = Vec::new();
    for (i, after) in points.iter().enumerate() {
        let listing =
            engine.differing_in_range_sql(Some(after), points.get(i + 1).map(|p| p.as_str()));
        let params = params.clone();
        let timeout = policy.statement_timeout;
        pending.push(std::thread::spawn(move || list(&params, listing, timeout)));
    }
    Ok(Some(Split {
        parts: points.len() + 1,
        first_up_to: points.into_iter().next(),
        pending,
        listed: None,
    }))
}

/// Lists one range's differing keys on a session of its own, into a temporary file.
fn list(params: &ConnParams, listing: BoundSql, timeout: std::time::Duration) -> Result<Listed> {
    let mut session = crate::db::connect(params)?;
    let mut tx = session
        .client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a session to list a range of the freeze")?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = '{}ms'",
        timeout.as_millis().max(1)
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
        let key: Vec<String> = row.doing("listing a range of the freeze")?.get(0);
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
    /// Freezes the first range in `tx`, then appends the others' keys in order; returns how
    /// many targets. Run again after a retried transaction, it reads the same files again.
    pub fn freeze(
        &mut self,
        tx: &mut Transaction<'_>,
        engine: &CounterEngine,
        run_id: i64,
    ) -> Result<i64> {
        let first = engine.freeze_range_sql(run_id, 0, None, self.first_up_to.as_deref());
        let mut targets = tx.execute(&first.sql, &first.binds.params())? as i64;
        if self.listed.is_none() {
            let mut listed = Vec::new();
            for handle in self.pending.drain(..) {
                listed.push(handle.join().map_err(|_| {
                    anyhow::anyhow!("a session listing a range of the freeze panicked")
                })??);
            }
            self.listed = Some(listed);
        }
        for range in self.listed.as_mut().expect("joined above") {
            range.file.rewind()?;
            let mut chunk = Vec::with_capacity(APPEND_CHUNK);
            for line in BufReader::new(&range.file).lines() {
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
        Ok(targets)
    }

    /// Keys the other sessions listed (for the progress line).
    pub fn listed_elsewhere(&self) -> i64 {
        self.listed.iter().flatten().map(|l| l.keys).sum()
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        // A freeze that failed before joining them: their sessions end with their read.
        for handle in self.pending.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Appends keys (JSON arrays of text) to the run's targets, numbered after `from`.
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
