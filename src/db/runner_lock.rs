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
//! (pid, application_name, user, client address, connection start).
//!
//! The lock is a **lease**. It is held by a connection of its own (to the server the main session
//! reached), whose thread sends a heartbeat every [`HEARTBEAT`] and which the server ends by
//! `idle_session_timeout` once [`LEASE`] passes without one: a pgmend whose network path went
//! silent, or whose process hangs, blocks the next run for [`LEASE`] at most, and nothing is left
//! for a person to `pg_terminate_backend`. A connection of its own, because the main session
//! legitimately idles for long (a `[y/N]` prompt, `--pause`, waiting on workers or an online
//! build) and is busy for long (a 10-minute freeze), and neither may end the lease nor starve the
//! heartbeat. The lease is **fenced**: every transaction under a lock policy (every batch, step
//! and migration) first takes the fence key in shared mode and checks that this pgmend's lease
//! session is still the one alive on the server ([`fence_sql`]); a new pgmend, once it has the
//! lock, takes the fence key exclusively once ([`acquire`]), so it starts only after every such
//! transaction of an earlier pgmend has ended, and no worker of a pgmend whose lease expired ever
//! commits beside it. The returned `RunnerLock` is proof of holding it; dropping it unlocks
//! explicitly (the server ends a closed session's backend asynchronously, so a pgmend started
//! right after this one exits could otherwise find the lock still held for a moment).
//!
//! With `--pooler session`, [`ensure_backend`] checks that a session still talks to the server
//! backend it started on, and otherwise names the connections that hold the lock now.

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use postgres::Client;

use super::Session;

use crate::error::{describe, PgContext, Stopped};

/// The advisory lock key: "pgmend" in ASCII. pg_locks shows it as classid 28775, objid
/// 1835363940.
pub const RUNNER_LOCK_KEY: i64 = 0x7067_6d65_6e64;

/// The fence key ("pgmfnc"): shared by every fenced transaction, taken exclusively once by a
/// pgmend that has just got the lock.
pub const FENCE_KEY: i64 = 0x7067_6d66_6e63;

/// How long the server keeps the lease of a pgmend it no longer hears from
/// (`idle_session_timeout` on the lease session); in `config`, so that `signals` can say it.
pub use crate::config::LEASE;

/// How often the lease's thread shows the server that pgmend is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// How long the run has, once the lease is lost, to stop by itself before pgmend exits 2.
const LOST_GRACE: Duration = Duration::from_secs(20);

/// The client-side bound of one heartbeat: past it the lease's path is taken as silent.
const HEARTBEAT_BOUND: Duration = Duration::from_secs(20);

/// How long a transaction of pgmend idles at most on the server between two of its statements
/// (`idle_in_transaction_session_timeout` in every write transaction).
pub use crate::config::IDLE_IN_TRANSACTION;

/// The lease session of this process while it holds the lock: its backend pid and start (in
/// microseconds since the epoch), which the fence checks.
static LEASE_SESSION: Mutex<Option<(i32, i64)>> = Mutex::new(None);

/// Proof that this process holds the runner lock, through its lease. Dropping it ends the
/// heartbeat and unlocks.
pub struct RunnerLock {
    stop: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
}

impl Drop for RunnerLock {
    fn drop(&mut self) {
        *LEASE_SESSION.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let _ = self.stop.send(());
        // The unlock is answered within a moment on a live path; on a silent one the lease
        // ends on the server by itself.
        let _ = self.done.recv_timeout(Duration::from_secs(3));
    }
}

/// The backend pid of this process's lease session, while it holds the runner lock.
pub fn lease_pid() -> Option<i32> {
    LEASE_SESSION
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map(|(pid, _)| pid)
}

