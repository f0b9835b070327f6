//! Bounded lock waits: every attempt runs under `lock_timeout`, and an attempt the server
//! rolled back for a lock or a deadlock is retried with full-jitter exponential backoff until
//! a total budget runs out. There is never a last attempt without a timeout.
//!
//! Bounded lock waits. `LockPolicy` holds `--lock-timeout`, `--statement-timeout`,
//! `--lock-retry-for` and `--validate-timeout` (a VALIDATE's statement timeout: `for_validate`),
//! and renders the `SET LOCAL` statements for both timeouts. `with_lock_retry`
//! runs a closure that opens, fills and commits one transaction; on SQLSTATE 55P03, 40P01 or 40001
//! it sleeps a full-jitter exponential backoff (100 ms base, 5 s cap) and tries again, logging each
//! retry to stderr; when the pause plus one more full lock wait would go past the budget it returns
//! `Stopped`, naming the sessions that hold locks on the tables involved. Any other error is
//! returned at once. A transactional migration first waits out, queued nowhere, the long
//! transactions holding conflicting locks on the tables whose reads or writes its own lock would
//! hold up ([`wait_for_long_holders`]).

use std::time::{Duration, Instant};

use anyhow::Result;
use postgres::Client;
use rand::Rng;

use crate::error::{describe, sqlstate, DbFailure, PgContext, Stopped};

/// How long pgmend lets a statement wait for a lock, and for how long it keeps trying.
#[derive(Debug, Clone, Copy)]
pub struct LockPolicy {
    pub lock_timeout: Duration,
    pub statement_timeout: Duration,
    pub retry_for: Duration,
    /// `--validate-timeout`: the `statement_timeout` of a `VALIDATE CONSTRAINT` (a scan of the
    /// whole table under SHARE UPDATE EXCLUSIVE), instead of `statement_timeout`.
    pub validate_timeout: Duration,
}

impl LockPolicy {
    /// What a transaction under this policy runs first: `SET LOCAL` for both timeouts and for
    /// `idle_in_transaction_session_timeout` (a pgmend cut off mid-transaction does not keep
    /// its locks past [`IDLE_IN_TRANSACTION`](super::runner_lock::IDLE_IN_TRANSACTION)), then
    /// the runner lock's fence while this process holds it ([`fence_sql`](super::runner_lock::fence_sql)).
    pub fn set_local_sql(&self) -> String {
        format!(
            "SET LOCAL lock_timeout = '{}ms'; SET LOCAL statement_timeout = '{}ms'; SET LOCAL idle_in_transaction_session_timeout = '{}s'{}",
            self.lock_timeout.as_millis().max(1),
            self.statement_timeout.as_millis().max(1),
            super::runner_lock::IDLE_IN_TRANSACTION.as_secs(),
            super::runner_lock::fence_sql()
        )
    }
}

impl LockPolicy {
    /// This policy with `validate_timeout` as its statement timeout: for a transaction that
    /// runs a `VALIDATE CONSTRAINT`, its client-side bound included.
    pub fn for_validate(&self) -> LockPolicy {
        LockPolicy {
            statement_timeout: self.validate_timeout,
            ..*self
        }
    }

    /// `SET LOCAL statement_timeout` to this policy's, after a statement that ran under another.
    pub fn statement_timeout_sql(&self) -> String {
        format!(
            "SET LOCAL statement_timeout = '{}ms'",
            self.statement_timeout.as_millis().max(1)
        )
    }
}

/// SQLSTATEs after which the server has rolled the transaction back and a retry is safe:
/// lock_not_available, deadlock_detected, serialization_failure.
const RETRYABLE: &[&str] = &["55P03", "40P01", "40001"];

const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Runs `sql` (one or more statements) in one transaction with the policy's timeouts, through
/// [`with_lock_retry`].
pub fn execute_with_lock_retry(
    client: &mut Client,
    policy: &LockPolicy,
    what: &str,
    tables: &[String],
    sql: &str,
) -> Result<()> {
    with_lock_retry(client, policy, what, tables, |c| {
        let mut tx = c.transaction()?;
        tx.batch_execute(&policy.set_local_sql())?;
        tx.batch_execute(sql)?;
        Ok(tx.commit()?)
    })
}

