//! Repair runs: their rows in `pgmend.repair_runs`, their frozen targets and their
//! checkpoints, and the ledger records `repair log` and undo read.
//!
//! `Run` is the run row as served to `repair status` and JSON (timestamps formatted by the server,
//! `skipped` parsed from `jsonb` text into [`Skipped`] keys, `state` a `RunState` and `kind` a `RunKind`, parsed where
//! the row is read). Functions: `all`, `run`, `unfinished`, `latest_run_id`, `create`,
//! `set_targets`, `advance` (the checkpoint, in the batch's transaction), `add_repass_targets`,
//! `analyze_targets`, `finish`, `abandon`; `frozen_keys_sql` (the frozen keys over a
//! `sql_text::SeqRange`: a batch's `seq` range, or all of them for reconciliation, cast back to the
//! group columns' types); `ledger_records` (streamed, for `repair log`); and the undo run's steps
//! (`unfinished_undo`, `create_undo`, `ledger_page` of 1,000 records, `advance_undo`,
//! `undo_counts`, `finish_undo`).

use anyhow::Result;
use postgres::{GenericClient, Transaction};
use serde::Serialize;

use super::{skipped_json, Skipped};
use crate::db::sql_text::{Ident, Param, SeqRange, TypeName};
use crate::error::PgContext;

/// Where a run stands; parsed once, where the row is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Finished,
    Abandoned,
}

