//! `pgmend plan --format markdown`: the release's dry run as a change ticket (a pull request
//! or a ticket system's Markdown): a summary table with each pending step's estimated duration
//! and where it comes from, the totals per campaign, then each step with its statements and
//! locks, its SQL, its censuses and a sample of its diffs.
//!
//! Whatever comes from the database or the files (names, keys, values, SQL, census samples)
//! never becomes Markdown or HTML: in text and table cells it goes through
//! [`markdown_text`] (HTML as entities, Markdown's punctuation backslash-escaped), and SQL sits
//! in a fenced block whose fence is longer than any run of backticks inside it.

use std::io::{self, Write};

use super::dry_run::StepPlan;
use super::Step;
use crate::human;
use crate::report::markdown_text as text;

/// What the ticket shows: the plan's steps, for which target, and the saved file if any.
pub struct Ticket<'a> {
    /// The connection target, as `ConnParams` displays it (never the password).
    pub target: String,
    pub made_at: &'a str,
    pub steps: &'a [StepPlan<'a>],
    pub blockers: &'a [String],
    /// The plan file written with it (`--output`) and its `plan_sha256`.
    pub saved: Option<(String, String)>,
}

/// Counter keys listed per step in the totals; past that, the JSON plan has them.
const KEYS_LISTED: usize = 20;

pub fn render(out: &mut impl Write, t: &Ticket) -> io::Result<()> {
    writeln!(out, "# Release plan\n")?;
    writeln!(
        out,
        "Made by `pgmend plan` at {} on {}, in read-only transactions (nothing was changed).\n",
        text(t.made_at),
        text(&t.target)
    )?;
    if let Some((file, digest)) = &t.saved {
        writeln!(
            out,
            "Saved as {} with plan\\_sha256 {}. Apply exactly this plan with:\n",
            text(file),
            text(digest)
        )?;
        code_block(
            out,
            "sh",
            &format!("pgmend apply --plan {file} --plan-sha256 {digest} --yes"),
        )?;
    }
    if !t.blockers.is_empty() {
        writeln!(
            out,
            "## Blockers\n\n`apply` would stop before changing anything:\n"
        )?;
        for b in t.blockers {
            writeln!(out, "- {}", text(b))?;
        }
        writeln!(out)?;
    }
    summary(out, t.steps)?;
    totals(out, t.steps)?;
    for plan in t.steps.iter().filter(|p| !p.done) {
        step(out, plan)?;
    }
    Ok(())
}

fn summary(out: &mut impl Write, steps: &[StepPlan]) -> io::Result<()> {
    writeln!(out, "## Steps\n")?;
    writeln!(
        out,
        "| step | what | status | estimated duration | estimate from |"
    )?;
    writeln!(out, "|---:|---|---|---:|---|")?;
    let mut total = 0;
    for p in steps {
        let status = match (p.done, p.what) {
            (true, _) => "done",
            (false, Step::Gate { .. }) => "waits for a person",
            (false, _) => "pending",
        };
        let (time, from) = match &p.estimate {
            Some(e) => {
                total += e.milliseconds;
                (e.shown(), text(&e.from))
            }
            None => (String::new(), String::new()),
        };
        writeln!(
            out,
            "| {} | {} | {status} | {time} | {from} |",
            p.step,
            text(&p.what.label())
        )?;
    }

    writeln!(
        out,
        "\nEstimated total for the pending steps: **{}** (a gate's wait for people not counted).\n",
        human::millis(total)
    )
}

/// The amount each pending repair moves, per key (a void: per group's `report_by`).
fn totals(out: &mut impl Write, steps: &[StepPlan]) -> io::Result<()> {
    let with = steps
        .iter()
        .filter(|p| !p.done)
        .filter_map(|p| p.repair.as_ref().map(|r| (p, r)));
    let mut any = false;
    for (p, r) in with.filter(|(_, r)| !r.amounts.is_empty()) {
        if !any {
            writeln!(out, "## Totals per key of each repair\n")?;
            any = true;
        }
        let what = match r.kind {
            crate::repair::definition::Kind::VoidDuplicates => "the amount of the rows it voids",
            crate::repair::definition::Kind::RebuildCounter => "new counter minus old",
            crate::repair::definition::Kind::Backfill
            | crate::repair::definition::Kind::Orphans => "the amount",
        };
        writeln!(
            out,
            "Step {} ({}), {what}:\n",
            p.step,
            text(&p.what.label())
        )?;
        writeln!(out, "| key | amount |\n|---|---:|")?;
        for (key, yen) in r.amounts.iter().take(KEYS_LISTED) {
            writeln!(out, "| {} | {} |", text(key), human::int(*yen))?;
        }
        writeln!(
            out,
            "| **total** | **{}** |\n",
            human::int(r.amounts.values().sum::<i64>())
        )?;
        if r.amounts.len() > KEYS_LISTED {
            // The preview lists the first 1,000 keys of a counter; the total is theirs.
            writeln!(
                out,
                "(the first {KEYS_LISTED} of {} keys{}; `pgmend plan --format json` lists them)\n",
                human::int(r.amounts.len() as i64),
                if r.amounts.len() >= 1000 && (r.changes as usize) > r.amounts.len() {
                    format!(
                        ", of {} that change: the total is the listed keys'",
                        human::int(r.changes)
                    )
                } else {
                    String::new()
                }
            )?;
        }
    }
    Ok(())
}

