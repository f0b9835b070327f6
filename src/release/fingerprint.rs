//! A saved plan (`pgmend plan --output FILE`) and the checks `pgmend apply --plan FILE` makes
//! against it before the first change.
//!
//! The fingerprint is what the plan was made from: the server (`system_identifier`, which
//! standbys and restored copies share, so also the database OID, the connection target and the
//! role), the target schema, pgmend's version, the SHA-256 of every migration file, repair
//! definition and `release.toml`, a SHA-256 per table of the canonical text of its shape
//! (columns, types, defaults, constraints, indexes, triggers, row security and policies), the
//! steps done, the pending steps the plan covers (up to the next pending gate) and each pending
//! repair step's predicted counts and yen. The document's own digest, `plan_sha256`, is the
//! SHA-256 of the canonical JSON text (serde_json's compact form) of the document without it.
//!
//! Each step an `apply --plan` finishes records [`table_shapes`] as the step left them, under
//! the plan's digest (`store::records::record_plan_step`, from `engine`). When steps were done
//! since the plan, [`check`] compares the tables with the shapes recorded after the last of
//! them this plan ran, so the same plan resumes across its own migrations; a migration it did
//! not run (a plain `apply`, `migrate apply`, or a record lost to a crash) is refused.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use postgres::GenericClient;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Progress, Release, Step};
use crate::db::conninfo::ConnParams;
use crate::digest::sha256_hex;
use crate::error::{PgContext, Stopped};
use crate::migrate::source::Migration;
use crate::repair::definition::{Repair, Spec};
use crate::repair::preview::Preview;
use crate::store::records::{Shapes, Unfinished};

/// The share of a count the next data step may move by between the plan and `apply`; never
/// less than [`DRIFT_FLOOR_ROWS`]. A live old application keeps adding duplicates.
pub const DEFAULT_MAX_DRIFT: f64 = 0.05;
pub const DRIFT_FLOOR_ROWS: i64 = 100;

/// The name of the document's own digest.
pub const DIGEST_FIELD: &str = "plan_sha256";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Server {
    pub system_identifier: String,
    pub database_oid: i64,
    pub host: String,
    pub port: u16,
    pub dbname: String,
    pub role: String,
    /// The server's timeline: a promoted standby keeps its old primary's system identifier
    /// but starts a new timeline, so a plan made before a failover is refused after it.
    #[serde(default)]
    pub timeline: i64,
}

/// A pending repair step's predicted figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFigures {
    pub step: usize,
    pub label: String,
    pub changes: i64,
    pub voided_or_created: i64,
    /// Void: the yen of the coupons voided; counters: the sum of new minus old values.
    pub yen: i64,
    /// An unfinished run of this repair (a step interrupted): what it has done so far. The
    /// counts above are what it has left; `apply --plan` compares the sums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Unfinished>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fingerprint {
    /// When the plan was made (UTC, RFC 3339).
    pub made_at: String,
    pub server: Server,
    pub schema: String,
    pub pgmend_version: String,
    /// `migrations/FILE`, `repairs/FILE` and `release.toml`, each with its SHA-256.
    pub files: BTreeMap<String, String>,
    /// Each table the release touches, with the SHA-256 of its shape's canonical text.
    pub tables: Shapes,
    pub done_steps: Vec<usize>,
    /// The pending steps `apply --plan` runs: up to the next pending gate.
    pub covers: Vec<usize>,
    pub data_steps: Vec<StepFigures>,
}

/// What the release is made of, and where the database stands in it, for the fingerprint.
pub struct Inputs<'a> {
    pub release: &'a Release<'a>,
    pub progress: &'a Progress,
}