impl RunState {
    /// The table's CHECK admits these three only.
    fn parse(text: &str) -> RunState {
        match text {
            "running" => RunState::Running,
            "abandoned" => RunState::Abandoned,
            _ => RunState::Finished,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Abandoned => "abandoned",
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a run does: one of the two engines, or an undo; parsed where the row is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    VoidDuplicates,
    RebuildCounter,
    Backfill,
    Orphans,
    Undo,
}

impl RunKind {
    /// As the table holds it (the definitions' `kind`, or `undo`).
    pub fn parse(text: &str) -> Option<RunKind> {
        match text {
            "void_duplicates" => Some(RunKind::VoidDuplicates),
            "rebuild_counter" => Some(RunKind::RebuildCounter),
            "backfill" => Some(RunKind::Backfill),
            "orphans" => Some(RunKind::Orphans),
            "undo" => Some(RunKind::Undo),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub run_id: i64,
    pub repair: String,
    /// None for a kind this pgmend does not know (a newer pgmend's run).
    pub kind: Option<RunKind>,
    pub definition_checksum: String,
    pub state: RunState,
    pub as_of: String,
    pub targets: i64,
    pub checkpoint: i64,
    pub processed: i64,
    pub changed: i64,
    pub skipped: Vec<Skipped>,
    pub started_by: String,
    pub finished_at: Option<String>,
    pub undoes_run: Option<i64>,
    pub undone_by_run: Option<i64>,
    /// Counter runs after the deploy gate: targets from this one on are keys that still
    /// differed after the run's first pass, corrected again (their ledger records merged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repass_from: Option<i64>,
    /// A counter run whose targets (before `repass_from`) are ranges of keys: each target
    /// holds the last value of the key's first column in its range, the last one none.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub target_ranges: bool,
    /// A running run walked by several workers (`--jobs`): its slices, each with its
    /// checkpoint and the worker that walked it last (filled by [`all`] only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<super::slices::Slice>,
    /// What another session asked of the run (`repair pause`, `throttle`); none asked: absent.
    #[serde(skip_serializing_if = "Steering::is_none")]
    pub steering: Steering,
}

/// What another session asked of a run, read by the running pgmend before each batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Steering {
    /// Paused: by whom and when (UTC); the batches wait until it is resumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<(String, String)>,
    /// `repair throttle --pause`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<i64>,
    /// `repair throttle --duty-cycle`, in percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duty_cycle: Option<i16>,
}

impl Steering {
    pub fn is_none(&self) -> bool {
        *self == Steering::default()
    }
}

/// Over `pgmend.repair_runs r`. `target_ranges` (version 4) and the steering (version 7) are
/// read through the row's JSON: read-only commands never upgrade the schema, and an older one
/// lacks the columns.
const RUN_COLUMNS: &str = "run_id, repair, kind, definition_checksum, state,
    to_char(as_of AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), targets, checkpoint, processed, changed,
    skipped::text, started_by, to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
    undoes_run, undone_by_run, repass_from,
    coalesce((to_jsonb(r) ->> 'target_ranges')::boolean, false),
    to_jsonb(r) ->> 'paused_by', to_char((to_jsonb(r) ->> 'paused_at')::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
    (to_jsonb(r) ->> 'throttle_pause_ms')::bigint, (to_jsonb(r) ->> 'throttle_duty_cycle')::smallint";

fn run_from_row(r: &postgres::Row) -> Run {
    Run {
        run_id: r.get(0),
        repair: r.get(1),
        kind: RunKind::parse(r.get(2)),
        definition_checksum: r.get(3),
        state: RunState::parse(r.get(4)),
        as_of: r.get(5),
        targets: r.get(6),
        checkpoint: r.get(7),
        processed: r.get(8),
        changed: r.get(9),
        skipped: serde_json::from_str(&r.get::<_, String>(10)).unwrap_or_default(),
        started_by: r.get(11),
        finished_at: r.get(12),
        undoes_run: r.get(13),
        undone_by_run: r.get(14),
        repass_from: r.get(15),
        target_ranges: r.get(16),
        slices: Vec::new(),
        steering: Steering {
            paused: r
                .get::<_, Option<String>>(17)
                .map(|by| (by, r.get::<_, Option<String>>(18).unwrap_or_default())),
            pause_ms: r.get(19),
            duty_cycle: r.get(20),
        },
    }
}

/// What another session asked of run `run_id` now (read before each batch, outside any
/// transaction).
pub fn steering(client: &mut impl GenericClient, run_id: i64) -> Result<Steering> {
    // The running pgmend has upgraded the schema: the columns are there, and one narrow read
    // by primary key is all a batch pays.
    Ok(client
        .query_opt(
            "SELECT paused_by, to_char(paused_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    throttle_pause_ms, throttle_duty_cycle
               FROM pgmend.repair_runs WHERE run_id = $1",
            &[&run_id],
        )
        .doing("reading the requests for the run")?
        .map(|r| Steering {
            paused: r
                .get::<_, Option<String>>(0)
                .map(|by| (by, r.get::<_, Option<String>>(1).unwrap_or_default())),
            pause_ms: r.get(2),
            duty_cycle: r.get(3),
        })
        .unwrap_or_default())
}

/// Records a request for run `run_id` (`repair pause`, `resume`, `throttle`), if it is
/// running: `pause` Some(true) pauses it (by `who`), Some(false) resumes it; `throttle` sets
/// `--pause` (ms) and `--duty-cycle` (%), each kept when None. Returns the run as it is now
/// (none: it was not running when the request was recorded).
pub fn steer(
    client: &mut impl GenericClient,
    run_id: i64,
    who: &str,
    pause: Option<bool>,
    throttle: (Option<i64>, Option<i16>),
) -> Result<Option<Run>> {
    let changed = client
        .execute(
            "UPDATE pgmend.repair_runs
                SET paused_at = CASE WHEN $3::boolean IS NULL THEN paused_at
                                     WHEN $3 THEN coalesce(paused_at, now()) END,
                    paused_by = CASE WHEN $3::boolean IS NULL THEN paused_by
                                     WHEN $3 THEN coalesce(paused_by, $2 || ' (role ' || current_user || ')') END,
                    throttle_pause_ms = coalesce($4, throttle_pause_ms),
                    throttle_duty_cycle = coalesce($5, throttle_duty_cycle)
              WHERE run_id = $1 AND state = 'running'",
            &[&run_id, &who, &pause, &throttle.0, &throttle.1],
        )
        .doing("recording the request")?;
    if changed == 0 {
        return Ok(None);
    }
    run(client, run_id)
}

/// Every run, oldest first (none when pgmend's tables do not exist).
pub fn all(client: &mut impl GenericClient) -> Result<Vec<Run>> {
    if !super::exists(client)? {
        return Ok(Vec::new());
    }
    let mut runs = client
        .query(
            &format!("SELECT {RUN_COLUMNS} FROM pgmend.repair_runs r ORDER BY run_id"),
            &[],
        )
        .doing("reading the repair runs")?
        .iter()
        .map(run_from_row)
        .collect::<Vec<_>>();
    for run in runs.iter_mut().filter(|r| r.state == RunState::Running) {
        run.slices = super::slices::list(client, run.run_id)?;
    }
    Ok(runs)
}

pub fn run(client: &mut impl GenericClient, run_id: i64) -> Result<Option<Run>> {
    if !super::exists(client)? {
        return Ok(None);
    }
    Ok(client
        .query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM pgmend.repair_runs r WHERE run_id = $1"),
            &[&run_id],
        )
        .doing("reading the repair run")?
        .as_ref()
        .map(run_from_row))
}

/// The unfinished run of `repair`, if there is one.
pub fn unfinished(client: &mut impl GenericClient, repair: &str) -> Result<Option<Run>> {
    Ok(client
        .query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM pgmend.repair_runs r WHERE repair = $1 AND state = 'running'"),
            &[&repair],
        )
        .doing("looking for an unfinished run")?
        .as_ref()
        .map(run_from_row))
}

/// The latest run of `repair`, finished or not.
pub fn latest_run_id(client: &mut impl GenericClient, repair: &str) -> Result<Option<i64>> {
    Ok(client
        .query_one(
            "SELECT max(run_id) FROM pgmend.repair_runs WHERE repair = $1",
            &[&repair],
        )
        .doing("finding the latest run of the repair")?
        .get(0))
}

/// Creates a running run, in the transaction that freezes its targets (ranges of keys when
/// `target_ranges`).
pub fn create(
    tx: &mut Transaction<'_>,
    repair: &str,
    kind: &str,
    checksum: &str,
    target_ranges: bool,
) -> Result<i64, postgres::Error> {
    Ok(tx
        .query_one(
            "INSERT INTO pgmend.repair_runs (repair, kind, definition_checksum, state, target_ranges)
             VALUES ($1, $2, $3, 'running', $4) RETURNING run_id",
            &[&repair, &kind, &checksum, &target_ranges],
        )?
        .get(0))
}

/// The bounds of the key ranges `seq` in ($2, $3] of run $1: the last value of the range at
/// `lo` (None when `lo` is 0: from the first key) and of the range at `hi` (None for the last,
/// open-ended range), as text.
pub fn range_bounds(
    client: &mut impl GenericClient,
    run_id: i64,
    lo: i64,
    hi: i64,
) -> Result<(Option<String>, Option<String>), postgres::Error> {
    let row = client.query_one(
        "SELECT (SELECT key[1] FROM pgmend.repair_targets WHERE run_id = $1 AND seq = $2),
                (SELECT key[1] FROM pgmend.repair_targets WHERE run_id = $1 AND seq = $3)",
        &[&run_id, &lo, &hi],
    )?;
    Ok((row.get(0), row.get(1)))
}

/// Records how many targets the run froze.
pub fn set_targets(
    tx: &mut Transaction<'_>,
    run_id: i64,
    targets: i64,
) -> Result<(), postgres::Error> {
    tx.execute(
        "UPDATE pgmend.repair_runs SET targets = $2 WHERE run_id = $1",
        &[&run_id, &targets],
    )?;
    Ok(())
}

/// The batch's checkpoint, in the batch's transaction: from `lo` to `hi`, adding what it
/// changed and skipped. Returns 1, or 0 when the run is gone or its checkpoint moved.
pub fn advance(
    tx: &mut Transaction<'_>,
    run_id: i64,
    (lo, hi): (i64, i64),
    changed: i64,
    skipped: &[Skipped],
) -> Result<u64, postgres::Error> {
    tx.execute(
        "UPDATE pgmend.repair_runs SET checkpoint = $2, processed = processed + ($2 - $3), changed = changed + $4,
                skipped = skipped || $5::text::jsonb
          WHERE run_id = $1 AND checkpoint = $3",
        &[&run_id, &hi, &lo, &changed, &skipped_json(skipped)],
    )
}

/// Appends `keys` (each key's parts joined by U+001F) to the run's targets after `from`,
/// marking where its second pass begins, in one transaction.
pub fn add_repass_targets(
    tx: &mut Transaction<'_>,
    run_id: i64,
    from: i64,
    keys: &[String],
) -> Result<(), postgres::Error> {
    tx.execute(
        &format!(
            "{} SELECT $1, $2 + k.n, string_to_array(k.key, chr(31)) FROM unnest($3::text[]) WITH ORDINALITY AS k(key, n)",
            super::targets_insert()
        ),
        &[&run_id, &from, &keys],
    )?;
    tx.execute(
        "UPDATE pgmend.repair_runs SET targets = targets + $2, repass_from = coalesce(repass_from, $3) WHERE run_id = $1",
        &[&run_id, &(keys.len() as i64), &from],
    )?;
    Ok(())
}

/// The frozen targets have new rows: the batches' plans read them.
pub fn analyze_targets(client: &mut impl GenericClient) -> Result<()> {
    client
        .batch_execute("ANALYZE pgmend.repair_targets")
        .doing("analyzing the frozen targets")
}

pub fn finish(client: &mut impl GenericClient, run_id: i64) -> Result<()> {
    client
        .execute(
            "UPDATE pgmend.repair_runs SET state = 'finished', finished_at = now() WHERE run_id = $1",
            &[&run_id],
        )
        .doing("marking the run finished")?;
    Ok(())
}

/// Abandons the run if it is still running.
pub fn abandon(client: &mut impl GenericClient, run_id: i64) -> Result<()> {
    client
        .execute(
            "UPDATE pgmend.repair_runs SET state = 'abandoned', finished_at = now() WHERE run_id = $1 AND state = 'running'",
            &[&run_id],
        )
        .doing("abandoning the run")?;
    Ok(())
}

/// How many rows of its table one range target holds, about: a batch starts at one range
/// (about 400 coupons, 108 members' coupons and month counters, of the incident's data).
pub const ROWS_PER_RANGE: i64 = 400;

/// How a range freeze reads its table's column: every row, or a sample of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RangeSample {
    /// Every row (a small table, one whose size the statistics do not know, or a view).
    All,
    /// `TABLESAMPLE BERNOULLI (percent) REPEATABLE (0)`: rows drawn one by one, so a sorted
    /// sample cut every `SAMPLED_PER_RANGE` rows cuts the table about every `ROWS_PER_RANGE`.
    Percent(f64),
}

/// Below this many rows (`pg_class.reltuples`) a range freeze reads every row.
const SAMPLE_FROM_ROWS: f64 = 100_000.0;
/// Sampled rows per range: the ranges' sizes vary by about 1/√40 (16%) around
/// `ROWS_PER_RANGE`.
const SAMPLED_PER_RANGE: i64 = 40;

impl RangeSample {
    /// How a range freeze reads `table`: sampled when it is a table or materialized view of
    /// at least [`SAMPLE_FROM_ROWS`] rows by its statistics.
    pub fn of(client: &mut impl GenericClient, table: &str) -> Result<RangeSample> {
        let row = client
            .query_opt(
                "SELECT c.relkind::text, c.reltuples::float8 FROM pg_class c WHERE c.oid = to_regclass($1)",
                &[&table],
            )
            .doing("reading the table's size for the range freeze")?;
        Ok(match row {
            Some(r)
                if matches!(r.get::<_, String>(0).as_str(), "r" | "m")
                    && r.get::<_, f64>(1) >= SAMPLE_FROM_ROWS =>
            {
                RangeSample::Percent(100.0 * SAMPLED_PER_RANGE as f64 / ROWS_PER_RANGE as f64)
            }
            _ => RangeSample::All,
        })
    }

