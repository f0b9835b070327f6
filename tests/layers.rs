//! The layers of `src/` point one way (in the spirit of rust-analyzer's tidy tests): plain
//! file reading, no database, no compiler.
//!
//! A file's module is its top-level module under `src/` (`src/db/connect.rs` is `db`,
//! `src/verify.rs` is `verify`); what it uses is every `crate::NAME` path in it (in `use`
//! lines, groups `crate::{a, b}` and inline paths), plus `super::NAME` in a folder's own
//! `mod.rs`. Comments and the unit tests at the end of a file are left out. The rules:
//!
//! - `db/` talks to PostgreSQL and knows nothing above it: it may use only [`DB_MAY_USE`].
//! - No cycle between the top-level modules of `src/`: the module graph is a layering.
//! - No cycle between the files of a folder either (deeper folders included): each file is a
//!   node (a folder's `mod.rs` is the folder module itself), and a `super::X` or
//!   `crate::dir::X` path leads to the file whose module it names (`X.rs` when `X` is a
//!   module, the folder's `mod.rs` when `X` is an item of it). A `mod.rs`'s bare paths to its
//!   own children (`engine::apply`) are not read.
//! - No command module uses another: what two commands share lives in the library or in
//!   `commands/mod.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules below (or beside) the database layer: errors with their SQLSTATE, durations
/// and lock options, how numbers and durations are written, stdout and progress lines, and the
/// signal state a bounded retry checks. None of them uses anything of pgmend but each other.
const DB_MAY_USE: &[&str] = &["error", "config", "human", "output", "signals"];

/// The source files of `src/`, as (path relative to `src/`, text without comments).
fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((rel.replace('\\', "/"), strip_comments(without_tests(&text))));
            }
        }
    }
    files.sort();
    files
}

/// The file without its unit tests (`#[cfg(test)] mod tests` at the end, the house's habit):
/// a test may use whatever it needs to build its case.
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// Drops `//` comments (doc comments included: an intra-doc link is not a dependency).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module of a file (`None` for the crate roots).
fn module_of(rel: &str) -> Option<&str> {
    match rel.split_once('/') {
        Some((dir, _)) => Some(dir),
        None if rel == "lib.rs" || rel == "main.rs" => None,
        None => rel.strip_suffix(".rs"),
    }
}

/// The names that follow `prefix` in `text`: `prefix::a`, and each of `prefix::{a, b::c}`.
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    paths_after(text, prefix)
        .into_iter()
        .filter_map(|path| path.into_iter().next())
        .collect()
}

fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

fn split_top_level(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The top-level modules each top-level module uses (itself left out).
fn graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|(rel, _)| module_of(rel).map(String::from))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        let Some(module) = module_of(rel) else {
            continue;
        };
        let mut used = names_after(text, "crate::");
        if rel.ends_with("/mod.rs") {
            used.extend(names_after(text, "super::")); // a folder's parent is the crate root
        }
        let entry = graph.entry(module.to_string()).or_default();
        entry.extend(
            used.into_iter()
                .filter(|u| u != module && modules.contains(u)),
        );
    }
    graph
}

/// The module path of a file: `release/engine.rs` is `release::engine`, `release/mod.rs` is
/// `release`, `lib.rs` and `main.rs` the crate root (no segment).
fn module_path(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut path: Vec<String> = rel.split('/').map(String::from).collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// The whole paths that follow `prefix` in `text`, as segments: `prefix::a::B`, each path of
/// `prefix::{a, b::{self, C}}` (`self` ends a path at its parent), and `prefix::*` as none.
fn paths_after(text: &str, prefix: &str) -> BTreeSet<Vec<String>> {
    fn read(rest: &str, mut at: Vec<String>, out: &mut BTreeSet<Vec<String>>) {
        let mut rest = rest;
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let end = matching_brace(group);
                for item in split_top_level(&group[..end]) {
                    read(item.trim(), at.clone(), out);
                }
                return;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() {
                break;
            }
            rest = &rest[name.len()..];
            if name != "self" {
                at.push(name);
            }
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        out.insert(at);
    }
    let mut paths = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            read(rest, Vec::new(), &mut paths);
        }
    }
    paths
}

/// Each file of a folder of `src/` (deeper folders included) with the files of the same
/// top-level folder it uses, itself left out: a `crate::` or `super::` path leads to the file
/// of the longest module the path starts with.
fn file_graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let by_module: BTreeMap<Vec<String>, &str> = files
        .iter()
        .map(|(rel, _)| (module_path(rel), rel.as_str()))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files.iter().filter(|(rel, _)| rel.contains('/')) {
        let own = module_path(rel);
        let mut used: Vec<Vec<String>> = paths_after(text, "crate::").into_iter().collect();
        for path in paths_after(text, "super::") {
            let ups = 1 + path.iter().take_while(|s| *s == "super").count();
            if ups <= own.len() {
                let mut whole = own[..own.len() - ups].to_vec();
                whole.extend(path.into_iter().skip(ups - 1));
                used.push(whole);
            }
        }
        let entry = graph.entry(rel.clone()).or_default();
        for whole in used {
            let target = (1..=whole.len())
                .rev()
                .find_map(|n| by_module.get(&whole[..n]));
            if let Some(&target) = target {
                if target != rel && whole[0] == own[0] {
                    entry.insert(target.to_string());
                }
            }
        }
    }
    graph
}

