//! Reading migration SQL without a server: splitting a file into statements, and the
//! strongest lock each statement takes (from PostgreSQL's documentation of lock modes).
//!
//! The plan reports these locks from the text alone: a dry run never runs DDL to find out.
//!
//! `split` cuts a file into statements at top-level semicolons, respecting quotes, `E''` strings,
//! dollar quotes and nested comments, records each statement's line (its first line that is not
//! blank, a `--` comment or inside a `/* */` block that starts a line, so V5's `ALTER TABLE` is
//! line 17, after its precondition block), and strips leading `--` lines and `/* */` blocks from
//! the statement's text (so a precondition block before a statement is not part of it). Each
//! statement is then tokenized (`tokens`) and read (`analyze`). `LockMode` serializes as
//! `ACCESS_EXCLUSIVE` and so on.

use std::fmt;

use serde::Serialize;

use analyze::analyze;
use tokens::{comment_end, tokenize};

mod analyze;
pub mod long_lock;
mod tokens;

pub use long_lock::{LongLock, NotNullCheck};

/// PostgreSQL's table-level lock modes, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockMode {
    AccessShare,
    RowShare,
    RowExclusive,
    ShareUpdateExclusive,
    Share,
    ShareRowExclusive,
    Exclusive,
    AccessExclusive,
}

impl LockMode {
    /// What the application notices while the lock is held (or waited for).
    pub fn blocks(self) -> &'static str {
        match self {
            LockMode::AccessShare | LockMode::RowShare | LockMode::RowExclusive => {
                "nothing the application does"
            }
            LockMode::ShareUpdateExclusive => "other DDL and VACUUM; reads and writes go on",
            LockMode::Share => "writes (INSERT, UPDATE, DELETE); reads go on",
            LockMode::ShareRowExclusive => "writes (INSERT, UPDATE, DELETE); reads go on",
            LockMode::Exclusive => "everything but plain reads",
            LockMode::AccessExclusive => "every query on the table, reads included",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockMode::AccessShare => "ACCESS SHARE",
            LockMode::RowShare => "ROW SHARE",
            LockMode::RowExclusive => "ROW EXCLUSIVE",
            LockMode::ShareUpdateExclusive => "SHARE UPDATE EXCLUSIVE",
            LockMode::Share => "SHARE",
            LockMode::ShareRowExclusive => "SHARE ROW EXCLUSIVE",
            LockMode::Exclusive => "EXCLUSIVE",
            LockMode::AccessExclusive => "ACCESS EXCLUSIVE",
        })
    }
}

/// One lock a statement takes on an existing relation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockTaken {
    /// The relation as written (`schema.table` joined with `.`); `DROP INDEX` gives
    /// `"<index> and its table"`.
    pub relation: String,
    pub mode: LockMode,
    /// The name to find the locked table by in the catalog: `relation`, or for `DROP INDEX`
    /// the index's name, which stands for its table (`db::retry`'s waits find the table from it).
    #[serde(skip)]
    pub lookup: String,
}

/// One statement of a migration file, with what pgmend knows about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Statement {
    /// 1-based line of the file where the statement starts.
    pub line: usize,
    pub sql: String,
    /// `ALTER TABLE issued_coupons`, `CREATE UNIQUE INDEX CONCURRENTLY ...`.
    pub summary: String,
    pub locks: Vec<LockTaken>,
    /// Must run outside a transaction block (CONCURRENTLY, VACUUM).
    pub online: bool,
    /// BEGIN, COMMIT and friends: pgmend owns the transactions, so files may not.
    pub transaction_control: bool,
    /// The lock analysis did not recognise the statement and assumed the strongest lock.
    pub lock_assumed: bool,
    /// Tables this statement creates (to refuse re-creating what exists).
    pub creates_tables: Vec<String>,
    /// `CREATE TABLE IF NOT EXISTS`: the table may be there already, with its readers and
    /// writers (a migration's gap wait waits for them as for any table's).
    #[serde(skip)]
    pub creates_if_missing: bool,
    /// Why pgmend does not run this statement, and what to write instead (a migration file
    /// holding it is refused as it loads).
    #[serde(skip)]
    pub unsupported: Option<&'static str>,
    /// Why the migration's author accepts a long lock here: the text after
    /// [`LONG_LOCK_MARKER`] in a `--` line among the comments right before the statement.
    #[serde(skip)]
    pub long_lock_accepted: Option<String>,
}

