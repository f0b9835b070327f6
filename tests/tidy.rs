//! Tidy checks over the source text, in the spirit of rust-analyzer's tidy tests: no database,
//! only files. SQL text lives only in the modules listed here (and in ARCHITECTURE.md), there
//! is one identifier quoter, and only the store owner names pgmend's own tables.

use std::path::{Path, PathBuf};

/// The modules allowed to hold SQL text (a path prefix under `src/`). Commands hold none: a
/// command asks, calls the library and renders.
const SQL_ALLOWED: &[&str] = &[
    "src/db/",
    "src/store/",
    "src/repair/",
    "src/migrate/",
    "src/online/",
    "src/report/",
    "src/verify.rs",
    "src/release/",
    "src/preflight/",
    "src/statements/",
    "src/demo_data.rs",
    // The throwaway cluster's own set-up (roles, settings), not the release's database.
    "src/localpg.rs",
];

/// The one module that quotes identifiers and constants, and two that quote for other
/// languages than SQL.
const QUOTING_ALLOWED: &[&str] = &[
    "src/db/sql_text.rs",
    // CSV quoting, not SQL.
    "src/report/csv_sections.rs",
    // postgresql.conf values of the throwaway cluster (the configuration file's quoting).
    "src/localpg.rs",
];

/// The owner of pgmend's tables.
const PGMEND_TABLES_ALLOWED: &[&str] = &["src/store/"];

#[test]
fn sql_text_only_in_the_allowed_modules() {
    check(
        SQL_ALLOWED,
        |text| {
            literals(text)
                .into_iter()
                .filter(|(_, l)| is_sql(l))
                .collect()
        },
        "SQL text outside the modules allowed to hold it (tests/tidy.rs SQL_ALLOWED, \
         ARCHITECTURE.md); move it into the library and call it",
    );
}