/// What a fenced transaction runs first (after its `SET LOCAL`s): the fence key in shared mode,
/// then an error (SQLSTATE PGM01) unless this process's lease session is alive on the server.
/// Empty when this process holds no lease (commands that take no runner lock).
pub fn fence_sql() -> String {
    let Some((pid, started)) = *LEASE_SESSION.lock().unwrap_or_else(|e| e.into_inner()) else {
        return String::new();
    };
    format!(
        "; SELECT pg_advisory_xact_lock_shared({FENCE_KEY}); DO $fence$ BEGIN IF NOT EXISTS (SELECT FROM pg_stat_get_activity({pid}) WHERE (extract(epoch FROM backend_start) * 1000000)::bigint = {started}) THEN RAISE EXCEPTION USING ERRCODE = 'PGM01', MESSAGE = 'this pgmend''s lease on the runner lock has expired (its session, backend pid {pid}, is gone: the server ended it after {lease} s without a heartbeat, it was terminated, or a connection pool in front of the server closed it)', HINT = 'nothing of this transaction was committed; another pgmend may hold the lock now. Check `pgmend repair status`, then rerun. Through a connection pool that does not keep sessions, pgmend''s runner lock may stay with a pooled server connection: restart the pool, and connect directly or through a pool in session mode'; END IF; END $fence$",
        lease = LEASE.as_secs()
    )
}

/// Takes the runner lock, polling for up to `wait`. With another pgmend holding it past
/// `wait`, stops (exit 1) naming the holder. Then waits for any fenced transaction of an
/// earlier pgmend to end, sets the main session's `idle_in_transaction_session_timeout`, and
/// starts the lease's heartbeat.
pub fn acquire(session: &mut Session, wait: Duration) -> Result<RunnerLock> {
    let mut lease = super::connect(&session.params)?;
    lease
        .client
        .batch_execute(&format!(
            "SET idle_session_timeout = '{}s'",
            LEASE.as_secs()
        ))
        .doing("setting the lease's idle_session_timeout")?;
    let client = &mut lease.client;
    let started = Instant::now();
    let mut announced = false;
    loop {
        let got: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&RUNNER_LOCK_KEY])
            .doing("taking pgmend's runner lock (pg_try_advisory_lock)")?
            .get(0);
        if got {
            break;
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
    wait_for_earlier_transactions(client, wait)?;
    let backend_start: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM backend_start) * 1000000)::bigint FROM pg_stat_get_activity(pg_backend_pid())",
            &[],
        )
        .doing("reading the lease session's start")?
        .get(0);
    session
        .client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{}s'",
            IDLE_IN_TRANSACTION.as_secs()
        ))
        .doing("bounding how long the server keeps an idle transaction of pgmend")?;
    *LEASE_SESSION.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((lease.backend_pid, backend_start));
    let (stop, stop_receiver) = mpsc::channel();
    let (done_sender, done) = mpsc::channel();
    std::thread::spawn(move || heartbeat(lease, stop_receiver, done_sender));
    Ok(RunnerLock { stop, done })
}

