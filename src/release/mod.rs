//! The whole release as data: a `release.toml` (its `name`, its steps — migrations, repairs
//! and gates in the order docs/release.md explains — and the invariants it declares), the files
//! its steps resolve to, and where a database stands in it. Where a release is found is
//! [`project`]; its identity on the database [`identity`]; its dry run [`dry_run`]; its
//! execution [`engine`].
//!
//! `Definition::parse` reads a `release.toml` with `toml` into `Step` values (`Migrate {
//! version, retry_with }`, `Repair { name }`, `Gate { name, explain }`, serialized with a
//! `kind` tag) and `Invariant`s; a file without a `name` or a step, a step that names not
//! exactly one of `migrate`, `repair`, `gate`, or an unknown key is refused. The coupon
//! release's `release.toml` stays compiled in (`Definition::built_in`, named
//! [`COUPON_RELEASE`]) for `pgmend demo` and `pgmend init`. A `Release` is a definition with the
//! migration files and repair definitions it resolves to, what [`dry_run`] and [`engine`] both
//! take. `resolve` checks, before `plan` and `apply` connect, that every step names a file of
//! the migration set or a repair definition, and returns a note for each migration no step
//! names. `progress` reads what is done, in the caller's transaction: the applied versions
//! (passed in), the release's finished steps and confirmed gates (`store::records`, by release
//! name), or none of the last two when pgmend's schema does not exist yet (so a read-only plan
//! creates nothing). `Progress::done` answers per step: migrations by version, repair steps by
//! position, gates by name. A unit test pins the coupon release's step order.

pub mod compare;
pub mod dry_run;
pub mod engine;
pub mod estimate;
pub mod fingerprint;
pub mod identity;
pub mod markdown;
pub mod project;

use anyhow::{bail, Context, Result};
use postgres::GenericClient;
use serde::{Deserialize, Serialize};

use crate::migrate::source::Migration;
use crate::repair::definition::Repair;
use crate::store;

/// The coupon release's `release.toml`, built in for `pgmend demo` and `pgmend init`.
const BUILT_IN: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/release.toml"));

/// The name the built-in coupon release gives itself (`name` in its `release.toml`); a
/// database whose records predate release identities is adopted as this release.
pub const COUPON_RELEASE: &str = store::schema::ADOPTED_RELEASE;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    #[serde(default)]
    step: Vec<StepDef>,
    #[serde(default)]
    invariant: Vec<Invariant>,
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

/// An invariant a release declares in its `release.toml` (`[[invariant]]`): `sql` selects the
/// rows that break it, none when it holds; `explain` says what breaking rows mean and what to
/// do, `holds` what it means when none does. An `anomaly` is listed apart by `verify` and does
/// not change its exit code; `repair = "NAME"` says the invariant checks that repair's outcome
/// (`verify` then derives no check of its own for it); `amount` is summed over the breaking
/// rows (the counters' drift in yen, for the coupon release).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Invariant {
    pub name: String,
    pub sql: String,
    #[serde(default)]
    pub explain: String,
    #[serde(default)]
    pub holds: String,
    #[serde(default)]
    pub anomaly: bool,
    pub repair: Option<String>,
    /// An SQL expression over the breaking rows whose sum `verify` reports (yen, say).
    pub amount: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// A release's `release.toml`, read: its name, steps and declared invariants, and where it
/// came from.
#[derive(Debug, Clone)]
pub struct Definition {
    pub name: String,
    pub steps: Vec<Step>,
    pub invariants: Vec<Invariant>,
    /// The file's text, as read (its digest is part of the release's and of a saved plan's).
    pub text: String,
    /// Where it was read, for messages: `release.toml in DIR`, or `the coupon release built
    /// into pgmend`.
    pub origin: String,
}

/// What the release is made of: its definition and the files its steps resolve to.
pub struct Release<'a> {
    pub name: &'a str,
    pub text: &'a str,
    pub steps: &'a [Step],
    pub invariants: &'a [Invariant],
    pub files: &'a [Migration],
    pub repairs: &'a [Repair],
}