/// Every circle of `graph`: for each set of nodes that reach one another, one cycle through
/// them, as `a -> b -> a`.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reach = |from: &str| -> BTreeSet<&str> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from]);
        while let Some(node) = todo.pop() {
            for next in graph.get(node).into_iter().flatten() {
                if seen.insert(next.as_str()) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut rings = Vec::new();
    for node in graph.keys().map(String::as_str) {
        if placed.contains(node) {
            continue;
        }
        let ring: BTreeSet<&str> = reach(node)
            .into_iter()
            .filter(|n| *n != node && reach(n).contains(node))
            .chain([node])
            .collect();
        placed.extend(&ring);
        if ring.len() > 1 {
            let within = ring
                .iter()
                .map(|n| {
                    let next = graph[*n].iter().filter(|m| ring.contains(m.as_str()));
                    (n.to_string(), next.cloned().collect())
                })
                .collect();
            rings.extend(cycle(&within));
        }
    }
    rings
}

/// The files of `db/` that use a module outside [`DB_MAY_USE`], with what they use.
fn db_violations(files: &[(String, String)]) -> Vec<String> {
    let modules = graph(files).into_keys().collect::<BTreeSet<_>>();
    let mut found = Vec::new();
    for (rel, text) in files.iter().filter(|(rel, _)| rel.starts_with("db/")) {
        let above: Vec<String> = names_after(text, "crate::")
            .into_iter()
            .filter(|u| u != "db" && modules.contains(u) && !DB_MAY_USE.contains(&u.as_str()))
            .collect();
        if !above.is_empty() {
            found.push(format!("src/{rel} uses {}", above.join(", ")));
        }
    }
    found
}

/// A cycle of the module graph, as `a -> b -> a`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        finished: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut ring = path[at..].to_vec();
            ring.push(node);
            return Some(ring.join(" -> "));
        }
        if finished.contains(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, finished) {
                return Some(found);
            }
        }
        path.pop();
        finished.insert(node);
        None
    }
    let mut finished = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut finished))
}

/// Command files that use another command module, with what they use.
fn command_violations(files: &[(String, String)]) -> Vec<String> {
    let commands: BTreeSet<String> = files
        .iter()
        .filter_map(|(rel, _)| rel.strip_prefix("commands/")?.strip_suffix(".rs"))
        .filter(|name| *name != "mod")
        .map(String::from)
        .collect();
    let mut found = Vec::new();
    for (rel, text) in files {
        let Some(own) = rel
            .strip_prefix("commands/")
            .and_then(|r| r.strip_suffix(".rs"))
        else {
            continue;
        };
        if own == "mod" {
            continue;
        }
        let mut used = names_after(text, "super::");
        used.extend(names_after(text, "crate::commands::"));
        let others: Vec<String> = used
            .into_iter()
            .filter(|u| u != own && commands.contains(u))
            .collect();
        if !others.is_empty() {
            found.push(format!("src/{rel} uses commands::{}", others.join(", ")));
        }
    }
    found
}

#[test]
fn db_uses_nothing_above_it() {
    let found = db_violations(&sources());
    assert!(
        found.is_empty(),
        "db/ is the lowest layer that talks to PostgreSQL; it may use only {DB_MAY_USE:?}, but:\n  {}\nMove what needs the domain into a module above db (as preflight/ is).",
        found.join("\n  ")
    );
}

#[test]
fn no_cycle_between_top_level_modules() {
    let graph = graph(&sources());
    assert!(graph.contains_key("db") && graph.contains_key("commands"));
    if let Some(ring) = cycle(&graph) {
        panic!("the top-level modules of src/ import each other in a circle: {ring}. Make one a layer below the other (pass what it needs as parameters, or move the shared type down).");
    }
}

#[test]
fn no_cycle_between_the_files_of_a_folder() {
    let graph = file_graph(&sources());
    assert!(graph.contains_key("release/engine.rs") && graph.contains_key("db/mod.rs"));
    let rings: Vec<String> = cycles(&graph)
        .iter()
        .map(|ring| {
            ring.split(" -> ")
                .map(|f| format!("src/{f}"))
                .collect::<Vec<_>>()
                .join(" -> ")
        })
        .collect();
    assert!(
        rings.is_empty(),
        "files of a folder of src/ import each other in a circle:\n  {}\nMove the type they share into a file below both (or the folder's mod.rs), or have one pass the other plain values.",
        rings.join("\n  ")
    );
}

