//! `--format openmetrics`: what `verify` and `repair status` found, in the OpenMetrics text
//! format (the Prometheus exposition format's successor) that node_exporter's textfile
//! collector and Prometheus read. Pure: the commands gather, this renders.
//!
//! Every family is a gauge named `pgmend_...` with a `# HELP` line and base units in its name
//! (`_seconds`), labels escaped as the format says, and the text ends with `# EOF`. Each
//! document carries `pgmend_<command>_up` (1: the check ran to the end, whatever it found; 0:
//! it could not run) and `pgmend_<command>_last_success_timestamp_seconds` (when it last ran to
//! the end: on a failed run, taken from the file it replaces, [`last_success`]), so that a
//! dashboard never shows a stale "all ok". The names and labels are documented in
//! docs/operating.md.

use std::fmt::Write;

use crate::store::runs::{Run, RunState};
use crate::verify::Verification;

/// A per-run gauge: its name, its help, and its value for a run.
type PerRun = (&'static str, &'static str, fn(&Run) -> f64);

/// One gauge family: its name, help, and samples (labels, value).
struct Family {
    name: String,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    fn new(name: &str, help: &'static str) -> Family {
        Family {
            name: name.to_string(),
            help,
            samples: Vec::new(),
        }
    }

    fn sample(mut self, labels: Vec<(&'static str, String)>, value: f64) -> Family {
        self.samples.push((labels, value));
        self
    }
}

/// A label value as the format writes it: `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families {
        let _ = writeln!(out, "# TYPE {} gauge", f.name);
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        for (labels, value) in &f.samples {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", labels.join(","))
            };
            let _ = writeln!(out, "{}{labels} {value}", f.name);
        }
    }
    out.push_str("# EOF\n");
    out
}