/// The `--` comment before a statement that accepts its long lock: `-- pgmend:long-lock <why>`.
pub const LONG_LOCK_MARKER: &str = "pgmend:long-lock";

/// What `statement` does to a `CHECK (col IS NOT NULL)` (see [`long_lock::NotNullCheck`]).
pub fn not_null_check(statement: &Statement) -> Option<NotNullCheck> {
    long_lock::not_null_check(&tokenize(&statement.sql))
}

/// Whether `statement` is an `ALTER TABLE ... DETACH PARTITION` (the server asks for the owner
/// of the table, not of the partition it detaches).
pub fn detaches_partition(statement: &Statement) -> bool {
    tokenize(&statement.sql)
        .windows(2)
        .any(|w| tokens::is_word(w.first(), "detach") && tokens::is_word(w.get(1), "partition"))
}

/// The constraint an `ALTER TABLE table VALIDATE CONSTRAINT name` validates, as (table, name).
pub fn validated_constraint(statement: &Statement) -> Option<(String, String)> {
    match long_lock::not_null_check(&tokenize(&statement.sql))? {
        NotNullCheck::Validates { table, name } => Some((table, name)),
        NotNullCheck::Adds { .. } => None,
    }
}

/// The forms of `statement` that would hold a strong lock for a time that grows with the
/// table, from its text (see [`long_lock`]).
pub fn long_locks(statement: &Statement) -> Vec<LongLock> {
    long_lock::candidates(statement, &tokenize(&statement.sql))
}

/// What pgmend reads of an expression from a repair definition, before the server checks it:
/// whether it holds a `;` outside quotes and comments, and the names it calls as functions (a
/// name, possibly schema-qualified, right before a `(`), lower-cased unless quoted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExpressionText {
    pub semicolon: bool,
    pub calls: Vec<String>,
    /// The parentheses close more than they open somewhere, or do not all close: the text
    /// would leave the parentheses pgmend puts around it.
    pub unbalanced: bool,
    /// The text is one string literal or `NULL`, which the server types as text in a query
    /// but takes as the column's type in an assignment.
    pub untyped_literal: bool,
    /// The text holds a form whose quoting pgmend's reader does not follow (`E'...'` escapes,
    /// `$$` quotes, `U&` names) or a `$` parameter.
    pub unusual_quoting: bool,
}

/// Reads `text` as one SQL expression (see [`ExpressionText`]).
pub fn expression_text(text: &str) -> ExpressionText {
    let tokens = tokenize(text);
    let mut depth: i64 = 0;
    let mut unbalanced = false;
    for t in &tokens {
        match t {
            tokens::Token::Punct('(') => depth += 1,
            tokens::Token::Punct(')') => {
                depth -= 1;
                unbalanced |= depth < 0;
            }
            _ => {}
        }
    }
    let mut out = ExpressionText {
        semicolon: tokens.contains(&tokens::Token::Punct(';')),
        calls: Vec::new(),
        unbalanced: unbalanced || depth != 0,
        untyped_literal: matches!(tokens.as_slice(), [tokens::Token::Literal])
            || matches!(tokens.as_slice(), [tokens::Token::Word(w)] if w == "null"),
        unusual_quoting: tokens.iter().any(|t| match t {
            tokens::Token::Punct('$') => true,
            tokens::Token::Word(w) => w.contains('$'),
            _ => false,
        }) || tokens.windows(2).any(|w| {
            matches!((&w[0], &w[1]), (tokens::Token::Word(e), tokens::Token::Literal) if e == "e")
                || matches!((&w[0], &w[1]), (tokens::Token::Word(u), tokens::Token::Punct('&')) if u == "u")
        }),
    };
    let mut i = 0;
    while i < tokens.len() {
        match tokens::read_name(&tokens, i) {
            Some((name, next)) => {
                // A call, or functional notation (`t.f` calls `f(t)`): the last part is looked up too.
                let called = tokens.get(next) == Some(&tokens::Token::Punct('('));
                let last = name.rsplit('.').next().unwrap_or(&name).to_string();
                for candidate in [
                    called.then(|| name.clone()),
                    (name.contains('.') && !called).then_some(last),
                ]
                .into_iter()
                .flatten()
                {
                    if !out.calls.contains(&candidate) {
                        out.calls.push(candidate);
                    }
                }
                i = next;
            }
            None => i += 1,
        }
    }
    out
}