    /// The clause after a table's alias in `FROM`.
    pub fn clause(self) -> String {
        match self {
            RangeSample::All => String::new(),
            RangeSample::Percent(p) => format!("TABLESAMPLE BERNOULLI ({p}) REPEATABLE (0)"),
        }
    }

    /// Every how many rows of the (sampled) column a range ends.
    fn every(self) -> i64 {
        match self {
            RangeSample::All => ROWS_PER_RANGE,
            RangeSample::Percent(_) => SAMPLED_PER_RANGE,
        }
    }
}

/// Freezes run `run`'s targets as ranges: `rows` (a `SELECT` of one column `k`, a row per row of
/// the table, read as `sample` says) in order, cut about every [`ROWS_PER_RANGE`] rows of the
/// table; each target holds the last value of its range as text (a value is the end of one
/// range at most), and one more target, `ARRAY[NULL]`, the open range after the last. The
/// ranges cover every value whatever the cuts, so a sample only sizes them; it spares sorting
/// every row (at 1,000,000 members 0.7 s for the void's freeze and 1.5 s for the member-months'
/// reading every value in order). The `INSERT` counts the targets.
pub fn range_targets_sql(rows: &str, run: Param, sample: RangeSample) -> String {
    format!(
        "WITH b AS (SELECT k, row_number() OVER (ORDER BY k) AS seq
                      FROM (SELECT DISTINCT k
                              FROM (SELECT k, row_number() OVER (ORDER BY k) AS n FROM ({rows}) u) x
                             WHERE n % {every} = 0) d)
         {targets_insert}
         SELECT {run}::bigint, seq, ARRAY[k::text] FROM b
         UNION ALL SELECT {run}::bigint, (SELECT count(*) FROM b) + 1, ARRAY[NULL::text]",
        every = sample.every(),
        targets_insert = super::targets_insert(),
    )
}

