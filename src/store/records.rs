//! The releases' records: finished steps and confirmed gates (by release name, see
//! `schema::V7_SQL`; [`releases`] for the releases themselves), the saved plans applied, the
//! schema the release belongs to, and the legacy counter recorded at the deploy gate (read by
//! `report::legacy_counter`).
//!
//! `finished_steps`, `record_step`, `confirmed_gates`, `confirm_gate` (who confirmed, with the
//! role: `current_user`), `gates_passed`, `gate_confirmed`, `released_schema`, and
//! `record_legacy_counter`/`legacy_counter` (the figures `report::legacy_counter` computes; a rerun
//! keeps the first record); `record_plan`/`applied_plans`, the saved plans `apply --plan`
//! ran (digest, steps, who, when); `record_plan_step`/`plan_steps`, the table shapes each step
//! of an `apply --plan` left.

use anyhow::Result;
use postgres::{GenericClient, Row};

use crate::error::PgContext;

/// Whether the records are keyed by release (schema version 7 on). A read-only command may
/// find an older schema, which it does not upgrade: its records are all the coupon release's
/// ([`ADOPTED_RELEASE`](super::schema::ADOPTED_RELEASE)).
fn keyed(client: &mut impl GenericClient) -> Result<bool> {
    Ok(super::schema::version(client)?.is_some_and(|v| v >= 7))
}

/// The records of `release` in `table`, read with `sql` (whose `$1` is the release), or, in a
/// schema from before release identities, with `unkeyed` when `release` is the adopted one.
fn release_rows(
    client: &mut impl GenericClient,
    release: &str,
    sql: &str,
    unkeyed: &str,
    what: &str,
) -> Result<Vec<Row>> {
    if keyed(client)? {
        Ok(client.query(sql, &[&release]).doing(what)?)
    } else if release == super::schema::ADOPTED_RELEASE {
        Ok(client.query(unkeyed, &[]).doing(what)?)
    } else {
        Ok(Vec::new())
    }
}

/// The steps of `release` recorded as finished: (1-based position, label), in order.
pub fn finished_steps(
    client: &mut impl GenericClient,
    release: &str,
) -> Result<Vec<(i32, String)>> {
    Ok(release_rows(
        client,
        release,
        "SELECT step, what FROM pgmend.release_steps WHERE release = $1 ORDER BY step",
        "SELECT step, what FROM pgmend.release_steps ORDER BY step",
        "reading the release's finished steps",
    )?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect())
}

/// The confirmed gates of `release`: (gate, confirmed by, when in UTC).
pub fn confirmed_gates(
    client: &mut impl GenericClient,
    release: &str,
) -> Result<Vec<(String, String, String)>> {
    const COLUMNS: &str = "gate, confirmed_by, to_char(confirmed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')";
    Ok(release_rows(
        client,
        release,
        &format!(
            "SELECT {COLUMNS} FROM pgmend.gates WHERE release = $1 ORDER BY confirmed_at, gate"
        ),
        &format!("SELECT {COLUMNS} FROM pgmend.gates ORDER BY confirmed_at, gate"),
        "reading the confirmed gates",
    )?
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect())
}

/// Records step `step` (1-based) of `release` as finished, with the run that did it; a rerun
/// keeps the first record.
pub fn record_step(
    client: &mut impl GenericClient,
    release: &str,
    step: i32,
    what: &str,
    run_id: Option<i64>,
) -> Result<()> {
    client
        .execute(
            "INSERT INTO pgmend.release_steps (release, step, what, run_id) VALUES ($1, $2, $3, $4) ON CONFLICT (release, step) DO NOTHING",
            &[&release, &step, &what, &run_id],
        )
        .doing("recording the finished step")?;
    Ok(())
}

/// Records `gate` of `release` as confirmed by `who` (and the session's role); a rerun keeps
/// the first.
pub fn confirm_gate(
    client: &mut impl GenericClient,
    release: &str,
    gate: &str,
    who: &str,
) -> Result<()> {
    client
        .execute(
            "INSERT INTO pgmend.gates (release, gate, confirmed_by) VALUES ($1, $2, $3 || ' (role ' || current_user || ')') ON CONFLICT (release, gate) DO NOTHING",
            &[&release, &gate, &who],
        )
        .doing("recording the gate")?;
    Ok(())
}

/// Whether any release has passed a gate: from then on the new application runs (a gate is
/// about the database and its application, whichever release asked for it), which keeps
/// every counter in step with its source.
pub fn gates_passed(client: &mut impl GenericClient) -> Result<bool> {
    if !super::exists(client)? {
        return Ok(false);
    }
    Ok(client
        .query_one("SELECT EXISTS (SELECT 1 FROM pgmend.gates)", &[])
        .doing("reading whether the release has passed its gate")?
        .get(0))
}

/// Whether `gate` of `release` is confirmed (false when pgmend's tables do not exist).
pub fn gate_confirmed(client: &mut impl GenericClient, release: &str, gate: &str) -> Result<bool> {
    Ok(super::exists(client)?
        && confirmed_gates(client, release)?
            .iter()
            .any(|g| g.0 == gate))
}