#[test]
fn commands_do_not_use_each_other() {
    let found = command_violations(&sources());
    assert!(
        found.is_empty(),
        "a command asks, calls the library and renders; it does not call another command:\n  {}\nMove what they share into the library (or a helper of commands/mod.rs).",
        found.join("\n  ")
    );
}

// The checks themselves, on made-up sources: each one sees what it is there to see.

fn made_up(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(rel, text)| (rel.to_string(), strip_comments(without_tests(text))))
        .collect()
}

#[test]
fn the_checks_see_an_upward_import_a_cycle_and_a_command_calling_a_command() {
    let files = made_up(&[
        (
            "db/mod.rs",
            "use crate::error::PgContext;\nuse crate::{config, repair::store};",
        ),
        ("error.rs", "// uses crate::db in a comment only\n"),
        ("config.rs", ""),
        ("repair/mod.rs", "pub fn f() { crate::migrate::g() }"),
        ("migrate/mod.rs", "use super::repair;"),
        ("commands/mod.rs", "pub fn open() {}"),
        ("commands/release.rs", "use super::{open, repair::finish};"),
        ("commands/repair.rs", "use super::open;"),
    ]);
    assert_eq!(db_violations(&files), ["src/db/mod.rs uses repair"]);
    assert_eq!(
        cycle(&graph(&files)).as_deref(),
        Some("repair -> migrate -> repair")
    );
    assert_eq!(
        command_violations(&files),
        ["src/commands/release.rs uses commands::repair"]
    );
    let clean = made_up(&[
        ("db/mod.rs", "use crate::error::PgContext;"),
        ("error.rs", "// crate::db"),
        (
            "config.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests { use crate::repair; }",
        ),
        ("repair/mod.rs", "use crate::db; use crate::config;"),
        ("commands/repair.rs", "use super::open; use crate::repair;"),
    ]);
    assert!(db_violations(&clean).is_empty());
    assert_eq!(cycle(&graph(&clean)), None);
    assert!(command_violations(&clean).is_empty());
}

#[test]
fn the_file_check_sees_a_circle_inside_a_folder_and_follows_super_and_crate_paths() {
    let files = made_up(&[
        ("lib.rs", "pub mod release;"),
        ("store.rs", "use crate::release::Step;"),
        (
            "release/mod.rs",
            "pub mod engine;\nuse crate::store;\npub enum Step {}",
        ),
        (
            "release/dry_run.rs",
            "use super::engine::Release;\nuse super::{fingerprint::{self, Inputs}, Step};",
        ),
        ("release/engine.rs", "use super::{fingerprint, Step};"),
        (
            "release/fingerprint.rs",
            "fn f(p: &[crate::release::dry_run::StepPlan]) {}",
        ),
        ("repair/mod.rs", ""),
        (
            "repair/runner.rs",
            "use super::workers;\nuse crate::release::Step;",
        ),
        (
            "repair/workers.rs",
            "pub fn g() { super::runner::run() }\n// super::mod",
        ),
        (
            "online/mod.rs",
            "use super::repair::runner;\npub use crate::online::evaluate::f;",
        ),
        ("online/evaluate.rs", "pub fn f() {}"),
        (
            "online/census.rs",
            "use super::*;\nuse super::super::store;",
        ),
    ]);
    let graph = file_graph(&files);
    assert_eq!(
        graph["release/dry_run.rs"],
        [
            "release/engine.rs",
            "release/fingerprint.rs",
            "release/mod.rs"
        ]
        .map(String::from)
        .into()
    );
    assert!(graph["release/mod.rs"].is_empty());
    assert_eq!(
        graph["online/mod.rs"],
        ["online/evaluate.rs".to_string()].into()
    );
    assert_eq!(
        graph["online/census.rs"],
        ["online/mod.rs".to_string()].into()
    );
    assert!(!graph.contains_key("store.rs"));
    assert_eq!(
        cycles(&graph),
        [
            "release/dry_run.rs -> release/engine.rs -> release/fingerprint.rs -> release/dry_run.rs",
            "repair/runner.rs -> repair/workers.rs -> repair/runner.rs",
        ]
    );
    let clean = made_up(&[
        ("release/mod.rs", "pub struct Release;\npub enum Step {}"),
        ("release/dry_run.rs", "use super::{fingerprint, Release};"),
        (
            "release/engine.rs",
            "use super::{fingerprint, Release, Step};",
        ),
        ("release/fingerprint.rs", "use super::Step;"),
    ]);
    assert!(cycles(&file_graph(&clean)).is_empty());
}