fn step(out: &mut impl Write, p: &StepPlan) -> io::Result<()> {
    writeln!(out, "## Step {}: {}\n", p.step, text(&p.what.label()))?;
    if let Some(e) = &p.estimate {
        writeln!(
            out,
            "Estimated duration: **{}** ({}).\n",
            e.shown(),
            text(&e.from)
        )?;
    }
    match p.what {
        Step::Gate { name, explain } => {
            writeln!(out, "{}\n", text(explain))?;
            code_block(out, "sh", &format!("pgmend apply --yes --confirm {name}"))?;
        }
        Step::Migrate { .. } => {
            if let Some(m) = p.migration {
                migration(out, m, p)?;
            }
        }
        Step::Repair { .. } => repair(out, p)?,
    }
    Ok(())
}

fn migration(
    out: &mut impl Write,
    m: &crate::migrate::plan::PlannedMigration,
    p: &StepPlan,
) -> io::Result<()> {
    writeln!(
        out,
        "{} ({}), {}.\n",
        text(&format!("V{}__{}", m.version, m.name)),
        text(&m.origin),
        if m.in_transaction {
            "in one transaction with its history row"
        } else {
            "online: each statement in autocommit"
        }
    )?;
    writeln!(out, "| line | statement | locks |\n|---:|---|---|")?;
    for s in &m.statements {
        let locks: Vec<String> = s
            .locks
            .iter()
            .map(|l| format!("{} on {}", l.mode, l.relation))
            .collect();
        let locks = if locks.is_empty() {
            "no lock on existing tables".into()
        } else {
            locks.join(", ")
        };
        writeln!(
            out,
            "| {} | {} | {}{} |",
            s.line,
            text(&s.summary),
            text(&locks),
            if s.lock_assumed {
                " (not recognised: assumed)"
            } else {
                ""
            }
        )?;
    }
    writeln!(out)?;
    code_block(out, "sql", &m.sql)?;
    if !m.censuses.is_empty() {
        writeln!(out, "Censuses, counted now:\n")?;
        for f in &m.censuses {
            writeln!(
                out,
                "- {}{}",
                text(&f.describe()),
                if f.stops() {
                    " (apply stops here, exit 1)"
                } else {
                    ""
                }
            )?;
        }
        writeln!(out)?;
    }
    if !p.predicted_censuses.is_empty() {
        writeln!(
            out,
            "Censuses predicted on the data as the earlier pending steps leave it:\n"
        )?;
        for f in &p.predicted_censuses {
            writeln!(out, "- {}", text(&f.describe()))?;
        }
        writeln!(out)?;
    }
    for note in &m.existing_indexes {
        writeln!(out, "- {}", text(note))?;
    }
    Ok(())
}

fn repair(out: &mut impl Write, p: &StepPlan) -> io::Result<()> {
    if let Some(r) = &p.repair {
        writeln!(out, "{}\n", text(&r.description))?;
        writeln!(
            out,
            "Changes {}; {} {}.\n",
            human::count(r.changes, "row"),
            match r.kind {
                crate::repair::definition::Kind::VoidDuplicates => "voided",
                crate::repair::definition::Kind::RebuildCounter => "created",
                crate::repair::definition::Kind::Backfill => "set by its expressions",
                crate::repair::definition::Kind::Orphans => "quarantined",
            },
            human::int(r.voided_or_created)
        )?;
        if let Some(why) = &r.not_yet {
            writeln!(out, "Not computed yet: {}\n", text(why))?;
        }
    }
    if let Some(on) = &p.predicted_on {
        writeln!(out, "Predicted {}.\n", text(on))?;
    }
    if !p.sample.is_empty() {
        writeln!(out, "Sample of the changes:\n")?;
        writeln!(
            out,
            "| table | key | column | before | after | why |\n|---|---|---|---|---|---|"
        )?;
        for c in &p.sample {
            let none = String::new();
            for (column, after) in &c.after {
                let before = c.before.get(column).unwrap_or(&none);
                if before == after {
                    continue;
                }
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    text(&c.table),
                    text(&c.key),
                    text(column),
                    text(before),
                    text(after),
                    text(&c.reason)
                )?;
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

/// `body` in a fenced code block whose fence is longer than any run of backticks in it.
fn code_block(out: &mut impl Write, info: &str, body: &str) -> io::Result<()> {
    let longest = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    writeln!(out, "{fence}{info}\n{}\n{fence}\n", body.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_is_longer_than_any_backtick_run_inside() {
        let mut out = Vec::new();
        code_block(&mut out, "sql", "SELECT '````' AS x").unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("`````sql\n"), "{text}");
        assert!(text.ends_with("\n`````\n\n"), "{text}");
    }
}