/// The schema whose release pgmend's records are, when recorded.
pub fn released_schema(client: &mut impl GenericClient) -> Result<Option<String>> {
    let recorded: bool = client
        .query_one(
            "SELECT to_regclass('pgmend.released_schema') IS NOT NULL",
            &[],
        )
        .doing("looking for pgmend's tables")?
        .get(0);
    if !recorded {
        return Ok(None);
    }
    Ok(client
        .query_opt("SELECT schema_name FROM pgmend.released_schema", &[])
        .doing("reading which schema pgmend's records belong to")?
        .map(|r| r.get(0)))
}

/// Records, once, per campaign the legacy counter and what the old system really issued
/// (`source` is the SELECT of campaign_id, legacy counter, issued yen, coupons). Returns how
/// many campaigns were recorded (0 when already recorded).
pub fn record_legacy_counter(client: &mut impl GenericClient, source: &str) -> Result<u64> {
    let recorded: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pgmend.legacy_counter_at_deploy)",
            &[],
        )
        .doing("reading whether the legacy counter was recorded at the deploy gate")?
        .get(0);
    if recorded {
        return Ok(0);
    }
    let mut tx = client
        .transaction()
        .doing("opening the transaction that records the legacy counter")?;
    // The sums over every coupon, read apart where the role may: the server's parallel
    // workers sum them, which they never do inside an INSERT (`crate::db::staged`).
    let named = format!(
        "SELECT * FROM ({source}) AS s (campaign_id, legacy_counter_yen, old_system_issued_yen, old_system_coupons)"
    );
    let from = crate::db::staged::stage(&mut tx, "pgmend_legacy_counter", &named)
        .doing("summing the coupons per campaign for the legacy counter")?
        .map(|table| format!("SELECT * FROM {table}"))
        .unwrap_or_else(|| source.to_string());
    let rows = tx
        .execute(
            &format!(
                "INSERT INTO pgmend.legacy_counter_at_deploy (campaign_id, legacy_counter_yen, old_system_issued_yen, old_system_coupons)
                 {from}
                  WHERE NOT EXISTS (SELECT 1 FROM pgmend.legacy_counter_at_deploy)"
            ),
            &[],
        )
        .doing("recording the legacy counter at the deploy gate")?;
    tx.commit()
        .doing("committing the legacy counter recorded at the deploy gate")?;
    Ok(rows)
}

/// The recorded legacy counter: campaign, legacy counter, issued yen, recorded at (µs since
/// the epoch). Empty when not recorded (or pgmend's tables do not exist).
pub fn legacy_counter(client: &mut impl GenericClient) -> Result<Vec<Row>> {
    let has_record: bool = client
        .query_one(
            "SELECT to_regclass('pgmend.legacy_counter_at_deploy') IS NOT NULL",
            &[],
        )
        .doing("looking for pgmend's tables")?
        .get(0);
    if !has_record {
        return Ok(Vec::new());
    }
    client
        .query(
            "SELECT campaign_id, legacy_counter_yen, old_system_issued_yen,
                    (extract(epoch FROM recorded_at) * 1000000)::int8
               FROM pgmend.legacy_counter_at_deploy",
            &[],
        )
        .doing("reading the legacy counter recorded at the deploy gate")
}

/// A saved plan that `pgmend apply --plan` ran.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AppliedPlan {
    pub plan_sha256: String,
    pub made_at: String,
    pub first_step: i32,
    pub through_step: i32,
    pub applied_by: String,
    pub applied_at: String,
}

impl std::fmt::Display for AppliedPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "saved plan {} (made {}) applied steps {}–{}, by {} at {}",
            self.plan_sha256,
            self.made_at,
            self.first_step,
            self.through_step,
            self.applied_by,
            self.applied_at
        )
    }
}

/// Records that the plan `plan_sha256` (made at `made_at`, RFC 3339) was applied by `who`,
/// covering steps `first..=through`.
pub fn record_plan(
    client: &mut impl GenericClient,
    plan_sha256: &str,
    made_at: &str,
    (first, through): (i32, i32),
    who: &str,
) -> Result<()> {
    client
        .execute(
            "INSERT INTO pgmend.applied_plans (plan_sha256, made_at, first_step, through_step, applied_by)
             VALUES ($1, $2::text::timestamptz, $3, $4, $5)",
            &[&plan_sha256, &made_at, &first, &through, &who],
        )
        .doing("recording the applied plan")?;
    Ok(())
}

/// The saved plans applied, oldest first (none before version 3 of pgmend's schema).
pub fn applied_plans(client: &mut impl GenericClient) -> Result<Vec<AppliedPlan>> {
    let present: bool = client
        .query_one(
            "SELECT to_regclass('pgmend.applied_plans') IS NOT NULL",
            &[],
        )
        .doing("looking for pgmend.applied_plans")?
        .get(0);
    if !present {
        return Ok(Vec::new());
    }
    let utc =
        |c: &str| format!("to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')");
    Ok(client
        .query(
            &format!(
                "SELECT plan_sha256, {}, first_step, through_step, applied_by, {} FROM pgmend.applied_plans ORDER BY applied_at",
                utc("made_at"),
                utc("applied_at")
            ),
            &[],
        )
        .doing("reading the applied plans")?
        .iter()
        .map(|r| AppliedPlan {
            plan_sha256: r.get(0),
            made_at: r.get(1),
            first_step: r.get(2),
            through_step: r.get(3),
            applied_by: r.get(4),
            applied_at: r.get(5),
        })
        .collect())
}