/// The fingerprint of a plan whose pending repair steps preview `previews` (each with its
/// 1-based step number, in step order), read in `tx` (the plan's read-only transaction).
pub fn take(
    tx: &mut impl GenericClient,
    params: &ConnParams,
    inputs: &Inputs,
    previews: &[(usize, &Preview)],
) -> Result<Fingerprint> {
    let row = tx
        .query_one(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()),
                    (SELECT oid::int8 FROM pg_database WHERE datname = current_database()),
                    current_user::text, current_schema()::text,
                    CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id::int8 FROM pg_control_checkpoint())
                         ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END",
            &[],
        )
        .doing("reading the server's identity (pg_control_system(), pg_database)")?;
    let release = inputs.release;
    let files = super::project::file_digests(release.text, release.files, release.repairs);
    let done_steps: Vec<usize> = (0..release.steps.len())
        .filter(|i| inputs.progress.done(*i, &release.steps[*i]))
        .map(|i| i + 1)
        .collect();
    Ok(Fingerprint {
        made_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        server: Server {
            system_identifier: row.get::<_, Option<String>>(0).unwrap_or_default(),
            database_oid: row.get(1),
            host: params.host.clone(),
            port: params.port,
            dbname: params.dbname.clone(),
            role: row.get(2),
            timeline: row.get(4),
        },
        schema: row.get::<_, Option<String>>(3).unwrap_or_default(),
        pgmend_version: env!("CARGO_PKG_VERSION").into(),
        tables: table_shapes(tx, release.files, release.repairs)?,
        covers: covers(release.steps, &done_steps),
        done_steps,
        files,
        data_steps: data_steps(tx, inputs, previews)?,
    })
}

/// Each pending repair step's predicted figures; the first pending step of a repair with an
/// unfinished run also says what that run has done (its counts are then what is left).
fn data_steps(
    tx: &mut impl GenericClient,
    inputs: &Inputs,
    previews: &[(usize, &Preview)],
) -> Result<Vec<StepFigures>> {
    let release = inputs.release;
    let mut out: Vec<StepFigures> = Vec::new();
    for &(step, r) in previews {
        let label = release.steps[step - 1].label();
        let first = !out.iter().any(|s| s.label == label);
        let resumed = match release.repairs.iter().find(|d| d.name == r.repair) {
            Some(d) if first => {
                let void = match &d.spec {
                    Spec::VoidDuplicates(v) => Some(v.void.as_str()),
                    _ => None,
                };
                crate::store::records::unfinished(tx, &d.name, void)?
            }
            _ => None,
        };
        out.push(StepFigures {
            step,
            label,
            changes: r.changes,
            voided_or_created: r.voided_or_created,
            yen: r.amounts.values().sum(),
            resumed,
        });
    }
    Ok(out)
}

/// The pending steps from the first one up to, not including, the next pending gate (a plan
/// made while a gate is the first pending step covers that gate and what follows it).
fn covers(steps: &[Step], done: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if done.contains(&(i + 1)) {
            continue;
        }
        if matches!(step, Step::Gate { .. }) && !out.is_empty() {
            break;
        }
        out.push(i + 1);
    }
    out
}