/// Waits until no fenced transaction of an earlier pgmend is open (the fence key is free), for
/// `wait` or [`LEASE`] plus a minute, whichever is longer: such a transaction ends by its own
/// statement timeout or by [`IDLE_IN_TRANSACTION`].
fn wait_for_earlier_transactions(client: &mut Client, wait: Duration) -> Result<()> {
    let limit = wait.max(LEASE + Duration::from_secs(60));
    let started = Instant::now();
    let mut announced = false;
    loop {
        let free: bool = client
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&FENCE_KEY])
            .doing("waiting for the transactions of an earlier pgmend (pg_try_advisory_xact_lock)")?
            .get(0);
        if free {
            return Ok(());
        }
        if started.elapsed() >= limit {
            return Err(Stopped::error(format!(
                "a transaction of an earlier pgmend is still open on this database after {}; nothing was changed. Find it in pg_stat_activity (application_name pgmend) and end it, then rerun",
                crate::config::format_duration(limit)
            )));
        }
        if !announced {
            crate::say!(
                "waiting for a transaction of an earlier pgmend to end (it ends within {} s of its last statement)",
                IDLE_IN_TRANSACTION.as_secs()
            );
            announced = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The lease's thread: a heartbeat every [`HEARTBEAT`] until told to stop, then the unlock.
/// A heartbeat that fails, or lands on another server connection (a pooler that does not
/// keep sessions), loses the lease: pgmend says so, and its next fenced transaction stops.
fn heartbeat(mut lease: Session, stop: mpsc::Receiver<()>, done: mpsc::Sender<()>) {
    let _bound = super::deadline::at_most(HEARTBEAT_BOUND);
    let mut lost = false;
    loop {
        if lost {
            // The run stops at its next fenced transaction; one still waiting on a server
            // pgmend cannot reach would never get there, and the lock may soon be another's.
            if let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(LOST_GRACE) {
                crate::signals::exit_lease_lost(&format!(
                    "pgmend lost its lease on the runner lock {} s ago and the run did not stop by itself (a statement still waits on the server)",
                    LOST_GRACE.as_secs()
                ));
            }
            break;
        }
        match stop.recv_timeout(HEARTBEAT) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        match super::connect::simple_row::<1>(&mut lease.client, "SELECT pg_backend_pid()") {
            Ok([pid]) if pid == lease.backend_pid.to_string() => {}
            Ok([pid]) => {
                crate::say!("pgmend: its lease on the runner lock is lost: the heartbeat reached server backend {pid}, not the lease's {} (a pooler that does not keep sessions); the run stops before its next commit", lease.backend_pid);
                lost = true;
            }
            Err(e) => {
                crate::say!("pgmend: its lease on the runner lock is lost ({}); the run stops before its next commit, and the server releases the lock within {} s", describe(&e), LEASE.as_secs());
                lost = true;
            }
        }
    }
    if !lost && !lease.client.is_closed() {
        let _ = lease
            .client
            .batch_execute("SELECT pg_advisory_unlock_all()");
    }
    let _ = done.send(());
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

/// Whether `client` still talks to server backend `backend_pid` (the one its session started
/// on): through a pooler that does not keep sessions it would not, and the runner lock and
/// session settings would be lost. Checked by the pre-flight and before every release step.
pub fn ensure_backend(client: &mut Client, backend_pid: i32) -> Result<()> {
    for _ in 0..2 {
        let [pid] = super::connect::simple_row(client, "SELECT pg_backend_pid()")
            .doing("checking that the server session is still the same")?;
        let pid: i32 = pid.parse().unwrap_or_default();
        if pid != backend_pid {
            // The lock stays with the server connection that took it, which through such a
            // pool need not be the one the session started on: name the ones holding it now.
            let lock = match holder_pids(client) {
                Ok(pids) if pids.is_empty() => "No server connection holds pgmend's runner lock now.".to_string(),
                Ok(pids) => format!(
                    "pgmend's runner lock stays with server {} until {} closed: restart the pool, or run {} once no client uses {}.",
                    crate::human::count(pids.len() as i64, "connection"),
                    if pids.len() == 1 { "it is" } else { "they are" },
                    pids.iter()
                        .map(|p| format!("SELECT pg_terminate_backend({p})"))
                        .collect::<Vec<_>>()
                        .join(" and "),
                    if pids.len() == 1 { "it" } else { "them" },
                ),
                Err(_) => "pgmend's runner lock may stay with a pooled server connection: restart the pool.".to_string(),
            };
            bail!(
                "the server session changed under pgmend (backend {backend_pid} at the start, {pid} now): what stands between pgmend and the server does not keep sessions (a pooler in transaction or statement mode), so pgmend's runner lock and prepared statements would be lost. {lock} Then connect to the server directly, or through a pool in session mode. Every step committed so far is complete; a rerun continues from there"
            );
        }
    }
    Ok(())
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