/// Table name to the SHA-256 of its shape (`release::fingerprint`).
pub type Shapes = std::collections::BTreeMap<String, String>;

/// Records the table shapes step `step` of the saved plan `plan_sha256` left; a step run
/// again replaces them.
pub fn record_plan_step(
    client: &mut impl GenericClient,
    plan_sha256: &str,
    step: i32,
    shapes: &Shapes,
) -> Result<()> {
    client
        .execute(
            "INSERT INTO pgmend.plan_steps (plan_sha256, step, shapes) VALUES ($1, $2, $3::text::jsonb)
             ON CONFLICT (plan_sha256, step) DO UPDATE SET shapes = excluded.shapes, recorded_at = now()",
            &[&plan_sha256, &step, &serde_json::to_string(shapes)?],
        )
        .doing(format!("recording the table shapes step {step} of the saved plan left"))?;
    Ok(())
}

/// The steps an `apply` of the saved plan `plan_sha256` ran, each with the table shapes it
/// left (none before `pgmend.plan_steps` exists).
pub fn plan_steps(
    client: &mut impl GenericClient,
    plan_sha256: &str,
) -> Result<std::collections::BTreeMap<usize, Shapes>> {
    let present: bool = client
        .query_one("SELECT to_regclass('pgmend.plan_steps') IS NOT NULL", &[])
        .doing("looking for pgmend.plan_steps")?
        .get(0);
    if !present {
        return Ok(Default::default());
    }
    let mut out = std::collections::BTreeMap::new();
    for r in client
        .query(
            "SELECT step, shapes::text FROM pgmend.plan_steps WHERE plan_sha256 = $1",
            &[&plan_sha256],
        )
        .doing("reading the table shapes the saved plan's steps left")?
    {
        let step: i32 = r.get(0);
        let shapes: Shapes = serde_json::from_str(r.get(1))?;
        out.insert(step as usize, shapes);
    }
    Ok(out)
}

/// A finished repair run's rate, for the plan's duration estimates: how many rows it changed
/// and how long it took from its freeze (`as_of`) to `finished_at`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecordedRate {
    pub run_id: i64,
    pub repair: String,
    pub kind: String,
    pub changed: i64,
    pub processed: i64,
    pub seconds: f64,
}

/// The finished runs (undo runs aside) that changed rows, newest first; none when pgmend's
/// schema does not exist.
pub fn recorded_rates(client: &mut impl GenericClient) -> Result<Vec<RecordedRate>> {
    if !super::exists(client)? {
        return Ok(Vec::new());
    }
    Ok(client
        .query(
            "SELECT run_id, repair, kind, changed, processed,
                    extract(epoch FROM finished_at - as_of)::float8
               FROM pgmend.repair_runs
              WHERE state = 'finished' AND undoes_run IS NULL AND changed > 0
                AND finished_at > as_of
              ORDER BY finished_at DESC, run_id DESC",
            &[],
        )
        .doing("reading the rates of the finished repair runs")?
        .iter()
        .map(|r| RecordedRate {
            run_id: r.get(0),
            repair: r.get(1),
            kind: r.get(2),
            changed: r.get(3),
            processed: r.get(4),
            seconds: r.get(5),
        })
        .collect())
}

/// What the unfinished run of a repair has done so far: a resumed step is judged by what it
/// has left, plus this.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unfinished {
    pub run_id: i64,
    pub changes: i64,
    /// Rows it voided (its ledger records whose `void_column` went from null to a value), or
    /// counter rows it created (`insert` records).
    pub voided_or_created: i64,
}

/// The unfinished run of `repair`, if any (none when pgmend's schema does not exist).
pub fn unfinished(
    client: &mut impl GenericClient,
    repair: &str,
    void_column: Option<&str>,
) -> Result<Option<Unfinished>> {
    if !super::exists(client)? {
        return Ok(None);
    }
    let void_column = void_column.unwrap_or_default();
    let ledger = super::ledger_to_read(client)?;
    Ok(client
        .query_opt(
            &format!("SELECT r.run_id, r.changed,
                    (SELECT count(*) FROM {ledger} l
                      WHERE l.run_id = r.run_id
                        AND (l.action = 'insert'
                             OR ($2 <> '' AND l.before ->> $2 IS NULL AND l.after ->> $2 IS NOT NULL)))
               FROM pgmend.repair_runs r
              WHERE r.repair = $1 AND r.state = 'running'"),
            &[&repair, &void_column],
        )
        .doing(format!("reading the unfinished run of repair {repair}"))?
        .map(|r| Unfinished {
            run_id: r.get(0),
            changes: r.get(1),
            voided_or_created: r.get(2),
        }))
}
