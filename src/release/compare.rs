//! `pgmend plan --compare STAGING-PLAN.json`: the plan made here beside the one `plan --output`
//! wrote on staging, step by step: the files and table shapes that differ, each step's counts
//! (rows changed, voided or created, the yen moved, each census's violators) and estimated
//! duration, and the steps the rehearsal did not exercise: a count of zero (or not counted)
//! there and more than zero here, so what production will do was never tried.
//!
//! Both plans are read as the same documents ([`PlanDoc`]); comparing and rendering are pure.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::estimate::Estimate;
use super::fingerprint::{self, Fingerprint};
use crate::human;
use crate::report::markdown_text;

/// The parts of a plan document (`plan --format json`, `plan --output`) a comparison reads.
#[derive(Debug, Deserialize)]
pub struct PlanDoc {
    #[serde(skip)]
    pub digest: String,
    pub steps: Vec<StepDoc>,
    pub fingerprint: Fingerprint,
}

#[derive(Debug, Deserialize)]
pub struct StepDoc {
    pub step: usize,
    pub kind: String,
    pub version: Option<i32>,
    pub name: Option<String>,
    pub done: bool,
    pub repair: Option<RepairDoc>,
    pub migration: Option<MigrationDoc>,
    #[serde(default)]
    pub predicted_censuses: Vec<CensusDoc>,
    pub estimate: Option<Estimate>,
}

#[derive(Debug, Deserialize)]
pub struct RepairDoc {
    pub changes: i64,
    pub voided_or_created: i64,
    #[serde(default)]
    pub amounts: BTreeMap<String, i64>,
}

#[derive(Debug, Deserialize)]
pub struct MigrationDoc {
    #[serde(default)]
    pub censuses: Vec<CensusDoc>,
}

#[derive(Debug, Deserialize)]
pub struct CensusDoc {
    pub name: String,
    pub violators: Option<i64>,
}

impl StepDoc {
    fn label(&self) -> String {
        let name = self.name.clone().unwrap_or_default();
        match (self.kind.as_str(), self.version) {
            ("migrate", Some(v)) => format!("migration V{v}"),
            ("repair", _) => format!("repair {name}"),
            (kind, _) => format!("{kind} {name}"),
        }
    }

    /// Each count the step predicts, by what it counts (None: not counted).
    fn counts(&self) -> Vec<(String, Option<i64>)> {
        let mut out = Vec::new();
        if let Some(r) = &self.repair {
            out.push(("rows changed".into(), Some(r.changes)));
            out.push(("rows voided or created".into(), Some(r.voided_or_created)));
            out.push(("yen".into(), Some(r.amounts.values().sum())));
        }
        for c in self.migration.iter().flat_map(|m| &m.censuses) {
            out.push((format!("census {}", c.name), c.violators));
        }
        for c in &self.predicted_censuses {
            out.push((format!("census {} (predicted)", c.name), c.violators));
        }
        out
    }
}

/// Reads a plan file: refused (exit 2) when it is not JSON, has no or a wrong `plan_sha256`,
/// or lacks the plan's steps and fingerprint.
pub fn open(path: &Path, text: &str) -> Result<PlanDoc> {
    let saved = fingerprint::open(path, text, None)?;
    let mut doc: PlanDoc = serde_json::from_str(text).with_context(|| {
        format!(
            "{} is not a plan file (pgmend plan --output): its steps cannot be read",
            path.display()
        )
    })?;
    doc.digest = saved.digest;
    Ok(doc)
}

/// One step of the two plans side by side.
#[derive(Debug, Serialize)]
pub struct StepComparison {
    pub step: usize,
    pub label: String,
    /// Each count that differs.
    pub counts: Vec<CountDiff>,
    pub estimated_milliseconds: (Option<u64>, Option<u64>),
    /// Done on one side only, or another step altogether.
    pub notes: Vec<String>,
    /// Done on both sides: nothing to compare.
    pub done_on_both: bool,
    /// Why the rehearsal did not exercise this step, if it did not.
    pub not_exercised: Option<String>,
}

/// A count that differs (None: not counted on that side).
#[derive(Debug, Serialize)]
pub struct CountDiff {
    pub what: String,
    pub staging: Option<i64>,
    pub here: Option<i64>,
}

/// How the plan made here differs from the staging plan.
#[derive(Debug, Serialize)]
pub struct Comparison {
    pub staging_plan_sha256: String,
    pub staging_made_at: String,
    pub staging_target: String,
    pub files_differ: Vec<String>,
    pub tables_differ: Vec<String>,
    pub steps: Vec<StepComparison>,
    pub not_exercised: Vec<usize>,
    pub counts_differ: Vec<usize>,
}

pub fn compare(staging: &PlanDoc, here: &PlanDoc) -> Comparison {
    let s = &staging.fingerprint.server;
    let mut steps = Vec::new();
    for h in &here.steps {
        let there = staging.steps.iter().find(|t| t.step == h.step);
        steps.push(step(there, h));
    }
    Comparison {
        staging_plan_sha256: staging.digest.clone(),
        staging_made_at: staging.fingerprint.made_at.clone(),
        staging_target: format!(
            "host={} port={} dbname={} user={}",
            s.host, s.port, s.dbname, s.role
        ),
        files_differ: fingerprint::differing(&staging.fingerprint.files, &here.fingerprint.files),
        tables_differ: fingerprint::differing(
            &staging.fingerprint.tables,
            &here.fingerprint.tables,
        ),
        not_exercised: steps
            .iter()
            .filter(|s| s.not_exercised.is_some())
            .map(|s| s.step)
            .collect(),
        counts_differ: steps
            .iter()
            .filter(|s| !s.counts.is_empty())
            .map(|s| s.step)
            .collect(),
        steps,
    }
}

