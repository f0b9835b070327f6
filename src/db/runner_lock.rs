//! One pgmend at a time per database: a session-level advisory lock, taken by polling.
//!
//! `pg_advisory_lock` would block inside the server, and a session blocked there is an
//! "older transaction" that every `CREATE INDEX CONCURRENTLY` must wait out: two pgmends
//! could deadlock each other's index builds. `pg_try_advisory_lock` returns at once, so
//! pgmend polls it from the client. Session locks need a direct connection (or a
//! session-mode pooler): in a transaction-mode pooler the lock would stay behind on a
//! server connection that another client then uses.
//!
//! One pgmend at a time per database: a session-level advisory lock with key `0x70676d656e64`
//! ("pgmend" in ASCII; `pg_locks` shows classid 28775, objid 1835363940), taken by polling
//! `pg_try_advisory_lock` every 250 ms for up to `--runner-wait`, then `Stopped` naming the holder
//! (pid, application_name, user, client address, connection start). The returned `RunnerLock` is
//! proof of holding it; `acquire` marks the `Session`, which unlocks explicitly when it drops (and
//! the server releases it anyway when the session ends, e.g. after a kill).

use std::time::{Duration, Instant};

use anyhow::Result;
use postgres::Client;

use super::Session;

use crate::error::{PgContext, Stopped};

/// The advisory lock key: "pgmend" in ASCII. pg_locks shows it as classid 28775, objid
/// 1835363940.
pub const RUNNER_LOCK_KEY: i64 = 0x7067_6d65_6e64;

/// Proof that this session holds the runner lock. Dropping the session releases it (with an
/// explicit unlock, see [`Session`]'s `Drop`).
pub struct RunnerLock(());

/// Takes the runner lock, polling for up to `wait`. With another pgmend holding it past
/// `wait`, stops (exit 1) naming the holder.
pub fn acquire(session: &mut Session, wait: Duration) -> Result<RunnerLock> {
    let client = &mut session.client;
    let started = Instant::now();
    let mut announced = false;
    loop {
        let got: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&RUNNER_LOCK_KEY])
            .doing("taking pgmend's runner lock (pg_try_advisory_lock)")?
            .get(0);
        if got {
            session.holds_runner_lock = true;
            return Ok(RunnerLock(()));
        }
        let holder = describe_holder(client)?;
        if started.elapsed() >= wait {
            return Err(Stopped::error(format!(
                "another pgmend is working on this database ({holder}); nothing was changed. Wait for it to finish, or rerun with --runner-wait 5m to wait for it"
            )));
        }
        if !announced {
            crate::say!(
                "waiting up to {} for another pgmend to finish ({holder})",
                crate::config::format_duration(wait)
            );
            announced = true;
        }
        std::thread::sleep(Duration::from_millis(250).min(wait.saturating_sub(started.elapsed())));
    }
}

/// The rows of `pg_locks` (alias `l`) that grant the runner lock in this database (`$1`: the key).
const HELD: &str = "l.locktype = 'advisory' AND l.granted
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND l.classid::bigint = ($1::bigint >> 32) AND l.objid::bigint = ($1::bigint & 4294967295)
                AND l.objsubid = 1";

/// The server backends that hold the runner lock now. Through a pooler that does not keep
/// sessions, the lock stays with whichever server connection ran `pg_try_advisory_lock`,
/// which need not be the one the session started on.
pub fn holder_pids(client: &mut Client) -> Result<Vec<i32>> {
    Ok(client
        .query(
            &format!("SELECT l.pid FROM pg_locks l WHERE {HELD} ORDER BY l.pid"),
            &[&RUNNER_LOCK_KEY],
        )
        .doing("looking up which server connections hold pgmend's runner lock")?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Who holds the runner lock, in words.
fn describe_holder(client: &mut Client) -> Result<String> {
    let rows = client
        .query(
            &format!(
                "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.usename::text, ''),
                    coalesce(host(a.client_addr), 'local socket'),
                    to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pg_locks l JOIN pg_stat_activity a USING (pid)
              WHERE {HELD}"
            ),
            &[&RUNNER_LOCK_KEY],
        )
        .doing("looking up who holds pgmend's runner lock")?;
    Ok(match rows.first() {
        Some(r) => format!(
            "backend pid {}, application_name {:?}, user {}, from {}, connected since {}",
            r.get::<_, i32>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3),
            r.get::<_, String>(4)
        ),
        None => "its session is no longer visible; it may have just finished".to_string(),
    })
}
