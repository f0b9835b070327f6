//! Taking a census against the database: how many violators, and a few of them.
//!
//! Takes censuses against the database. `evaluate` counts one census in the caller's transaction,
//! inside a savepoint, with up to five sample rows as `row_to_json` text; a census whose tables do
//! not exist yet, or whose query fails with 42703 or 42P01, is returned uncounted with a `not_yet`
//! reason; shadows apply only to columns the table lacks today. `Finding` (a flattened `Census`
//! plus `violators`, `sample`, `not_yet`) is what the plan and `validate` serialize, and `describe`
//! the sentence people read. A census that leaves part to the catalog (`census::Resolve`) is
//! resolved first, in the same transaction (`resolve`): a `VALIDATE CONSTRAINT`'s constraint from
//! `pg_constraint` (a CHECK's body through `sql_text::CheckBody`, a foreign key's columns, parent
//! and match rule as `sql_text::Ident`s), else the census of the earlier `ADD CONSTRAINT ... NOT
//! VALID` that adds it, else uncounted (the VALIDATE would fail: no such constraint); a foreign
//! key's referenced columns, when its text names none, from the parent's primary key. The
//! finding carries the resolved census. `check_before` takes a migration's censuses in one short read-only
//! transaction, without shadows, and returns `Violators` listing every blocking finding;
//! `check_during_build` does the same while an online build runs, its lock waits bounded.

use anyhow::Result;
use postgres::GenericClient;
use serde::Serialize;

use super::census::{
    orphans_counts, orphans_sql, with_predicted, AddedColumn, Census, Guard, Predicted, Resolve,
};
use crate::db::sql_text::{CheckBody, Ident};
use crate::error::{describe, sqlstate, PgContext, Violators};

/// How many rows of each violation a finding shows.
const SAMPLE: i64 = 5;

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    #[serde(flatten)]
    pub census: Census,
    /// None when it cannot be counted yet (it reads a table an earlier pending step creates).
    pub violators: Option<i64>,
    pub sample: Vec<String>,
    pub not_yet: Option<String>,
}

impl Finding {
    pub fn stops(&self) -> bool {
        self.census.guard.blocks() && self.violators.is_some_and(|n| n > 0)
    }

    /// One paragraph for people.
    pub fn describe(&self) -> String {
        match self.violators {
            None => format!(
                "census {}: {} — {}",
                self.census.name,
                self.census.counts,
                self.not_yet.as_deref().unwrap_or("not counted")
            ),
            Some(0) => format!("census {}: no {}", self.census.name, self.census.counts),
            Some(n) => format!(
                "census {}: {n} {}{}. {}",
                self.census.name,
                self.census.counts,
                if self.sample.is_empty() {
                    String::new()
                } else {
                    format!(" (for example {})", self.sample.join("; "))
                },
                if self.census.guard.not_valid() {
                    format!("It is added NOT VALID: {}", self.census.fix)
                } else {
                    format!("To fix: {}", self.census.fix)
                }
            ),
        }
    }
}

/// Counts `census` inside `tx` (read-only is enough), each query in a savepoint so a
/// census that cannot run yet does not spoil the transaction. `shadows` are columns that
/// pending steps add; those the table lacks today read as the value the step gives them.
pub fn evaluate(
    tx: &mut postgres::Transaction<'_>,
    census: &Census,
    shadows: &[AddedColumn],
) -> Result<Finding> {
    evaluate_predicted(tx, census, shadows, &[])
}

