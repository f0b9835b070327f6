//! Statements that would hold a strong lock for a time that grows with their table, read from
//! the text (squawk's rules are the reference list): a foreign key, a CHECK, a UNIQUE or
//! PRIMARY KEY added without the online form, `SET NOT NULL`, `ALTER COLUMN ... TYPE`, a
//! `CREATE INDEX` without CONCURRENTLY, a column added with a volatile default, and a scan
//! (`VALIDATE`, a whole-table `UPDATE` or `DELETE`) after a strong lock taken earlier in the same
//! transaction.
//!
//! Some of these forms are long only on some databases: `SET NOT NULL` scans unless a valid
//! `CHECK (col IS NOT NULL)` is there, a type change rewrites unless the types are binary
//! coercible, a default is slow only when volatile. The text gives the candidates; the plan asks
//! the catalog (`migrate::long_locks`), which also reads each table's size.

use serde::Serialize;

use super::tokens::{is_word, read_name, skip_words, top_level_actions, Token};
use super::{LockMode, Statement};

/// A statement form that holds `mode` on `table` while it reads or rewrites every row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LongLock {
    pub table: String,
    pub mode: LockMode,
    pub form: Form,
}

/// Which long-lock form, with what the catalog needs to decide it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "form", rename_all = "snake_case")]
pub enum Form {
    /// `ADD ... FOREIGN KEY` (or `REFERENCES`) without `NOT VALID`: every row checked.
    ForeignKey,
    /// `ADD ... CHECK` without `NOT VALID`: every row checked.
    Check,
    /// `ADD UNIQUE` or `ADD PRIMARY KEY` without `USING INDEX`: the index built under the lock.
    UniqueConstraint,
    /// `ALTER COLUMN c SET NOT NULL`: every row checked, unless a valid `CHECK (c IS NOT NULL)`
    /// proves it (PostgreSQL 12+).
    SetNotNull { column: String },
    /// `ALTER COLUMN c TYPE t`: the table rewritten, unless the change is binary coercible.
    TypeChange {
        column: String,
        to: String,
        using: bool,
    },
    /// `CREATE INDEX` without `CONCURRENTLY`: writes wait for the whole build.
    IndexWithoutConcurrently,
    /// `REFRESH MATERIALIZED VIEW` without `CONCURRENTLY`: reads of the view wait for the whole
    /// refresh.
    RefreshWithoutConcurrently,
    /// `ADD COLUMN c ... DEFAULT f(...)` with a volatile function, a serial type or a stored
    /// generated column: the table rewritten. `calls` are the functions the default calls (the
    /// catalog says whether one is volatile); `always`: a serial or stored generated column.
    VolatileDefault {
        column: String,
        calls: Vec<String>,
        always: bool,
    },
    /// A scan (`what`) while a strong lock this transaction took earlier, at `line`, is held.
    ScanAfterStrongLock {
        what: String,
        line: usize,
        held: LockMode,
    },
}

impl Form {
    /// What the statement does that takes long, in a few words.
    pub fn describe(&self) -> String {
        match self {
            Form::ForeignKey => "adds a FOREIGN KEY that checks every row".into(),
            Form::Check => "adds a CHECK that checks every row".into(),
            Form::UniqueConstraint => "builds a unique index under the table's lock".into(),
            Form::SetNotNull { column } => {
                format!("SET NOT NULL on {column} checks every row")
            }
            Form::TypeChange { column, to, .. } => {
                format!("changing {column} to {to} rewrites the table")
            }
            Form::IndexWithoutConcurrently => "builds the index without CONCURRENTLY".into(),
            Form::RefreshWithoutConcurrently => {
                "refreshes the materialized view without CONCURRENTLY: its readers wait".into()
            }
            Form::VolatileDefault { column, .. } => {
                format!("adding {column} with a volatile default rewrites the table")
            }
            Form::ScanAfterStrongLock { what, line, held } => {
                format!("{what} scans the table while the {held} lock taken at line {line} is held")
            }
        }
    }

