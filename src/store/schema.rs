//! pgmend's schema and its version. Version 1 is the schema every pgmend before versions
//! created (its `CREATE ... IF NOT EXISTS` statements, which also complete an older one);
//! version 2 adds `pgmend.schema_version`, one row holding the version; version 3 adds
//! `pgmend.applied_plans`, the saved plans `apply --plan` ran; version 4 adds
//! `repair_runs.target_ranges`, set on a counter run whose targets are ranges of keys rather
//! than keys (see `repair::counter`), and `pgmend.plan_steps`, the table shapes each step of
//! an `apply --plan` left (see `release::fingerprint`); version 5 adds `pgmend.run_slices`, the
//! slices of a run walked by several workers (`--jobs`, see `store::slices`); version 6 the compact
//! ledger (`ledger_compact` and `ledger_shapes`, read with `repair_ledger` through the view
//! `ledger_records`, see
//! `V6_SQL`); version 7 release identities (`pgmend.releases`, step records and gates keyed
//! by release) and the steering requests on `repair_runs` (see `V7_SQL`). [`ensure`] creates the
//! schema or upgrades it in place, in one transaction serialised by an advisory lock under
//! the session's bounded lock waits; a schema newer than this binary is refused before any
//! change.
//!
//! Version 1 is `repair_runs` (with the partial unique index `one_unfinished_run_per_repair`),
//! `repair_targets`, `repair_ledger` (primary key `(run_id, ledger_id)` its only index), `gates`,
//! `release_steps`, `released_schema` and `legacy_counter_at_deploy`. `version` reads the version:
//! none without the tables, 1 for the tables without a version table. `ensure` returns at once when
//! the version is `CURRENT`; otherwise, under `with_lock_retry` and the lock policy, it takes a
//! transaction-level advisory lock, reads the version again, runs version 1's idempotent statements
//! and every later missing step, and records `CURRENT`, all in one transaction. A newer version
//! than `CURRENT` is refused (exit 2, naming both versions) by `refuse_newer`, which `ensure` and
//! `store::exists` (what read-only callers use: they never create the schema) both call.
//!
//! `repair_targets` and `repair_ledger` have no foreign key to `repair_runs`: they are written in
//! bulk, and a check per row cost a quarter of a freeze and a tenth of a batch; they are written
//! only in the transaction that creates the run or advances its checkpoint, and the runner rolls a
//! batch back when its checkpoint update finds no run.

use anyhow::{bail, Result};
use postgres::GenericClient;

use crate::db::retry::{with_lock_retry, LockPolicy};
use crate::error::PgContext;

/// The version of pgmend's schema this binary creates and works with.
pub const CURRENT: i32 = 7;

/// The first key of the transaction-level advisory lock upgrades take ("pgmd"), second key
/// "schm": two pgmends upgrading at once take turns, the second finds the work done.
const LOCK: (i32, i32) = (0x706d_6764, 0x7363_686d);

pub(super) const V1_SQL: &str = "
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

/// Version 1 to 2: the version table.
const V2_SQL: &str = "
CREATE TABLE IF NOT EXISTS pgmend.schema_version (
  only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  version     integer NOT NULL,
  upgraded_at timestamptz NOT NULL DEFAULT now()
);";

/// Version 2 to 3: the saved plans `pgmend apply --plan` ran, with who ran them and when.
const V3_SQL: &str = "
CREATE TABLE IF NOT EXISTS pgmend.applied_plans (
  plan_sha256  text NOT NULL,
  made_at      timestamptz NOT NULL,
  first_step   integer NOT NULL,
  through_step integer NOT NULL,
  applied_by   text NOT NULL,
  applied_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (plan_sha256, applied_at)
);";

/// Version 3 to 4: a counter run before the deploy gate freezes ranges of keys (each target the
/// last value of the key's first column in its range; the last range open-ended) instead of
/// every key that differs. Runs an older pgmend froze keep their keys and resume as they were.
/// And per saved plan and step it ran, the digests of the release's table shapes the step left
/// (`shapes`, table name to SHA-256): what the same plan, applied again, compares them with.
const V4_SQL: &str = "
ALTER TABLE pgmend.repair_runs ADD COLUMN IF NOT EXISTS target_ranges boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS pgmend.plan_steps (
  plan_sha256 text NOT NULL,
  step        integer NOT NULL,
  shapes      jsonb NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (plan_sha256, step)
);";