impl Statement {
    pub fn strongest_lock(&self) -> Option<LockMode> {
        self.locks.iter().map(|l| l.mode).max()
    }
}

/// Splits SQL into statements at top-level semicolons, respecting quotes, dollar quotes
/// and comments. Statements that hold only comments are dropped.
pub fn split(sql: &str) -> Vec<Statement> {
    let bytes: Vec<char> = sql.chars().collect();
    let mut statements = Vec::new();
    let mut start = 0usize;
    let mut i = 0usize;
    let mut line = 1usize;
    let mut start_line = 1usize;
    let n = bytes.len();
    let advance = |i: &mut usize, line: &mut usize, c: char| {
        if c == '\n' {
            *line += 1;
        }
        *i += 1;
    };
    while i < n {
        if let Some(end) = comment_end(&bytes, i) {
            line += bytes[i..end].iter().filter(|&&c| c == '\n').count();
            i = end;
            continue;
        }
        let c = bytes[i];
        match c {
            '\'' | '"' => {
                let backslash = c == '\''
                    && i > 0
                    && matches!(bytes[i - 1], 'e' | 'E')
                    && (i < 2 || !bytes[i - 2].is_alphanumeric());
                i += 1;
                while i < n {
                    if backslash && bytes[i] == '\\' {
                        i += 2;
                        continue;
                    }
                    if bytes[i] == c {
                        if bytes.get(i + 1) == Some(&c) {
                            i += 2;
                            continue;
                        }
                        i += 1;
                        break;
                    }
                    {
                        let c = bytes[i];
                        advance(&mut i, &mut line, c);
                    }
                }
            }
            '$' => {
                // $tag$ ... $tag$, where tag is empty or an identifier (not $1 parameters).
                let mut j = i + 1;
                while j < n && (bytes[j].is_alphanumeric() || bytes[j] == '_') {
                    j += 1;
                }
                let is_tag = j < n
                    && bytes[j] == '$'
                    && !bytes.get(i + 1).is_some_and(|d| d.is_ascii_digit());
                if is_tag {
                    let tag: String = bytes[i..=j].iter().collect();
                    i = j + 1;
                    let tag_chars: Vec<char> = tag.chars().collect();
                    while i < n && bytes[i..].iter().take(tag_chars.len()).ne(tag_chars.iter()) {
                        {
                            let c = bytes[i];
                            advance(&mut i, &mut line, c);
                        }
                    }
                    i = (i + tag_chars.len()).min(n);
                } else {
                    i += 1;
                }
            }
            ';' => {
                push_statement(&mut statements, &bytes[start..i], start_line);
                i += 1;
                start = i;
                start_line = line;
            }
            _ => advance(&mut i, &mut line, c),
        }
    }
    push_statement(&mut statements, &bytes[start..n], start_line);
    statements
}

fn push_statement(out: &mut Vec<Statement>, chars: &[char], first_line: usize) {
    let text: String = chars.iter().collect();
    let tokens = tokenize(&text);
    if tokens.is_empty() {
        return;
    }
    // The statement starts at its first line that holds more than blanks and comments.
    let leading = text.len() - text.trim_start().len();
    let mut line = first_line + text[..leading].matches('\n').count();
    let mut in_block = false;
    for l in text.trim_start().lines() {
        let t = l.trim();
        if in_block || t.starts_with("/*") {
            in_block = !t.contains("*/");
            line += 1;
        } else if t.is_empty() || t.starts_with("--") {
            line += 1;
        } else {
            break;
        }
    }
    let mut statement = analyze(strip_leading_comments(text.trim()), line, &tokens);
    statement.long_lock_accepted = long_lock_accepted(&text);
    out.push(statement);
}

/// The reason given by a `-- pgmend:long-lock <why>` line among the comments before the
/// statement (an empty reason accepts nothing).
fn long_lock_accepted(text: &str) -> Option<String> {
    text.trim_start()
        .lines()
        .take_while(|l| l.trim().is_empty() || l.trim().starts_with("--"))
        .filter_map(|l| l.trim().strip_prefix("--"))
        .filter_map(|c| c.trim().strip_prefix(LONG_LOCK_MARKER))
        .map(|why| why.trim_start_matches(':').trim().to_string())
        .find(|why| !why.is_empty())
}

