//! Long locks flagged before they are taken: each statement of the pending migrations that
//! would hold a strong lock for a time that grows with its table (`statements::long_lock` reads
//! the forms from the text), with the table's size, a rough time and the online form to use.
//!
//! `flag` runs in the plan's read-only transaction, over the pending migrations in order. For each
//! candidate on a table that exists now (a table the release creates is empty when the statement
//! runs) it asks the catalog what the text cannot say: whether a valid `CHECK (col IS NOT NULL)`
//! proves a `SET NOT NULL` (or an earlier pending migration adds and validates one, or the column
//! is already NOT NULL), whether a type change is binary coercible, whether a default's function
//! is volatile. The table's rows are `pg_class.reltuples`, or, for a table never analyzed, a
//! count that stops after the threshold. A flagged statement on a table above the threshold
//! (`--long-lock-rows`, default 1,000,000) is a blocker of the plan, so `apply` refuses it
//! before its first change (exit 2), unless the migration accepts it: a `-- pgmend:long-lock
//! <why>` line among the comments right before the statement.
//!
//! The time is the table's size read at [`SCAN_BYTES_PER_SECOND`], three times that for a
//! rewrite or an index build: an order of magnitude for people, not a promise.

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use super::source::{Migration, Mode};
use crate::db::sql_text::Ident;
use crate::error::PgContext;
use crate::human;
use crate::statements::long_lock::{after_strong_locks, Form};
use crate::statements::{long_locks, not_null_check, LockMode, NotNullCheck};

/// `--long-lock-rows`' default: a statement that holds a strong lock while it reads or
/// rewrites a table of more rows than this is refused unless its migration accepts it.
pub const DEFAULT_ROWS: i64 = 1_000_000;

/// How fast the estimate assumes a busy server reads a table: 100 MiB/s.
pub const SCAN_BYTES_PER_SECOND: i64 = 100 * 1024 * 1024;

/// One flagged statement.
#[derive(Debug, Clone, Serialize)]
pub struct LongLockFinding {
    /// The migration's version.
    #[serde(skip)]
    pub version: i32,
    pub line: usize,
    pub statement: String,
    pub table: String,
    pub lock: LockMode,
    #[serde(flatten)]
    pub form: Form,
    /// What takes long, in words.
    pub what: String,
    /// Rows of the table: the planner's estimate, or, for a table never analyzed, a count
    /// that stops at the threshold + 1.
    pub rows: i64,
    /// The count stopped there: the table holds at least `rows` rows.
    pub rows_at_least: bool,
    /// The table's size on disk (heap and indexes).
    pub bytes: i64,
    /// A rough time the lock would be held, in seconds.
    pub estimated_seconds: i64,
    pub online_form: String,
    /// The reason the migration gives for accepting it, if it does.
    pub accepted: Option<String>,
    /// Above the threshold and not accepted: `apply` refuses it.
    pub refused: bool,
}

impl LongLockFinding {
    /// One line for the plan and for the refusal.
    pub fn describe(&self, label: &str) -> String {
        format!(
            "{label} line {}: {} ({}) holds {} on {} ({}{} rows, {}) for about {}, blocking {}. Online form: {}{}",
            self.line,
            self.statement,
            self.what,
            self.lock,
            self.table,
            if self.rows_at_least { "at least " } else { "" },
            human::int(self.rows),
            human::bytes(self.bytes),
            human::duration(std::time::Duration::from_secs(self.estimated_seconds as u64)),
            self.lock.blocks(),
            self.online_form,
            match &self.accepted {
                Some(why) => format!(". Accepted by the migration: {why}"),
                None => String::new(),
            }
        )
    }
}

/// The long locks of `pending` migrations, in order, as the module says, and a blocker for each
/// one refused.
pub fn flag(
    client: &mut postgres::Client,
    pending: &[&Migration],
    threshold: i64,
) -> Result<(Vec<LongLockFinding>, Vec<String>)> {
    let mut tx = client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a read-only transaction to look for long locks")?;
    let mut checks = Checks::default();
    let mut found = Vec::new();
    let mut refused = Vec::new();
    for migration in pending {
        let label = migration.label();
        let mut candidates: Vec<(usize, crate::statements::LongLock)> = migration
            .statements
            .iter()
            .enumerate()
            .flat_map(|(i, s)| long_locks(s).into_iter().map(move |l| (i, l)))
            .collect();
        if migration.mode == Mode::Transactional {
            candidates.extend(after_strong_locks(&migration.statements));
            candidates.sort_by_key(|(i, _)| *i);
        }
        for (i, candidate) in candidates {
            let statement = &migration.statements[i];
            if let Some(finding) = assess(
                &mut tx,
                migration.version,
                statement,
                candidate,
                &checks,
                threshold,
            )? {
                if finding.refused {
                    refused.push(format!(
                        "{}. Use the online form, or accept the lock with a `-- pgmend:long-lock <why>` line right before the statement (or raise --long-lock-rows, now {})",
                        finding.describe(&label),
                        human::int(threshold)
                    ));
                }
                found.push(finding);
            }
        }
        for statement in &migration.statements {
            checks.record(not_null_check(statement));
        }
    }
    tx.rollback().doing("closing the read-only transaction")?;
    Ok((found, refused))
}