/// Version 4 to 5: the slices of a run walked by several workers (`--jobs`): each an interval
/// of the run's targets, `(lo, hi]`, with its own checkpoint, and the worker that last walked
/// it. The run's own checkpoint stays the point below which every target is done.
const V5_SQL: &str = "
CREATE TABLE IF NOT EXISTS pgmend.run_slices (
  run_id     bigint NOT NULL,
  slice      integer NOT NULL,
  lo         bigint NOT NULL,
  hi         bigint NOT NULL,
  checkpoint bigint NOT NULL,
  worker     integer,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, slice),
  CHECK (lo <= checkpoint AND checkpoint <= hi)
);";

/// Version 5 to 6: the compact ledger. The batches that change many rows (a void run's, a
/// counter run's before the deploy gate) write `ledger_compact` records: the key, the changed
/// columns before and after and the reason's arguments as `jsonb` arrays of values, against a
/// per-run `ledger_shapes` row that holds what every record of that kind repeats (the table,
/// the action, the column names, the reason as a `format` template). The records written in
/// full until now, and the rare kinds (a counter corrected after the gate, the guard's, undo's),
/// stay in `repair_ledger`, unchanged (a guard trigger an older pgmend left still writes there);
/// the view `ledger_records` is both, a compact record rendered exactly as it would have been
/// written in full, and every reader reads it. Both tables take their `ledger_id`s from the one
/// sequence, so the view's order is the order of writing.
const V6_SQL: &str = "
CREATE TABLE pgmend.ledger_shapes (
  run_id       bigint NOT NULL,
  shape        smallint NOT NULL,
  target_table text NOT NULL,
  action       text NOT NULL CHECK (action IN ('update', 'insert')),
  key_columns  text[] NOT NULL,
  columns      text[] NOT NULL,
  reason       text NOT NULL,
  PRIMARY KEY (run_id, shape)
);
CREATE TABLE pgmend.ledger_compact (
  ledger_id bigint NOT NULL DEFAULT nextval('pgmend.repair_ledger_ledger_id_seq'),
  run_id    bigint NOT NULL,
  shape     smallint NOT NULL,
  row_key   jsonb NOT NULL,
  before    jsonb,
  after     jsonb,
  args      jsonb,
  at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, ledger_id)
);
-- names[i] -> vals[i], an object as jsonb_build_object makes it (jsonb orders its keys itself).
CREATE FUNCTION pgmend.ledger_object(names text[], vals jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT CASE WHEN vals IS NOT NULL THEN
                 (SELECT jsonb_object_agg(n, vals -> (i::int - 1)) FROM unnest(names) WITH ORDINALITY u(n, i))
               END $$;
CREATE VIEW pgmend.ledger_records AS
  SELECT ledger_id, run_id, target_table, row_key, action, before, after, reason, at
    FROM pgmend.repair_ledger
  UNION ALL
  SELECT c.ledger_id, c.run_id, s.target_table, pgmend.ledger_object(s.key_columns, c.row_key),
         s.action, pgmend.ledger_object(s.columns, c.before), pgmend.ledger_object(s.columns, c.after),
         format(s.reason, VARIADIC coalesce((SELECT array_agg(a.e ORDER BY a.i)
                                               FROM jsonb_array_elements_text(c.args) WITH ORDINALITY a(e, i)), '{}')),
         c.at
    FROM pgmend.ledger_compact c JOIN pgmend.ledger_shapes s ON s.run_id = c.run_id AND s.shape = c.shape;";

/// The release that records made before release identities belong to: the coupon release, the
/// one release pgmend ran then (`release::COUPON_RELEASE` is this name).
pub const ADOPTED_RELEASE: &str = "coupon-incident";

/// Version 7: release identities, and steering a run from another session (the requests on
/// `repair_runs`: `paused_at`/`paused_by`, `throttle_pause_ms`, `throttle_duty_cycle`). `pgmend.releases` holds each release started on this database
/// (its name, the digest of its files when last applied, its steps as JSON so that another
/// release can tell whether it is finished without its files, and when it finished); the
/// release's step records and gates are keyed by its name. Records an older pgmend wrote, and
/// a database with any, are adopted as the coupon release's, with their progress (its steps
/// are the built-in release's, filled in by `release::identity`).
const V7_SQL: &str = "
CREATE TABLE pgmend.releases (
  release     text PRIMARY KEY,
  digest      text NOT NULL,
  steps       jsonb,
  started_by  text NOT NULL DEFAULT current_user,
  started_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);
ALTER TABLE pgmend.release_steps ADD COLUMN release text NOT NULL DEFAULT 'coupon-incident';
ALTER TABLE pgmend.release_steps ALTER COLUMN release DROP DEFAULT;
ALTER TABLE pgmend.release_steps DROP CONSTRAINT release_steps_pkey;
ALTER TABLE pgmend.release_steps ADD PRIMARY KEY (release, step);
ALTER TABLE pgmend.gates ADD COLUMN release text NOT NULL DEFAULT 'coupon-incident';
ALTER TABLE pgmend.gates ALTER COLUMN release DROP DEFAULT;
ALTER TABLE pgmend.gates DROP CONSTRAINT gates_pkey;
ALTER TABLE pgmend.gates ADD PRIMARY KEY (release, gate);
-- Steering a run from another session (`pgmend repair pause|resume|throttle`): requests the
-- running pgmend reads before each batch.
ALTER TABLE pgmend.repair_runs ADD COLUMN paused_at timestamptz;
ALTER TABLE pgmend.repair_runs ADD COLUMN paused_by text;
ALTER TABLE pgmend.repair_runs ADD COLUMN throttle_pause_ms bigint;
ALTER TABLE pgmend.repair_runs ADD COLUMN throttle_duty_cycle smallint;
INSERT INTO pgmend.releases (release, digest)
  SELECT 'coupon-incident', 'adopted: recorded before release identities'
   WHERE EXISTS (SELECT 1 FROM pgmend.release_steps) OR EXISTS (SELECT 1 FROM pgmend.gates);";

/// Each upgrade step, by the version it leads to.
const STEPS: [(i32, &str); 7] = [
    (1, V1_SQL),
    (2, V2_SQL),
    (3, V3_SQL),
    (4, V4_SQL),
    (5, V5_SQL),
    (6, V6_SQL),
    (7, V7_SQL),
];

/// The version of the schema in the database: None when there is no schema yet; 1 when the
/// tables exist without a version table (an older pgmend's).
pub fn version(client: &mut impl GenericClient) -> Result<Option<i32>> {
    let row = client
        .query_one(
            "SELECT to_regclass('pgmend.schema_version') IS NOT NULL, to_regclass('pgmend.repair_runs') IS NOT NULL",
            &[],
        )
        .doing("looking for pgmend's tables")?;
    let (versioned, tables): (bool, bool) = (row.get(0), row.get(1));
    if !versioned {
        return Ok(tables.then_some(1));
    }
    Ok(Some(
        client
            .query_opt("SELECT version FROM pgmend.schema_version", &[])
            .doing("reading the version of pgmend's schema")?
            .map_or(1, |r| r.get(0)),
    ))
}

/// Refuses a schema made by a newer pgmend (exit 2): its tables may mean what this binary
/// does not know.
pub fn refuse_newer(found: Option<i32>) -> Result<()> {
    match found {
        Some(v) if v > CURRENT => bail!(
            "pgmend's schema in this database (schema pgmend) is at version {v}, made by a newer pgmend; this pgmend knows versions up to {CURRENT} and does not read or change a newer one. Use the newer pgmend (the one that upgraded the schema, or later); nothing was changed"
        ),
        _ => Ok(()),
    }
}

/// Creates pgmend's schema, or upgrades it to [`CURRENT`] in place (runs left by an older
/// pgmend keep their rows and resume). Safe under a concurrent pgmend: one transaction that
/// takes an advisory lock first and then looks at the version again.
pub fn ensure(client: &mut postgres::Client, policy: &LockPolicy) -> Result<()> {
    let found = version(client)?;
    refuse_newer(found)?;
    if found == Some(CURRENT) {
        return Ok(());
    }
    with_lock_retry(
        client,
        policy,
        "creating or upgrading pgmend's tables (schema pgmend)",
        &[],
        |c| {
            let mut tx = c.transaction()?;
            tx.batch_execute(&policy.set_local_sql())?;
            tx.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&LOCK.0, &LOCK.1])?;
            let now = version(&mut tx)?;
            refuse_newer(now)?;
            let from = now.unwrap_or(0);
            for (to, sql) in STEPS {
                // Version 1's statements are idempotent and complete any older schema.
                if to > from || to == 1 {
                    tx.batch_execute(sql)?;
                }
            }
            tx.execute(
                "INSERT INTO pgmend.schema_version (version) VALUES ($1)
                 ON CONFLICT (only_row) DO UPDATE SET version = excluded.version, upgraded_at = now()",
                &[&CURRENT],
            )?;
            tx.commit()?;
            Ok(())
        },
    )
}