impl Definition {
    /// The coupon release built into pgmend.
    pub fn built_in() -> Definition {
        Definition::parse(BUILT_IN, "the coupon release built into pgmend")
            .expect("the built-in release.toml is valid (a unit test reads it)")
    }

    /// Reads `text` (a `release.toml`), refusing a file without a `name`, with a step that
    /// names not exactly one of `migrate`, `repair`, `gate`, or with an unknown key.
    pub fn parse(text: &str, origin: &str) -> Result<Definition> {
        let file: File = toml::from_str(text).with_context(|| format!("{origin} is malformed"))?;
        let name = file.name.with_context(|| {
            format!("{origin} has no name: give the release one at the top of the file, e.g. name = \"orders-cleanup-2027\" (its steps and gates are recorded under it)")
        })?;
        check_name(&name).with_context(|| format!("{origin}: name = {name:?}"))?;
        let steps = file
            .step
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
                    "{origin} step {}: give exactly one of migrate, repair, gate",
                    i + 1
                ),
            })
            .collect::<Result<Vec<Step>>>()?;
        if steps.is_empty() {
            bail!("{origin} has no step: add [[step]] entries (migrate = N, repair = \"NAME\", gate = \"NAME\")");
        }
        let mut seen = std::collections::BTreeSet::new();
        for inv in &file.invariant {
            if inv.name.trim().is_empty() || inv.sql.trim().is_empty() {
                bail!("{origin}: every [[invariant]] needs a name and the sql that selects the rows breaking it");
            }
            if !seen.insert(inv.name.as_str()) {
                bail!("{origin}: two invariants are named {:?}", inv.name);
            }
            if ["released_schema", "no_invalid_index", "no_guard_trigger"]
                .contains(&inv.name.as_str())
                || inv.name.starts_with("repair_")
            {
                bail!(
                    "{origin}: invariant {:?} takes the name of a check verify makes itself (released_schema, no_invalid_index, no_guard_trigger, repair_NAME); name it otherwise",
                    inv.name
                );
            }
        }
        Ok(Definition {
            name,
            steps,
            invariants: file.invariant,
            text: text.to_string(),
            origin: origin.to_string(),
        })
    }

    /// The release with the files its steps resolve to.
    pub fn with<'a>(&'a self, files: &'a [Migration], repairs: &'a [Repair]) -> Release<'a> {
        Release {
            name: &self.name,
            text: &self.text,
            steps: &self.steps,
            invariants: &self.invariants,
            files,
            repairs,
        }
    }
}

