//! Executing a migration plan: each transactional migration and its history row commit
//! together, under bounded lock waits, while this session holds the runner lock.
//!
//! `execute` runs a `Plan`. It refuses a plan with blockers before changing anything and creates
//! the history table in its own retried transaction. Then, for each pending migration, it takes the
//! migration's censuses with `online::evaluate::check_before` (which stops, exit 1, when one
//! blocks) and runs it: a transactional migration as `SET LOCAL` timeouts, the file's SQL and
//! `history::record` in one transaction through `with_lock_retry`; an online migration through
//! `online::index::apply`. A transactional migration that holds a `VALIDATE CONSTRAINT` runs its
//! statements one by one, the VALIDATE under `SET LOCAL statement_timeout` of
//! `--validate-timeout` and the others under `--statement-timeout`; cancelled at that bound, the
//! VALIDATE stops the step (`online::validate::past_its_bound`, exit 1). Progress goes through a callback.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Serialize;

use super::history;
use super::plan::Plan;
use super::source::{by_version, Mode};
use crate::db::conninfo::ConnParams;
use crate::db::retry::{wait_for_long_holders, with_lock_retry, Asking, LockPolicy};
use crate::error::PgContext;
use crate::online::{evaluate, index, validate};
use crate::statements::LockMode;

#[derive(Debug, Serialize)]
pub struct AppliedMigration {
    pub version: i32,
    pub name: String,
    pub duration_ms: u64,
}

/// When an online build takes its migration's censuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CensusTiming {
    /// Before each attempt: violators stop the step before anything is built.
    First,
    /// The first attempt's census on the main session while the index is built
    /// (`index::OnlineMigration::census_alongside`): for the release, whose repair right
    /// before removed the violators.
    AlongsideBuild,
}

