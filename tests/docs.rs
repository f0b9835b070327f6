//! The documentation holds together, without a database: every relative link in README.md,
//! ARCHITECTURE.md, docs/*.md and runbooks/*.md resolves (the file exists, and a `#anchor`
//! names a heading of it by GitHub's slug rules), the README's command table lists exactly
//! the commands the binary has (each one answers `--help`), and the README and ARCHITECTURE.md
//! stay within their size limits.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use common::pgmend_command;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

const README_LIMIT: usize = 20_000;
const ARCHITECTURE_LIMIT: usize = 30_000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, ARCHITECTURE.md, docs/*.md and runbooks/*.md, as paths relative to the repository.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    for dir in ["docs", "runbooks"] {
        let mut in_dir: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".md"))
            .map(|n| Path::new(dir).join(n))
            .collect();
        in_dir.sort();
        files.extend(in_dir);
    }
    files
}

fn parser(markdown: &str) -> Parser<'_> {
    Parser::new_ext(markdown, Options::ENABLE_TABLES)
}

/// GitHub's anchor for a heading's text: lowercased, every character that is not a letter, a
/// digit, a space, `-` or `_` dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a document's headings, with GitHub's `-1`, `-2`, ... for repeated ones.
/// Headings inside code blocks are not headings (pulldown-cmark knows).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in parser(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap());
                let mut anchor = base.clone();
                let mut n = 0;
                while found.contains(&anchor) {
                    n += 1;
                    anchor = format!("{base}-{n}");
                }
                found.insert(anchor);
            }
            _ => {}
        }
    }
    found
}

/// Every link and image destination in a document.
fn links(markdown: &str) -> Vec<String> {
    parser(markdown)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.into_string()),
            _ => None,
        })
        .collect()
}

/// What is wrong with one relative link of `file`, if anything.
fn broken(file: &Path, link: &str) -> Option<String> {
    if link.contains("://") || link.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
    let target = if path.is_empty() {
        repo().join(file)
    } else {
        repo().join(file.parent().unwrap()).join(path)
    };
    if !target.exists() {
        return Some(format!("{link}: {} does not exist", target.display()));
    }
    if anchor.is_empty() {
        return None;
    }
    if target.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "{link}: an anchor into a file that is not Markdown"
        ));
    }
    let headings = anchors(&std::fs::read_to_string(&target).unwrap());
    (!headings.contains(anchor))
        .then(|| format!("{link}: no heading with the anchor #{anchor} (it has: {headings:?})"))
}

fn broken_links() -> Vec<String> {
    let mut problems = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(repo().join(&file)).unwrap();
        for link in links(&text) {
            if let Some(p) = broken(&file, &link) {
                problems.push(format!("{}: {p}", file.display()));
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_in_the_documentation_resolves() {
    let problems = broken_links();
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_link_checker_catches_a_missing_file_and_a_missing_anchor() {
    let readme = Path::new("README.md");
    assert_eq!(broken(readme, "docs/commands.md"), None);
    assert_eq!(broken(readme, "#quick-start"), None);
    assert_eq!(broken(readme, "https://example.com/nothing.md"), None);
    assert!(broken(readme, "docs/no-such-page.md").is_some());
    assert!(broken(readme, "#no-such-heading").is_some());
    assert!(broken(readme, "docs/commands.md#no-such-heading").is_some());
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("The release, in order"), "the-release-in-order");
    assert_eq!(
        slug("repair apply NAME --format json"),
        "repair-apply-name---format-json"
    );
    assert_eq!(
        slug("Signals: Ctrl-C, SIGTERM, SIGHUP"),
        "signals-ctrl-c-sigterm-sighup"
    );
    assert_eq!(slug("pgmend's own tables"), "pgmends-own-tables");
    let repeated = anchors("# A\n\n## Step\n\n## Step\n\n```\n# not a heading\n```\n");
    let expected: BTreeSet<String> = ["a", "step", "step-1"].map(String::from).into();
    assert_eq!(repeated, expected);
}

/// The commands of the README's table (the `pgmend ...` cell of each row under `## Commands`),
/// as their words without `pgmend`.
fn readme_commands() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("\n## Commands\n")
        .nth(1)
        .expect("a Commands section in the README")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `pgmend "))
        .map(|l| {
            l.split('`')
                .next()
                .unwrap()
                .split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .map(String::from)
                .collect()
        })
        .collect()
}

/// Every command the binary has, from its clap definition: leaves, and groups by their leaves.
fn cli_commands() -> BTreeSet<Vec<String>> {
    fn walk(cmd: &clap::Command, prefix: &[String], out: &mut BTreeSet<Vec<String>>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut words = prefix.to_vec();
            words.push(sub.get_name().to_string());
            if sub.has_subcommands() {
                walk(sub, &words, out);
            } else {
                out.insert(words);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&pgmend::cli::Cli::command(), &[], &mut out);
    out
}

#[test]
fn every_command_in_the_readme_table_exists_and_every_command_is_in_it() {
    let table = readme_commands();
    assert!(
        table.len() >= 10,
        "the command table looks empty: {table:?}"
    );
    for words in &table {
        let out = pgmend_command()
            .args(words)
            .arg("--help")
            .output()
            .expect("running pgmend");
        assert_eq!(
            out.status.code(),
            Some(0),
            "README lists `pgmend {}`, but `pgmend {} --help` fails:\n{}",
            words.join(" "),
            words.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed: BTreeSet<Vec<String>> = table.into_iter().collect();
    let missing: Vec<String> = cli_commands()
        .difference(&listed)
        .map(|w| w.join(" "))
        .collect();
    assert!(
        missing.is_empty(),
        "commands missing from the README's table: {missing:?}"
    );
}

fn chars(file: &str) -> usize {
    std::fs::read_to_string(repo().join(file))
        .unwrap()
        .chars()
        .count()
}

#[test]
fn the_readme_and_the_architecture_stay_short() {
    let readme = chars("README.md");
    assert!(
        readme <= README_LIMIT,
        "README.md has {readme} characters, more than {README_LIMIT}: move reference material to docs/"
    );
    let architecture = chars("ARCHITECTURE.md");
    assert!(
        architecture <= ARCHITECTURE_LIMIT,
        "ARCHITECTURE.md has {architecture} characters, more than {ARCHITECTURE_LIMIT}: \
         move function-level detail into the modules' //! docs"
    );
}

/// Every `tests/FILE.rs::name` that a document names as the test of something.
fn named_tests(markdown: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (i, _) in markdown.match_indices("tests/") {
        let rest = &markdown[i + "tests/".len()..];
        let Some((file, after)) = rest.split_once(".rs::") else {
            continue;
        };
        if file.is_empty()
            || !file
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/')
        {
            continue;
        }
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        found.push((format!("tests/{file}.rs"), name));
    }
    found
}

fn missing_tests(markdown: &str) -> Vec<String> {
    named_tests(markdown)
        .into_iter()
        .filter(|(file, name)| {
            let source = std::fs::read_to_string(repo().join(file)).unwrap_or_default();
            !source.contains(&format!("fn {name}("))
        })
        .map(|(file, name)| format!("{file}::{name}"))
        .collect()
}

#[test]
fn every_test_the_documentation_names_exists() {
    let mut missing = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(repo().join(&file)).unwrap();
        for test in missing_tests(&text) {
            missing.push(format!("{}: {test}", file.display()));
        }
    }
    assert!(
        missing.is_empty(),
        "named tests that do not exist:\n{}",
        missing.join("\n")
    );
    let architecture = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    assert!(
        named_tests(&architecture).len() >= 20,
        "ARCHITECTURE.md's invariants name their tests as tests/FILE.rs::name"
    );
    assert_eq!(
        missing_tests("tests/docs.rs::no_such_test and tests/docs.rs::slugs_follow_github"),
        ["tests/docs.rs::no_such_test"]
    );
}

/// The pages a document links to, as paths relative to the repository.
fn linked_pages(file: &Path) -> BTreeSet<PathBuf> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    links(&text)
        .into_iter()
        .filter(|l| !l.contains("://"))
        .filter_map(|l| {
            let path = l.split('#').next().unwrap().to_string();
            (!path.is_empty()).then(|| file.parent().unwrap().join(path))
        })
        .map(|p| {
            // docs/../runbooks/x.md → runbooks/x.md
            let mut parts: Vec<std::path::Component> = Vec::new();
            for c in p.components() {
                match c {
                    std::path::Component::ParentDir => {
                        parts.pop();
                    }
                    std::path::Component::CurDir => {}
                    c => parts.push(c),
                }
            }
            parts.iter().collect()
        })
        .collect()
}

#[test]
fn every_page_is_linked_from_the_readme() {
    let linked = linked_pages(Path::new("README.md"));
    let orphans: Vec<String> = documents()
        .into_iter()
        .filter(|d| d != Path::new("README.md") && !linked.contains(d))
        .map(|d| d.display().to_string())
        .collect();
    assert!(
        orphans.is_empty(),
        "pages the README does not link to (add them to its Documentation section): {orphans:?}"
    );
}