/// [`range_targets_sql`] over the values of `table.column` that are not NULL, for the run
/// given as the statement's first parameter.
pub fn column_range_targets_sql(table: &Ident, column: &Ident, sample: RangeSample) -> String {
    let [run] = Param::ordered();
    range_targets_sql(
        &format!(
            "SELECT t.{column} AS k FROM {table} t {sampled} WHERE t.{column} IS NOT NULL",
            sampled = sample.clause(),
        ),
        run,
        sample,
    )
}

/// The keys of run `run`'s frozen targets in `range` (`seq`), cast back from text to the
/// types of `columns`.
pub fn frozen_keys_sql(
    columns: &[Ident],
    types: &[TypeName],
    run: Param,
    range: SeqRange,
) -> String {
    let cols = columns
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (c, ty))| format!("key[{}]::{ty} AS {c}", i + 1))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT {cols} FROM pgmend.repair_targets WHERE run_id = {run} AND {}",
        range.predicate("seq")
    )
}

/// What every compact ledger record of one kind in a run repeats (schema version 6): the
/// table, the action, the names of the key's columns and of the changed columns (the record's
/// `row_key`, `before` and `after` are arrays of values in this order), and the reason as a
/// `format` template of the record's `args`. Plain names only (checked identifiers), so the
/// template holds no `%` but its own.
#[derive(Debug, Clone)]
pub struct LedgerShape {
    pub shape: i16,
    pub target_table: String,
    pub action: &'static str,
    pub key_columns: Vec<String>,
    pub columns: Vec<String>,
    pub reason: String,
}

