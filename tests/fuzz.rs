//! Property tests of the parsers that read hostile input before any connection: migration
//! file names and sets, repair definitions, connection strings. None may panic; each
//! returns Ok or Err, and what it accepts keeps its promises.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use pgmend::db::conninfo;
use pgmend::migrate::source;
use pgmend::repair::definition::{self, Spec};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Names built from the pieces a real name has, so that many of them are nearly right.
fn migration_name() -> impl Strategy<Value = String> {
    (
        prop_oneof!["V", "U", "v", "", "\\PC"],
        prop_oneof![
            "[0-9]{1,3}",
            "[0-9]{9,12}",
            "[0-9]\\.[0-9]",
            "0",
            "",
            "\\PC{1,3}"
        ],
        prop_oneof!["__", "_", "___", ""],
        prop_oneof![
            "[a-z_]{1,12}",
            "\\PC{0,12}",
            "[a-z]{1,4}[\u{e9}\u{b2}\u{301}\u{660}-][a-z]{0,4}"
        ],
        prop_oneof![".sql", ".SQL", ".sql.bak", ""],
    )
        .prop_map(|(p, v, sep, name, ext)| format!("{p}{v}{sep}{name}{ext}"))
}

proptest! {
    #![proptest_config(config())]

    /// Whatever pgmend accepts, refinery reads the same way (so the history it writes stays
    /// refinery's), and the name round-trips.
    #[test]
    fn migration_names_pgmend_accepts_refinery_reads_alike(name in prop_oneof![migration_name(), "\\PC{0,40}"]) {
        if let Ok((version, stem)) = source::parse_name(&name) {
            prop_assert!(version >= 1);
            let r = refinery::Migration::unapplied(&format!("V{version}__{stem}"), "SELECT 1;");
            prop_assert!(r.is_ok(), "refinery refuses {name}");
            let r = r.unwrap();
            prop_assert_eq!(r.version(), version);
            prop_assert_eq!(r.name(), stem.as_str());
            prop_assert_eq!(
                source::parse_name(&format!("V{version}__{stem}.sql")),
                Ok((version, stem.clone()))
            );
        }
    }

    /// A set of arbitrary files: refused or accepted, never a panic; an accepted set has
    /// unique versions in order and no statement-less migration.
    #[test]
    fn migration_sets_never_panic(
        files in prop::collection::vec(
            (migration_name(), prop_oneof![
                "[-a-zA-Z0-9 ;'\"$/*()\\n\\\\]{0,80}".prop_map(|s| s.into_bytes()),
                prop::collection::vec(any::<u8>(), 0..40),
                Just(b"CREATE TABLE t (x int);".to_vec()),
                Just(b"CREATE UNIQUE INDEX CONCURRENTLY i ON t (x) WHERE NOT y;".to_vec()),
                Just(b"/* pgmend:precondition\nname: p\nquery: SELECT 1\n*/ ALTER TABLE t ADD CONSTRAINT c CHECK (x > 0) NOT VALID;".to_vec()),
            ]),
            0..5,
        )
    ) {
        let files: Vec<(String, String, Vec<u8>)> = files
            .into_iter()
            .map(|(name, bytes)| (name.clone(), format!("m/{name}"), bytes))
            .collect();
        if let Ok(set) = source::parse_set(files) {
            for pair in set.windows(2) {
                prop_assert!(pair[0].version < pair[1].version);
            }
            for m in &set {
                prop_assert!(!m.statements.is_empty());
            }
        }
    }

    /// Arbitrary SQL in a well-named file: the splitter, the lock analysis and the census
    /// reader never panic.
    #[test]
    fn migration_sql_never_panics(sql in prop_oneof![
        "\\PC{0,200}",
        "(CREATE (UNIQUE )?INDEX (CONCURRENTLY )?|ALTER TABLE |/\\* pgmend:precondition|\\*/|--|'|\\$\\$|\\$q\\$|;|\\(|\\)|E'\\\\'|[a-z_]{1,8}| |\\n){0,40}",
    ]) {
        let _ = source::parse_set(vec![("V1__x.sql".into(), "m/V1__x.sql".into(), sql.into_bytes())]);
    }
}

