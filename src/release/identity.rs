//! A release's identity on a database: several releases run on one database one after another,
//! each under its `name`, its step records and gates keyed by it (`store::releases`,
//! `store::records`), its migrations numbered in the one history all releases share.
//!
//! [`standings`] reads every other release recorded, with the first of its steps not done (its
//! steps from its record; the coupon release adopted from records older than release
//! identities, or from its migrations in the history, has none recorded and takes the built-in
//! release's). [`check`] refuses (exit 2, before any change) work for a release while another is
//! unfinished, naming it, that step and the command that finishes it, and a release whose steps
//! apply a migration version another release's steps apply (one history: the second release
//! numbers after the first). `apply`, `migrate apply`, `migrate baseline` and `repair apply`
//! call it before they ask; `plan` shows its refusal as a blocker. [`other_versions`] are the
//! versions `migrate::status` takes as another release's. [`enter`] records the release as started (or continued) with the
//! digest of its files, once the walk begins; [`finish`] when every step is done.

use anyhow::{bail, Context, Result};
use postgres::GenericClient;

use super::{progress, Definition, Release, Step, COUPON_RELEASE};
use crate::migrate::history;
use crate::migrate::source::Source;
use crate::store::{self, releases::Recorded};

/// Another release recorded on the database, and where it stands.
pub struct Standing {
    pub recorded: Recorded,
    pub steps: Vec<Step>,
    /// The first step not done (1-based, with its label); none when it is finished.
    pub pending: Option<(usize, String)>,
}

/// Every release recorded on the database other than `me`, with its steps. The coupon release
/// counts as recorded, with the built-in release's steps, when an older pgmend left its records
/// (`store::releases`) or only its migrations: the history holds a coupon migration after V1,
/// by version and name.
fn others(client: &mut impl GenericClient, me: &str) -> Result<Vec<(Recorded, Vec<Step>)>> {
    let mut recorded = store::releases::all(client)?;
    if me != COUPON_RELEASE && !recorded.iter().any(|r| r.name == COUPON_RELEASE) {
        let history = history::read(client)?;
        let built_in = Source::Embedded.load()?;
        let coupon_applied = history.iter().any(|a| {
            a.version > 1
                && built_in
                    .iter()
                    .any(|m| m.version == a.version && m.name == a.name)
        });
        if coupon_applied {
            recorded.insert(
                0,
                Recorded {
                    name: COUPON_RELEASE.into(),
                    digest: "adopted: its migrations are in the history".into(),
                    steps: None,
                    started_by: String::new(),
                    started_at: String::new(),
                    finished_at: None,
                },
            );
        }
    }
    let mut out = Vec::new();
    for r in recorded.into_iter().filter(|r| r.name != me) {
        let steps: Vec<Step> = match &r.steps {
            Some(json) => serde_json::from_str(json)
                .with_context(|| format!("reading the steps recorded for release {}", r.name))?,
            None if r.name == COUPON_RELEASE => Definition::built_in().steps,
            None => bail!(
                "release {} is recorded without its steps in pgmend's records; pgmend cannot tell whether it is finished. Continue it with its own files (pgmend apply --release DIR), which records them; nothing was changed",
                r.name
            ),
        };
        out.push((r, steps));
    }
    Ok(out)
}

/// The migration versions the steps of every release recorded other than `me` apply: one
/// history serves them all, so such a version applied without a file here is that release's,
/// not a missing file (`migrate::status::compute`).
pub fn other_versions(client: &mut impl GenericClient, me: &str) -> Result<Vec<i32>> {
    Ok(others(client, me)?
        .iter()
        .flat_map(|(_, steps)| steps.iter())
        .filter_map(|s| match s {
            Step::Migrate { version, .. } => Some(*version),
            _ => None,
        })
        .collect())
}

/// Every release recorded other than `me`, with its first pending step; `applied` is the
/// migration history's versions, read in the same transaction.
pub fn standings(
    client: &mut impl GenericClient,
    me: &str,
    applied: &[i32],
) -> Result<Vec<Standing>> {
    let mut out = Vec::new();
    for (recorded, steps) in others(client, me)? {
        let done = progress(client, &recorded.name, applied.to_vec())?;
        let pending = steps
            .iter()
            .enumerate()
            .find(|(i, s)| !done.done(*i, s))
            .map(|(i, s)| (i + 1, s.label()));
        out.push(Standing {
            recorded,
            steps,
            pending,
        });
    }
    Ok(out)
}

/// Refuses work for the release `name` with these `steps` (none: work outside any release,
/// from `--migrations-dir` or `--repairs-dir` alone) while another release is unfinished, or
/// when its steps apply a migration version that another release's steps apply.
pub fn check(others: &[Standing], name: Option<&str>, steps: &[Step]) -> Result<()> {
    if let Some(other) = others.iter().find(|o| o.pending.is_some()) {
        let (n, label) = other.pending.as_ref().expect("pending");
        let o = &other.recorded;
        let how = match &other.steps[n - 1] {
            Step::Gate { name: gate, .. } => format!(
                "pgmend apply --confirm {gate} with its release directory (--release DIR{})",
                if o.name == COUPON_RELEASE {
                    "; `pgmend init DIR` writes the coupon release"
                } else {
                    ""
                }
            ),
            _ => format!(
                "pgmend apply with its release directory (--release DIR{})",
                if o.name == COUPON_RELEASE {
                    "; `pgmend init DIR` writes the coupon release"
                } else {
                    ""
                }
            ),
        };
        bail!(
            "release {} is unfinished on this database (started {} by {}): its step {n} ({label}) is not done. Releases run one after another: finish {} first ({how}), then run {}; nothing was changed",
            o.name,
            if o.started_at.is_empty() { "before release identities" } else { &o.started_at },
            if o.started_by.is_empty() { "an earlier pgmend" } else { &o.started_by },
            o.name,
            name.map_or_else(|| "this".to_string(), |n| format!("release {n}")),
        );
    }
    let mut clashes = Vec::new();
    for other in others {
        for step in steps {
            if let Step::Migrate { version, .. } = step {
                if super::runs_migration(&other.steps, *version) {
                    clashes.push(format!(
                        "V{version} (also a step of release {})",
                        other.recorded.name
                    ));
                }
            }
        }
    }
    if !clashes.is_empty() {
        let newest = others
            .iter()
            .flat_map(|o| o.steps.iter())
            .filter_map(|s| match s {
                Step::Migrate { version, .. } => Some(*version),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        bail!(
            "release {} applies migrations whose versions another release on this database already has: {}. Migrations are one history per database: number this release's migrations after V{newest}; nothing was changed",
            name.unwrap_or("(none)"),
            clashes.join(", ")
        );
    }
    Ok(())
}

/// Records `release` as started, or continued, with files of `digest` (pgmend's schema
/// exists).
pub fn enter(client: &mut impl GenericClient, release: &Release, digest: &str) -> Result<()> {
    let steps = serde_json::to_string(release.steps)?;
    store::releases::enter(client, release.name, digest, &steps)
}

/// Records `release` as finished.
pub fn finish(client: &mut impl GenericClient, release: &Release) -> Result<()> {
    store::releases::finish(client, release.name)
}
