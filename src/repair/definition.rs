//! Repair definitions: TOML files in `repairs/`, one per repair, for one of two engines.
//! Identifiers are checked here and always quoted in SQL; values are always bound.
//!
//! Repair definitions: `Spec` is a `kind`-tagged enum of `VoidSpec` and `CounterSpec` (both
//! `deny_unknown_fields`), parsed with `toml`; `parse` then checks every identifier with
//! `check_identifier` (plain names: ASCII letters, digits and `_`, not starting with a digit, at
//! most 63 characters) and the cross-field rules (`group_by`, `rank_by` and `key` not empty; `sum`
//! needs `value`; `copy_on_create` needs `keys_from` to be a table), and computes the FNV-1a
//! checksum of the file's bytes. `RepairSource` is the embedded set (`embedded_repairs.rs` from
//! `build.rs`) or a directory; `load` reads every `*.toml` (names of lowercase letters, digits and
//! dashes), refuses the whole set on one bad file, and sorts by name; `find` names the known
//! repairs when the name is unknown. Unit tests: the shipped files load, hostile identifiers,
//! unknown fields, missing fields and unknown kinds are refused, and proptest fuzzes the parser.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::db::sql_text::Ident;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded_repairs.rs"));
}

/// The coupon release's repair definitions built into pgmend, as (file name, bytes): what `pgmend init`
/// writes out.
pub fn built_in_files() -> &'static [(&'static str, &'static [u8])] {
    embedded::EMBEDDED
}

/// How one column orders the rows of a group (rank 1 is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    Asc,
    Desc,
    /// Rows where the column is set come first (`column IS NULL` ascending).
    NotNullFirst,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RankBy {
    pub column: Ident,
    #[serde(default = "default_order")]
    pub order: Order,
}

fn default_order() -> Order {
    Order::Asc
}

/// Void duplicates: in each group of `group_by` with more than one unmarked row, rank the
/// unmarked rows; every row after the first gets `mark = true`, and `void = now()` unless
/// `keep_when_not_null` is set on it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VoidSpec {
    /// The `kind` key. `Spec`'s tag consumes it; it is here so that a file can also be
    /// read as this struct alone, which gives errors their line and field.
    #[serde(default, skip_serializing)]
    pub kind: Option<String>,
    pub description: String,
    pub table: Ident,
    pub row_key: Ident,
    pub group_by: Vec<Ident>,
    pub rank_by: Vec<RankBy>,
    pub mark: Ident,
    pub void: Ident,
    pub keep_when_not_null: Option<Ident>,
    /// For the dry run: sum this column of the changed rows ...
    pub report_sum: Option<Ident>,
    /// ... per value of this column (yen affected per campaign).
    pub report_by: Option<Ident>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    Sum,
    Count,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenNoSource {
    /// The counter becomes 0.
    Zero,
    /// The counter keeps its value.
    Keep,
}

/// Rebuild a counter: for every key, `counter = aggregate(value)` over the source rows with
/// the same key (and `source_filter_null` IS NULL), locking the counter row first and
/// summing in a new statement.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CounterSpec {
    /// The `kind` key. `Spec`'s tag consumes it; it is here so that a file can also be
    /// read as this struct alone, which gives errors their line and field.
    #[serde(default, skip_serializing)]
    pub kind: Option<String>,
    pub description: String,
    pub counter_table: Ident,
    pub key: Vec<Ident>,
    pub counter: Ident,
    pub source_table: Ident,
    pub aggregate: Aggregate,
    /// The summed column (ignored for count).
    pub value: Option<Ident>,
    /// Only source rows where this column IS NULL count.
    pub source_filter_null: Option<Ident>,
    /// `source` (every key with source rows) or a table holding every key.
    pub keys_from: Ident,
    /// counter-table column = keys_from column, copied when a counter row is created.
    #[serde(default)]
    pub copy_on_create: std::collections::BTreeMap<Ident, Ident>,
    pub when_no_source: WhenNoSource,
}