/// The identifier fields of an accepted definition.
fn identifiers(spec: &Spec) -> Vec<String> {
    let mut out: Vec<pgmend::db::sql_text::Ident> = Vec::new();
    match spec {
        Spec::VoidDuplicates(v) => {
            out.extend([
                v.table.clone(),
                v.row_key.clone(),
                v.mark.clone(),
                v.void.clone(),
            ]);
            out.extend(v.group_by.iter().cloned());
            out.extend(v.rank_by.iter().map(|r| r.column.clone()));
            out.extend(v.keep_when_not_null.iter().cloned());
            out.extend(v.report_sum.iter().cloned());
            out.extend(v.report_by.iter().cloned());
        }
        Spec::Backfill(b) => {
            out.extend([b.table.clone(), b.row_key.clone()]);
            out.extend(b.set.keys().cloned());
        }
        Spec::Orphans(o) => {
            out.extend([
                o.table.clone(),
                o.row_key.clone(),
                o.references.table.clone(),
            ]);
            out.extend(o.columns.iter().cloned());
            out.extend(o.references.columns.iter().cloned());
            out.extend(o.quarantine_table.iter().cloned());
        }
        Spec::RebuildCounter(c) => {
            out.extend([
                c.counter_table.clone(),
                c.counter.clone(),
                c.source_table.clone(),
            ]);
            out.extend(c.key.iter().cloned());
            out.extend(c.value.iter().cloned());
            out.extend(c.source_filter_null.iter().cloned());
            if c.keys_from.as_str() != "source" {
                out.push(c.keys_from.clone());
            }
            for (to, from) in &c.copy_on_create {
                out.extend([to.clone(), from.clone()]);
            }
        }
    }
    out.into_iter().map(String::from).collect()
}

fn shipped_definitions() -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(repo().join("repairs"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    all.sort();
    all
}

/// One edit of a definition's text.
#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    Insert(usize, String),
    Replace(usize, usize, String),
    /// Replace the value of the n-th `key = "value"` with a hostile string.
    Value(usize, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let hostile = prop_oneof![
        Just("x\"; DROP TABLE campaigns; --".to_string()),
        Just("a--b".to_string()),
        Just("a/*b".to_string()),
        Just("a;b".to_string()),
        Just("\"".to_string()),
        Just(String::new()),
        Just("1abc".to_string()),
        Just("a".repeat(64)),
        Just("Éa".to_string()),
        "\\PC{0,12}",
    ];
    prop_oneof![
        any::<usize>().prop_map(Mutation::DeleteLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), "\\PC{0,20}|[=\\[\\]{}\"',\\n]{1,4}|[a-z_]{1,10} = (\"[a-z_]{0,8}\"|[0-9]{1,3}|\\[\\]|true)\\n")
            .prop_map(|(at, s)| Mutation::Insert(at, s)),
        (any::<usize>(), 0usize..30, "\\PC{0,10}").prop_map(|(at, len, s)| Mutation::Replace(at, len, s)),
        (any::<usize>(), hostile).prop_map(|(n, s)| Mutation::Value(n, s)),
    ]
}

