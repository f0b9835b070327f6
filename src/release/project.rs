//! Where a command's release comes from: a directory holding `release.toml`, `migrations/` and
//! `repairs/`, the user's project as in Flyway or sqlx-cli.
//!
//! [`find`] takes `--release DIR` (or `PGMEND_RELEASE`; clap merges the two), else the current
//! directory when it holds a `release.toml`, else nothing: a command that needs a release then
//! refuses with [`NOT_FOUND`] (exit 2) rather than apply the coupon release built into pgmend
//! to whatever database the URL names. `--migrations-dir` and `--repairs-dir` (and their
//! variables) override the matching part of the release found, and work without one for the
//! commands that need only that part ([`migrations`], [`repairs`]). [`load`] reads the
//! release's definition and both sets, and computes its digest ([`digest`], over the same
//! per-file SHA-256 a saved plan's fingerprint records). [`init`] writes the built-in coupon
//! release out as a starting point (`pgmend init DIR`), refusing to overwrite a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{Definition, Release};
use crate::digest::sha256_hex;
use crate::migrate::source::{self, Migration, Source};
use crate::repair::definition::{self, Repair, RepairSource};

/// The file that makes a directory a release.
pub const FILE: &str = "release.toml";

/// Why a command that needs a release has none.
pub const NOT_FOUND: &str = "no release found: give --release DIR (or PGMEND_RELEASE) naming a directory that holds release.toml, migrations/ and repairs/, or run pgmend from such a directory. `pgmend init DIR` writes the coupon release built into pgmend there as a starting point; nothing was changed";

/// A release directory, and how it was chosen (for messages).
#[derive(Debug, Clone)]
pub struct Found {
    pub dir: PathBuf,
    pub how: &'static str,
}

/// The release directory `--release` names (refused when it holds no `release.toml`), else
/// the current directory when it holds one, else none.
pub fn find(given: Option<&Path>) -> Result<Option<Found>> {
    if let Some(dir) = given {
        if !dir.join(FILE).is_file() {
            bail!(
                "--release {} (or PGMEND_RELEASE): {} holds no {FILE}; name the directory of the release (the one with release.toml, migrations/ and repairs/), or write one with `pgmend init DIR`; nothing was changed",
                dir.display(),
                if dir.is_dir() { "that directory" } else { "no such directory:" },
            );
        }
        return Ok(Some(Found {
            dir: dir.to_path_buf(),
            how: "--release",
        }));
    }
    let here = std::env::current_dir().context("reading the current directory")?;
    Ok(here.join(FILE).is_file().then_some(Found {
        dir: here,
        how: "the current directory",
    }))
}

/// The migration set: `--migrations-dir`, else the release's `migrations/` (an empty set when
/// the release has none), else refused with [`NOT_FOUND`].
pub fn migrations(found: Option<&Found>, dir: Option<&Path>) -> Result<Vec<Migration>> {
    match (dir, found) {
        (Some(dir), _) => Source::Directory(dir.to_path_buf()).load(),
        (None, Some(found)) => {
            let dir = found.dir.join("migrations");
            if dir.exists() {
                Source::Directory(dir).load()
            } else {
                Ok(Vec::new())
            }
        }
        (None, None) => bail!(NOT_FOUND),
    }
}

/// Where the repair definitions are: `--repairs-dir`, else the release's `repairs/`, else
/// refused with [`NOT_FOUND`].
pub fn repairs(found: Option<&Found>, dir: Option<&Path>) -> Result<RepairSource> {
    match (dir, found) {
        (Some(dir), _) => Ok(RepairSource::Directory(dir.to_path_buf())),
        (None, Some(found)) => Ok(RepairSource::Directory(found.dir.join("repairs"))),
        (None, None) => bail!(NOT_FOUND),
    }
}

/// The `release.toml` of the release `found` names. One found in the current directory that
/// does not read as a release says so (another tool's file of that name, such as
/// cargo-release's).
pub fn definition(found: &Found) -> Result<Definition> {
    let path = found.dir.join(FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Definition::parse(&text, &path.display().to_string()).with_context(|| {
        if found.how == "the current directory" {
            format!(
                "pgmend took {} for a release because it is in the current directory; if it is another tool's file, give --release DIR (or PGMEND_RELEASE), or run pgmend elsewhere",
                path.display()
            )
        } else {
            format!("reading the release {}", found.dir.display())
        }
    })
}

/// A release as a command runs it: its definition and its files.
pub struct Loaded {
    pub definition: Definition,
    pub files: Vec<Migration>,
    pub repairs: Vec<Repair>,
    pub dir: PathBuf,
}

impl Loaded {
    pub fn release(&self) -> Release<'_> {
        self.definition.with(&self.files, &self.repairs)
    }
}

/// Reads the release `found` names, with `--migrations-dir` and `--repairs-dir` overriding
/// its parts. A release's `repairs/` may be missing when no step repairs.
pub fn load(
    found: Option<&Found>,
    migrations_dir: Option<&Path>,
    repairs_dir: Option<&Path>,
) -> Result<Loaded> {
    let found = found.context(NOT_FOUND)?;
    let definition = definition(found)?;
    let mut files = migrations(Some(found), migrations_dir)?;
    super::name_repairs_in_censuses(&definition.steps, &mut files);
    let repairs = match repairs_dir {
        None if !found.dir.join("repairs").exists() => Vec::new(),
        _ => self::repairs(Some(found), repairs_dir)?.load()?,
    };
    Ok(Loaded {
        definition,
        files,
        repairs,
        dir: found.dir.clone(),
    })
}

/// `release.toml`, `migrations/FILE` and `repairs/FILE`, each with its SHA-256: what a saved
/// plan's fingerprint records, and what the release's digest is taken over.
pub fn file_digests(
    text: &str,
    files: &[Migration],
    repairs: &[Repair],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for m in files {
        out.insert(format!("migrations/{}.sql", m.label()), sha256_hex(&m.sql));
    }
    for r in repairs {
        out.insert(format!("repairs/{}.toml", r.name), r.sha256.clone());
    }
    out.insert(FILE.into(), sha256_hex(text));
    out
}

/// The release's digest: the SHA-256 of its files' digests, one `PATH SHA256` line each, in
/// path order.
pub fn digest(files: &BTreeMap<String, String>) -> String {
    let lines: String = files.iter().map(|(p, d)| format!("{p} {d}\n")).collect();
    sha256_hex(lines)
}

/// Writes the coupon release built into pgmend to `dir` (created when missing): `release.toml`,
/// `migrations/` and `repairs/`. Refuses, before writing anything, when a file it would write
/// exists. Returns the files written.
pub fn init(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<(PathBuf, &[u8])> = vec![(dir.join(FILE), super::BUILT_IN.as_bytes())];
    for (name, bytes) in source::built_in_files() {
        files.push((dir.join("migrations").join(name), bytes));
    }
    for (name, bytes) in definition::built_in_files() {
        files.push((dir.join("repairs").join(name), bytes));
    }
    let existing: Vec<String> = files
        .iter()
        .filter(|(p, _)| p.exists())
        .map(|(p, _)| p.display().to_string())
        .collect();
    if !existing.is_empty() {
        bail!(
            "pgmend init would overwrite {}; choose an empty or new directory; nothing was written",
            existing.join(", ")
        );
    }
    for (path, bytes) in &files {
        let parent = path.parent().expect("a file in a directory");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(files.into_iter().map(|(p, _)| p).collect())
}