/// Whether the check ran, and when it last ran to the end.
fn liveness(
    command: &str,
    release: &[(&'static str, String)],
    ran_at: Option<f64>,
    last_success: Option<f64>,
) -> Vec<Family> {
    let mut families = vec![Family::new(
        &format!("pgmend_{command}_up"),
        "1 when the check ran to the end (whatever it found), 0 when it could not run",
    )
    .sample(release.to_vec(), if ran_at.is_some() { 1.0 } else { 0.0 })];
    if let Some(at) = ran_at.or(last_success) {
        families.push(
            Family::new(
                &format!("pgmend_{command}_last_success_timestamp_seconds"),
                "When the check last ran to the end, in seconds since the Unix epoch",
            )
            .sample(release.to_vec(), at),
        );
    }
    families
}

/// `verify`'s document for `release`: `verification` when it ran (at `now`), none when it
/// could not (then `last_success` is the previous document's).
pub fn verify(
    release: &str,
    verification: Option<&Verification>,
    now: f64,
    last_success: Option<f64>,
) -> String {
    let r = vec![("release", release.to_string())];
    let mut families = liveness("verify", &r, verification.map(|_| now), last_success);
    if let Some(v) = verification {
        families.push(
            Family::new(
                "pgmend_verify_invariants_hold",
                "1 when every invariant of the release holds (verify exits 0), 0 when one does not",
            )
            .sample(r.clone(), if v.ok { 1.0 } else { 0.0 }),
        );
        let mut ok = Family::new(
            "pgmend_verify_check_ok",
            "1 when the check holds; for an anomaly (kind anomaly), when nothing is worth a look",
        );
        let mut violations = Family::new(
            "pgmend_verify_check_violations",
            "How many rows, keys or objects break the check",
        );
        for (kind, checks) in [("invariant", &v.checks), ("anomaly", &v.anomalies)] {
            for c in checks.iter() {
                let labels = vec![
                    ("release", release.to_string()),
                    ("check", c.name.clone()),
                    ("kind", kind.to_string()),
                ];
                ok = ok.sample(labels.clone(), if c.ok { 1.0 } else { 0.0 });
                violations = violations.sample(labels, c.violations as f64);
            }
        }
        let mut amount = Family::new(
            "pgmend_verify_check_amount",
            "The sum the release declares for the check's breaking rows (the counters' drift in yen, for the coupon release)",
        );
        for (kind, checks) in [("invariant", &v.checks), ("anomaly", &v.anomalies)] {
            for c in checks.iter() {
                if let Some(a) = c.amount {
                    let labels = vec![
                        ("release", release.to_string()),
                        ("check", c.name.clone()),
                        ("kind", kind.to_string()),
                    ];
                    amount = amount.sample(labels, a as f64);
                }
            }
        }
        families.push(ok);
        families.push(violations);
        families.push(amount);
        families.push(
            Family::new(
                "pgmend_verify_unfinished_runs",
                "Repair runs not finished (running, or stopped before their end)",
            )
            .sample(r.clone(), v.unfinished_runs as f64),
        );
    }
    render(&families)
}

/// `repair status`'s document: each run's figures, and the runs by state; `runs` none when
/// it could not read them.
pub fn repair_status(runs: Option<&[Run]>, now: f64, last_success: Option<f64>) -> String {
    let mut families = liveness("repair_status", &[], runs.map(|_| now), last_success);
    if let Some(runs) = runs {
        let mut by_state = Family::new(
            "pgmend_repair_runs",
            "How many repair runs are in each state",
        );
        for state in [RunState::Running, RunState::Finished, RunState::Abandoned] {
            let n = runs.iter().filter(|r| r.state == state).count();
            by_state = by_state.sample(vec![("state", state.to_string())], n as f64);
        }
        families.push(by_state);
        let per_run: [PerRun; 6] = [
            ("pgmend_repair_run_paused", "1 while another session has paused the unfinished run (`pgmend repair pause`)", |r| f64::from(u8::from(r.steering.paused.is_some() && r.state == RunState::Running))),
            ("pgmend_repair_run_running", "1 while the run is unfinished (running or stopped before its end), 0 once finished or abandoned", |r| f64::from(u8::from(r.state == RunState::Running))),
            ("pgmend_repair_run_targets", "How many targets (keys or key ranges) the run froze", |r| r.targets as f64),
            ("pgmend_repair_run_targets_done", "How many of its targets the run has done (its checkpoint)", |r| r.checkpoint as f64),
            ("pgmend_repair_run_rows_changed", "How many rows the run changed (one ledger record each)", |r| r.changed as f64),
            ("pgmend_repair_run_keys_skipped", "How many keys the run skipped, each with its reason in `repair status`", |r| r.skipped.len() as f64),
        ];
        for (name, help, value) in per_run {
            let mut family = Family::new(name, help);
            for r in runs {
                family = family.sample(
                    vec![("run", r.run_id.to_string()), ("repair", r.repair.clone())],
                    value(r),
                );
            }
            families.push(family);
        }
    }
    render(&families)
}

/// The last success a previous document recorded (`text`, the file about to be replaced), for
/// a run that could not check.
pub fn last_success(text: &str, command: &str) -> Option<f64> {
    let name = format!("pgmend_{command}_last_success_timestamp_seconds");
    text.lines()
        .filter(|l| l.starts_with(&name))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_the_text_ends_with_eof() {
        let text = render(&[
            Family::new("pgmend_x", "help").sample(vec![("check", "a\"b\\c\nd".into())], 1.0)
        ]);
        assert_eq!(
            text,
            "# TYPE pgmend_x gauge\n# HELP pgmend_x help\npgmend_x{check=\"a\\\"b\\\\c\\nd\"} 1\n# EOF\n"
        );
    }

    #[test]
    fn a_failed_run_keeps_the_last_success_of_the_file_it_replaces() {
        let ok = verify("r", None, 0.0, Some(1700000000.0));
        assert!(ok.contains("pgmend_verify_up{release=\"r\"} 0\n"));
        assert_eq!(last_success(&ok, "verify"), Some(1700000000.0));
        assert_eq!(last_success("", "verify"), None);
    }
}