fn apply(text: &str, m: &Mutation) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let boundary = |at: usize| {
        let mut i = at % (text.len() + 1);
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match m {
        Mutation::DeleteLine(n) => {
            let n = n % lines.len();
            lines
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != n)
                .map(|(_, l)| *l)
                .collect::<Vec<_>>()
                .join("\n")
        }
        Mutation::DuplicateLine(n) => {
            let n = n % lines.len();
            let mut out = lines.clone();
            out.insert(n, lines[n]);
            out.join("\n")
        }
        Mutation::Insert(at, s) => {
            let at = boundary(*at);
            format!("{}{s}{}", &text[..at], &text[at..])
        }
        Mutation::Replace(at, len, s) => {
            let from = boundary(*at);
            let to = boundary(from + len).max(from);
            format!("{}{s}{}", &text[..from], &text[to..])
        }
        Mutation::Value(n, value) => {
            let quoted: Vec<(usize, usize)> = text
                .match_indices("= \"")
                .filter_map(|(i, _)| {
                    let start = i + 3;
                    text[start..].find('"').map(|len| (start, start + len))
                })
                .collect();
            let (from, to) = quoted[n % quoted.len()];
            let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
            format!("{}{escaped}{}", &text[..from], &text[to..])
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_definitions_never_panic(text in prop_oneof![
        "\\PC{0,200}",
        "(kind|description|table|key|group_by|rank_by|column|order|aggregate|copy_on_create|[a-z_]{1,6}| = |\"[a-z_]{0,6}\"|\\[|\\]|\\{|\\}|,|\\n|[0-9]{1,3}|'){0,40}",
    ], bytes in prop::collection::vec(any::<u8>(), 0..60)) {
        let _ = definition::parse("x", "x.toml", text.as_bytes());
        let _ = definition::parse("x", "x.toml", &bytes);
    }

    /// Mutations of the shipped definitions: refused, or accepted with every identifier a
    /// plain name (nothing that could leave its quotes or end a statement) and the file
    /// named in every refusal.
    #[test]
    fn mutated_shipped_definitions_are_refused_or_plain(
        which in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let all = shipped_definitions();
        let mut text = which.get(&all).clone();
        for m in &mutations {
            text = apply(&text, m);
        }
        match definition::parse("x", "repairs/x.toml", text.as_bytes()) {
            Ok(repair) => {
                for id in identifiers(&repair.spec) {
                    prop_assert!(
                        definition::check_identifier("x", "f", &id).is_ok()
                            && !id.contains(['"', ';', '-', '/', '*', ' ']),
                        "accepted {id:?} in\n{text}"
                    );
                }
            }
            Err(e) => prop_assert!(e.to_string().starts_with("repairs/x.toml: "), "{e}"),
        }
    }
}

/// Passwords made of segments like `Q7X2` joined by the characters that break URLs and
/// keyword strings: a leak of any part shows up as a segment in the output.
fn password() -> impl Strategy<Value = (String, Vec<String>)> {
    prop::collection::vec(("[A-Z][0-9][A-Z][0-9]", "[/?#@&:=% '+\\\\]{0,2}"), 1..4).prop_map(
        |parts| {
            let segments: Vec<String> = parts.iter().map(|(s, _)| s.clone()).collect();
            let password = parts.iter().map(|(s, sep)| format!("{s}{sep}")).collect();
            (password, segments)
        },
    )
}

fn env_from(vars: BTreeMap<String, String>) -> impl Fn(&str) -> Option<String> {
    move |k| vars.get(k).cloned()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn resolve_never_panics_on_arbitrary_strings(
        s in prop_oneof![
            "\\PC{0,80}",
            "(postgres(ql)?://)?([a-z@:/?&=%\\[\\],'\\\\ .]|[0-9]{1,6}|host|port|sslmode|password|connect_timeout|dbname){0,30}",
        ],
        env in prop::collection::btree_map(
            prop_oneof!["PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSSLMODE", "PGCONNECT_TIMEOUT", "PGAPPNAME", "USER"].prop_map(String::from),
            "\\PC{0,12}|[0-9]{1,22}",
            0..4,
        ),
    ) {
        if let Ok(p) = conninfo::resolve(Some(&s), &env_from(env)) {
            prop_assert!(p.port != 0);
            prop_assert!(p.connect_timeout >= Duration::from_secs(2));
            prop_assert!(p.connect_timeout <= Duration::from_secs(conninfo::MAX_CONNECT_TIMEOUT_SECS));
            let _ = format!("{p} {p:?}");
        }
    }

    /// Numbers at their edges: port 0 and 65536 are refused, a connect timeout is between 2
    /// seconds and a day (a huge one once overflowed when the connect added its margin).
    #[test]
    fn ports_and_timeouts_stay_in_range(
        port in prop_oneof!["[0-9]{1,6}", Just("0".to_string()), Just("+5432".to_string())],
        timeout in prop_oneof!["[0-9]{1,21}", Just("18446744073709551615".to_string())],
        url in any::<bool>(),
    ) {
        let s = if url {
            format!("postgresql://u@h:{port}/d?connect_timeout={timeout}")
        } else {
            format!("host=h user=u port={port} connect_timeout={timeout}")
        };
        if let Ok(p) = conninfo::resolve(Some(&s), &|_| None) {
            prop_assert!(p.port != 0 && port.chars().all(|c| c.is_ascii_digit()));
            prop_assert!(p.connect_timeout >= Duration::from_secs(2));
            prop_assert!(p.connect_timeout <= Duration::from_secs(conninfo::MAX_CONNECT_TIMEOUT_SECS));
        }
    }

    /// No part of the password ever shows, in an error or in the rendered parameters,
    /// however it is written (unencoded in a URL, unquoted in a keyword string).
    #[test]
    fn no_part_of_the_password_ever_shows(
        (pw, segments) in password(),
        form in 0usize..4,
        host in "[a-z]{1,8}",
        port in prop_oneof!["[0-9]{1,5}", "[a-z]{1,3}", Just(String::new())],
        db in "[a-z]{0,8}",
        query in "(&?(sslmode|application_name|dbname)=[a-z-]{0,8}){0,3}",
    ) {
        let colon_port = if port.is_empty() { String::new() } else { format!(":{port}") };
        let s = match form {
            0 => format!("postgresql://u:{pw}@{host}{colon_port}/{db}?{query}"),
            1 => format!("postgres://{host}{colon_port}/{db}?{query}&password={pw}"),
            2 => format!("host={host} user=u password={pw} dbname=x{db}"),
            _ => format!("host={host} password='{}' port={port}", pw.replace('\\', "\\\\").replace('\'', "\\'")),
        };
        let shown = match conninfo::resolve(Some(&s), &|_| None) {
            Ok(p) => format!("{p} {p:?}"),
            Err(e) => format!("{e:#} {e:?}"),
        };
        for seg in &segments {
            prop_assert!(!shown.contains(seg.as_str()), "{s:?} shows {seg}: {shown}");
        }
    }
}

/// One slip of the hand in a connection string.
#[derive(Debug, Clone)]
enum Slip {
    /// The scheme damaged: `postgresql//`, `postgresql:/`, `postgres:`, a JDBC prefix.
    Scheme(&'static str),
    Delete(usize),
    Insert(usize, char),
    Replace(usize, char),
    /// A key misspelt: one letter of the n-th `key=` dropped.
    Key(usize),
}

fn slip() -> impl Strategy<Value = Slip> {
    let hostile = prop::sample::select(vec![
        '%', '\'', '=', '&', '?', '@', ':', '/', ' ', '\\', '[', ',',
    ]);
    prop_oneof![
        prop::sample::select(vec![
            "postgresql//",
            "postgresql:/",
            "postgres:",
            "jdbc:postgresql://",
            "postgresq://"
        ])
        .prop_map(Slip::Scheme),
        any::<usize>().prop_map(Slip::Delete),
        (any::<usize>(), hostile.clone()).prop_map(|(at, c)| Slip::Insert(at, c)),
        (any::<usize>(), hostile).prop_map(|(at, c)| Slip::Replace(at, c)),
        any::<usize>().prop_map(Slip::Key),
    ]
}

fn slip_into(s: &str, slip: &Slip) -> String {
    let chars: Vec<char> = s.chars().collect();
    let at = |n: usize| n % (chars.len() + 1);
    let mut out = chars.clone();
    match slip {
        Slip::Scheme(scheme) => {
            return match s.split_once("://") {
                Some((_, rest)) => format!("{scheme}{rest}"),
                None => s.to_string(),
            }
        }
        Slip::Delete(n) if !chars.is_empty() => {
            out.remove(n % chars.len());
        }
        Slip::Insert(n, c) => out.insert(at(*n), *c),
        Slip::Replace(n, c) if !chars.is_empty() => out[n % chars.len()] = *c,
        Slip::Key(n) => {
            let keys: Vec<usize> = s
                .match_indices('=')
                .map(|(i, _)| i)
                .filter(|i| *i > 1)
                .collect();
            if let Some(i) = keys.get(n % keys.len().max(1)) {
                let mut t = s.to_string();
                t.remove(i - 2);
                return t;
            }
        }
        _ => {}
    }
    out.into_iter().collect()
}

proptest! {
    #![proptest_config(config())]

    /// Well-formed strings with a password, then one to three slips: whatever the parser
    /// refuses, neither its error nor the binary's stdout and stderr shows any piece of the
    /// password, and the binary exits 2 without trying to connect.
    #[test]
    fn malformed_strings_are_refused_without_showing_the_password(
        (pw, segments) in password(),
        form in 0usize..4,
        slips in prop::collection::vec(slip(), 1..4),
    ) {
        let s = match form {
            0 => format!("postgresql://u:{}@h:5432/db?sslmode=disable", utf8_percent_encode(&pw)),
            1 => format!("postgres://h/db?sslmode=disable&password={}", utf8_percent_encode(&pw)),
            2 => format!("host=h port=5432 user=u password='{}' dbname=db", pw.replace('\\', "\\\\").replace('\'', "\\'")),
            _ => format!("host=h password={} dbname=db sslmode=disable", pw.replace('\\', "\\\\").replace(' ', "\\ ")),
        };
        prop_assume!(conninfo::resolve(Some(&s), &env_from(user_env())).is_ok());
        let bad = slips.iter().fold(s, |s, slip| slip_into(&s, slip));
        let Err(e) = conninfo::resolve(Some(&bad), &env_from(user_env())) else {
            return Ok(());
        };
        let shown = format!("{e:#} {e:?}");
        for seg in &segments {
            prop_assert!(!shown.contains(seg.as_str()), "{bad:?} shows {seg}: {shown}");
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pgmend"))
            .env_clear()
            .envs(user_env())
            .args(["migrate", "status", "--database-url", &bad])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let both = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        prop_assert_eq!(out.status.code(), Some(2), "{:?}: {}", bad, both);
        prop_assert!(both.starts_with("pgmend: error: ") && !both.contains("could not connect"), "{bad:?}: {both}");
        for seg in &segments {
            prop_assert!(!both.contains(seg.as_str()), "{bad:?} shows {seg}: {both}");
        }
    }
}

/// What the malformed-string test runs with: a user, and no password file.
fn user_env() -> BTreeMap<String, String> {
    [("USER", "u"), ("HOME", "/nonexistent")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn utf8_percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[test]
fn the_shipped_definitions_survive_the_mutation_harness_unchanged() {
    for text in shipped_definitions() {
        assert!(definition::parse("x", "x.toml", text.as_bytes()).is_ok());
    }
}