/// The tables the release touches (those its repairs name, and those of the target schema
/// its migration files name), each with the SHA-256 of its shape's canonical text.
pub fn table_shapes(
    tx: &mut impl GenericClient,
    files: &[Migration],
    repairs: &[Repair],
) -> Result<Shapes> {
    let tables = tx
        .query(
            "SELECT c.oid, c.relname::text FROM pg_class c
              WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
              ORDER BY c.relname",
            &[],
        )
        .doing("listing the tables of the target schema")?;
    let named = repair_tables(repairs);
    let mut out = BTreeMap::new();
    for t in tables {
        let (oid, name): (u32, String) = (t.get(0), t.get(1));
        let word = regex::Regex::new(&format!(r"(?i)\b{}\b", regex::escape(&name)))
            .context("a table name as a pattern")?;
        if !named.contains(&name) && !files.iter().any(|m| word.is_match(&m.sql)) {
            continue;
        }
        let lines: Vec<String> = tx
            .query(SHAPE_SQL, &[&oid])
            .doing(format!("reading the shape of table {name}"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        out.insert(name, sha256_hex(lines.join("\n")));
    }
    Ok(out)
}

/// A table's shape, one line per column (in order), constraint, index, trigger, and its row
/// security with each policy: the canonical text its digest is taken of.
const SHAPE_SQL: &str = "
SELECT line FROM (
  SELECT 1 AS part, a.attnum::int AS n, format('column %s %s not null %s default %s', a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)) AS line
    FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 2, 0, format('constraint %s %s valid %s', conname, pg_get_constraintdef(oid), convalidated) FROM pg_constraint WHERE conrelid = $1
  UNION ALL
  SELECT 3, 0, format('index %s valid %s', pg_get_indexdef(indexrelid), indisvalid) FROM pg_index WHERE indrelid = $1
  UNION ALL
  SELECT 4, 0, format('trigger %s enabled %s', pg_get_triggerdef(oid), tgenabled) FROM pg_trigger WHERE tgrelid = $1 AND NOT tgisinternal
  UNION ALL
  SELECT 5, 0, format('row security %s forced %s', relrowsecurity, relforcerowsecurity) FROM pg_class WHERE oid = $1
  UNION ALL
  SELECT 6, 0, format('policy %s %s permissive %s roles %s using %s check %s', polname, polcmd, polpermissive, polroles::text, pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid)) FROM pg_policy WHERE polrelid = $1
) s ORDER BY part, n, line COLLATE \"C\"";

fn repair_tables(repairs: &[Repair]) -> Vec<String> {
    repairs.iter().flat_map(Repair::tables).collect()
}

/// The document with its digest added, as the pretty JSON text the file holds.
pub fn seal(document: &impl Serialize) -> Result<(String, String)> {
    let mut value = serde_json::to_value(document)?;
    let digest = sha256_hex(serde_json::to_string(&value)?);
    if let Value::Object(map) = &mut value {
        map.insert(DIGEST_FIELD.into(), Value::String(digest.clone()));
    }
    Ok((serde_json::to_string_pretty(&value)? + "\n", digest))
}

/// A plan file as `apply` reads it: refused (exit 2) when its content does not match its
/// digest, or the digest is not `expected`.
pub struct Saved {
    pub digest: String,
    pub fingerprint: Fingerprint,
}

pub fn open(path: &std::path::Path, text: &str, expected: Option<&str>) -> Result<Saved> {
    let shown = path.display();
    let mut value: Value = serde_json::from_str(text)
        .with_context(|| format!("{shown} is not a plan file (pgmend plan --output): not JSON"))?;
    let recorded = value
        .as_object_mut()
        .and_then(|m| m.remove(DIGEST_FIELD))
        .and_then(|v| v.as_str().map(String::from))
        .with_context(|| {
            format!("{shown} is not a plan file (pgmend plan --output): it has no {DIGEST_FIELD}")
        })?;
    let actual = sha256_hex(serde_json::to_string(&value)?);
    if actual != recorded {
        bail!("the plan file {shown} was changed after pgmend wrote it: its content's SHA-256 is {actual}, not the {recorded} it records; nothing was changed. Make a new plan with `pgmend plan --output {shown}` and review it");
    }
    if let Some(want) = expected.filter(|w| !w.eq_ignore_ascii_case(&recorded)) {
        bail!("the plan file {shown} is not the reviewed plan: its SHA-256 is {recorded}, --plan-sha256 gives {want}; nothing was changed");
    }
    let fingerprint = serde_json::from_value(value.get("fingerprint").cloned().unwrap_or_default())
        .with_context(|| format!("{shown} has no valid fingerprint part"))?;
    Ok(Saved {
        digest: recorded,
        fingerprint,
    })
}

