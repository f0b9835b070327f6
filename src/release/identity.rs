//! A release's identity on a database: several releases run on one database one after another,
//! each under its `name`, its step records and gates keyed by it (`store::releases`,
//! `store::records`), its migrations numbered in the one history all releases share.
//!
//! [`standings`] reads every other release recorded, with the first of its steps not done (its
//! steps from its record; the coupon release adopted from records older than release
//! identities has none recorded, and takes the built-in release's). [`check`] refuses (exit 2,
//! before any change) a release while another is unfinished, naming it and that step, and a
//! release whose steps apply a migration version another release's steps apply (one history:
//! the second release numbers after the first). `apply` calls it before it asks, `plan` shows
//! its refusal as a blocker. [`enter`] records the release as started (or continued) with the
//! digest of its files, once the walk begins; [`finish`] when every step is done.

use anyhow::{bail, Context, Result};
use postgres::GenericClient;

use super::{progress, Definition, Release, Step, COUPON_RELEASE};
use crate::store::{self, releases::Recorded};

/// Another release recorded on the database, and where it stands.
pub struct Standing {
    pub recorded: Recorded,
    pub steps: Vec<Step>,
    /// The first step not done (1-based, with its label); none when it is finished.
    pub pending: Option<(usize, String)>,
}

/// Every release recorded other than `me`, with its first pending step; `applied` is the
/// migration history's versions, read in the same transaction.
pub fn standings(
    client: &mut impl GenericClient,
    me: &str,
    applied: &[i32],
) -> Result<Vec<Standing>> {
    let mut out = Vec::new();
    for recorded in store::releases::all(client)? {
        if recorded.name == me {
            continue;
        }
        let steps: Vec<Step> = match &recorded.steps {
            Some(json) => serde_json::from_str(json).with_context(|| {
                format!("reading the steps recorded for release {}", recorded.name)
            })?,
            None if recorded.name == COUPON_RELEASE => Definition::built_in().steps,
            None => bail!(
                "release {} is recorded without its steps (pgmend.releases); pgmend cannot tell whether it is finished. Continue it with its own files (pgmend apply --release DIR), which records them; nothing was changed",
                recorded.name
            ),
        };
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

/// Refuses `release` while another release is unfinished, or when its steps apply a migration
/// version that another release's steps apply.
pub fn check(others: &[Standing], release: &Release) -> Result<()> {
    if let Some(other) = others.iter().find(|o| o.pending.is_some()) {
        let (n, label) = other.pending.as_ref().expect("pending");
        bail!(
            "release {} is unfinished on this database (started {} by {}): its step {n} ({label}) is not done. Releases run one after another: finish {} first (pgmend apply with its release directory: --release DIR), then run {}; nothing was changed",
            other.recorded.name,
            if other.recorded.started_at.is_empty() { "before release identities" } else { &other.recorded.started_at },
            if other.recorded.started_by.is_empty() { "an earlier pgmend" } else { &other.recorded.started_by },
            other.recorded.name,
            release.name,
        );
    }
    let mut clashes = Vec::new();
    for other in others {
        for step in release.steps {
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
            release.name,
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