/// [`execute_with_lock_retry`] for a statement that asks for `asking` on `tables`: each attempt
/// first waits, queued nowhere, for the holders of conflicting locks it finds
/// ([`wait_for_long_holders`]), within half of `--lock-retry-for` less one `--lock-timeout`.
/// With `cleanup` (the guard's drop) a stop request ends the wait and the attempts go on
/// within the clean-up limit; without, it stops before the attempt.
pub fn execute_in_a_gap(
    client: &mut Client,
    policy: &LockPolicy,
    what: &str,
    tables: &[String],
    asking: Asking,
    cleanup: bool,
    sql: &str,
) -> Result<()> {
    let gap_until = Instant::now() + policy.retry_for.saturating_sub(policy.lock_timeout) / 2;
    let gaps = [(asking, tables.to_vec())];
    with_lock_retry(client, policy, what, tables, |c| {
        wait_for_long_holders(c, &gaps, gap_until, what, cleanup, &mut |line| {
            crate::say!("{line}")
        })?;
        let mut tx = c.transaction()?;
        tx.batch_execute(&policy.set_local_sql())?;
        tx.batch_execute(sql)?;
        Ok(tx.commit()?)
    })
}

/// Runs `attempt` (which opens, fills and commits one transaction, setting the policy's
/// timeouts itself) until it succeeds, fails for a reason a retry cannot fix, or the retry
/// budget is spent. Whether a failure is retried is decided by the server's SQLSTATE alone
/// (the `postgres::Error` or [`DbFailure`] in the error's chain); an error of pgmend's own
/// (a checkpoint that moved, a lease lost) is returned at once, as it is, and a server's
/// error is rendered with [`describe`] under `what`. Each attempt's waits on the server are bounded on the client side by the
/// policy's `statement_timeout` plus [`MARGIN`](super::deadline::MARGIN) (see `db::deadline`). `what` names the work for messages; `tables` are the relations whose
/// lock holders are named when the budget runs out.
pub fn with_lock_retry<T>(
    client: &mut Client,
    policy: &LockPolicy,
    what: &str,
    tables: &[String],
    mut attempt: impl FnMut(&mut Client) -> Result<T>,
) -> Result<T> {
    let started = Instant::now();
    let mut tries: u32 = 0;
    loop {
        tries += 1;
        let bounded = super::deadline::within(policy.statement_timeout);
        let outcome = attempt(client);
        drop(bounded);
        let error = match outcome {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        if !sqlstate_in(&error).is_some_and(|c| RETRYABLE.contains(&c.as_str())) {
            return Err(match error.downcast::<postgres::Error>() {
                Ok(server) => anyhow::Error::new(describe(&server)).context(what.to_string()),
                Err(other) => other,
            });
        }
        let ceiling = BACKOFF_BASE
            .saturating_mul(1u32 << (tries - 1).min(16))
            .min(BACKOFF_CAP);
        let pause =
            Duration::from_millis(rand::thread_rng().gen_range(0..=ceiling.as_millis() as u64));
        let elapsed = started.elapsed();
        // After a stop was requested, the clean-up's time limit is the budget too.
        let past_cleanup = crate::signals::cleanup_deadline()
            .is_some_and(|d| Instant::now() + pause + policy.lock_timeout > d);
        if elapsed + pause + policy.lock_timeout > policy.retry_for || past_cleanup {
            let blockers = lock_holders(client, tables)
                .unwrap_or_else(|e| format!("(could not list them: {e:#})"));
            return Err(Stopped::error(format!(
                "{what}: gave up after {tries} attempts in {} ({}); each waited at most {} for its lock (last: {}). Each attempt was rolled back: nothing of it was changed. Sessions holding locks on {}: {blockers}. Let them finish or end them, then rerun; or rerun with a longer --lock-retry-for",
                crate::config::format_duration(elapsed),
                if past_cleanup {
                    format!("the clean-up limit of {} s after the signal", crate::signals::CLEANUP_LIMIT.as_secs())
                } else {
                    format!("--lock-retry-for {}", crate::config::format_duration(policy.retry_for))
                },
                crate::config::format_duration(policy.lock_timeout),
                rendered(&error),
                if tables.is_empty() { "its tables".to_string() } else { tables.join(", ") },
            )));
        }
        crate::say!(
            "{what}: {} (attempt {tries}); retrying in {}",
            rendered(&error),
            crate::config::format_duration(pause)
        );
        std::thread::sleep(pause);
    }
}

/// Another session's transaction still open this long after [`wait_for_long_holders`] first
/// saw it holding a conflicting lock is a long holder, and the wait says whom it waits for: an
/// application's statements are shorter.
pub const LONG_HOLDER: Duration = Duration::from_millis(100);

/// How often [`wait_for_long_holders`] reads the locks again: often while the holders may
/// still be short ones, then less often.
const GAP_POLL_FIRST: Duration = Duration::from_millis(10);
const GAP_POLL: Duration = Duration::from_millis(50);

/// Granted locks `l` of other sessions on the tables `$1` in this database, the tables as the
/// statement parser spells them (`schema.table`, or a bare name found on the search path) and
/// matched by name, never an error for an odd name (`to_regclass` would fail on a blank or a
/// dot inside a name, and fold a capital). An index's name stands for itself and its table
/// (`DROP INDEX` locks both, and every reader and writer of the table holds a lock on the
/// table, not always on the index).
const LOCKS_ON_TABLES: &str = "
   l.granted AND l.pid <> pg_backend_pid()
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.relation IN (SELECT x.oid
                        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                        LEFT JOIN pg_index i ON i.indexrelid = c.oid,
                        LATERAL (VALUES (c.oid), (i.indrelid)) x (oid)
                       WHERE n.nspname || '.' || c.relname = ANY ($1)
                          OR (c.relname = ANY ($1) AND pg_table_is_visible(c.oid)))";

/// The holders of locks in modes `$3` on `tables` ([`LOCKS_ON_TABLES`]): client backends and
/// autovacuum workers whose transaction has been open longer than `$2` seconds (and whose start
/// this role may read), as
/// (pid, transaction start in µs since the epoch, application, seconds open, query), the oldest
/// first.
fn long_holders_sql() -> String {
    format!(
        "SELECT DISTINCT a.pid, (extract(epoch FROM a.xact_start) * 1000000)::bigint,
                CASE WHEN a.backend_type = 'autovacuum worker' THEN 'autovacuum' ELSE coalesce(a.application_name, '') END,
                extract(epoch FROM statement_timestamp() - a.xact_start)::float8,
                left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 80)
           FROM pg_locks l JOIN pg_stat_activity a USING (pid)
          WHERE {LOCKS_ON_TABLES} AND l.mode = ANY ($3)
            AND a.backend_type IN ('client backend', 'autovacuum worker')
            AND a.xact_start < clock_timestamp() - make_interval(secs => $2)
          ORDER BY 2"
    )
}