/// How far `apply --plan` lets the database be from the plan.
pub struct Limits {
    pub max_age: Duration,
    /// A share of each count of the next data step (at least [`DRIFT_FLOOR_ROWS`]).
    pub max_drift: f64,
}

/// Compares the plan with the database as it is now (`now`, taken just before; `recorded`, the
/// shapes each step an apply of this plan ran left, by step). Another server, database,
/// schema, role or pgmend, or any file that differs: an error (exit 2). Steps done since that
/// the plan does not account for, table shapes that differ, a plan too old, or the next data
/// step's counts moved past the limit: [`Stopped`] (exit 1). Returns a line for each count
/// that moved within the limit.
pub fn check(
    saved: &Fingerprint,
    now: &Fingerprint,
    steps: &[Step],
    recorded: &BTreeMap<usize, Shapes>,
    limits: &Limits,
) -> Result<Vec<String>> {
    check_identity(saved, now)?;
    let Some((expected, after)) = expected_shapes(saved, now, steps, recorded) else {
        return Err(Stopped::error(format!(
            "the release moved on since the plan was made (steps done then: {:?}, now: {:?}; a step done since is not the plan's next, or is a migration an apply of this plan did not run); nothing was changed. Make a new plan (`pgmend plan --output FILE`), review it, and apply that",
            saved.done_steps, now.done_steps
        )));
    };
    let shapes = differing(expected, &now.tables);
    if !shapes.is_empty() {
        let whose = match after {
            Some(n) => format!("what step {n}, the last an apply of this plan ran, left"),
            None => "the plan's".into(),
        };
        return Err(Stopped::error(format!(
            "the shape of {} differs from {whose} (columns, types, constraints, indexes, triggers or row security changed by someone else since); nothing was changed. Find out who changed it, then make a new plan and review it",
            shapes.join(", ")
        )));
    }
    let made = chrono::DateTime::parse_from_rfc3339(&saved.made_at)
        .context("the plan's made_at is not a time")?;
    let age = (chrono::Utc::now() - made.with_timezone(&chrono::Utc))
        .to_std()
        .unwrap_or_default();
    if age > limits.max_age {
        return Err(Stopped::error(format!(
            "the plan was made at {} ({} ago), more than --max-plan-age {}; nothing was changed. Make a new plan and review it, or give a longer --max-plan-age",
            saved.made_at,
            crate::config::format_duration(Duration::from_secs(age.as_secs())),
            crate::config::format_duration(limits.max_age)
        )));
    }
    drift(saved, now, limits)
}

/// The shapes the tables should have now, and the step that left them. No step done since the
/// plan: the plan's. Steps done since that are the plan's own first steps, each migration among
/// them run by an apply of this plan: those recorded after the last of them it ran (a repair
/// step or a gate run otherwise leaves the shapes as they were). Otherwise None: the release
/// moved on.
fn expected_shapes<'a>(
    saved: &'a Fingerprint,
    now: &Fingerprint,
    steps: &[Step],
    recorded: &'a BTreeMap<usize, Shapes>,
) -> Option<(&'a Shapes, Option<usize>)> {
    let since: Vec<usize> = now
        .done_steps
        .iter()
        .filter(|s| !saved.done_steps.contains(s))
        .copied()
        .collect();
    let unaccounted = since.iter().any(|n| {
        matches!(steps.get(n - 1), Some(Step::Migrate { .. })) && !recorded.contains_key(n)
    });
    if unaccounted
        || !saved.covers.starts_with(&since)
        || !saved.done_steps.iter().all(|s| now.done_steps.contains(s))
    {
        return None;
    }
    Some(
        match since.iter().rev().find(|n| recorded.contains_key(n)) {
            Some(n) => (&recorded[n], Some(*n)),
            None => (&saved.tables, None),
        },
    )
}