/// A release's name: what its records are kept under, so letters, digits, `-`, `_` and `.`,
/// at most 63 characters.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 63
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        bail!("a release name is 1 to 63 letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

impl Release<'_> {
    /// The digest of the release's files ([`project::digest`]).
    pub fn digest(&self) -> String {
        project::digest(&project::file_digests(self.text, self.files, self.repairs))
    }

    /// The tables the release works on, as its steps name them: those its migrations lock
    /// and those its repairs read and write. The pre-flight looks for them, and `verify`
    /// refuses a database that has none of them.
    pub fn tables(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for step in self.steps {
            match step {
                Step::Migrate { version, .. } => {
                    if let Some(m) = self.files.iter().find(|m| m.version == *version) {
                        out.extend(
                            m.statements
                                .iter()
                                .flat_map(|s| s.locks.iter().map(|l| l.relation.clone())),
                        );
                    }
                }
                Step::Repair { name } => {
                    if let Some(r) = self.repairs.iter().find(|r| &r.name == name) {
                        out.extend(r.tables());
                    }
                }
                Step::Gate { .. } => {}
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        out.retain(|t| seen.insert(t.clone()));
        out
    }
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

/// Names the repair in the advice of each unique index's and VALIDATE's census: a migration step with
/// `retry_with = "NAME"` is retried after that repair, so its census says to run it (a census
/// read from the file alone knows no repair).
pub fn name_repairs_in_censuses(steps: &[Step], files: &mut [Migration]) {
    for step in steps {
        let Step::Migrate {
            version,
            retry_with: Some(repair),
        } = step
        else {
            continue;
        };
        for m in files.iter_mut().filter(|m| m.version == *version) {
            for c in m.censuses.iter_mut() {
                match c.guard {
                    crate::online::census::Guard::UniqueIndex => c.fix = format!(
                        "void the duplicates first: pgmend repair apply {repair} --yes (or fix the rows by hand), then rerun"
                    ),
                    crate::online::census::Guard::Validate => c.fix = format!(
                        "repair them first: pgmend repair apply {repair} --yes (or fix the rows by hand), then rerun; {} stays NOT VALID meanwhile and still refuses new violations",
                        c.name
                    ),
                    _ => {}
                }
            }
        }
    }
}

/// Whether a migration step with this `retry_with` takes its census during its first build
/// (`online::index::OnlineMigration::census_alongside`): the repair right before it removed
/// the violators, so the census is expected clean. `apply` and the plan's estimate ask here.
pub fn census_during_build(retry_with: Option<&str>) -> bool {
    retry_with.is_some()
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
            "the release (release.toml) names steps that the migration and repair sets do not have; nothing was changed:\n  - {}\nPut the files in the release directory's migrations/ and repairs/, or point --migrations-dir and --repairs-dir (PGMEND_MIGRATIONS_DIR, PGMEND_REPAIRS_DIR) at them",
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

/// Which steps of a release are done: migrations by the history, repair steps by the
/// release's rows of pgmend.release_steps, gates by its rows of pgmend.gates.
pub struct Progress {
    pub applied_versions: Vec<i32>,
    /// (1-based position, label) of each repair step recorded as finished.
    pub finished_steps: Vec<(i32, String)>,
    pub gates: Vec<(String, String, String)>,
}

pub fn progress(
    client: &mut impl GenericClient,
    release: &str,
    applied_versions: Vec<i32>,
) -> Result<Progress> {
    let (mut finished_steps, mut gates) = (Vec::new(), Vec::new());
    if store::exists(client)? {
        finished_steps = store::records::finished_steps(client, release)?;
        gates = store::records::confirmed_gates(client, release)?;
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
            // By position and label: a release whose steps moved since does not take another
            // step's record for this one.
            Step::Repair { .. } => self
                .finished_steps
                .iter()
                .any(|(n, what)| *n == index as i32 + 1 && *what == step.label()),
            Step::Gate { name, .. } => self.gates.iter().any(|g| &g.0 == name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_follows_product_md() {
        let built_in = Definition::built_in();
        assert_eq!(built_in.name, COUPON_RELEASE);
        let labels: Vec<String> = built_in.steps.iter().map(Step::label).collect();
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

    #[test]
    fn a_repair_step_is_done_by_its_position_and_its_label() {
        let steps = Definition::built_in().steps;
        let progress = Progress {
            applied_versions: vec![],
            finished_steps: vec![
                (4, "repair void-duplicate-coupons".into()),
                (6, "repair other".into()),
            ],
            gates: vec![],
        };
        assert!(progress.done(3, &steps[3]));
        // Step 6 recorded under another label: a step that moved is not taken as done.
        assert!(!progress.done(5, &steps[5]));
    }

    #[test]
    fn a_release_without_a_name_or_steps_or_with_a_bad_name_is_refused() {
        let e = Definition::parse("[[step]]\nmigrate = 1\n", "x").unwrap_err();
        assert!(format!("{e:#}").contains("x has no name"), "{e:#}");
        let e = Definition::parse("name = \"a b\"\n[[step]]\nmigrate = 1\n", "x").unwrap_err();
        assert!(format!("{e:#}").contains("1 to 63 letters"), "{e:#}");
        let e = Definition::parse("name = \"a\"\n", "x").unwrap_err();
        assert!(format!("{e:#}").contains("x has no step"), "{e:#}");
        let e = Definition::parse(
            "name = \"a\"\n[[step]]\nmigrate = 1\n[[invariant]]\nname = \"i\"\nsql = \"\"\n",
            "x",
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("needs a name and the sql"),
            "{e:#}"
        );
        let ok = Definition::parse(
            "name = \"orders-2027\"\n[[step]]\nmigrate = 6\n[[invariant]]\nname = \"i\"\nsql = \"SELECT 1 WHERE false\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(ok.name, "orders-2027");
        assert_eq!(ok.invariants.len(), 1);
    }
}