/// [`evaluate`] on `predicted`, the tables as earlier pending repairs leave them: the plan's
/// prediction of what the census finds when its migration runs.
pub fn evaluate_predicted(
    tx: &mut postgres::Transaction<'_>,
    census: &Census,
    shadows: &[AddedColumn],
    predicted: &[Predicted],
) -> Result<Finding> {
    let uncounted = |census: &Census, why: String| Finding {
        census: census.clone(),
        violators: None,
        sample: Vec::new(),
        not_yet: Some(why),
    };
    if let Some(why) = missing_tables(tx, census)? {
        return Ok(uncounted(census, why));
    }
    let resolved = match resolve(tx, census)? {
        Ok(resolved) => resolved,
        Err(why) => return Ok(uncounted(census, why)),
    };
    let census = &resolved;
    if let Some(why) = missing_tables(tx, census)? {
        return Ok(uncounted(census, why));
    }
    let predicted: Vec<Predicted> = predicted
        .iter()
        .filter(|p| census.tables.contains(&p.table))
        .cloned()
        .collect();
    let mut active = Vec::new();
    for s in shadows.iter().filter(|s| census.tables.contains(&s.table)) {
        let present: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
                &[&s.table, &s.column.trim_matches('"')],
            )
            .doing("checking a census column")?
            .get(0);
        if !present {
            active.push(s.clone());
        }
    }
    let count_sql = with_predicted(
        &format!("SELECT count(*) FROM ({}) v", census.violators_sql),
        &active,
        &predicted,
    );
    let sample_sql = with_predicted(
        &format!(
            "SELECT row_to_json(v)::text FROM ({}) v LIMIT {SAMPLE}",
            census.violators_sql
        ),
        &active,
        &predicted,
    );
    let mut savepoint = tx
        .transaction()
        .doing("opening a savepoint for the census")?;
    savepoint
        .batch_execute(crate::db::connect::RAISE_WORK_MEM)
        .doing("raising work_mem for the census")?;
    let counted = savepoint.query_one(&count_sql, &[]);
    let finding = match counted {
        Ok(row) => {
            let n: i64 = row.get(0);
            let sample = if n > 0 {
                savepoint
                    .query(&sample_sql, &[])
                    .doing(format!("sampling census {}", census.name))?
                    .iter()
                    .map(|r| r.get(0))
                    .collect()
            } else {
                Vec::new()
            };
            Finding {
                census: census.clone(),
                violators: Some(n),
                sample,
                not_yet: None,
            }
        }
        Err(e) if matches!(sqlstate(&e), Some("42703") | Some("42P01")) => Finding {
            census: census.clone(),
            violators: None,
            sample: Vec::new(),
            not_yet: Some(format!(
                "not countable before the earlier pending steps run ({})",
                describe(&e)
            )),
        },
        Err(e) => {
            return Err(anyhow::Error::new(describe(&e))
                .context(format!("taking census {} ({count_sql})", census.name)))
        }
    };
    savepoint.rollback().doing("closing the census savepoint")?;
    Ok(finding)
}

/// Why `census` cannot be counted yet: the tables it reads that do not exist (an earlier
/// pending step creates them).
fn missing_tables(tx: &mut postgres::Transaction<'_>, census: &Census) -> Result<Option<String>> {
    let mut missing = Vec::new();
    for t in &census.tables {
        let exists: bool = tx
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[t])
            .doing("checking a census table")?
            .get(0);
        if !exists {
            missing.push(t.clone());
        }
    }
    Ok((!missing.is_empty()).then(|| {
        format!(
            "counted when it runs: it reads {}, which an earlier pending step creates",
            missing.join(", ")
        )
    }))
}

/// `census` with what its text leaves to the catalog read from it (see [`Resolve`]), or why it
/// cannot be counted.
pub fn resolve(
    tx: &mut impl GenericClient,
    census: &Census,
) -> Result<std::result::Result<Census, String>> {
    match &census.resolve {
        None => Ok(Ok(census.clone())),
        Some(Resolve::PrimaryKey {
            child,
            columns,
            parent,
            match_full,
        }) => {
            let keys: Vec<String> = tx
                .query_one(
                    "SELECT ARRAY(SELECT a.attname::text
                       FROM pg_constraint c, unnest(c.conkey) WITH ORDINALITY k(attnum, n), pg_attribute a
                      WHERE c.conrelid = to_regclass($1) AND c.contype = 'p'
                        AND a.attrelid = c.conrelid AND a.attnum = k.attnum ORDER BY k.n)",
                    &[parent],
                )
                .doing(format!("reading the primary key of {parent}"))?
                .get(0);
            if keys.len() != columns.len() {
                return Ok(Err(format!(
                    "not counted: {parent} has no primary key of {} column(s) for the key to reference (it is created by an earlier pending step, or the foreign key would fail)",
                    columns.len()
                )));
            }
            let keys: Vec<String> = keys.iter().map(|k| Ident::new(k).to_string()).collect();
            Ok(Ok(Census {
                violators_sql: orphans_sql(child, columns, parent, &keys, *match_full),
                resolve: None,
                ..census.clone()
            }))
        }
        Some(Resolve::Constraint {
            table,
            name,
            declared,
        }) => {
            let found = match (constraint_in_catalog(tx, table, name)?, declared) {
                (Some(found), _) => found,
                (None, Some(declared)) => match resolve(tx, declared)? {
                    Ok(found) => found,
                    Err(why) => return Ok(Err(why)),
                },
                (None, None) => {
                    return Ok(Err(format!(
                        "not counted: {table} has no constraint {name} and no earlier migration adds it, so the VALIDATE would fail"
                    )))
                }
            };
            Ok(Ok(Census {
                counts: found.counts,
                violators_sql: found.violators_sql,
                tables: found.tables,
                resolve: None,
                ..census.clone()
            }))
        }
    }
}