fn step(there: Option<&StepDoc>, here: &StepDoc) -> StepComparison {
    let mut c = StepComparison {
        step: here.step,
        label: here.label(),
        counts: Vec::new(),
        estimated_milliseconds: (
            there
                .and_then(|t| t.estimate.as_ref())
                .map(|e| e.milliseconds),
            here.estimate.as_ref().map(|e| e.milliseconds),
        ),
        notes: Vec::new(),
        done_on_both: false,
        not_exercised: None,
    };
    let Some(there) = there else {
        c.notes.push("the staging plan has no such step".into());
        return c;
    };
    if there.label() != here.label() {
        c.notes.push(format!(
            "staging's step {} is {}",
            there.step,
            there.label()
        ));
        return c;
    }
    match (there.done, here.done) {
        (true, false) => c
            .notes
            .push("done on staging when its plan was made, pending here".into()),
        (false, true) => c
            .notes
            .push("pending on staging when its plan was made, done here".into()),
        _ => {}
    }
    if there.done || here.done {
        c.done_on_both = there.done && here.done;
        return c;
    }
    let theirs = there.counts();
    let mut unexercised = Vec::new();
    for (what, mine) in here.counts() {
        let other = theirs
            .iter()
            .find(|(w, _)| *w == what)
            .and_then(|(_, n)| *n);
        if other == mine {
            continue;
        }
        if mine.is_some_and(|n| n > 0) && other.unwrap_or(0) == 0 && !what.starts_with("yen") {
            unexercised.push(format!(
                "{what}: {} there, {} here",
                other.map_or("not counted".into(), human::int),
                human::int(mine.unwrap_or(0))
            ));
        }
        c.counts.push(CountDiff {
            what,
            staging: other,
            here: mine,
        });
    }
    if !unexercised.is_empty() {
        c.not_exercised = Some(unexercised.join("; "));
    }
    c
}

fn seconds(ms: Option<u64>) -> String {
    ms.map_or("-".into(), human::millis)
}

fn number(n: Option<i64>) -> String {
    n.map_or("not counted".into(), human::int)
}

fn list(steps: &[usize]) -> String {
    if steps.is_empty() {
        return "none".into();
    }
    steps
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// For people: the differences first, then each step.
pub fn render_human(out: &mut impl Write, c: &Comparison, file: &str) -> io::Result<()> {
    writeln!(out, "The plan made here, compared with the staging plan {file} (plan_sha256 {}, made at {} on {}):", c.staging_plan_sha256, c.staging_made_at, c.staging_target)?;
    let same = |v: &[String]| {
        if v.is_empty() {
            "the same".to_string()
        } else {
            format!("differ: {}", v.join(", "))
        }
    };
    writeln!(out, "files: {}", same(&c.files_differ))?;
    writeln!(out, "table shapes: {}", same(&c.tables_differ))?;
    writeln!(
        out,
        "not exercised by the rehearsal: {}",
        list(&c.not_exercised)
    )?;
    writeln!(out, "counts differ: {}", list(&c.counts_differ))?;
    for s in &c.steps {
        if s.done_on_both {
            writeln!(out, "\nstep {} ({}): done on both", s.step, s.label)?;
            continue;
        }
        writeln!(
            out,
            "\nstep {} ({}): estimated {} on staging, {} here",
            s.step,
            s.label,
            seconds(s.estimated_milliseconds.0),
            seconds(s.estimated_milliseconds.1)
        )?;
        for n in &s.notes {
            writeln!(out, "   {n}")?;
        }
        if let Some(why) = &s.not_exercised {
            writeln!(out, "   NOT EXERCISED by the rehearsal: {why}")?;
        }
        for d in &s.counts {
            writeln!(
                out,
                "   {}: {} on staging, {} here",
                d.what,
                number(d.staging),
                number(d.here)
            )?;
        }
    }
    Ok(())
}

/// For a change ticket: one table, every cell escaped.
pub fn render_markdown(out: &mut impl Write, c: &Comparison, file: &str) -> io::Result<()> {
    let t = markdown_text;
    writeln!(out, "# Plan compared with the staging rehearsal\n")?;
    writeln!(
        out,
        "Staging plan {} (plan\\_sha256 {}, made at {} on {}).\n",
        t(file),
        t(&c.staging_plan_sha256),
        t(&c.staging_made_at),
        t(&c.staging_target)
    )?;
    let names = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            t(&v.join(", "))
        }
    };
    writeln!(out, "- Files that differ: {}", names(&c.files_differ))?;
    writeln!(
        out,
        "- Table shapes that differ: {}",
        names(&c.tables_differ)
    )?;
    writeln!(
        out,
        "- Not exercised by the rehearsal: steps {}",
        list(&c.not_exercised)
    )?;
    writeln!(out, "- Counts differ: steps {}\n", list(&c.counts_differ))?;
    writeln!(out, "| step | what | staging | here | estimated on staging | estimated here | note |\n|---:|---|---|---|---:|---:|---|")?;
    for s in &c.steps {
        let there: Vec<String> = s
            .counts
            .iter()
            .map(|d| format!("{}: {}", d.what, number(d.staging)))
            .collect();
        let here: Vec<String> = s
            .counts
            .iter()
            .map(|d| format!("{}: {}", d.what, number(d.here)))
            .collect();
        let mut note = s.notes.clone();
        if let Some(why) = &s.not_exercised {
            note.insert(0, format!("NOT EXERCISED: {why}"));
        }
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.step,
            t(&s.label),
            t(&there.join("; ")),
            t(&here.join("; ")),
            seconds(s.estimated_milliseconds.0),
            seconds(s.estimated_milliseconds.1),
            t(&note.join("; "))
        )?;
    }
    Ok(())
}