/// Backfill: for every row of `table` where `where` holds, set each column of `set` to its
/// expression, over the row's own columns (qualified by the table's name when a subquery needs
/// it). Both are SQL from the file: checked by the server before the first change
/// ([`super::expression`]), evaluated by each batch on the rows it has locked.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillSpec {
    /// The `kind` key (see [`VoidSpec::kind`]).
    #[serde(default, skip_serializing)]
    pub kind: Option<String>,
    pub description: String,
    pub table: Ident,
    pub row_key: Ident,
    /// column = "SQL expression", one expression each.
    pub set: std::collections::BTreeMap<Ident, String>,
    /// The rows to backfill: a SQL predicate over the row's columns.
    #[serde(rename = "where")]
    pub predicate: String,
    /// Volatile functions the expressions may call (by name): refused unless listed here.
    #[serde(default)]
    pub allow_volatile: Vec<String>,
}

/// What an orphans repair does to a row whose reference has no row to refer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrphanAction {
    /// The referencing columns become NULL.
    SetNull,
    /// The row is copied into the quarantine table, with its run and reason, then deleted.
    Quarantine,
}

/// The foreign key's match rule, which decides what an orphan is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchRule {
    /// A row with any NULL referencing column is not checked (PostgreSQL's default).
    #[default]
    Simple,
    /// All referencing columns NULL, or none; a row with some NULL is refused too.
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct References {
    pub table: Ident,
    pub columns: Vec<Ident>,
}

/// Orphans: rows of `table` whose `columns` refer to no row of `references` (what a foreign
/// key from `columns` to `references.columns` would refuse under `match`), set to NULL or
/// quarantined.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OrphansSpec {
    /// The `kind` key (see [`VoidSpec::kind`]).
    #[serde(default, skip_serializing)]
    pub kind: Option<String>,
    pub description: String,
    pub table: Ident,
    pub row_key: Ident,
    pub columns: Vec<Ident>,
    pub references: References,
    pub action: OrphanAction,
    #[serde(rename = "match", default)]
    pub match_rule: MatchRule,
    /// For `quarantine`: the table the rows go to (default `<table>_quarantine`), which pgmend
    /// creates beside the table when it is missing.
    pub quarantine_table: Option<Ident>,
}

impl OrphansSpec {
    /// The quarantine table, for `action = "quarantine"`.
    pub fn quarantine(&self) -> Option<Ident> {
        (self.action == OrphanAction::Quarantine).then(|| {
            self.quarantine_table
                .clone()
                .unwrap_or_else(|| Ident::new(format!("{}_quarantine", self.table.as_str())))
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Spec {
    VoidDuplicates(VoidSpec),
    RebuildCounter(CounterSpec),
    Backfill(BackfillSpec),
    Orphans(OrphansSpec),
}

#[derive(Debug, Clone)]
pub struct Repair {
    pub name: String,
    pub origin: String,
    /// FNV-1a of the file's bytes: a run resumes only under the definition it started with.
    pub checksum: String,
    /// SHA-256 of the file's bytes, hex: what a saved plan records of it.
    pub sha256: String,
    pub spec: Spec,
}

impl Repair {
    /// The tables the repair reads and writes, as its definition names them.
    pub fn tables(&self) -> Vec<String> {
        match &self.spec {
            Spec::VoidDuplicates(v) => vec![v.table.as_str().to_string()],
            Spec::Backfill(b) => vec![b.table.as_str().to_string()],
            Spec::Orphans(o) => {
                let mut t = vec![
                    o.table.as_str().to_string(),
                    o.references.table.as_str().to_string(),
                ];
                t.extend(o.quarantine().map(|q| q.as_str().to_string()));
                t
            }
            Spec::RebuildCounter(c) => {
                let mut t = vec![
                    c.counter_table.as_str().to_string(),
                    c.source_table.as_str().to_string(),
                ];
                if c.keys_from.as_str() != "source" {
                    t.push(c.keys_from.as_str().to_string());
                }
                t
            }
        }
    }

    pub fn description(&self) -> &str {
        match &self.spec {
            Spec::VoidDuplicates(v) => &v.description,
            Spec::RebuildCounter(c) => &c.description,
            Spec::Backfill(b) => &b.description,
            Spec::Orphans(o) => &o.description,
        }
    }

    pub fn kind(&self) -> Kind {
        match self.spec {
            Spec::VoidDuplicates(_) => Kind::VoidDuplicates,
            Spec::RebuildCounter(_) => Kind::RebuildCounter,
            Spec::Backfill(_) => Kind::Backfill,
            Spec::Orphans(_) => Kind::Orphans,
        }
    }
}

/// The kind of a repair, as the `kind` key of its definition names it (and as JSON output and
/// `pgmend.repair_runs.kind` write it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    #[default]
    VoidDuplicates,
    RebuildCounter,
    Backfill,
    Orphans,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VoidDuplicates => "void_duplicates",
            Kind::RebuildCounter => "rebuild_counter",
            Kind::Backfill => "backfill",
            Kind::Orphans => "orphans",
        }
    }
}

/// An identifier as written in a definition: a plain SQL name, quoted wherever it is used.
pub fn check_identifier(origin: &str, field: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        bail!(
            "{origin}: {field} {name:?} is not a plain identifier (letters, digits and underscores, starting with a letter or underscore, at most 63 characters)"
        );
    }
    Ok(())
}