/// The table lock a statement asks for, for [`wait_for_long_holders`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asking {
    /// `ALTER TABLE` mostly, `DROP TRIGGER`: conflicts with every mode, readers' too.
    AccessExclusive,
    /// `LOCK TABLE ... IN EXCLUSIVE MODE`: conflicts with locking reads (`ROW SHARE`, `SELECT
    /// ... FOR UPDATE`) and with everything [`Asking::ShareRowExclusive`] conflicts with.
    Exclusive,
    /// `CREATE TRIGGER`, a foreign key (on both tables): conflicts with writers (`ROW
    /// EXCLUSIVE`), with `VACUUM`, `ANALYZE` and `CREATE INDEX CONCURRENTLY` (`SHARE UPDATE
    /// EXCLUSIVE`) and stronger, not with readers.
    ShareRowExclusive,
    /// `CREATE INDEX` (not concurrently): as [`Asking::ShareRowExclusive`], but not with
    /// another `SHARE`.
    Share,
}

impl Asking {
    /// The modes held (as `pg_locks` names them) that make this request wait.
    pub fn conflicts(self) -> &'static [&'static str] {
        /// Every mode, the weakest first: each request below conflicts with a tail of it.
        const ALL: [&str; 8] = [
            "AccessShareLock",
            "RowShareLock",
            "RowExclusiveLock",
            "ShareUpdateExclusiveLock",
            "ShareLock",
            "ShareRowExclusiveLock",
            "ExclusiveLock",
            "AccessExclusiveLock",
        ];
        /// SHARE does not conflict with itself.
        const SHARE: [&str; 5] = [ALL[2], ALL[3], ALL[5], ALL[6], ALL[7]];
        match self {
            Asking::AccessExclusive => &ALL,
            Asking::Exclusive => &ALL[1..],
            Asking::ShareRowExclusive => &ALL[2..],
            Asking::Share => &SHARE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Asking::AccessExclusive => "ACCESS EXCLUSIVE",
            Asking::Exclusive => "EXCLUSIVE",
            Asking::ShareRowExclusive => "SHARE ROW EXCLUSIVE",
            Asking::Share => "SHARE",
        }
    }
}