/// The `CHECK (col IS NOT NULL)` constraints the earlier pending migrations add: those added
/// NOT VALID, and the (table, column) pairs a valid one proves.
#[derive(Default)]
struct Checks {
    not_valid: Vec<(String, String, String)>,
    proven: Vec<(String, String)>,
}

impl Checks {
    fn record(&mut self, check: Option<NotNullCheck>) {
        match check {
            Some(NotNullCheck::Adds {
                table,
                column,
                valid: true,
                ..
            }) => self.proven.push((table, column)),
            Some(NotNullCheck::Adds {
                table,
                name,
                column,
                valid: false,
            }) => self.not_valid.push((table, name, column)),
            Some(NotNullCheck::Validates { table, name }) => {
                if let Some((t, _, c)) = self
                    .not_valid
                    .iter()
                    .find(|(t, n, _)| *t == table && *n == name)
                {
                    self.proven.push((t.clone(), c.clone()));
                }
            }
            None => {}
        }
    }

    fn proves(&self, table: &str, column: &str) -> bool {
        self.proven.iter().any(|(t, c)| t == table && c == column)
    }
}

/// The finding for one candidate, or None when the table does not exist yet or the catalog
/// says the form is quick here.
fn assess(
    tx: &mut impl GenericClient,
    version: i32,
    statement: &crate::statements::Statement,
    candidate: crate::statements::LongLock,
    checks: &Checks,
    threshold: i64,
) -> Result<Option<LongLockFinding>> {
    let Some(row) = tx
        .query_opt(
            "SELECT c.oid::regclass::text,
                    CASE WHEN c.relkind = 'm' AND NOT c.relispopulated THEN 0 ELSE c.reltuples::bigint END,
                    pg_total_relation_size(c.oid), n.nspname::text, c.relname::text
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.oid = to_regclass(array_to_string(ARRAY(
                      SELECT quote_ident(p) FROM unnest(string_to_array($1, '.')) p), '.'))",
            &[&candidate.table],
        )
        .doing(format!("reading the size of {}", candidate.table))?
    else {
        return Ok(None);
    };
    let (name, estimate, bytes): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
    let table = Ident::qualified(row.get::<_, String>(3), row.get::<_, String>(4));
    let long_here = match &candidate.form {
        Form::SetNotNull { column } => {
            !checks.proves(&candidate.table, column)
                && !not_null_proven(tx, &name, column)?
        }
        Form::TypeChange { column, to, using } => *using || rewrites(tx, &name, column, to)?,
        Form::VolatileDefault {
            calls,
            always: false,
            ..
        } => tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = ANY ($1) AND provolatile = 'v')",
                &[calls],
            )
            .doing("reading the volatility of a default's functions")?
            .get(0),
        _ => true,
    };
    if !long_here {
        return Ok(None);
    }
    let rows = if estimate >= 0 {
        estimate
    } else {
        // Never analyzed: count, but never past the threshold.
        tx.query_one(
            &format!("SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT $1) t"),
            &[&(threshold + 1)],
        )
        .doing(format!("counting the rows of {name}"))?
        .get(0)
    };
    let factor = match candidate.form {
        Form::TypeChange { .. }
        | Form::VolatileDefault { .. }
        | Form::IndexWithoutConcurrently
        | Form::RefreshWithoutConcurrently
        | Form::UniqueConstraint => 3,
        _ => 1,
    };
    let accepted = statement.long_lock_accepted.clone();
    Ok(Some(LongLockFinding {
        version,
        line: statement.line,
        statement: statement.summary.clone(),
        table: name,
        lock: candidate.mode,
        what: candidate.form.describe(),
        online_form: candidate.form.online_form(),
        form: candidate.form,
        rows_at_least: estimate < 0 && rows > threshold,
        rows,
        bytes,
        estimated_seconds: (bytes * factor + SCAN_BYTES_PER_SECOND - 1) / SCAN_BYTES_PER_SECOND,
        refused: rows > threshold && accepted.is_none(),
        accepted,
    }))
}

