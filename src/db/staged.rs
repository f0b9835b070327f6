//! A whole-table read that the server may give its parallel workers, inside a transaction that
//! writes from it (issue 36: the serial steps use the server's parallelism where it has some to
//! spare). PostgreSQL never plans an `INSERT ... SELECT`, nor a statement with a writing `WITH`,
//! in parallel; it does plan `CREATE TABLE ... AS` in parallel. So a step that sums a whole table
//! into a few rows (the campaigns' budgets before and after the deploy gate, the legacy counter
//! recorded at the gate) first reads them into a temporary table dropped at commit ([`stage`]),
//! then writes from that table. On 3 million coupons in 3 campaigns on two cores (PostgreSQL 15),
//! the sum took 318 ms this way against 592 ms inside the `INSERT`.
//!
//! The read and the write are then two statements, two snapshots in READ COMMITTED: what the
//! write adds is what the read found, as a counter batch after the gate always did (a drift read
//! beforehand, added to the row as it is when written), so a writer that changes a counter and
//! its source together in between moves both sides alike.
//!
//! The read takes the server's own parallel settings, as the same `SELECT` run by hand would.
//! It is not staged (the writing statement reads, on its backend alone, as before) when it would
//! gain nothing or cannot be: `max_parallel_workers_per_gather` is 0; the role lacks the
//! `TEMPORARY` privilege on the database; pgmend's workers crowded the application out of the
//! CPUs earlier in this process (`crowding::ceiling`: the read then leaves the cores alone, as an
//! index build does); or the server refused the table (an event trigger that forbids DDL, say):
//! that is said once, and no later read of this process tries again. The table lives in the
//! session's own temporary schema, so nobody else sees or waits on it, and it goes with the
//! transaction, committed or not.

use std::sync::atomic::{AtomicBool, Ordering};

use postgres::Transaction;

use super::sql_text::Ident;

/// Whether staging can gain anything and the role may create temporary tables here.
const MAY_STAGE_SQL: &str = "SELECT has_database_privilege(current_database(), 'TEMPORARY')
            AND current_setting('max_parallel_workers_per_gather')::int > 0";

/// Set once the server refused a staged read in this process.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Reads `select` (no parameters: `CREATE TABLE AS` takes none; its columns named apart) into
/// the temporary table `name`, dropped at commit, and returns the table; `None` when the read is
/// not staged (see the module's docs), and the caller then reads `select` in its own statement.
/// Once per name in a transaction. A refusal by the server is undone (a savepoint) and said; a
/// cancel, a lock wait or a lost connection is the caller's error as before.
pub fn stage(
    tx: &mut Transaction<'_>,
    name: &str,
    select: &str,
) -> Result<Option<Ident>, postgres::Error> {
    if REFUSED.load(Ordering::Relaxed) || super::crowding::ceiling().is_some() {
        return Ok(None);
    }
    let may: bool = tx.query_one(MAY_STAGE_SQL, &[])?.get(0);
    if !may {
        return Ok(None);
    }
    let table = Ident::qualified("pg_temp", name);
    let mut attempt = tx.savepoint("pgmend_stage")?;
    match attempt.batch_execute(&format!(
        "CREATE TEMPORARY TABLE {table} ON COMMIT DROP AS {select}"
    )) {
        Ok(()) => {
            attempt.commit()?;
            Ok(Some(table))
        }
        Err(e) if refused(&e) => {
            attempt.rollback()?;
            if !REFUSED.swap(true, Ordering::Relaxed) {
                crate::say!(
                    "note: the server refused a temporary table for a whole-table sum ({}); pgmend sums inside the statements that write instead, without the server's parallel workers, for the rest of this run. Nothing was changed by it",
                    crate::error::describe(&e)
                );
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// A refusal of the table itself, which the statement that reads inside the write does not
/// meet: privileges and names (class 42), an event trigger's exception (P0), a feature not
/// supported (0A), a read-only transaction (25). Anything else (a cancel, a lock wait, a lost
/// connection, a full disk) stays the caller's error.
fn refused(e: &postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| ["42", "P0", "0A", "25"].contains(&&c.code()[..2]))
}
