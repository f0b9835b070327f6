//! The slices of a run walked by several workers (`--jobs N`), in `pgmend.run_slices`.
//!
//! A slice is an interval `(lo, hi]` of a run's targets with its own checkpoint; the worker that
//! walks it advances that checkpoint in each batch's transaction ([`advance`]), together with the
//! run's counts. The run's own `checkpoint` stays what it always meant: every target below it is
//! done. [`advance`] raises it to the lowest checkpoint of an unfinished slice, as its snapshot
//! sees them (never above the truth: checkpoints only grow), and [`settle`] raises it again once
//! no worker writes. [`cut`] (re)cuts what is left of a run for any number of workers: the
//! intervals left (the unfinished slices, or the targets after the run's checkpoint) are halved,
//! the largest first, until there are `pieces` of them or none can be halved ([`recut`]).

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use crate::db::runner_lock::RUNNER_LOCK_KEY;
use crate::error::PgContext;

/// One slice of a run: targets `(lo, hi]`, done up to `checkpoint`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Slice {
    pub slice: i32,
    pub lo: i64,
    pub hi: i64,
    pub checkpoint: i64,
    /// The worker (1 to N) that walked it last, if any did.
    pub worker: Option<i32>,
}

/// The run's slices, by their first target; none when the run was walked by one worker, or
/// on a schema older than version 5 (read-only commands never upgrade it).
pub fn list(client: &mut impl GenericClient, run_id: i64) -> Result<Vec<Slice>> {
    let exists: bool = client
        .query_one("SELECT to_regclass('pgmend.run_slices') IS NOT NULL", &[])
        .doing("looking for pgmend.run_slices")?
        .get(0);
    if !exists {
        return Ok(Vec::new());
    }
    Ok(client
        .query(
            "SELECT slice, lo, hi, checkpoint, worker FROM pgmend.run_slices WHERE run_id = $1 ORDER BY lo",
            &[&run_id],
        )
        .doing("reading the run's slices")?
        .iter()
        .map(|r| Slice {
            slice: r.get(0),
            lo: r.get(1),
            hi: r.get(2),
            checkpoint: r.get(3),
            worker: r.get(4),
        })
        .collect())
}

/// Halves the largest interval until there are `pieces` or none is longer than one target.
/// Pure; the intervals come back in order.
pub fn recut(mut intervals: Vec<(i64, i64)>, pieces: usize) -> Vec<(i64, i64)> {
    intervals.retain(|(lo, hi)| hi > lo);
    while intervals.len() < pieces {
        let Some((i, &(lo, hi))) = intervals
            .iter()
            .enumerate()
            .max_by_key(|(_, (lo, hi))| hi - lo)
        else {
            break;
        };
        if hi - lo < 2 {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        intervals[i] = (lo, mid);
        intervals.insert(i + 1, (mid, hi));
    }
    intervals.sort_unstable();
    intervals
}

/// Cuts what is left of run `run_id` (`checkpoint` to `targets` when it has no slices yet) into
/// slices for the workers, in one transaction, and returns the unfinished ones.
pub fn cut(
    client: &mut postgres::Client,
    run_id: i64,
    checkpoint: i64,
    targets: i64,
    pieces: usize,
) -> Result<Vec<Slice>> {
    let existing = list(client, run_id)?;
    let left: Vec<(i64, i64)> = if existing.is_empty() {
        vec![(checkpoint, targets)]
    } else {
        existing.iter().map(|s| (s.checkpoint, s.hi)).collect()
    };
    let intervals = recut(left, pieces);
    let mut tx = client.transaction().doing("cutting the run into slices")?;
    tx.execute(
        "DELETE FROM pgmend.run_slices WHERE run_id = $1",
        &[&run_id],
    )
    .doing("cutting the run into slices")?;
    let (los, his): (Vec<i64>, Vec<i64>) = intervals.iter().copied().unzip();
    tx.execute(
        "INSERT INTO pgmend.run_slices (run_id, slice, lo, hi, checkpoint)
         SELECT $1, n::integer, lo, hi, lo FROM unnest($2::bigint[], $3::bigint[]) WITH ORDINALITY AS s(lo, hi, n)",
        &[&run_id, &los, &his],
    )
    .doing("cutting the run into slices")?;
    tx.commit().doing("cutting the run into slices")?;
    Ok(intervals
        .iter()
        .enumerate()
        .map(|(i, &(lo, hi))| Slice {
            slice: i as i32 + 1,
            lo,
            hi,
            checkpoint: lo,
            worker: None,
        })
        .collect())
}

/// The lowest checkpoint of an unfinished slice of run $1, or the run's targets.
const LOW_WATER: &str = "coalesce((SELECT min(s.checkpoint) FROM pgmend.run_slices s
                                    WHERE s.run_id = $1 AND s.checkpoint < s.hi), r.targets)";