/// Whether `column` of `table` is NOT NULL already, or a valid `CHECK (column IS NOT NULL)`
/// proves it (then PostgreSQL 12+ sets NOT NULL without a scan).
fn not_null_proven(tx: &mut impl GenericClient, table: &str, column: &str) -> Result<bool> {
    Ok(tx
        .query_one(
            "SELECT coalesce((SELECT a.attnotnull FROM pg_attribute a
                               WHERE a.attrelid = $1::text::regclass AND a.attname = $2 AND NOT a.attisdropped), false)
                 OR EXISTS (SELECT 1 FROM pg_constraint k
                             WHERE k.conrelid = $1::text::regclass AND k.contype = 'c' AND k.convalidated
                               AND pg_get_constraintdef(k.oid) = format('CHECK ((%s IS NOT NULL))', quote_ident($2)))",
            &[&table, &column],
        )
        .doing(format!("looking for a valid NOT NULL check on {table}.{column}"))?
        .get(0))
}

/// Whether changing `column` of `table` to `to` rewrites the table: anything but the same type,
/// or a binary-coercible widening (varchar or text to text or a varchar at least as long, a
/// numeric of more precision at the same scale, or unconstrained).
fn rewrites(tx: &mut impl GenericClient, table: &str, column: &str, to: &str) -> Result<bool> {
    let (base, args) = match to.split_once('(') {
        Some((base, rest)) => (
            base.trim(),
            rest.trim_end_matches(')')
                .split(',')
                .filter_map(|a| a.trim().parse::<i32>().ok())
                .collect::<Vec<i32>>(),
        ),
        None => (to.trim(), Vec::new()),
    };
    let row = tx
        .query_opt(
            "SELECT t.typname::text, a.atttypmod, (SELECT n.typname::text FROM pg_type n WHERE n.oid = to_regtype($3))
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
              WHERE a.attrelid = $1::text::regclass AND a.attname = $2 AND NOT a.attisdropped",
            &[&table, &column, &base],
        )
        .doing(format!("reading the type of {table}.{column}"))?;
    let Some(row) = row else {
        // A column an earlier statement adds: it is empty or rewritten with the table anyway.
        return Ok(true);
    };
    let (from, typmod, new): (String, i32, Option<String>) = (row.get(0), row.get(1), row.get(2));
    Ok(!binary_coercible(&from, typmod, new.as_deref(), &args))
}

/// The widenings that keep every stored value's bytes (no rewrite), from the old type and its
/// `atttypmod` to the new type's name and modifiers.
fn binary_coercible(from: &str, typmod: i32, to: Option<&str>, args: &[i32]) -> bool {
    match (from, to, args) {
        ("varchar" | "text", Some("text"), []) | ("varchar" | "text", Some("varchar"), []) => true,
        ("varchar", Some("varchar"), [n]) => typmod >= 0 && *n >= typmod - 4,
        ("numeric", Some("numeric"), []) => true,
        ("numeric", Some("numeric"), [p, rest @ ..]) if typmod >= 0 => {
            let (old_p, old_s) = (((typmod - 4) >> 16) & 0xffff, (typmod - 4) & 0xffff);
            let s = rest.first().copied().unwrap_or(0);
            *p >= old_p && s == old_s
        }
        (old, Some(new), []) => old == new && typmod < 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::binary_coercible;

    #[test]
    fn widenings_that_keep_the_bytes_are_not_rewrites() {
        // varchar(20) has atttypmod 24; numeric(10,2) has ((10 << 16) | 2) + 4.
        assert!(binary_coercible("varchar", 24, Some("text"), &[]));
        assert!(binary_coercible("varchar", 24, Some("varchar"), &[40]));
        assert!(!binary_coercible("varchar", 24, Some("varchar"), &[10]));
        let numeric_10_2 = ((10 << 16) | 2) + 4;
        assert!(binary_coercible(
            "numeric",
            numeric_10_2,
            Some("numeric"),
            &[12, 2]
        ));
        assert!(!binary_coercible(
            "numeric",
            numeric_10_2,
            Some("numeric"),
            &[12, 3]
        ));
        assert!(!binary_coercible("int4", -1, Some("int8"), &[]));
        assert!(!binary_coercible("text", -1, Some("int4"), &[]));
        assert!(!binary_coercible("text", -1, None, &[]));
    }
}