    /// The online form to use instead.
    pub fn online_form(&self) -> String {
        match self {
            Form::ForeignKey => "add it NOT VALID, then VALIDATE CONSTRAINT in a later migration (SHARE UPDATE EXCLUSIVE: reads and writes go on)".into(),
            Form::Check => "add it NOT VALID, then VALIDATE CONSTRAINT in a later migration".into(),
            Form::UniqueConstraint => "CREATE UNIQUE INDEX CONCURRENTLY in an online migration, then ADD CONSTRAINT ... UNIQUE USING INDEX".into(),
            Form::SetNotNull { column } => format!(
                "ADD CONSTRAINT ... CHECK ({column} IS NOT NULL) NOT VALID, VALIDATE CONSTRAINT in a later migration, then SET NOT NULL (PostgreSQL 12+ uses the valid check instead of a scan)"
            ),
            Form::TypeChange { column, .. } => format!(
                "add a new column, backfill it in batches, and switch the application over, instead of changing {column} in place"
            ),
            Form::IndexWithoutConcurrently => "CREATE INDEX CONCURRENTLY, in an online migration (-- pgmend:online)".into(),
            Form::RefreshWithoutConcurrently => "REFRESH MATERIALIZED VIEW CONCURRENTLY (EXCLUSIVE: reads go on; the view needs a unique index on plain columns)".into(),
            Form::VolatileDefault { .. } => "add the column without the default (or with a constant one), set the default for new rows, and backfill the existing rows in batches".into(),
            Form::ScanAfterStrongLock { .. } => "move the scan into a migration of its own, so that the strong lock is released before it".into(),
        }
    }

    /// Whether the table's size alone decides: else the catalog must say that the form is
    /// long on this database (a check, a type, a function's volatility).
    pub fn needs_catalog(&self) -> bool {
        match self {
            Form::SetNotNull { .. } | Form::TypeChange { .. } => true,
            Form::VolatileDefault { always, .. } => !always,
            _ => false,
        }
    }
}

/// The long-lock forms of one statement, from its text alone (the earlier statements of its
/// transaction are [`after_strong_locks`]'s).
pub(super) fn candidates(statement: &Statement, tokens: &[Token]) -> Vec<LongLock> {
    let first = |w: &str| is_word(tokens.first(), w);
    if first("alter") && is_word(tokens.get(1), "table") {
        return alter_table(tokens);
    }
    // `WITH NO DATA` empties the view at once: quick.
    let no_data = tokens
        .windows(2)
        .any(|w| is_word(w.first(), "no") && is_word(w.get(1), "data"));
    if first("refresh") && !no_data && !tokens.iter().any(|t| is_word(Some(t), "concurrently")) {
        if let Some(lock) = statement.locks.first() {
            return vec![LongLock {
                table: lock.relation.clone(),
                mode: LockMode::AccessExclusive,
                form: Form::RefreshWithoutConcurrently,
            }];
        }
    }
    if first("create") {
        let i = skip_words(tokens, 1, &["unique"]);
        if is_word(tokens.get(i), "index") && !statement.online {
            if let Some(lock) = statement.locks.first() {
                return vec![LongLock {
                    table: lock.relation.clone(),
                    mode: LockMode::Share,
                    form: Form::IndexWithoutConcurrently,
                }];
            }
        }
    }
    Vec::new()
}

/// The actions of `ALTER TABLE name action, action ...`.
fn alter_table(tokens: &[Token]) -> Vec<LongLock> {
    let i = skip_words(tokens, 2, &["if", "exists", "only"]);
    let Some((table, after)) = read_name(tokens, i) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for action in top_level_actions(&tokens[after.min(tokens.len())..]) {
        let word = |k: usize, w: &str| is_word(action.get(k), w);
        let has = |w: &str| action.iter().any(|t| matches!(t, Token::Word(x) if x == w));
        let not_valid = action
            .windows(2)
            .any(|p| is_word(p.first(), "not") && is_word(p.get(1), "valid"));
        let lock = |mode, form| LongLock {
            table: table.clone(),
            mode,
            form,
        };
        if word(0, "add") {
            // ADD [CONSTRAINT name] FOREIGN KEY | CHECK | UNIQUE | PRIMARY KEY, else a column.
            let k = if word(1, "constraint") { 3 } else { 1 };
            if word(k, "foreign") {
                if !not_valid {
                    found.push(lock(LockMode::ShareRowExclusive, Form::ForeignKey));
                }
            } else if word(k, "check") {
                if !not_valid {
                    found.push(lock(LockMode::AccessExclusive, Form::Check));
                }
            } else if word(k, "unique") || (word(k, "primary") && word(k + 1, "key")) {
                if !has("using") {
                    found.push(lock(LockMode::AccessExclusive, Form::UniqueConstraint));
                }
            } else {
                found
                    .extend(added_column(&action[1..]).map(|f| lock(LockMode::AccessExclusive, f)));
            }
        } else if word(0, "alter") {
            let k = if word(1, "column") { 2 } else { 1 };
            let Some((column, next)) = read_name(action, k) else {
                continue;
            };
            let at = |w: &str| is_word(action.get(next), w);
            if at("set")
                && is_word(action.get(next + 1), "not")
                && is_word(action.get(next + 2), "null")
            {
                found.push(lock(LockMode::AccessExclusive, Form::SetNotNull { column }));
            } else if at("type") || (at("set") && is_word(action.get(next + 1), "data")) {
                let start = next + if at("type") { 1 } else { 3 };
                let end = action[start.min(action.len())..]
                    .iter()
                    .position(|t| matches!(t, Token::Word(w) if w == "using" || w == "collate"))
                    .map_or(action.len(), |p| start + p);
                found.push(lock(
                    LockMode::AccessExclusive,
                    Form::TypeChange {
                        column,
                        to: spelled(&action[start.min(end)..end]),
                        using: has("using"),
                    },
                ));
            }
        }
    }
    found
}