/// Applies every pending migration of `plan`, in order. Refuses a plan with blockers
/// before changing anything. The caller holds the runner lock and built `plan` after
/// taking it.
pub fn execute(
    client: &mut postgres::Client,
    params: &ConnParams,
    plan: &Plan,
    policy: &LockPolicy,
    build_wait: Duration,
    census: CensusTiming,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<AppliedMigration>> {
    if !plan.blockers.is_empty() {
        bail!("nothing was changed:\n  - {}", plan.blockers.join("\n  - "));
    }
    if !plan.pending.is_empty() {
        with_lock_retry(client, policy, "creating the history table", &[], |c| {
            let mut tx = c.transaction()?;
            tx.batch_execute(&policy.set_local_sql())?;
            history::ensure_table(&mut tx)?;
            Ok(tx.commit()?)
        })?;
    }
    let mut done = Vec::new();
    for planned in &plan.pending {
        let migration = by_version(&plan.migrations, planned.version);
        let label = migration.label();
        crate::signals::check(&format!("{label}; the migrations before it are applied"))?;
        let tables: Vec<String> = planned
            .statements
            .iter()
            .flat_map(|s| s.locks.iter().map(|l| l.lookup.clone()))
            .collect();
        // Censuses are taken right before the step, on the data as it is now (an online
        // build takes its own before each attempt).
        if migration.mode != Mode::Online {
            for finding in evaluate::check_before(client, &label, &migration.censuses)? {
                progress(&finding.describe());
            }
        }
        let started = Instant::now();
        if migration.mode == Mode::Online {
            progress(&format!(
                "applying {label} (online: each statement in autocommit, watched)"
            ));
            let online = index::OnlineMigration {
                label: label.clone(),
                origin: &migration.origin,
                statements: &migration.statements,
                censuses: &migration.censuses,
                census_alongside: (census == CensusTiming::AlongsideBuild)
                    .then_some(policy.lock_timeout),
            };
            index::apply(client, params, &online, build_wait, progress)?;
            history::record(client, migration)
                .doing(format!("recording {label} in the history"))?;
        } else {
            progress(&format!(
                "applying {label} ({}, one transaction)",
                crate::human::count(planned.statements.len() as i64, "statement")
            ));
            let validates: Vec<Option<String>> = migration
                .statements
                .iter()
                .map(|s| crate::statements::validated_constraint(s).map(|(_, name)| name))
                .collect();
            // A VALIDATE runs under --validate-timeout; the attempt's client-side bound is
            // the longer of the two.
            let bound = if validates.iter().any(Option::is_some) {
                LockPolicy {
                    statement_timeout: policy.statement_timeout.max(policy.validate_timeout),
                    ..*policy
                }
            } else {
                *policy
            };
            // The tables whose queries (or writes) the migration holds up while it waits for
            // its lock: it waits for the transactions holding conflicting locks on them to end
            // before each attempt, within the retry budget.
            let gaps = gaps_to_wait_for(&planned.statements);
            // At most half the retry budget: the rest is for attempts.
            let gap_until = started + policy.retry_for.saturating_sub(policy.lock_timeout) / 2;
            with_lock_retry(client, &bound, &format!("applying {label}"), &tables, |c| {
                // One wait for every group's holders: waited for one group after another, a
                // long transaction that began on the first group's table meanwhile would be one
                // the attempt queues behind.
                wait_for_long_holders(
                    c,
                    &gaps,
                    gap_until,
                    &format!("applying {label}"),
                    false,
                    progress,
                )?;
                let mut tx = c.transaction()?;
                tx.batch_execute(&policy.set_local_sql())?;
                if validates.iter().all(Option::is_none) {
                    tx.batch_execute(&migration.sql)?;
                } else {
                    run_statements(&mut tx, migration, &validates, policy)?;
                }
                history::record(&mut tx, migration)?;
                Ok(tx.commit()?)
            })?;
        }
        let elapsed = started.elapsed();
        progress(&format!(
            "applied {label} in {}",
            crate::config::format_duration(round_ms(elapsed))
        ));
        done.push(AppliedMigration {
            version: migration.version,
            name: migration.name.clone(),
            duration_ms: elapsed.as_millis() as u64,
        });
    }
    Ok(done)
}

/// The lock waits a transactional migration makes the application's statements queue behind:
/// per table, the strongest mode its statements take, when that mode holds up reads or writes
/// (`SHARE` and stronger; `SHARE UPDATE EXCLUSIVE`, `VALIDATE`'s, holds up neither), grouped by
/// the request [`wait_for_long_holders`] waits for a gap before, the strongest first. A table
/// the migration creates (a plain `CREATE TABLE`, before any statement of it locks that name)
/// is left out: no other session sees it before the migration commits.
fn gaps_to_wait_for(statements: &[crate::statements::Statement]) -> Vec<(Asking, Vec<String>)> {
    let mut created: Vec<&str> = Vec::new();
    let mut strongest: BTreeMap<&str, LockMode> = BTreeMap::new();
    for statement in statements {
        for lock in &statement.locks {
            if created.contains(&lock.lookup.as_str()) {
                continue;
            }
            let mode = strongest.entry(lock.lookup.as_str()).or_insert(lock.mode);
            *mode = (*mode).max(lock.mode);
        }
        // `IF NOT EXISTS` may find the table there: it is waited for as any other.
        for table in &statement.creates_tables {
            if !statement.creates_if_missing && !strongest.contains_key(table.as_str()) {
                created.push(table);
            }
        }
    }
    let asking = |mode: LockMode| match mode {
        LockMode::AccessExclusive => Some(Asking::AccessExclusive),
        LockMode::Exclusive => Some(Asking::Exclusive),
        LockMode::ShareRowExclusive => Some(Asking::ShareRowExclusive),
        LockMode::Share => Some(Asking::Share),
        _ => None,
    };
    [
        Asking::AccessExclusive,
        Asking::Exclusive,
        Asking::ShareRowExclusive,
        Asking::Share,
    ]
    .into_iter()
    .filter_map(|a| {
        let tables: Vec<String> = strongest
            .iter()
            .filter(|(_, m)| asking(**m) == Some(a))
            .map(|(t, _)| t.to_string())
            .collect();
        (!tables.is_empty()).then_some((a, tables))
    })
    .collect()
}

/// Runs `migration`'s statements one by one in `tx`, each `VALIDATE CONSTRAINT` (named in
/// `validates`, by position) under `--validate-timeout` instead of `--statement-timeout`.
fn run_statements(
    tx: &mut postgres::Transaction<'_>,
    migration: &super::source::Migration,
    validates: &[Option<String>],
    policy: &LockPolicy,
) -> Result<()> {
    for (statement, validated) in migration.statements.iter().zip(validates) {
        let Some(name) = validated else {
            tx.batch_execute(&statement.sql)?;
            continue;
        };
        tx.batch_execute(&policy.for_validate().statement_timeout_sql())?;
        tx.batch_execute(&statement.sql).map_err(|e| {
            validate::past_its_bound(
                e,
                name,
                policy,
                &format!("nothing of {} was changed", migration.label()),
            )
        })?;
        tx.batch_execute(&policy.statement_timeout_sql())?;
    }
    Ok(())
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::gaps_to_wait_for;
    use crate::db::retry::Asking;

    #[test]
    fn a_migration_waits_for_a_gap_on_every_table_whose_reads_or_writes_it_holds_up() {
        // V2's shape: ACCESS EXCLUSIVE on issued_coupons (its ALTERs, and a foreign key's
        // SHARE ROW EXCLUSIVE, the weaker one, on it too); SHARE ROW EXCLUSIVE alone on
        // campaigns, for the foreign key of a new table.
        let v2 = crate::statements::split(
            "ALTER TABLE issued_coupons ADD COLUMN voided_at timestamptz;
             CREATE TABLE campaign_budgets (campaign_id text PRIMARY KEY REFERENCES campaigns);
             CREATE TABLE outbox (coupon_id uuid PRIMARY KEY REFERENCES issued_coupons);
             CREATE INDEX outbox_at ON outbox (coupon_id);",
        );
        let gaps = gaps_to_wait_for(&v2);
        assert_eq!(
            gaps,
            vec![
                (Asking::AccessExclusive, vec!["issued_coupons".to_string()]),
                // Not outbox: the migration creates it (its index's SHARE lock is on a table
                // no other session sees yet).
                (Asking::ShareRowExclusive, vec!["campaigns".to_string()]),
            ]
        );
        // A table dropped and created again, or created if it does not exist, may be there
        // with the application's locks on it: waited for. A plain index build waits as SHARE.
        let again = crate::statements::split(
            "DROP TABLE old_t; CREATE TABLE old_t (x int);
             CREATE TABLE IF NOT EXISTS maybe_t (x int); CREATE INDEX maybe_x ON maybe_t (x);
             CREATE INDEX plain_x ON plain_t (x);",
        );
        assert_eq!(
            gaps_to_wait_for(&again),
            vec![
                (Asking::AccessExclusive, vec!["old_t".to_string()]),
                (
                    Asking::Share,
                    vec!["maybe_t".to_string(), "plain_t".to_string()]
                ),
            ]
        );
        // A plain DROP INDEX is waited for by the index's name, which stands for its table; a
        // new partition takes ACCESS EXCLUSIVE on its parent.
        let partitions = crate::statements::split(
            "DROP INDEX IF EXISTS old_x; CREATE TABLE events_2027 PARTITION OF events FOR VALUES IN (2027);",
        );
        assert_eq!(
            gaps_to_wait_for(&partitions),
            vec![(
                Asking::AccessExclusive,
                vec!["events".to_string(), "old_x".to_string()]
            )]
        );
        // A trigger created holds up writes, one dropped everything.
        let triggers = crate::statements::split(
            "CREATE TRIGGER audit AFTER UPDATE ON campaigns FOR EACH ROW EXECUTE FUNCTION f();
             DROP TRIGGER old_audit ON issued_coupons;",
        );
        assert_eq!(
            gaps_to_wait_for(&triggers),
            vec![
                (Asking::AccessExclusive, vec!["issued_coupons".to_string()]),
                (Asking::ShareRowExclusive, vec!["campaigns".to_string()]),
            ]
        );
        // A VALIDATE's SHARE UPDATE EXCLUSIVE holds up neither reads nor writes: no wait.
        let validate = crate::statements::split(
            "ALTER TABLE campaign_budgets VALIDATE CONSTRAINT issued_within_budget;",
        );
        assert!(gaps_to_wait_for(&validate).is_empty());
    }
}