fn check_identity(saved: &Fingerprint, now: &Fingerprint) -> Result<()> {
    let (a, b) = (&saved.server, &now.server);
    let mut other = Vec::new();
    let mut differ = |what: &str, then: &dyn std::fmt::Display, here: &dyn std::fmt::Display| {
        if then.to_string() != here.to_string() {
            other.push(format!("{what} {here} (the plan's: {then})"));
        }
    };
    differ(
        "server system_identifier",
        &a.system_identifier,
        &b.system_identifier,
    );
    differ("database OID", &a.database_oid, &b.database_oid);
    differ("database", &a.dbname, &b.dbname);
    differ("host", &a.host, &b.host);
    differ("port", &a.port, &b.port);
    differ("role", &a.role, &b.role);
    differ("server timeline", &a.timeline, &b.timeline);
    differ("schema", &saved.schema, &now.schema);
    differ("pgmend version", &saved.pgmend_version, &now.pgmend_version);
    if a.timeline != b.timeline || a.host != b.host || a.port != b.port {
        other.push("the server reached is not the one the plan was made on (after a failover a promoted standby starts a new timeline): what the plan predicted may not hold on it".into());
    }
    if !other.is_empty() {
        bail!(
            "the plan was made for another target: {}; nothing was changed. Apply it where it was made, or make a plan here",
            other.join(", ")
        );
    }
    let files = differing(&saved.files, &now.files);
    if !files.is_empty() {
        bail!(
            "files differ from the ones the plan was made from: {}; nothing was changed. Use the files that were reviewed, or make a new plan and review it",
            files.join(", ")
        );
    }
    Ok(())
}

/// The names whose digest differs, or that only one side has.
pub(crate) fn differing(
    then: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut names: Vec<String> = then
        .iter()
        .filter(|(k, v)| now.get(*k) != Some(v))
        .map(|(k, _)| match now.contains_key(k) {
            true => k.clone(),
            false => format!("{k} (gone)"),
        })
        .collect();
    names.extend(
        now.keys()
            .filter(|k| !then.contains_key(*k))
            .map(|k| format!("{k} (new)")),
    );
    names
}