/// The tagged enum reads the file through a buffer and loses where an error is ("invalid
/// type: integer `5`, expected string or map"). Reading the file again as the struct its
/// `kind` names gives the line, the column and the key.
fn detailed_error(text: &str, tagged: toml::de::Error) -> String {
    let again = match toml::from_str::<toml::Table>(text) {
        Err(syntax) => Some(syntax),
        Ok(table) => match table.get("kind").and_then(|k| k.as_str()) {
            Some("void_duplicates") => toml::from_str::<VoidSpec>(text).err(),
            Some("rebuild_counter") => toml::from_str::<CounterSpec>(text).err(),
            Some("backfill") => toml::from_str::<BackfillSpec>(text).err(),
            Some("orphans") => toml::from_str::<OrphansSpec>(text).err(),
            _ => None,
        },
    };
    again.unwrap_or(tagged).to_string()
}

/// Checks an expression's text as the file holds it (no server).
pub fn check_text(origin: &str, key: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        bail!("{origin}: {key} is empty; write one SQL expression");
    }
    let read = crate::statements::expression_text(text);
    if read.semicolon {
        bail!("{origin}: {key} holds a `;`: write one SQL expression, with no `;` and no second statement");
    }
    if read.unbalanced {
        bail!("{origin}: {key} has unbalanced parentheses: write one SQL expression whose parentheses all close within it");
    }
    if read.unusual_quoting {
        bail!("{origin}: {key} uses `$` (quoting or a parameter), an E'...' string or a U& name: write plain '...' strings (pgmend reads the expression to find the functions it calls)");
    }
    Ok(())
}

/// Refuses a column named twice in one list.
fn distinct<'a>(origin: &str, field: &str, columns: impl Iterator<Item = &'a Ident>) -> Result<()> {
    let mut seen: Vec<&Ident> = Vec::new();
    for c in columns {
        if seen.contains(&c) {
            bail!("{origin}: {field} names {c:?} twice; name each column once");
        }
        seen.push(c);
    }
    Ok(())
}

fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Parses and checks one definition file.
pub fn parse(name: &str, origin: &str, bytes: &[u8]) -> Result<Repair> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{origin}: not valid UTF-8 (at byte {})", e.valid_up_to()))?;
    let spec: Spec = toml::from_str(text)
        .map_err(|e| anyhow::anyhow!("{origin}: {}", detailed_error(text, e).trim()))?;
    let check = |field: &str, n: &Ident| check_identifier(origin, field, n.as_str());
    match &spec {
        Spec::VoidDuplicates(v) => {
            check("table", &v.table)?;
            check("row_key", &v.row_key)?;
            check("mark", &v.mark)?;
            check("void", &v.void)?;
            if v.group_by.is_empty() || v.rank_by.is_empty() {
                bail!("{origin}: group_by and rank_by need at least one column each");
            }
            for c in &v.group_by {
                check("group_by", c)?;
            }
            for r in &v.rank_by {
                check("rank_by", &r.column)?;
            }
            distinct(origin, "group_by", v.group_by.iter())?;
            distinct(origin, "rank_by", v.rank_by.iter().map(|r| &r.column))?;
            // The engine sets mark and void on rows it finds by row_key and group_by: one
            // column for two roles would fail in the middle of a run, or regroup rows under it.
            if v.mark == v.void {
                bail!("{origin}: mark and void name the same column {:?}; they must be two columns (a boolean and a timestamp)", v.mark);
            }
            for (field, column) in [("mark", &v.mark), ("void", &v.void)] {
                if *column == v.row_key || v.group_by.contains(column) {
                    bail!("{origin}: {field} {column:?} is also the row_key or in group_by; the repair would change the columns it finds and groups rows by");
                }
            }
            for (field, value) in [
                ("keep_when_not_null", &v.keep_when_not_null),
                ("report_sum", &v.report_sum),
                ("report_by", &v.report_by),
            ] {
                if let Some(k) = value {
                    check(field, k)?;
                }
            }
        }
        Spec::RebuildCounter(c) => {
            check("counter_table", &c.counter_table)?;
            check("counter", &c.counter)?;
            check("source_table", &c.source_table)?;
            if c.key.is_empty() {
                bail!("{origin}: key needs at least one column");
            }
            for k in &c.key {
                check("key", k)?;
            }
            distinct(origin, "key", c.key.iter())?;
            if c.key.contains(&c.counter) {
                bail!("{origin}: counter {:?} is also in key; the counter must be a column of its own", c.counter);
            }
            match (c.aggregate, &c.value) {
                (Aggregate::Sum, None) => {
                    bail!("{origin}: aggregate = \"sum\" needs value = \"<column>\"")
                }
                (_, Some(v)) => check("value", v)?,
                _ => {}
            }
            if let Some(f) = &c.source_filter_null {
                check("source_filter_null", f)?;
            }
            if c.keys_from.as_str() != "source" {
                check("keys_from", &c.keys_from)?;
            } else if !c.copy_on_create.is_empty() {
                bail!("{origin}: copy_on_create needs keys_from = \"<table>\" to copy from");
            }
            for (to, from) in &c.copy_on_create {
                check("copy_on_create", to)?;
                check("copy_on_create", from)?;
                if *to == c.counter || c.key.contains(to) {
                    bail!("{origin}: copy_on_create sets {to:?}, which is the counter or in key; those are set by the repair itself");
                }
            }
        }
        Spec::Backfill(b) => {
            check("table", &b.table)?;
            check("row_key", &b.row_key)?;
            if b.set.is_empty() {
                bail!("{origin}: set needs at least one column = \"SQL expression\"");
            }
            for (column, expression) in &b.set {
                check("set", column)?;
                if *column == b.row_key {
                    bail!("{origin}: set names the row_key {column:?}; a backfill finds rows by it and may not change it");
                }
                check_text(origin, &format!("set.{}", column.as_str()), expression)?;
            }
            check_text(origin, "where", &b.predicate)?;
            for f in &b.allow_volatile {
                check_identifier(origin, "allow_volatile", f)?;
            }
        }
        Spec::Orphans(o) => {
            check("table", &o.table)?;
            check("row_key", &o.row_key)?;
            check("references.table", &o.references.table)?;
            if o.columns.is_empty() || o.columns.len() != o.references.columns.len() {
                bail!("{origin}: columns and references.columns need the same number of columns, at least one (the foreign key's)");
            }
            for c in &o.columns {
                check("columns", c)?;
            }
            for c in &o.references.columns {
                check("references.columns", c)?;
            }
            distinct(origin, "columns", o.columns.iter())?;
            distinct(origin, "references.columns", o.references.columns.iter())?;
            if o.columns.contains(&o.row_key) {
                bail!("{origin}: columns names the row_key {:?}; the repair finds rows by it and may not change it", o.row_key);
            }
            match (&o.quarantine_table, o.action) {
                (Some(_), OrphanAction::SetNull) => bail!("{origin}: quarantine_table is for action = \"quarantine\"; remove it, or quarantine the rows"),
                (Some(q), _) => check("quarantine_table", q)?,
                (None, _) => {}
            }
            if let Some(q) = o.quarantine() {
                check_identifier(
                    origin,
                    "quarantine_table (the default, <table>_quarantine)",
                    q.as_str(),
                )?;
                if q == o.table || q == o.references.table {
                    bail!("{origin}: the quarantine table {q:?} is the table or the referenced table; name another with quarantine_table");
                }
            }
        }
    }
    Ok(Repair {
        name: name.to_string(),
        origin: origin.to_string(),
        checksum: fnv1a(bytes),
        sha256: crate::digest::sha256_hex(bytes),
        spec,
    })
}