#[test]
fn one_identifier_quoter() {
    check(
        QUOTING_ALLOWED,
        |text| {
            code_lines(text)
                .into_iter()
                .filter(|(_, l)| {
                    let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
                    l.contains(r#"replace('"',"\"\"")"#)
                        || l.contains(r#"replace("\"","\"\"")"#)
                        || l.contains(r#"replace('\'',"''")"#)
                })
                .collect()
        },
        "quoting outside src/db/sql_text.rs; use Ident or Literal",
    );
}

#[test]
fn pgmend_tables_only_in_the_store() {
    check(
        PGMEND_TABLES_ALLOWED,
        |text| {
            literals(text)
                .into_iter()
                .filter(|(_, l)| names_pgmend_table(l))
                .collect()
        },
        "pgmend's tables named outside src/store (call a store function instead)",
    );
}

/// Fails with every (line, text) `find` reports in a source file outside `allowed_in`.
fn check(allowed_in: &[&str], find: impl Fn(&str) -> Vec<(usize, String)>, message: &str) {
    let found: Vec<String> = sources()
        .iter()
        .filter(|(path, _)| !allowed(path, allowed_in))
        .flat_map(|(path, text)| {
            find(text)
                .into_iter()
                .map(move |(line, l)| format!("{path}:{line}: {}", first_line(&l)))
        })
        .collect();
    assert!(found.is_empty(), "{message}:\n{}", found.join("\n"));
}

/// The heuristic's own cases, so that a change to it that stops catching SQL fails here.
#[test]
fn the_heuristics_catch_sql_and_leave_prose_alone() {
    for sql in [
        "SELECT 1",
        "  SELECT count(*) FROM t",
        "INSERT INTO t VALUES (1)",
        "UPDATE t SET x = 1",
        "DELETE FROM t",
        "CREATE INDEX i ON t (x)",
        "ALTER TABLE t ADD COLUMN c int",
        "DROP INDEX CONCURRENTLY i",
        "WITH a AS (SELECT 1) SELECT * FROM a",
        "SET LOCAL lock_timeout = '1s'",
        "x FROM pg_class WHERE relname = $1",
    ] {
        assert!(is_sql(sql), "{sql:?} is SQL");
    }
    for prose in [
        "nothing was changed; run `pgmend apply --yes`",
        "reading the ledger",
        "Add one (for example ALTER TABLE t ADD PRIMARY KEY (k))",
        "the counter differs from the source",
        "from",
        "Drop it by hand, then rerun",
        "Set PGMEND_SCHEMA to the schema's name",
    ] {
        assert!(!is_sql(prose), "{prose:?} is not SQL");
    }
    assert!(names_pgmend_table("SELECT 1 FROM pgmend.gates"));
    assert!(names_pgmend_table("to_regclass('pgmend.repair_runs')"));
    assert!(!names_pgmend_table("pgmend.1 man page"));
    let lits = literals(
        "let a = \"x\\\"y\"; // \"not\"\nlet b = r#\"raw \"q\"\"#; /* \"c\" */ let d = '\"';",
    );
    let texts: Vec<&str> = lits.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(texts, ["x\\\"y", "raw \"q\""]);
}

fn is_sql(literal: &str) -> bool {
    const STATEMENTS: [&str; 18] = [
        "SELECT",
        "INSERT INTO",
        "UPDATE",
        "DELETE FROM",
        "CREATE",
        "ALTER",
        "DROP",
        "WITH",
        "SET",
        "RESET",
        "ANALYZE",
        "LOCK",
        "TRUNCATE",
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "GRANT",
        "REVOKE",
    ];
    // Case-sensitive: pgmend writes SQL keywords in upper case, and prose that begins with
    // "Drop" or "Set" is prose.
    let text = literal.trim_start();
    let starts = STATEMENTS.iter().any(|s| {
        text.starts_with(s)
            && text[s.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_whitespace() || c == '(')
    });
    // A statement's start, or a piece of one: a FROM or a WHERE between SQL words. Prose is
    // written in lower case; SQL keywords in pgmend's statements are upper case.
    starts
        || text.contains(" FROM ") && (text.contains(" WHERE ") || text.contains("SELECT "))
        || text.contains(" FROM pg_")
        || text.contains("INSERT INTO ")
        || text.contains("DELETE FROM ")
}

/// `pgmend.` followed by a table or function name (a letter), or a quoted one.
fn names_pgmend_table(literal: &str) -> bool {
    literal.match_indices("pgmend.").any(|(i, m)| {
        let before = literal[..i].chars().last();
        let after = literal[i + m.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '/')
            && after.is_some_and(|c| c.is_ascii_lowercase() || c == '_' || c == '"')
    }) || literal.contains("\"pgmend\".")
}

fn allowed(path: &str, list: &[&str]) -> bool {
    list.iter()
        .any(|a| path == *a || (a.ends_with('/') && path.starts_with(a)))
}

fn first_line(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("");
    line.chars().take(100).collect()
}

/// Every `.rs` file under `src/`, as (path relative to the repository, text); the directory
/// `TIDY_SRC` names instead when set (to try the checks on a copy).
fn sources() -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = std::env::var_os("TIDY_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("src"));
    let mut out = Vec::new();
    walk(&src, &mut |path| {
        let relative = path.strip_prefix(&src).unwrap();
        let name = format!("src/{}", relative.to_string_lossy().replace('\\', "/"));
        out.push((name, std::fs::read_to_string(path).unwrap()));
    });
    assert!(out.len() > 20, "found the sources in {}", src.display());
    out.sort();
    out
}

fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, visit);
        } else if path.extension().is_some_and(|e| e == "rs") {
            visit(&path);
        }
    }
}

/// The string literals of a Rust file (regular and raw, byte strings too) with the line each
/// starts on, skipping comments and char literals. Escapes are kept as written.
fn literals(text: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 2;
        } else if c == 'r' && matches!(next, Some('#') | Some('"')) && !ident_before(&chars, i) {
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                i += 1;
                continue;
            }
            let start_line = line;
            let mut k = j + 1;
            let mut body = String::new();
            loop {
                if k >= chars.len() {
                    break;
                }
                if chars[k] == '"' && (0..hashes).all(|h| chars.get(k + 1 + h) == Some(&'#')) {
                    break;
                }
                line += usize::from(chars[k] == '\n');
                body.push(chars[k]);
                k += 1;
            }
            out.push((start_line, body));
            i = k + 1 + hashes;
        } else if c == '"' {
            let start_line = line;
            let mut k = i + 1;
            let mut body = String::new();
            while k < chars.len() && chars[k] != '"' {
                if chars[k] == '\\' && k + 1 < chars.len() {
                    body.push(chars[k]);
                    k += 1;
                }
                line += usize::from(chars[k] == '\n');
                body.push(chars[k]);
                k += 1;
            }
            out.push((start_line, body));
            i = k + 1;
        } else if c == '\'' {
            // A char literal ('x', '\'', '\u{1f}') or a lifetime ('a): skip the literal only.
            if next == Some('\\') {
                let mut k = i + 2;
                while k < chars.len() && chars[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The lines of a file outside comments, with their numbers.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(n, l)| (n + 1, l.to_string()))
        .collect()
}