/// The next data step the plan covers: its counts now against the plan's.
fn drift(saved: &Fingerprint, now: &Fingerprint, limits: &Limits) -> Result<Vec<String>> {
    let Some(then) = saved
        .data_steps
        .iter()
        .find(|s| saved.covers.contains(&s.step) && !now.done_steps.contains(&s.step))
    else {
        return Ok(Vec::new());
    };
    let Some(here) = now.data_steps.iter().find(|s| s.step == then.step) else {
        return Ok(Vec::new());
    };
    let mut moved = Vec::new();
    let mut past = false;
    // A resumed step is judged by what it has left plus what its run has done.
    let done = |s: &StepFigures| {
        s.resumed
            .clone()
            .map_or((0, 0), |u| (u.changes, u.voided_or_created))
    };
    let (then_done, here_done) = (done(then), done(here));
    for (what, a, b, by_run) in [
        (
            "changes",
            then.changes + then_done.0,
            here.changes + here_done.0,
            here_done.0,
        ),
        (
            "voided or created",
            then.voided_or_created + then_done.1,
            here.voided_or_created + here_done.1,
            here_done.1,
        ),
    ] {
        if a == b {
            continue;
        }
        let bound = ((a as f64 * limits.max_drift).ceil() as i64).max(DRIFT_FLOOR_ROWS);
        past |= (b - a).abs() > bound;
        let resumed = match &here.resumed {
            Some(u) => format!(" ({by_run} done by run {}, {} left)", u.run_id, b - by_run),
            None => String::new(),
        };
        moved.push(format!(
            "step {} ({}) {what}: {a} in the plan, {b} now{resumed} ({:+}, limit ±{bound})",
            then.step,
            then.label,
            b - a
        ));
    }
    if past {
        return Err(Stopped::error(format!(
            "the next data step's counts moved past --max-drift {} since the plan was made: {}; nothing was changed. Make a new plan and review it (or stop what writes them)",
            limits.max_drift,
            moved.join("; ")
        )));
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_covers_the_steps_up_to_the_next_gate() {
        let steps = super::super::Definition::built_in().steps;
        assert_eq!(covers(&steps, &[]), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(covers(&steps, &[1, 2, 3, 4, 5, 6, 7]), [8, 9, 10, 11]);
    }

    fn print(changes: i64) -> Fingerprint {
        Fingerprint {
            made_at: chrono::Utc::now().to_rfc3339(),
            server: Server {
                system_identifier: "7".into(),
                database_oid: 16384,
                host: "db".into(),
                port: 5432,
                dbname: "shop".into(),
                role: "owner".into(),
                timeline: 1,
            },
            schema: "public".into(),
            pgmend_version: "0".into(),
            files: BTreeMap::from([("release.toml".into(), "a".into())]),
            tables: BTreeMap::from([("campaigns".into(), "b".into())]),
            done_steps: vec![1],
            covers: vec![2, 3, 4],
            data_steps: vec![StepFigures {
                step: 4,
                label: "repair void-duplicate-coupons".into(),
                changes,
                voided_or_created: changes,
                yen: 0,
                resumed: None,
            }],
        }
    }

    fn steps() -> Vec<Step> {
        super::super::Definition::built_in().steps
    }

    const LIMITS: Limits = Limits {
        max_age: Duration::from_secs(86_400),
        max_drift: DEFAULT_MAX_DRIFT,
    };

    /// `check` with no step recorded by an apply of the plan.
    fn unrecorded(saved: &Fingerprint, now: &Fingerprint) -> Result<Vec<String>> {
        check(saved, now, &steps(), &BTreeMap::new(), &LIMITS)
    }

    fn exit_code(e: anyhow::Error) -> u8 {
        crate::error::exit_code_for(&e)
    }

    #[test]
    fn drift_is_bounded_by_a_share_and_never_less_than_100_rows() {
        let plan = print(4000);
        assert!(unrecorded(&plan, &print(4000)).unwrap().is_empty());
        let moved = unrecorded(&plan, &print(4200)).unwrap();
        assert_eq!(moved.len(), 2);
        assert!(
            moved[0].contains("4000 in the plan, 4200 now (+200, limit ±200)"),
            "{moved:?}"
        );
        let past = unrecorded(&plan, &print(4201)).unwrap_err();
        assert_eq!(exit_code(past), 1);
        // A small count may move by 100 rows.
        assert!(unrecorded(&print(10), &print(110)).is_ok());
        assert!(unrecorded(&print(10), &print(111)).is_err());
    }

    #[test]
    fn a_resumed_step_is_judged_by_what_it_has_left_plus_what_its_run_did() {
        let plan = print(4000);
        let resumed = |left: i64, done: i64| {
            let mut now = print(left);
            now.data_steps[0].resumed = Some(Unfinished {
                run_id: 7,
                changes: done,
                voided_or_created: done,
            });
            now
        };
        assert!(unrecorded(&plan, &resumed(1000, 3000)).unwrap().is_empty());
        let moved = unrecorded(&plan, &resumed(1010, 3000)).unwrap();
        assert!(
            moved[0].contains(
                "4000 in the plan, 4010 now (3000 done by run 7, 1010 left) (+10, limit ±200)"
            ),
            "{moved:?}"
        );
        // Without the run's part, what is left looks like 3,000 rows gone.
        assert_eq!(exit_code(unrecorded(&plan, &print(1000)).unwrap_err()), 1);
        assert_eq!(
            exit_code(unrecorded(&plan, &resumed(1000, 2000)).unwrap_err()),
            1
        );
    }

    #[test]
    fn a_plan_whose_walk_finished_its_gate_and_repair_steps_may_go_on_but_not_past_a_migration() {
        let after_gate = |done: &[usize]| {
            let mut p = print(10);
            p.done_steps = done.to_vec();
            p.covers = vec![8, 9, 10, 11];
            p.data_steps[0].step = 10;
            p
        };
        let plan = after_gate(&[1, 2, 3, 4, 5, 6, 7]);
        for (done, ok) in [
            (&[1, 2, 3, 4, 5, 6, 7, 8][..], true),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9], true),
            // Not the plan's first steps, or a migration among them, or a step undone.
            (&[1, 2, 3, 4, 5, 6, 7, 9], false),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], false),
            (&[1, 2, 3, 4, 5, 6, 8], false),
        ] {
            let r = unrecorded(&plan, &after_gate(done));
            assert_eq!(r.is_ok(), ok, "{done:?}: {r:?}");
        }
        // Before the gate, V2 done since the plan is a migration: refused.
        let mut now = print(10);
        now.done_steps = vec![1, 2];
        let e = unrecorded(&print(10), &now).unwrap_err();
        assert!(format!("{e:#}").contains("the release moved on"), "{e:#}");
    }

    #[test]
    fn past_its_own_migrations_a_plan_is_compared_with_the_shapes_they_left() {
        let plan = print(10);
        let mut now = print(10);
        now.done_steps = vec![1, 2, 3];
        now.tables.insert("campaigns".into(), "after V2".into());
        let after = |step: usize, shape: &str| {
            BTreeMap::from([(step, BTreeMap::from([("campaigns".into(), shape.into())]))])
        };
        let mut both = after(2, "after V2");
        both.extend(after(3, "after V2"));
        assert!(check(&plan, &now, &steps(), &both, &LIMITS).is_ok());
        // Someone changed the table after step 3: named, a stop.
        let mut moved = both.clone();
        moved.extend(after(3, "after V3"));
        let e = check(&plan, &now, &steps(), &moved, &LIMITS).unwrap_err();
        assert!(
            format!("{e:#}").contains("the shape of campaigns differs from what step 3"),
            "{e:#}"
        );
        assert_eq!(exit_code(e), 1);
        // V2 not run by this plan: the release moved on.
        let e = check(&plan, &now, &steps(), &after(3, "after V2"), &LIMITS).unwrap_err();
        assert!(format!("{e:#}").contains("the release moved on"), "{e:#}");
    }

    #[test]
    fn another_target_or_file_is_an_error_and_a_moved_table_a_stop() {
        let plan = print(10);
        let mut other = print(10);
        other.server.database_oid = 1;
        let e = unrecorded(&plan, &other).unwrap_err();
        assert!(format!("{e:#}").contains("database OID 1 (the plan's: 16384)"));
        assert_eq!(exit_code(e), 2);
        let mut other = print(10);
        other.files.insert("repairs/new.toml".into(), "c".into());
        let e = unrecorded(&plan, &other).unwrap_err();
        assert!(format!("{e:#}").contains("repairs/new.toml (new)"));
        assert_eq!(exit_code(e), 2);
        let mut other = print(10);
        other.tables.insert("campaigns".into(), "changed".into());
        let e = unrecorded(&plan, &other).unwrap_err();
        assert!(format!("{e:#}").contains("the shape of campaigns differs"));
        assert_eq!(exit_code(e), 1);
    }

    #[test]
    fn the_seal_is_the_digest_of_the_document_without_it() {
        let (text, digest) = seal(&serde_json::json!({"b": 1, "a": [2]})).unwrap();
        assert_eq!(digest, sha256_hex(r#"{"a":[2],"b":1}"#));
        let p = std::path::Path::new("p.json");
        assert!(format!("{:#}", open(p, &text, None).err().unwrap()).contains("fingerprint"));
        let edited = text.replace("[\n    2\n  ]", "[\n    3\n  ]");
        assert_ne!(edited, text);
        assert!(format!("{:#}", open(p, &edited, None).err().unwrap()).contains("was changed"));
    }
}