/// Records a run's ledger shapes, before its first batch (idempotent: a resumed run, also one
/// an older pgmend began, gets them too).
pub fn record_shapes(
    client: &mut impl GenericClient,
    run_id: i64,
    shapes: &[LedgerShape],
) -> Result<()> {
    for s in shapes {
        client
            .execute(
                "INSERT INTO pgmend.ledger_shapes (run_id, shape, target_table, action, key_columns, columns, reason)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_id, shape) DO NOTHING",
                &[&run_id, &s.shape, &s.target_table, &s.action, &s.key_columns, &s.columns, &s.reason],
            )
            .doing("recording the run's ledger shapes")?;
    }
    Ok(())
}

/// A run's ledger records in order, for `repair log`: id, table, row key, action, before,
/// after (text, '' for none), reason, time.
pub fn ledger_records<'a>(
    client: &'a mut impl GenericClient,
    run_id: &'a i64,
) -> Result<postgres::RowIter<'a>> {
    let ledger = super::ledger_to_read(client)?;
    client
        .query_raw(
            &format!("SELECT ledger_id, target_table, row_key::text, action, coalesce(before::text, ''), coalesce(after::text, ''), reason,
                    to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
               FROM {ledger} WHERE run_id = $1 ORDER BY ledger_id"),
            [run_id],
        )
        .doing("reading the ledger")
}

