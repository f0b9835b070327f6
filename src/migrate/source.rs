//! Migration files: names, versions, checksums, and the checks that refuse a bad set
//! before anything touches the database.
//!
//! Files are named like refinery's (`V<version>__<name>.sql`) and checksummed the way
//! refinery does, so the history table stays readable by refinery itself.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::online::census::{self, Census};
use crate::statements::{self as sql, Statement};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded_migrations.rs"));
}

/// The migration of `files` with `version`, which a plan or a status entry built from those
/// files names: its absence is a bug, not an input error.
pub fn by_version(files: &[Migration], version: i32) -> &Migration {
    files
        .iter()
        .find(|m| m.version == version)
        .expect("every planned or pending version comes from the migration files")
}

/// How a migration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// All statements and the history row in one transaction.
    Transactional,
    /// Each statement alone in autocommit (CONCURRENTLY); the history row after the last.
    Online,
}

#[derive(Debug, Clone)]
pub struct Migration {
    pub version: i32,
    pub name: String,
    /// Where it came from, for messages: a path, or `embedded:<file>`.
    pub origin: String,
    pub sql: String,
    pub checksum: u64,
    pub mode: Mode,
    pub statements: Vec<Statement>,
    /// What must be counted before it runs (unique indexes, checks, preconditions).
    pub censuses: Vec<Census>,
}

impl Migration {
    /// `V2__expand_for_repair`, the form refinery uses.
    pub fn label(&self) -> String {
        format!("V{}__{}", self.version, self.name)
    }
}

/// Where the migrations come from: the binary's own, or a directory.
#[derive(Debug, Clone)]
pub enum Source {
    Embedded,
    Directory(PathBuf),
}

impl Source {
    pub fn load(&self) -> Result<Vec<Migration>> {
        let files: Vec<(String, String, Vec<u8>)> = match self {
            Source::Embedded => embedded::EMBEDDED
                .iter()
                .map(|(name, bytes)| (name.to_string(), format!("embedded:{name}"), bytes.to_vec()))
                .collect(),
            Source::Directory(dir) => read_dir(dir)?,
        };
        parse_set(files)
    }
}

fn read_dir(dir: &Path) -> Result<Vec<(String, String, Vec<u8>)>> {
    let entries = std::fs::read_dir(dir).with_context(|| {
        format!(
            "cannot read the migrations directory {}; check --migrations-dir",
            dir.display()
        )
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            bail!(
                "{}: the file name is not valid UTF-8; rename it V<version>__<name>.sql",
                path.display()
            );
        };
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        files.push((name, path.display().to_string(), bytes));
    }
    Ok(files)
}

/// Validates a whole set: every `.sql` file well named, UTF-8, non-empty, no version twice,
/// no file that mixes online and transactional statements. Returns them by version.
pub fn parse_set(files: Vec<(String, String, Vec<u8>)>) -> Result<Vec<Migration>> {
    let mut migrations: Vec<Migration> = Vec::new();
    for (file_name, origin, bytes) in files {
        if !file_name.ends_with(".sql") {
            continue; // READMEs and the like live beside migrations.
        }
        let migration = parse_file(&file_name, &origin, bytes)?;
        if let Some(other) = migrations.iter().find(|m| m.version == migration.version) {
            bail!(
                "two migrations have version {}: {} and {}. Each version must be unique; renumber the newer one to the next free version",
                migration.version,
                other.origin,
                migration.origin
            );
        }
        migrations.push(migration);
    }
    migrations.sort_by_key(|m| m.version);
    Ok(migrations)
}

/// Parses `V<version>__<name>.sql` into (version, name).
pub fn parse_name(file_name: &str) -> Result<(i32, String), String> {
    let expected = "a migration file is named V<version>__<name>.sql, for example V3__add_unique_index.sql (capital V, a whole number, two underscores, ASCII letters, digits and underscores)";
    let stem = file_name
        .strip_suffix(".sql")
        .ok_or_else(|| expected.to_string())?;
    if stem.starts_with('U') || stem.starts_with('u') {
        return Err(format!("unversioned (U) migrations are not supported: pgmend applies migrations strictly in version order; {expected}"));
    }
    let rest = stem.strip_prefix('V').ok_or_else(|| expected.to_string())?;
    let (version, name) = rest.split_once("__").ok_or_else(|| expected.to_string())?;
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "the version {version:?} is not a whole number; {expected}"
        ));
    }
    let version: i32 = version
        .parse()
        .map_err(|_| format!("the version {version} is larger than 2147483647; {expected}"))?;
    if version == 0 {
        return Err(format!("versions start at 1; {expected}"));
    }
    // ASCII only: refinery reads the name with `\w+` and no end anchor, so a name holding
    // `²` or a combining accent (as macOS spells `é` in file names) would be recorded under
    // a shorter name than the file's, and checksummed with it.
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.len() > 200
    {
        return Err(format!(
            "the name {name:?} must be 1 to 200 ASCII letters, digits or underscores; {expected}"
        ));
    }
    Ok((version, name.to_string()))
}