/// Where the repair definitions come from.
#[derive(Debug, Clone)]
pub enum RepairSource {
    Embedded,
    Directory(PathBuf),
}

impl RepairSource {
    /// Every definition, by name. A broken file refuses the whole set.
    pub fn load(&self) -> Result<Vec<Repair>> {
        let files: Vec<(String, String, Vec<u8>)> = match self {
            RepairSource::Embedded => embedded::EMBEDDED
                .iter()
                .map(|(f, b)| (f.to_string(), format!("embedded:{f}"), b.to_vec()))
                .collect(),
            RepairSource::Directory(dir) => {
                let mut out = Vec::new();
                for entry in std::fs::read_dir(dir).with_context(|| {
                    format!(
                        "cannot read the repairs directory {}; check --repairs-dir",
                        dir.display()
                    )
                })? {
                    let path = entry?.path();
                    if let Some(f) = path.file_name().and_then(|f| f.to_str()) {
                        if path.is_file() {
                            out.push((
                                f.to_string(),
                                path.display().to_string(),
                                std::fs::read(&path)?,
                            ));
                        }
                    }
                }
                out
            }
        };
        let mut repairs = Vec::new();
        for (file, origin, bytes) in files {
            let Some(name) = file.strip_suffix(".toml") else {
                continue;
            };
            if !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                || name.is_empty()
            {
                bail!("{origin}: a repair file is named <name>.toml with lowercase letters, digits and dashes, e.g. void-duplicate-coupons.toml");
            }
            repairs.push(parse(name, &origin, &bytes)?);
        }
        repairs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(repairs)
    }

    pub fn find(&self, name: &str) -> Result<Repair> {
        let all = self.load()?;
        let names: Vec<String> = all.iter().map(|r| r.name.clone()).collect();
        all.into_iter().find(|r| r.name == name).with_context(|| {
            format!(
                "there is no repair named {name:?}; the repairs are: {}",
                names.join(", ")
            )
        })
    }
}

/// The repair `name` of a loaded set, for a step of the release (`release.toml`) that names it.
pub fn named<'a>(repairs: &'a [Repair], name: &str) -> Result<&'a Repair> {
    repairs
        .iter()
        .find(|r| r.name == name)
        .with_context(|| format!("release.toml names repair {name:?}, which has no definition"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_shipped_definitions_load() {
        let all = RepairSource::Embedded.load().unwrap();
        let names: Vec<&str> = all.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "rebuild-campaign-budgets",
                "rebuild-member-monthly-usage",
                "restore-legacy-campaign-counters",
                "void-duplicate-coupons"
            ]
        );
    }

    #[test]
    fn hostile_definitions_are_refused() {
        let base = "kind = \"rebuild_counter\"\ndescription = \"d\"\ncounter_table = \"t\"\nkey = [\"k\"]\ncounter = \"c\"\nsource_table = \"s\"\naggregate = \"count\"\nkeys_from = \"source\"\nwhen_no_source = \"zero\"\n";
        assert!(parse("x", "x.toml", base.as_bytes()).is_ok());
        for (bad, expect) in [
            (
                base.replace("counter = \"c\"", "counter = \"c\\\"; DROP TABLE t; --\""),
                "not a plain identifier",
            ),
            (
                base.replace("key = [\"k\"]", "key = [\"k--\"]"),
                "not a plain identifier",
            ),
            (
                base.replace("key = [\"k\"]", "key = [\"k/*\"]"),
                "not a plain identifier",
            ),
            (format!("{base}bogus = 1\n"), "unknown field"),
            (
                base.replace("when_no_source = \"zero\"\n", ""),
                "missing field",
            ),
            (
                base.replace("kind = \"rebuild_counter\"", "kind = \"delete_everything\""),
                "unknown variant",
            ),
        ] {
            let e = parse("x", "repairs/x.toml", bad.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(expect) && e.contains("repairs/x.toml"),
                "{bad}\n=> {e}"
            );
        }
    }

    proptest! {
        #[test]
        fn the_definition_parser_never_panics(text in "\\PC{0,200}") {
            let _ = parse("x", "x.toml", text.as_bytes());
        }
    }
}
