//! `pgmend verify`: one REPEATABLE READ, READ ONLY snapshot (a hot standby will do).
//!
//! Loads the release (`--release DIR` or the current directory; none: exit 2), calls
//! `crate::verify::run` with it and the migration history in that snapshot and renders its
//! `Verification`: a failed invariant exits 1, anomalies do not change the exit code.

use std::io::Write;

use anyhow::Result;
use tabled::Tabled;

use super::{open_to_read, print_json, snapshot};
use crate::cli::{Format, VerifyArgs};
use crate::error::{Outcome, PgContext};

pub fn run(args: &VerifyArgs, format: Format) -> Result<Outcome> {
    super::metrics_output_needs_openmetrics(&args.metrics, format)?;
    let loaded = match super::load_release(&args.project) {
        Ok(loaded) => loaded,
        Err(e) => {
            // The metrics file says the check could not run, as for any later failure.
            if format == Format::Openmetrics {
                let now = super::unix_now();
                super::emit_metrics(&args.metrics, "verify", false, |last| {
                    crate::metrics::verify("unknown", None, now, last)
                })?;
            }
            return Err(e);
        }
    };
    let release = loaded.release();
    let checked = check(args, &release);
    if format == Format::Openmetrics {
        let now = super::unix_now();
        let result = checked.as_ref().ok().map(|(r, _, _)| r);
        let written = super::emit_metrics(&args.metrics, "verify", checked.is_ok(), |last| {
            crate::metrics::verify(release.name, result, now, last)
        });
        // The check's own error first: the file says it could not run.
        let outcome = outcome(&checked?.0);
        written?;
        return Ok(outcome);
    }
    let (result, header, environment) = checked?;
    match format {
        Format::Json => print_json(&result)?,
        _ => {
            #[derive(Tabled)]
            struct Row {
                check: String,
                status: &'static str,
                detail: String,
            }
            // The samples (JSON rows, hundreds of characters) go below the table: in a cell
            // they would pad every row to their width.
            let row = |c: &crate::verify::Check, bad: &'static str| Row {
                check: c.name.clone(),
                status: if c.ok { "ok" } else { bad },
                detail: if c.violations > 0 && !c.sample.is_empty() {
                    format!(
                        "{} {} (the first below)",
                        crate::human::int(c.violations),
                        c.detail
                    )
                } else {
                    c.detail.clone()
                },
            };
            let mut rows: Vec<Row> = result.checks.iter().map(|c| row(c, "FAILED")).collect();
            rows.extend(result.anomalies.iter().map(|c| row(c, "look")));
            let mut out = crate::output::stdout();
            writeln!(out, "{header}")?;
            writeln!(out, "{environment}")?;
            writeln!(out, "{}", crate::human::table(rows))?;
            let sampled = result.checks.iter().chain(&result.anomalies);
            for c in sampled.filter(|c| c.violations > 0 && !c.sample.is_empty()) {
                writeln!(
                    out,
                    "{}: the first {} of {}:",
                    c.name,
                    c.sample.len(),
                    crate::human::int(c.violations)
                )?;
                for s in &c.sample {
                    writeln!(out, "  {s}")?;
                }
            }
            writeln!(
                out,
                "{}",
                if result.ok {
                    "Every invariant holds."
                } else {
                    "Some invariants do not hold (exit 1)."
                }
            )?;
        }
    }
    Ok(outcome(&result))
}

fn outcome(result: &crate::verify::Verification) -> Outcome {
    if result.ok {
        Outcome::Done
    } else {
        Outcome::Findings
    }
}

/// The release's invariants checked in one snapshot, with the header line (server and
/// version) and what the pre-flight found.
fn check(
    args: &VerifyArgs,
    release: &crate::release::Release,
) -> Result<(
    crate::verify::Verification,
    String,
    crate::preflight::Environment,
)> {
    let tables = release.tables();
    let (mut session, environment) = open_to_read(&args.conn, "verify", &tables)?;
    let mut tx = snapshot(&mut session.client)?;
    let applied: Vec<i32> = crate::migrate::history::read(&mut tx)?
        .iter()
        .map(|a| a.version)
        .collect();
    let result = crate::verify::run(&mut tx, release, &applied)?;
    tx.rollback().doing("closing the snapshot")?;
    let header = format!("{} (PostgreSQL {})", session.params, session.server_version);
    Ok((result, header, environment))
}