/// `[COLUMN] [IF NOT EXISTS] name type ... [DEFAULT expr] ...` of `ADD`: a volatile-default
/// candidate when the default calls a function, the type is serial, or the column is stored
/// generated.
fn added_column(action: &[Token]) -> Option<Form> {
    let i = skip_words(action, 0, &["column", "if", "not", "exists"]);
    let (column, next) = read_name(action, i)?;
    let rest = &action[next.min(action.len())..];
    let serial = matches!(rest.first(), Some(Token::Word(t)) if t.ends_with("serial") && ["serial", "bigserial", "smallserial", "serial2", "serial4", "serial8"].contains(&t.as_str()));
    let stored = rest
        .windows(2)
        .any(|p| is_word(p.first(), "generated") && !is_word(p.get(1), "by"))
        && rest
            .iter()
            .any(|t| matches!(t, Token::Word(w) if w == "stored"));
    let calls: Vec<String> = match rest
        .iter()
        .position(|t| matches!(t, Token::Word(w) if w == "default"))
    {
        Some(d) => rest[d + 1..]
            .windows(2)
            .filter_map(|p| match (&p[0], &p[1]) {
                (Token::Word(f) | Token::Quoted(f), Token::Punct('(')) => Some(f.clone()),
                _ => None,
            })
            .collect(),
        None => Vec::new(),
    };
    (serial || stored || !calls.is_empty()).then_some(Form::VolatileDefault {
        column,
        calls,
        always: serial || stored,
    })
}

/// Tokens written back as text (a type name: `varchar(20)`, `numeric(12,2)`, `text[]`).
fn spelled(tokens: &[Token]) -> String {
    let mut out = String::new();
    for t in tokens {
        match t {
            Token::Word(w) => {
                if out.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    out.push(' ');
                }
                out.push_str(w);
            }
            // A quoted name as written between its quotes: the catalog does not find such a
            // type by this text, so its change counts as a rewrite.
            Token::Quoted(q) => out.push_str(q),
            Token::Literal => out.push_str("'...'"),
            Token::Punct(c) => out.push(*c),
        }
    }
    out
}

/// What a statement does to a `CHECK (col IS NOT NULL)`, which lets a later `SET NOT NULL` skip
/// its scan once valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotNullCheck {
    /// `ADD CONSTRAINT name CHECK (column IS NOT NULL)`, `valid` unless `NOT VALID`.
    Adds {
        table: String,
        name: String,
        column: String,
        valid: bool,
    },
    /// `VALIDATE CONSTRAINT name`.
    Validates { table: String, name: String },
}