/// Waits, without queueing for any lock, until the sessions seen at its first reading holding
/// locks that conflict with a group's request on the group's tables (`gaps`: a statement's
/// request per table) have all ended their transactions, up to `until`; says once whom it waits
/// for, per group, when they are still there after [`LONG_HOLDER`]. A request queued behind such
/// a transaction would make every later statement on the table that conflicts with it (for
/// `ACCESS EXCLUSIVE` every query; for `EXCLUSIVE` every write and locking read; for `SHARE ROW
/// EXCLUSIVE` and `SHARE` every write) queue behind it in turn, for up to `--lock-timeout` an
/// attempt: asked for once they are gone, it waits only for the application's short
/// statements. Holders of any age count: one whose long read had just begun looked short, and
/// the request queued behind it for its whole `--lock-timeout` (499 ms under `bench_release
/// --load`); a short one ends within milliseconds. Transactions that began after the first
/// reading are not waited for (an application whose transactions overlap would leave no gap).
/// Autovacuum's are: a queued request makes a (not anti-wraparound) autovacuum give way only
/// after `deadlock_timeout` (1 s by default), and the default `--lock-timeout` of 500 ms cancels
/// the attempt first, again and again while the application queues behind it. Past `until` it
/// returns, and the attempt queues as before. A role without `pg_read_all_stats` does not see
/// other roles' transaction starts, and their locks do not count. When a stop is requested it
/// stops (the signal's `Stopped`), or with `cleanup` (a statement that undoes pgmend's own
/// change, such as dropping the guard) returns at once, for the attempts to go on.
pub fn wait_for_long_holders(
    client: &mut Client,
    gaps: &[(Asking, Vec<String>)],
    until: Instant,
    what: &str,
    cleanup: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let started = Instant::now();
    let mut first: Option<Vec<(i32, i64)>> = None;
    let mut said = false;
    loop {
        if cleanup && crate::signals::requested().is_some() {
            return Ok(());
        }
        crate::signals::check(what)?;
        let mut now: Vec<(i32, i64)> = Vec::new();
        let mut lines: Vec<String> = Vec::new();
        for (asking, tables) in gaps {
            let modes: Vec<&str> = asking.conflicts().to_vec();
            let rows = client
                .query(&long_holders_sql(), &[tables, &0.0f64, &modes])
                .doing("reading which sessions hold locks on the tables (pg_locks)")?;
            let holders: Vec<(i32, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            // Those of the first reading still there, the oldest first.
            let waited: Vec<&postgres::Row> = rows
                .iter()
                .zip(&holders)
                .filter(|(_, h)| first.as_ref().is_none_or(|f| f.contains(h)))
                .map(|(r, _)| r)
                .collect();
            if let Some(row) = waited.first() {
                lines.push(format!(
                    "{what}: waiting for pid {} ({:?}, transaction open {:.1}s: {}){} to end before asking for {} on {}: a request queued behind it would hold up every {} on the table (waiting at most {}, then asking under --lock-timeout)",
                    row.get::<_, i32>(0),
                    row.get::<_, String>(2),
                    row.get::<_, f64>(3),
                    row.get::<_, String>(4),
                    match waited.len() {
                        1 => String::new(),
                        n => format!(" and {} more", n - 1),
                    },
                    asking.name(),
                    tables.join(", "),
                    match asking {
                        Asking::AccessExclusive => "query",
                        Asking::Exclusive => "write and locking read",
                        Asking::ShareRowExclusive | Asking::Share => "write",
                    },
                    crate::config::format_duration(until.saturating_duration_since(Instant::now()))
                ));
            }
            now.extend(holders);
        }
        let out_of_time = Instant::now() + GAP_POLL > until;
        match &first {
            None => {
                if now.is_empty() || out_of_time {
                    return Ok(());
                }
                first = Some(now);
            }
            Some(initial) => {
                if out_of_time || !now.iter().any(|h| initial.contains(h)) {
                    return Ok(());
                }
                if !said && started.elapsed() >= LONG_HOLDER {
                    for line in &lines {
                        progress(line);
                    }
                    said = true;
                }
            }
        }
        std::thread::sleep(if started.elapsed() < LONG_HOLDER {
            GAP_POLL_FIRST
        } else {
            GAP_POLL
        });
    }
}

/// The server's SQLSTATE somewhere in `error`'s chain: a `postgres::Error` an attempt passed
/// on with `?`, or one already rendered as a [`DbFailure`].
fn sqlstate_in(error: &anyhow::Error) -> Option<String> {
    error.chain().find_map(|cause| {
        if let Some(server) = cause.downcast_ref::<postgres::Error>() {
            sqlstate(server).map(str::to_owned)
        } else {
            cause
                .downcast_ref::<DbFailure>()
                .and_then(|f| f.sqlstate.clone())
        }
    })
}

/// An attempt's error as a line: the server's words for a `postgres::Error`, else the chain.
fn rendered(error: &anyhow::Error) -> String {
    match error.downcast_ref::<postgres::Error>() {
        Some(server) => describe(server).to_string(),
        None => format!("{error:#}"),
    }
}

/// The other sessions holding granted locks on `tables` ([`LOCKS_ON_TABLES`]), one line each,
/// with the modes each holds: a reader's `AccessShareLock` does not block a trigger's install.
fn lock_holders(client: &mut Client, tables: &[String]) -> Result<String> {
    let rows = client
        .query(
            &format!(
                "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
                    coalesce(extract(epoch FROM now() - a.xact_start)::int, 0),
                    left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 80),
                    string_agg(DISTINCT l.mode, ', ' ORDER BY l.mode)
               FROM pg_locks l JOIN pg_stat_activity a USING (pid)
              WHERE {LOCKS_ON_TABLES}
              GROUP BY a.pid, a.application_name, a.state, a.xact_start, a.query
              ORDER BY 1"
            ),
            &[&tables],
        )
        .doing("listing the sessions that hold the locks")?;
    if rows.is_empty() {
        return Ok("none right now".to_string());
    }
    Ok(rows
        .iter()
        .map(|r| {
            format!(
                "pid {} ({:?}, {}, holds {}, transaction open {}s, query: {})",
                r.get::<_, i32>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
                r.get::<_, String>(5),
                r.get::<_, i32>(3),
                r.get::<_, String>(4)
            )
        })
        .collect::<Vec<_>>()
        .join("; "))
}