fn parse_file(file_name: &str, origin: &str, bytes: Vec<u8>) -> Result<Migration> {
    let (version, name) = parse_name(file_name).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    let sql = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{origin}: not valid UTF-8 (at byte {}); save the file as UTF-8",
            e.utf8_error().valid_up_to()
        )
    })?;
    if sql.starts_with('\u{feff}') {
        bail!("{origin}: the file starts with a byte order mark (BOM), which the server would read as part of the first statement; save the file as UTF-8 without BOM");
    }
    let statements = sql::split(&sql);
    if statements.is_empty() {
        bail!("{origin}: the file holds no SQL statement; write the migration or delete the file");
    }
    if let Some(s) = statements.iter().find(|s| s.transaction_control) {
        bail!(
            "{origin}, line {}: {} — pgmend runs each migration in its own transaction (or, for CONCURRENTLY statements, in autocommit); remove the transaction control",
            s.line,
            s.summary
        );
    }
    let online = statements.iter().filter(|s| s.online).count();
    let mode = if online == 0 {
        Mode::Transactional
    } else if online == statements.len() {
        Mode::Online
    } else {
        let o = statements.iter().find(|s| s.online).unwrap();
        let t = statements.iter().find(|s| !s.online).unwrap();
        bail!(
            "{origin}: mixes a statement that must run outside a transaction (line {}: {}) with transactional ones (line {}: {}). A crash between them would leave the migration half-applied; put the online statements in a migration file of their own",
            o.line, o.summary, t.line, t.summary
        );
    };
    let refinery = refinery::Migration::unapplied(&format!("V{version}__{name}"), &sql)
        .map_err(|e| anyhow::anyhow!("{origin}: refinery rejects the name: {e}"))?;
    if refinery.name() != name || refinery.version() != version {
        bail!(
            "{origin}: refinery reads this name as V{}__{}; rename the file so that both agree",
            refinery.version(),
            refinery.name()
        );
    }
    let censuses = census::for_migration(&sql, &statements, origin)?;
    Ok(Migration {
        censuses,
        version,
        name,
        origin: origin.to_string(),
        checksum: refinery.checksum(),
        sql,
        mode,
        statements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(name: &str, sql: &str) -> (String, String, Vec<u8>) {
        (
            name.into(),
            format!("migrations/{name}"),
            sql.as_bytes().to_vec(),
        )
    }

    #[test]
    fn the_shipped_migrations_load() {
        let set = Source::Embedded.load().unwrap();
        assert_eq!(set[0].label(), "V1__legacy_baseline");
        assert!(set
            .iter()
            .all(|m| m.mode == Mode::Transactional || m.mode == Mode::Online));
    }

    #[test]
    fn names() {
        assert_eq!(parse_name("V01__x.sql").unwrap(), (1, "x".into()));
        for bad in [
            "V1_x.sql",
            "v1__x.sql",
            "V1.5__x.sql",
            "U1__x.sql",
            "V__x.sql",
            "V0__x.sql",
            "V1__.sql",
            "V1__a-b.sql",
            "V1__caf\u{e9}.sql",
            "V1__x\u{b2}.sql",
            "V99999999999__x.sql",
            "V1__x.txt",
        ] {
            assert!(parse_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn checksum_matches_refinery() {
        let set = parse_set(vec![file("V1__a.sql", "CREATE TABLE a (x int);")]).unwrap();
        let r = refinery::Migration::unapplied("V1__a", "CREATE TABLE a (x int);").unwrap();
        assert_eq!(set[0].checksum, r.checksum());
    }

    #[test]
    fn refuses_bad_sets_naming_the_file() {
        let dup = parse_set(vec![
            file("V1__a.sql", "SELECT 1;"),
            file("V1__b.sql", "SELECT 2;"),
        ])
        .unwrap_err();
        assert!(
            format!("{dup:#}").contains("V1__a.sql") && format!("{dup:#}").contains("V1__b.sql")
        );
        let empty = parse_set(vec![file("V1__a.sql", "-- nothing\n")]).unwrap_err();
        assert!(format!("{empty:#}").contains("no SQL statement"));
        let mixed = parse_set(vec![file(
            "V1__a.sql",
            "ALTER TABLE t ADD c int; CREATE INDEX CONCURRENTLY i ON t (c);",
        )])
        .unwrap_err();
        assert!(format!("{mixed:#}").contains("mixes"));
        let tx = parse_set(vec![file("V1__a.sql", "BEGIN; SELECT 1; COMMIT;")]).unwrap_err();
        assert!(format!("{tx:#}").contains("line 1"));
        let bin = parse_set(vec![(
            "V1__a.sql".into(),
            "m/V1__a.sql".into(),
            vec![b'S', 0xff, 0xfe],
        )])
        .unwrap_err();
        assert!(format!("{bin:#}").contains("UTF-8"));
        let online = parse_set(vec![file(
            "V3__i.sql",
            "CREATE INDEX CONCURRENTLY i ON t (c);",
        )])
        .unwrap();
        assert_eq!(online[0].mode, Mode::Online);
    }

    proptest! {
        #[test]
        fn name_parser_never_panics(name in "\\PC{0,40}") {
            let _ = parse_name(&name);
        }

        #[test]
        fn splitter_never_panics(sql in "[-a-zA-Z0-9 ;'\"$/*\\n\\\\]{0,120}") {
            let _ = sql::split(&sql);
        }
    }
}
