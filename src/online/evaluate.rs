//! Taking a census against the database: how many violators, and a few of them.
//!
//! Takes censuses against the database. `evaluate` counts one census in the caller's transaction,
//! inside a savepoint, with up to five sample rows as `row_to_json` text; a census whose tables do
//! not exist yet, or whose query fails with 42703 or 42P01, is returned uncounted with a `not_yet`
//! reason; shadows apply only to columns the table lacks today. `Finding` (a flattened `Census`
//! plus `violators`, `sample`, `not_yet`) is what the plan and `validate` serialize, and `describe`
//! the sentence people read. `check_before` takes a migration's censuses in one short read-only
//! transaction, without shadows, and returns `Violators` listing every blocking finding;
//! `check_during_build` does the same while an online build runs, its lock waits bounded.

use anyhow::Result;
use serde::Serialize;

use super::census::{with_predicted, AddedColumn, Census, Guard, Predicted};
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
                if self.census.guard == Guard::CheckNotValid {
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
    let predicted: Vec<Predicted> = predicted
        .iter()
        .filter(|p| census.tables.contains(&p.table))
        .cloned()
        .collect();
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
    if !missing.is_empty() {
        return Ok(Finding {
            census: census.clone(),
            violators: None,
            sample: Vec::new(),
            not_yet: Some(format!(
                "counted when it runs: it reads {}, which an earlier pending step creates",
                missing.join(", ")
            )),
        });
    }
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
