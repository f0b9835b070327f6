//! The whole release as data (`release.toml`, built into the binary): migrations, repairs and gates
//! in the order docs/release.md explains, and where a database stands in it. Its dry run is
//! [`dry_run`], its execution [`engine`].
//!
//! `release.toml` is compiled in (`include_str!`) and read with `toml` into `Step` values (`Migrate
//! { version, retry_with }`, `Repair { name }`, `Gate { name, explain }`, serialized with a `kind`
//! tag); a step that names not exactly one of `migrate`, `repair`, `gate`, or has an unknown key,
//! is refused. A `Release` is the steps with the migration files and repair definitions they
//! resolve to, what [`dry_run`] and [`engine`] both take. `resolve` checks, before `plan` and
//! `apply` connect, that every step names a file of the migration set or a repair definition,
//! and returns a note for each migration no step names. `progress` reads what is done, in the
//! caller's transaction: the applied versions (passed in), the finished steps and the confirmed
//! gates (`store::records`), or none of the last two when pgmend's schema does not exist yet (so
//! a read-only plan creates nothing). `Progress::done` answers per step: migrations by version,
//! repair steps by position, gates by name. A unit test pins the step order.

pub mod compare;
pub mod dry_run;
pub mod engine;
pub mod estimate;
pub mod fingerprint;
pub mod markdown;

use anyhow::{bail, Context, Result};
use postgres::GenericClient;
use serde::{Deserialize, Serialize};

use crate::migrate::source::Migration;
use crate::repair::definition::Repair;
use crate::store;

const RELEASE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/release.toml"));

/// The text of `release.toml`, as built in.
pub fn text() -> &'static str {
    RELEASE
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    step: Vec<StepDef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepDef {
    migrate: Option<i32>,
    repair: Option<String>,
    gate: Option<String>,
    explain: Option<String>,
    retry_with: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Apply migration `version`; when its census stops it, run `retry_with` and try again.
    Migrate {
        version: i32,
        retry_with: Option<String>,
    },
    Repair {
        name: String,
    },
    /// A person does something outside the database, then confirms.
    Gate {
        name: String,
        explain: String,
    },
}

/// Whether the release's `steps` apply migration `version`.
pub fn runs_migration(steps: &[Step], version: i32) -> bool {
    steps
        .iter()
        .any(|s| matches!(s, Step::Migrate { version: v, .. } if *v == version))
}

/// What the release is made of: its steps and the files they resolve to.
pub struct Release<'a> {
    pub steps: &'a [Step],
    pub files: &'a [Migration],
    pub repairs: &'a [Repair],
}

impl Step {
    pub fn label(&self) -> String {
        match self {
            Step::Migrate { version, .. } => format!("migration V{version}"),
            Step::Repair { name } => format!("repair {name}"),
            Step::Gate { name, .. } => format!("gate {name}"),
        }
    }
}

/// Whether a migration step with this `retry_with` takes its census during its first build
/// (`online::index::OnlineMigration::census_alongside`): the repair right before it removed
/// the violators, so the census is expected clean. `apply` and the plan's estimate ask here.
pub fn census_during_build(retry_with: Option<&str>) -> bool {
    retry_with.is_some()
}

/// The release steps, in order.
pub fn steps() -> Result<Vec<Step>> {
    let file: File = toml::from_str(RELEASE).context("release.toml is malformed")?;
    file.step
        .into_iter()
        .enumerate()
        .map(|(i, s)| match (s.migrate, s.repair, s.gate) {
            (Some(version), None, None) => Ok(Step::Migrate {
                version,
                retry_with: s.retry_with,
            }),
            (None, Some(name), None) => Ok(Step::Repair { name }),
            (None, None, Some(name)) => Ok(Step::Gate {
                name,
                explain: s.explain.unwrap_or_default(),
            }),
            _ => bail!(
                "release.toml step {}: give exactly one of migrate, repair, gate",
                i + 1
            ),
        })
        .collect()
}

/// Checks, before pgmend connects, that every step resolves: each migration step to a file of
/// the migration set, each repair step (and each `retry_with`) to a definition. Returns a
/// note for each migration of the set that no step names: the release never applies it.
pub fn resolve(
    steps: &[Step],
    migrations: &[Migration],
    repairs: &[Repair],
) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    let has_repair = |name: &str| repairs.iter().any(|r| r.name == name);
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Migrate {
                version,
                retry_with,
            } => {
                if !migrations.iter().any(|m| m.version == *version) {
                    missing.push(format!(
                        "step {} (migration V{version}): the migration set has no V{version} file (V{version}__NAME.sql)",
                        i + 1
                    ));
                }
                if let Some(name) = retry_with.as_deref().filter(|n| !has_repair(n)) {
                    missing.push(format!(
                        "step {} (migration V{version}) retries with repair {name:?}, which has no definition ({name}.toml)",
                        i + 1
                    ));
                }
            }
            Step::Repair { name } if !has_repair(name) => missing.push(format!(
                "step {} (repair {name}): the repair set has no definition {name}.toml",
                i + 1
            )),
            _ => {}
        }
    }
    if !missing.is_empty() {
        bail!(
            "the release (release.toml) names steps that the migration and repair sets do not have; nothing was changed:\n  - {}\nPoint --migrations-dir and --repairs-dir (PGMEND_MIGRATIONS_DIR, PGMEND_REPAIRS_DIR) at the release's files, or leave them out for the ones built into pgmend",
            missing.join("\n  - ")
        );
    }
    Ok(migrations
        .iter()
        .filter(|m| {
            !steps
                .iter()
                .any(|s| matches!(s, Step::Migrate { version, .. } if *version == m.version))
        })
        .map(|m| {
            format!(
                "migration {} ({}) is in the migration set but no step of the release names it: `pgmend apply` does not apply it (`pgmend migrate apply` would)",
                m.label(),
                m.origin
            )
        })
        .collect())
}

/// Which steps are done: migrations by the history, repair steps by pgmend.release_steps,
/// gates by pgmend.gates.
pub struct Progress {
    pub applied_versions: Vec<i32>,
    pub finished_steps: Vec<i32>,
    pub gates: Vec<(String, String, String)>,
}

pub fn progress(client: &mut impl GenericClient, applied_versions: Vec<i32>) -> Result<Progress> {
    let (mut finished_steps, mut gates) = (Vec::new(), Vec::new());
    if store::exists(client)? {
        finished_steps = store::records::finished_steps(client)?;
        gates = store::records::confirmed_gates(client)?;
    }
    Ok(Progress {
        applied_versions,
        finished_steps,
        gates,
    })
}

impl Progress {
    /// Whether step `index` (0-based) is done.
    pub fn done(&self, index: usize, step: &Step) -> bool {
        match step {
            Step::Migrate { version, .. } => self.applied_versions.contains(version),
            Step::Repair { .. } => self.finished_steps.contains(&(index as i32 + 1)),
            Step::Gate { name, .. } => self.gates.iter().any(|g| &g.0 == name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_follows_product_md() {
        let labels: Vec<String> = steps().unwrap().iter().map(Step::label).collect();
        assert_eq!(
            labels,
            [
                "migration V1",
                "migration V2",
                "migration V3",
                "repair void-duplicate-coupons",
                "migration V4",
                "repair rebuild-campaign-budgets",
                "repair rebuild-member-monthly-usage",
                "gate deploy-new-application",
                "repair rebuild-campaign-budgets",
                "repair rebuild-member-monthly-usage",
                "migration V5",
            ]
        );
    }
}