#[cfg(test)]
mod tests {
    use super::Asking;

    #[test]
    fn a_trigger_waits_for_writers_vacuum_and_stronger_but_not_for_readers() {
        let trigger = Asking::ShareRowExclusive.conflicts();
        for held in [
            "RowExclusiveLock",
            "ShareUpdateExclusiveLock",
            "ShareLock",
            "ShareRowExclusiveLock",
            "ExclusiveLock",
            "AccessExclusiveLock",
        ] {
            assert!(trigger.contains(&held), "{held}");
        }
        for held in ["AccessShareLock", "RowShareLock"] {
            assert!(!trigger.contains(&held), "{held}");
        }
        // ACCESS EXCLUSIVE waits for every mode, readers' too.
        let exclusive = Asking::AccessExclusive.conflicts();
        assert_eq!(exclusive.len(), 8);
        assert!(trigger.iter().all(|m| exclusive.contains(m)));
        assert!(exclusive.contains(&"AccessShareLock") && exclusive.contains(&"RowShareLock"));
        // EXCLUSIVE waits for locking reads too, not for plain ones.
        let locking = Asking::Exclusive.conflicts();
        assert_eq!(locking.len(), 7);
        assert!(trigger.iter().all(|m| locking.contains(m)));
        assert!(locking.contains(&"RowShareLock") && !locking.contains(&"AccessShareLock"));
        // SHARE waits for writers and stronger, not for another SHARE.
        let share = Asking::Share.conflicts();
        assert_eq!(share.len(), 5);
        assert!(share.iter().all(|m| trigger.contains(m)) && !share.contains(&"ShareLock"));
    }
}