/// The [`NotNullCheck`] of an `ALTER TABLE` with one action, if any.
pub(super) fn not_null_check(tokens: &[Token]) -> Option<NotNullCheck> {
    if !(is_word(tokens.first(), "alter") && is_word(tokens.get(1), "table")) {
        return None;
    }
    let i = skip_words(tokens, 2, &["if", "exists", "only"]);
    let (table, after) = read_name(tokens, i)?;
    let action = &tokens[after.min(tokens.len())..];
    let word = |k: usize, w: &str| is_word(action.get(k), w);
    if word(0, "validate") && word(1, "constraint") {
        let (name, _) = read_name(action, 2)?;
        return Some(NotNullCheck::Validates { table, name });
    }
    if !(word(0, "add") && word(1, "constraint") && word(3, "check")) {
        return None;
    }
    let (name, _) = read_name(action, 2)?;
    // CHECK ( column IS NOT NULL ) [NOT VALID], also with the column in its own parentheses.
    let inner: Vec<&Token> = action[4..]
        .iter()
        .filter(|t| !matches!(t, Token::Punct('(' | ')')))
        .collect();
    let (column, rest) = match inner.as_slice() {
        [Token::Word(c) | Token::Quoted(c), rest @ ..] => (c.clone(), rest),
        _ => return None,
    };
    let words: Vec<&str> = rest
        .iter()
        .map(|t| match t {
            Token::Word(w) => w.as_str(),
            _ => "?",
        })
        .collect();
    match words.as_slice() {
        ["is", "not", "null"] => Some(NotNullCheck::Adds {
            table,
            name,
            column,
            valid: true,
        }),
        ["is", "not", "null", "not", "valid"] => Some(NotNullCheck::Adds {
            table,
            name,
            column,
            valid: false,
        }),
        _ => None,
    }
}