/// The census of the check or foreign key `name` of `table` as the catalog defines it (guard,
/// name and fix from the VALIDATE's census are the caller's), None when it has no such one.
fn constraint_in_catalog(
    tx: &mut impl GenericClient,
    table: &str,
    name: &str,
) -> Result<Option<Census>> {
    let conname = super::census::catalog_name(name);
    let row = tx
        .query_opt(
            "SELECT c.contype::text, c.confmatchtype::text, pn.nspname::text, p.relname::text,
                    pn.nspname = current_schema(),
                    ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(attnum, n)
                            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum ORDER BY k.n),
                    ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(attnum, n)
                            JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum ORDER BY k.n)
               FROM pg_constraint c
               LEFT JOIN pg_class p ON p.oid = c.confrelid
               LEFT JOIN pg_namespace pn ON pn.oid = p.relnamespace
              WHERE c.conrelid = to_regclass($1) AND c.conname = $2 AND c.contype IN ('c', 'f')",
            &[&table, &conname],
        )
        .doing(format!("looking up constraint {name} of {table}"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let kind: String = row.get(0);
    let base = Census {
        guard: Guard::Validate,
        name: name.to_string(),
        counts: String::new(),
        fix: String::new(),
        violators_sql: String::new(),
        tables: vec![table.to_string()],
        resolve: None,
    };
    if kind == "c" {
        let Some(body) =
            CheckBody::named(tx, table, &conname).doing(format!("reading the check {name}"))?
        else {
            return Ok(None);
        };
        return Ok(Some(Census {
            counts: format!("rows of {table} that break CHECK {body}"),
            violators_sql: format!("SELECT * FROM {table} WHERE NOT {body}"),
            ..base
        }));
    }
    let (match_type, schema, relation, here): (String, String, String, bool) =
        (row.get(1), row.get(2), row.get(3), row.get(4));
    let parent = if here {
        Ident::new(&relation)
    } else {
        Ident::qualified(&schema, &relation)
    };
    let quoted = |names: Vec<String>| -> Vec<String> {
        names.iter().map(|n| Ident::new(n).to_string()).collect()
    };
    let columns = quoted(row.get(5));
    let keys = quoted(row.get(6));
    let match_full = match_type == "f";
    let mut tables = vec![table.to_string()];
    if parent.to_string() != Ident::new(table).to_string() && here {
        tables.push(parent.to_string());
    }
    Ok(Some(Census {
        counts: orphans_counts(table, &columns, &parent.to_string(), match_full),
        violators_sql: orphans_sql(table, &columns, &parent.to_string(), &keys, match_full),
        tables,
        ..base
    }))
}

/// Takes every census of a migration in one short read-only transaction, and stops
/// (exit 1) when one of them blocks the step.
pub fn check_before(
    client: &mut postgres::Client,
    label: &str,
    censuses: &[Census],
) -> Result<Vec<Finding>> {
    check(client, censuses, None, |stopping| {
        format!("{label} was not attempted: {stopping}. The steps before it are applied; nothing of {label} was changed")
    })
}

/// [`check_before`] for a census taken on the main session while the migration's index is
/// being built on another: its lock waits are bounded by `lock_timeout` (a session queued for a
/// stronger lock behind the build would otherwise hold the census, and with it the watcher),
/// and the message says that the build is cancelled.
pub fn check_during_build(
    client: &mut postgres::Client,
    label: &str,
    censuses: &[Census],
    lock_timeout: std::time::Duration,
) -> Result<Vec<Finding>> {
    check(client, censuses, Some(lock_timeout), |stopping| {
        format!("{label} was stopped by its census, taken while the index was being built: {stopping}. The build was cancelled; the steps before it are applied")
    })
}

fn check(
    client: &mut postgres::Client,
    censuses: &[Census],
    lock_timeout: Option<std::time::Duration>,
    stops: impl FnOnce(&str) -> String,
) -> Result<Vec<Finding>> {
    if censuses.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a read-only transaction for the census")?;
    if let Some(timeout) = lock_timeout {
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{}ms'",
            timeout.as_millis().max(1)
        ))
        .doing("bounding the census's lock waits")?;
    }
    let mut findings = Vec::new();
    for c in censuses {
        findings.push(evaluate(&mut tx, c, &[])?);
    }
    tx.rollback().doing("closing the census transaction")?;
    let stopping: Vec<String> = findings
        .iter()
        .filter(|f| f.stops())
        .map(Finding::describe)
        .collect();
    if !stopping.is_empty() {
        return Err(Violators::error(stops(&stopping.join("; "))));
    }
    Ok(findings)
}