fn strip_leading_comments(text: &str) -> String {
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if rest.starts_with("--") {
            rest = rest.split_once('\n').map(|(_, r)| r).unwrap_or("");
        } else if rest.starts_with("/*") {
            rest = rest.split_once("*/").map(|(_, r)| r).unwrap_or("");
        } else {
            return rest.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_respecting_quotes_comments_and_dollar_quotes() {
        let sql = "-- head; not a statement\nCREATE TABLE a (x text DEFAULT ';');\n\n/* ; */ INSERT INTO \"we;ird\" VALUES ($$;$$);\nDO $f$ BEGIN PERFORM 1; END $f$;\n-- trailing comment only\n";
        let s = split(sql);
        assert_eq!(s.len(), 3, "{s:#?}");
        assert_eq!((s[0].line, s[0].summary.as_str()), (2, "CREATE TABLE a"));
        assert_eq!(s[1].summary, "INSERT we;ird");
        assert_eq!(s[1].locks[0].mode, LockMode::RowExclusive);
        assert_eq!(s[2].line, 5);
        assert!(s[2].lock_assumed);
    }

    #[test]
    fn locks_of_the_release_statements() {
        let s = split(
            "ALTER TABLE issued_coupons ADD COLUMN voided_at timestamptz;
             CREATE TABLE campaign_budgets (campaign_id text PRIMARY KEY REFERENCES campaigns);
             CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate;
             ALTER TABLE campaign_budgets VALIDATE CONSTRAINT issued_within_budget;
             DROP INDEX CONCURRENTLY IF EXISTS one_coupon_per_member;
             ALTER TABLE \"Odd\".\"T\" ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES other (a) NOT VALID;",
        );
        let strongest: Vec<_> = s.iter().map(|st| st.strongest_lock().unwrap()).collect();
        assert_eq!(
            strongest,
            [
                LockMode::AccessExclusive,
                LockMode::ShareRowExclusive,
                LockMode::ShareUpdateExclusive,
                LockMode::ShareUpdateExclusive,
                LockMode::ShareUpdateExclusive,
                LockMode::ShareRowExclusive
            ]
        );
        assert_eq!(s[1].creates_tables, ["campaign_budgets"]);
        assert!(!s[1].creates_if_missing);
        assert_eq!(s[1].locks[0].relation, "campaigns");
        assert!(s[2].online && s[4].online && !s[0].online);
        assert_eq!(s[5].locks[0].relation, "Odd.T");
        assert_eq!(s[5].locks[1].relation, "other");
    }

    #[test]
    fn if_not_exists_says_the_table_may_be_there() {
        let s = split(
            "CREATE TABLE IF NOT EXISTS \"Audit\" (x int);
             create unlogged table if not exists audit2 (x int);
             CREATE TABLE exists_not (x int);",
        );
        assert_eq!(s[0].creates_tables, ["Audit"]);
        assert_eq!(s[1].creates_tables, ["audit2"]);
        assert!(s[0].creates_if_missing && s[1].creates_if_missing);
        assert!(!s[2].creates_if_missing);
    }

    #[test]
    fn a_statement_after_a_block_comment_starts_on_its_own_line() {
        let s = split("-- head\n/* pgmend:precondition\nname: x\n*/\nALTER TABLE t ADD c int;");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].line, 5);
        assert!(s[0].sql.starts_with("ALTER TABLE"), "{}", s[0].sql);
    }

    #[test]
    fn the_constraint_a_validate_names_is_read() {
        let s = split("ALTER TABLE ONLY \"Child\" VALIDATE CONSTRAINT \"Fk\"; ALTER TABLE t ADD CONSTRAINT c CHECK (x IS NOT NULL) NOT VALID; ALTER TABLE t VALIDATE CONSTRAINT a, VALIDATE CONSTRAINT b;");
        assert_eq!(
            validated_constraint(&s[0]),
            Some(("Child".to_string(), "Fk".to_string()))
        );
        assert_eq!(validated_constraint(&s[1]), None);
        assert_eq!(validated_constraint(&s[2]).unwrap().1, "a");
    }

    #[test]
    fn transaction_control_is_flagged() {
        let s = split("BEGIN; SELECT 1; COMMIT;");
        assert!(s[0].transaction_control && !s[1].transaction_control && s[2].transaction_control);
    }

    #[test]
    fn escape_strings_do_not_end_early() {
        let s = split(r"INSERT INTO t VALUES (E'it\'s; fine'); SELECT 2;");
        assert_eq!(s.len(), 2, "{s:#?}");
    }
}