/// A worker's batch, in its transaction: the slice's checkpoint from `lo` to `hi`, the run's
/// counts, and the run's checkpoint raised to the lowest unfinished slice's. Returns 1, or 0
/// when the run is no longer running or the slice's checkpoint moved.
#[allow(clippy::too_many_arguments)]
pub fn advance(
    tx: &mut postgres::Transaction<'_>,
    run_id: i64,
    slice: i32,
    worker: i32,
    (lo, hi): (i64, i64),
    changed: i64,
    skipped: &[super::Skipped],
) -> Result<u64, postgres::Error> {
    let moved = tx.execute(
        "UPDATE pgmend.run_slices SET checkpoint = $4, worker = $5, updated_at = now()
          WHERE run_id = $1 AND slice = $2 AND checkpoint = $3",
        &[&run_id, &slice, &lo, &hi, &worker],
    )?;
    if moved != 1 {
        return Ok(0);
    }
    tx.execute(
        &format!(
            "UPDATE pgmend.repair_runs r SET checkpoint = greatest(r.checkpoint, {LOW_WATER}),
                    processed = processed + $2, changed = changed + $3,
                    skipped = skipped || $4::text::jsonb
              WHERE r.run_id = $1 AND r.state = 'running'"
        ),
        &[&run_id, &(hi - lo), &changed, &super::skipped_json(skipped)],
    )
}

/// Raises the run's checkpoint to the lowest unfinished slice's, once no worker writes. The
/// slices stay, for `repair status` (which worker walked what).
pub fn settle(client: &mut impl GenericClient, run_id: i64) -> Result<()> {
    client
        .execute(
            &format!(
                "UPDATE pgmend.repair_runs r SET checkpoint = greatest(r.checkpoint, {LOW_WATER}) WHERE r.run_id = $1"
            ),
            &[&run_id],
        )
        .doing("recording the run's checkpoint after its workers")?;
    Ok(())
}

/// Whether backend `pid` still holds pgmend's runner lock on this database: a worker checks it
/// in every batch, before it commits, so that the workers stop when the session that holds the
/// lock is gone (and another pgmend could take it).
pub fn lock_held_by(tx: &mut postgres::Transaction<'_>, pid: i32) -> Result<bool, postgres::Error> {
    Ok(tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l
                             WHERE l.locktype = 'advisory' AND l.granted AND l.pid = $1
                               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                               AND l.classid::bigint = ($2::bigint >> 32) AND l.objid::bigint = ($2::bigint & 4294967295)
                               AND l.objsubid = 1)",
            &[&pid, &RUNNER_LOCK_KEY],
        )?
        .get(0))
}

#[cfg(test)]
mod tests {
    use super::recut;

    #[test]
    fn what_is_left_is_halved_largest_first_until_every_worker_has_a_slice() {
        assert_eq!(
            recut(vec![(0, 100)], 4),
            vec![(0, 25), (25, 50), (50, 75), (75, 100)]
        );
        // Two unfinished slices of different sizes, for three workers.
        assert_eq!(
            recut(vec![(10, 20), (60, 100)], 3),
            vec![(10, 20), (60, 80), (80, 100)]
        );
        // Finished slices drop out; one target cannot be halved.
        assert_eq!(recut(vec![(5, 5), (7, 8)], 4), vec![(7, 8)]);
        assert_eq!(recut(vec![(0, 3)], 8), vec![(0, 1), (1, 2), (2, 3)]);
        assert!(recut(vec![(4, 4)], 2).is_empty());
    }
}