/// In one transaction (`statements` of a transactional migration): each later statement that
/// scans a table (`VALIDATE CONSTRAINT`, an `UPDATE` or `DELETE`) on which an earlier one took a
/// lock stronger than SHARE UPDATE EXCLUSIVE, which is held until the commit. Returns the index
/// of the scanning statement and its long lock.
pub fn after_strong_locks(statements: &[Statement]) -> Vec<(usize, LongLock)> {
    let mut held: Vec<(String, LockMode, usize)> = Vec::new();
    let mut found = Vec::new();
    for (i, s) in statements.iter().enumerate() {
        let scans = s.summary.starts_with("UPDATE ")
            || s.summary.starts_with("DELETE ")
            || (s.summary.starts_with("ALTER TABLE ")
                && s.locks
                    .first()
                    .is_some_and(|l| l.mode == LockMode::ShareUpdateExclusive)
                && s.sql.to_lowercase().contains("validate"));
        if scans {
            if let Some(table) = s.locks.first().map(|l| l.relation.clone()) {
                if let Some((_, mode, line)) = held.iter().find(|(t, _, _)| *t == table) {
                    found.push((
                        i,
                        LongLock {
                            table: table.clone(),
                            mode: *mode,
                            form: Form::ScanAfterStrongLock {
                                what: match s.summary.split(' ').next() {
                                    Some("UPDATE") => "an UPDATE".into(),
                                    Some("DELETE") => "a DELETE".into(),
                                    _ => "VALIDATE CONSTRAINT".into(),
                                },
                                line: *line,
                                held: *mode,
                            },
                        },
                    ));
                }
            }
        }
        for lock in &s.locks {
            if lock.mode > LockMode::ShareUpdateExclusive
                && !held
                    .iter()
                    .any(|(t, m, _)| *t == lock.relation && *m >= lock.mode)
            {
                held.retain(|(t, _, _)| *t != lock.relation);
                held.push((lock.relation.clone(), lock.mode, s.line));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statements::{long_locks, split};

    fn forms(sql: &str) -> Vec<Form> {
        split(sql)
            .iter()
            .flat_map(long_locks)
            .map(|l| l.form)
            .collect()
    }

    #[test]
    fn each_long_form_is_a_candidate_and_its_online_form_is_not() {
        assert_eq!(
            forms("REFRESH MATERIALIZED VIEW sales_by_month"),
            [Form::RefreshWithoutConcurrently]
        );
        assert!(forms("REFRESH MATERIALIZED VIEW CONCURRENTLY sales_by_month").is_empty());
        assert!(forms("REFRESH MATERIALIZED VIEW sales_by_month WITH NO DATA").is_empty());
        assert_eq!(
            forms("ALTER TABLE lines ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES products (id)"),
            [Form::ForeignKey]
        );
        assert!(forms("ALTER TABLE lines ADD CONSTRAINT fk FOREIGN KEY (p) REFERENCES products (id) NOT VALID").is_empty());
        assert_eq!(
            forms("ALTER TABLE lines ADD CHECK (qty > 0)"),
            [Form::Check]
        );
        assert!(forms("ALTER TABLE lines ADD CONSTRAINT q CHECK (qty > 0) NOT VALID").is_empty());
        assert_eq!(
            forms("ALTER TABLE lines ADD CONSTRAINT u UNIQUE (a, b)"),
            [Form::UniqueConstraint]
        );
        assert!(forms("ALTER TABLE lines ADD CONSTRAINT u UNIQUE USING INDEX u_idx").is_empty());
        assert_eq!(
            forms("ALTER TABLE lines ALTER COLUMN qty SET NOT NULL"),
            [Form::SetNotNull {
                column: "qty".into()
            }]
        );
        assert_eq!(
            forms("ALTER TABLE lines ALTER qty TYPE numeric(12, 2) USING qty::numeric"),
            [Form::TypeChange {
                column: "qty".into(),
                to: "numeric(12,2)".into(),
                using: true
            }]
        );
        assert_eq!(
            forms("ALTER TABLE lines ALTER COLUMN note SET DATA TYPE varchar(20)"),
            [Form::TypeChange {
                column: "note".into(),
                to: "varchar(20)".into(),
                using: false
            }]
        );
        assert_eq!(
            forms("CREATE INDEX lines_by_p ON lines (p)"),
            [Form::IndexWithoutConcurrently]
        );
        assert!(forms("CREATE INDEX CONCURRENTLY lines_by_p ON lines (p)").is_empty());
        assert_eq!(
            forms("ALTER TABLE lines ADD COLUMN token uuid DEFAULT gen_random_uuid()"),
            [Form::VolatileDefault {
                column: "token".into(),
                calls: vec!["gen_random_uuid".into()],
                always: false
            }]
        );
        assert_eq!(
            forms("ALTER TABLE lines ADD COLUMN n bigserial"),
            [Form::VolatileDefault {
                column: "n".into(),
                calls: vec![],
                always: true
            }]
        );
        // A constant default, and a plain column, take no time with the table's size.
        assert!(forms("ALTER TABLE lines ADD COLUMN flag boolean NOT NULL DEFAULT false, ADD COLUMN at timestamptz").is_empty());
    }

    #[test]
    fn several_actions_are_read_one_by_one() {
        assert_eq!(
            forms("ALTER TABLE t ADD COLUMN c int DEFAULT 0, ALTER COLUMN d SET NOT NULL, ADD CONSTRAINT k CHECK (c IN (1, 2)) NOT VALID"),
            [Form::SetNotNull { column: "d".into() }]
        );
    }

    #[test]
    fn a_scan_after_a_strong_lock_in_the_same_transaction_is_flagged() {
        let s = split(
            "ALTER TABLE lines ADD CONSTRAINT q CHECK (qty > 0) NOT VALID;\nALTER TABLE lines VALIDATE CONSTRAINT q;\nUPDATE other SET x = 1;",
        );
        let found = after_strong_locks(&s);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, 1);
        assert_eq!(
            found[0].1.form,
            Form::ScanAfterStrongLock {
                what: "VALIDATE CONSTRAINT".into(),
                line: 1,
                held: LockMode::AccessExclusive
            }
        );
        // The VALIDATE alone, in a migration of its own, holds no strong lock.
        assert!(after_strong_locks(&split("ALTER TABLE lines VALIDATE CONSTRAINT q;")).is_empty());
    }

    #[test]
    fn a_not_null_check_and_its_validation_are_read() {
        let read = |sql: &str| crate::statements::not_null_check(&split(sql)[0]);
        assert_eq!(
            read("ALTER TABLE lines ADD CONSTRAINT qty_nn CHECK (qty IS NOT NULL) NOT VALID"),
            Some(NotNullCheck::Adds {
                table: "lines".into(),
                name: "qty_nn".into(),
                column: "qty".into(),
                valid: false
            })
        );
        assert_eq!(
            read("ALTER TABLE lines VALIDATE CONSTRAINT qty_nn"),
            Some(NotNullCheck::Validates {
                table: "lines".into(),
                name: "qty_nn".into()
            })
        );
        assert_eq!(
            read("ALTER TABLE lines ADD CONSTRAINT q CHECK (qty > 0) NOT VALID"),
            None
        );
    }

    #[test]
    fn a_marker_in_the_comments_before_a_statement_accepts_its_long_lock() {
        let s = split(
            "-- pgmend:long-lock the table holds 40 rows in every environment\nCREATE INDEX a ON t (x);\n-- pgmend:long-lock\nCREATE INDEX b ON t (y);\nCREATE INDEX c ON t (z);",
        );
        assert_eq!(
            s[0].long_lock_accepted.as_deref(),
            Some("the table holds 40 rows in every environment")
        );
        // A marker without a reason accepts nothing, and a marker covers its statement only.
        assert_eq!(s[1].long_lock_accepted, None);
        assert_eq!(s[2].long_lock_accepted, None);
    }
}
