//! pgmend's own tables, in schema `pgmend`: repair runs, their frozen targets, the audit
//! ledger, confirmed gates, finished release steps, and the legacy counter recorded at the
//! deploy gate (owned by `report::legacy_counter`).

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use crate::error::PgContext;

pub const SCHEMA_SQL: &str = "
CREATE SCHEMA IF NOT EXISTS pgmend;
CREATE TABLE IF NOT EXISTS pgmend.repair_runs (
  run_id              bigserial PRIMARY KEY,
  repair              text NOT NULL,
  kind                text NOT NULL,
  definition_checksum text NOT NULL,
  state               text NOT NULL CHECK (state IN ('running', 'finished', 'abandoned')),
  as_of               timestamptz NOT NULL DEFAULT now(),
  targets             bigint NOT NULL DEFAULT 0,
  checkpoint          bigint NOT NULL DEFAULT 0,
  processed           bigint NOT NULL DEFAULT 0,
  changed             bigint NOT NULL DEFAULT 0,
  skipped             jsonb NOT NULL DEFAULT '[]',
  started_by          text NOT NULL DEFAULT current_user,
  finished_at         timestamptz,
  undoes_run          bigint REFERENCES pgmend.repair_runs,
  undone_by_run       bigint REFERENCES pgmend.repair_runs
);
-- One unfinished run per repair (seed 004: the database, not the tool, enforces it).
CREATE UNIQUE INDEX IF NOT EXISTS one_unfinished_run_per_repair
  ON pgmend.repair_runs (repair) WHERE state = 'running';
-- repair_targets and repair_ledger carry no foreign key to repair_runs: their rows are
-- written in bulk (a check per row cost a quarter of a freeze and a tenth of a batch), only
-- in the transaction that creates the run or advances its checkpoint (a batch whose
-- checkpoint update finds no run is rolled back), and runs are never deleted.
CREATE TABLE IF NOT EXISTS pgmend.repair_targets (
  run_id bigint NOT NULL,
  seq    bigint NOT NULL,
  key    text[] NOT NULL,
  PRIMARY KEY (run_id, seq)
);
-- One index only, (run_id, ledger_id): what `repair log` and `undo` read a run's records by.
-- A run writes at most one record per row (its batches are disjoint, each record commits with
-- its checkpoint, and a counter row a batch creates and then corrects keeps its one record).
-- A unique index on (run_id, target_table, row_key) enforced that too, at about a fifth of a
-- void batch's time.
CREATE TABLE IF NOT EXISTS pgmend.repair_ledger (
  ledger_id    bigserial,
  run_id       bigint NOT NULL,
  target_table text NOT NULL,
  row_key      jsonb NOT NULL,
  action       text NOT NULL CHECK (action IN ('update', 'insert', 'restore', 'delete')),
  before       jsonb,
  after        jsonb,
  reason       text NOT NULL,
  at           timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, ledger_id)
);
CREATE TABLE IF NOT EXISTS pgmend.gates (
  gate         text PRIMARY KEY,
  confirmed_by text NOT NULL,
  confirmed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS pgmend.release_steps (
  step        integer PRIMARY KEY,
  what        text NOT NULL,
  run_id      bigint REFERENCES pgmend.repair_runs,
  finished_at timestamptz NOT NULL DEFAULT now()
);
-- A counter run after the deploy gate appends the keys that still differ after its pass to
-- its targets and corrects them again; targets from repass_from on are those.
ALTER TABLE pgmend.repair_runs ADD COLUMN IF NOT EXISTS repass_from bigint;
-- The schema whose release these records are (one row): the pre-flight refuses a session
-- that works in another schema, whose steps would otherwise be taken as done.
CREATE TABLE IF NOT EXISTS pgmend.released_schema (
  only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  schema_name text NOT NULL
);
-- Per campaign, the legacy counter campaigns.issued_yen and what the old system really issued
-- (every coupon, voided ones included), recorded once when the release passes the gate
-- deploy-new-application: the finance report's lost updates (src/report/legacy_counter.rs).
CREATE TABLE IF NOT EXISTS pgmend.legacy_counter_at_deploy (
  campaign_id           text PRIMARY KEY,
  legacy_counter_yen    bigint NOT NULL,
  old_system_issued_yen bigint NOT NULL,
  old_system_coupons    bigint NOT NULL,
  recorded_at           timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgmend.released_schema (schema_name) SELECT current_schema()
  ON CONFLICT (only_row) DO NOTHING;";

/// Whether pgmend's schema exists yet (read-only commands must not create it).
pub fn exists(client: &mut impl GenericClient) -> Result<bool> {
    exists_table(client, "pgmend.repair_runs")
}

/// Whether the release has passed a gate (`pgmend.gates` has a row): from then on the new
/// application runs, which keeps every counter in step with its source.
pub fn gates_passed(client: &mut impl GenericClient) -> Result<bool> {
    if !exists(client)? {
        return Ok(false);
    }
    Ok(client
        .query_one("SELECT EXISTS (SELECT 1 FROM pgmend.gates)", &[])
        .doing("reading whether the release has passed its gate")?
        .get(0))
}

/// Whether pgmend's schema has every table this version of pgmend keeps in it (the last one
/// [`SCHEMA_SQL`] creates); an older pgmend's schema gets the missing ones added.
pub fn complete(client: &mut impl GenericClient) -> Result<bool> {
    exists_table(client, "pgmend.legacy_counter_at_deploy")
}

fn exists_table(client: &mut impl GenericClient, table: &str) -> Result<bool> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .doing("looking for pgmend's tables")?
        .get(0))
}