/// An unfinished undo of `run_id`: (its run, its checkpoint).
pub fn unfinished_undo(client: &mut impl GenericClient, run_id: i64) -> Result<Option<(i64, i64)>> {
    Ok(client
        .query_opt(
            "SELECT run_id, checkpoint FROM pgmend.repair_runs WHERE undoes_run = $1 AND state = 'running'",
            &[&run_id],
        )
        .doing("looking for an unfinished undo of this run")?
        .map(|r| (r.get(0), r.get(1))))
}

/// Creates the run that undoes `run_id`, its targets the run's ledger records.
pub fn create_undo(client: &mut impl GenericClient, run_id: i64) -> Result<i64> {
    Ok(client
        .query_one(
            "INSERT INTO pgmend.repair_runs (repair, kind, definition_checksum, state, undoes_run, targets)
             SELECT 'undo:' || repair, 'undo', definition_checksum, 'running', run_id,
                    (SELECT count(*) FROM pgmend.ledger_records WHERE run_id = $1)
               FROM pgmend.repair_runs WHERE run_id = $1 RETURNING run_id",
            &[&run_id],
        )
        .doing("recording the undo run")?
        .get(0))
}

/// How many rows an undo run restored and deleted so far.
pub fn undo_counts(client: &mut impl GenericClient, undo_run: i64) -> Result<(i64, i64)> {
    client
        .query_one(
            "SELECT count(*) FILTER (WHERE action IN ('restore', 'insert')), count(*) FILTER (WHERE action = 'delete')
               FROM pgmend.ledger_records WHERE run_id = $1",
            &[&undo_run],
        )
        .map(|r| (r.get(0), r.get(1)))
        .doing("reading the undo's progress")
}

/// The next (at most 1,000) ledger ids of `run_id` after `after`.
pub fn ledger_page(
    tx: &mut Transaction<'_>,
    run_id: i64,
    after: i64,
) -> Result<Vec<i64>, postgres::Error> {
    Ok(tx
        .query(
            "SELECT ledger_id FROM pgmend.ledger_records WHERE run_id = $1 AND ledger_id > $2 ORDER BY ledger_id LIMIT 1000",
            &[&run_id, &after],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// An undo batch's checkpoint (the last ledger id it restored), in its transaction.
pub fn advance_undo(
    tx: &mut Transaction<'_>,
    undo_run: i64,
    last: i64,
    processed: i64,
    changed: i64,
) -> Result<(), postgres::Error> {
    tx.execute(
        "UPDATE pgmend.repair_runs SET checkpoint = $2, processed = processed + $3, changed = changed + $4 WHERE run_id = $1",
        &[&undo_run, &last, &processed, &changed],
    )?;
    Ok(())
}

/// The undo is done: its run finished, the undone run marked.
pub fn finish_undo(client: &mut impl GenericClient, undo_run: i64, run_id: i64) -> Result<()> {
    // One statement, so both rows change together or neither does.
    client
        .execute(
            "WITH undo AS (UPDATE pgmend.repair_runs SET state = 'finished', finished_at = now() WHERE run_id = $1)
             UPDATE pgmend.repair_runs SET undone_by_run = $1 WHERE run_id = $2",
            &[&undo_run, &run_id],
        )
        .doing("recording the undo")?;
    Ok(())
}