#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub run_id: i64,
    pub repair: String,
    pub kind: String,
    pub definition_checksum: String,
    pub state: String,
    pub as_of: String,
    pub targets: i64,
    pub checkpoint: i64,
    pub processed: i64,
    pub changed: i64,
    pub skipped: serde_json::Value,
    pub started_by: String,
    pub finished_at: Option<String>,
    pub undoes_run: Option<i64>,
    pub undone_by_run: Option<i64>,
    /// Counter runs after the deploy gate: targets from this one on are keys that still
    /// differed after the run's first pass, corrected again (their ledger records merged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repass_from: Option<i64>,
}

pub const RUN_COLUMNS: &str = "run_id, repair, kind, definition_checksum, state,
    to_char(as_of AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), targets, checkpoint, processed, changed,
    skipped::text, started_by, to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
    undoes_run, undone_by_run, repass_from";

pub fn run_from_row(r: &postgres::Row) -> Run {
    Run {
        run_id: r.get(0),
        repair: r.get(1),
        kind: r.get(2),
        definition_checksum: r.get(3),
        state: r.get(4),
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
    }
}

pub fn runs(client: &mut impl GenericClient) -> Result<Vec<Run>> {
    if !exists(client)? {
        return Ok(Vec::new());
    }
    Ok(client
        .query(
            &format!("SELECT {RUN_COLUMNS} FROM pgmend.repair_runs ORDER BY run_id"),
            &[],
        )
        .doing("reading the repair runs")?
        .iter()
        .map(run_from_row)
        .collect())
}

pub fn run(client: &mut impl GenericClient, run_id: i64) -> Result<Option<Run>> {
    if !exists(client)? {
        return Ok(None);
    }
    Ok(client
        .query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM pgmend.repair_runs WHERE run_id = $1"),
            &[&run_id],
        )
        .doing("reading the repair run")?
        .as_ref()
        .map(run_from_row))
}

/// A SQL identifier, quoted. Definitions only hold plain identifiers (checked on load), so
/// this never needs escaping, but it quotes anyway.
pub fn q(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The SQL types of `columns` of `table`, to cast frozen keys (stored as text) back.
pub fn column_types(
    client: &mut impl GenericClient,
    table: &str,
    columns: &[String],
) -> Result<Vec<String>> {
    let mut types = Vec::new();
    for c in columns {
        let row = client
            .query_opt(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                  WHERE attrelid = to_regclass(quote_ident($1)) AND attname = $2 AND attnum > 0 AND NOT attisdropped",
                &[&table, c],
            )
            .doing(format!("reading the type of {table}.{c}"))?;
        match row {
            Some(r) => types.push(r.get(0)),
            None => anyhow::bail!("{table}.{c} does not exist; the repair definition does not match this database (has the migration that adds it been applied?)"),
        }
    }
    Ok(types)
}

/// The keys of one batch: run $1's frozen keys with `seq` in ($2, $3], cast back from text to
/// the types of `columns`.
pub fn frozen_batch_sql(columns: &[String], types: &[String]) -> String {
    let cols = columns
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (c, ty))| format!("key[{}]::{ty} AS {}", i + 1, q(c)))
        .collect::<Vec<_>>()
        .join(", ");
    format!("SELECT {cols} FROM pgmend.repair_targets WHERE run_id = $1 AND seq > $2 AND seq <= $3")
}
