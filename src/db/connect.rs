//! Opening a session: TLS as libpq's `sslmode` means it, the server version check, and the
//! session settings every pgmend connection carries.
//!
//! Opens a `Session` (client, parameters, server version). Builds the OpenSSL connector for the six
//! `sslmode`s (`require` verifies when a root certificate is available; `verify-ca` the chain;
//! `verify-full` the chain and host name; `sslrootcert=system` the system store), turns connection
//! failures into advice (by SQLSTATE; for TLS failures by the client's error: an unknown authority,
//! a host name the certificate does not name, a server without TLS, a pg_hba entry that wants TLS),
//! ignores `sslmode` over a unix socket as libpq does (the server offers no TLS there), refuses
//! servers before 14.4, and sets `SESSION_SETTINGS` itself, each statement on its own and before
//! anything else (row_security off, its own timeouts and isolation, `jit = off`,
//! `client_connection_check_interval`; the doc comment says why each), so nothing a role or
//! database brings changes what pgmend's statements do. The version query uses the simple protocol,
//! so that through a transaction-mode pooler the pre-flight still gets to say so. `RAISE_WORK_MEM`
//! raises `work_mem` to 64 MB for one transaction (a larger setting is kept): a freeze, a census
//! (inside its savepoint) and a reconciliation each aggregate a whole table, and at the default 4
//! MB they spilled to disk. It is not set for the session: there it made the finance report's plan
//! slower (4.0 s against 2.7 s on 1.1 million coupons). `connect` also enables TCP keepalives and
//! prints server notices to stderr. `Session::ensure_writable` refuses hot standbys and
//! `default_transaction_read_only`. A `Session` whose `holds_runner_lock` is set runs
//! `pg_advisory_unlock_all()` when it drops: the server ends a closed session's backend
//! asynchronously, so without it a pgmend started right after this one exits could find the lock
//! still held and refuse. A closed connection's error says what usually closes one (the driver does
//! not always keep the server's last FATAL message).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres::Client;
use postgres_openssl::MakeTlsConnector;

use super::conninfo::{ConnParams, SslMode};
use crate::error::{describe, PgContext};

/// The oldest server pgmend works with: 14.0–14.3 could corrupt indexes built CONCURRENTLY.
pub const MIN_SERVER_VERSION: i32 = 140_004;

/// Raises `work_mem` to 64 MB for the rest of the current transaction (a larger setting is
/// kept). For the statements that aggregate a whole table once (freezing a repair's targets,
/// a census, a counter's reconciliation): at the default 4 MB their hash aggregates and sorts
/// spilled to disk, which made a freeze twice as slow on 740,000 coupons. Only there: set for
/// the whole session, it made the finance report's plan slower (4.0 s against 2.7 s on 1.1
/// million coupons).
pub const RAISE_WORK_MEM: &str = "SELECT set_config('work_mem', '64MB', true)
  WHERE pg_size_bytes(current_setting('work_mem')) < pg_size_bytes('64MB')";

/// What every pgmend session sets for itself, so that nothing a role or database brings
/// (`ALTER ROLE ... SET`, `ALTER DATABASE ... SET`, PGOPTIONS) changes what its statements do:
///
/// - `row_security = off`: a table whose row-level security would hide rows from pgmend makes
///   the server raise an error instead of filtering them, so no sum, census or report is
///   ever computed over the visible rows only (the pre-flight names such tables first).
/// - `statement_timeout = 10min`: the bound for statements outside a lock policy (reads,
///   freezes, ANALYZE, reconciliations); DDL and batches set their own with `SET LOCAL`
///   (`--statement-timeout`), and an online build sets 0 on its own connection, watched and
///   cancelled by pgmend (`--build-wait`). A role's `statement_timeout = '1s'` made the
///   freeze's ANALYZE fail on every rerun.
/// - `lock_timeout = 1min`: outside a lock policy, pgmend's statements take only the locks
///   of reads and of its own tables; a minute bounds a wait behind someone else's DDL.
/// - `idle_in_transaction_session_timeout = 0` (and `transaction_timeout = 0` from
///   PostgreSQL 17): a read-only transaction streams its output, which a pager can hold up
///   for as long as a person reads; write transactions are bounded per statement.
/// - `default_transaction_isolation = 'read committed'`, `default_transaction_deferrable =
///   off`: what the batches are written for; snapshots ask for REPEATABLE READ themselves.
/// - `client_connection_check_interval = 1s`: a backend whose client died (kill -9, a lost
///   network) notices within a second and rolls back, instead of holding its locks until the
///   current statement ends.
/// - `jit = off`: pgmend's statements are short batches whose estimated cost can still pass
///   jit_above_cost (a correlated lookup per key inflates it), and compiling them took
///   300-400 ms per batch against 40 ms of work, measured on a member-month batch of 5,000
///   keys. That time is spent holding the batch's row locks.
pub const SESSION_SETTINGS: &[&str] = &[
    "SET statement_timeout = '10min'",
    "SET row_security = off",
    "SET lock_timeout = '1min'",
    "SET idle_in_transaction_session_timeout = 0",
    "SET default_transaction_isolation = 'read committed'",
    "SET default_transaction_deferrable = off",
    "SET client_connection_check_interval = '1s'",
    "SET jit = off",
];

/// An open session and what pgmend learned about the server when it opened it.
pub struct Session {
    pub client: Client,
    /// Set by [`super::runner_lock::acquire`]: released explicitly when the session drops.
    pub holds_runner_lock: bool,
    pub params: ConnParams,
    pub server_version_num: i32,
    pub server_version: String,
    /// The server backend the session started on (`pg_backend_pid()`): a session that keeps
    /// it has kept its session state (see [`ensure_backend`]).
    pub backend_pid: i32,
}

/// The runner lock is a session lock: it goes when the session ends, but the server ends a
/// closed session's backend asynchronously, so a pgmend started right after this one exits
/// could still find the lock held for a moment and refuse (`--runner-wait 0s`). Releasing it
/// here, in a statement the server has answered before the process exits, closes that gap.
impl Drop for Session {
    fn drop(&mut self) {
        if self.holds_runner_lock && !self.client.is_closed() {
            let _ = self.client.batch_execute("SELECT pg_advisory_unlock_all()");
        }
    }
}

impl Session {
    /// Refuses (exit 2) when the server cannot take writes: a hot standby, or a database
    /// whose default is read-only.
    pub fn ensure_writable(&mut self) -> Result<()> {
        let row = self
            .client
            .query_one(
                "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only') = 'on'",
                &[],
            )
            .doing("checking whether the server accepts writes")?;
        let (standby, read_only): (bool, bool) = (row.get(0), row.get(1));
        if standby {
            bail!(
                "{} is a read-only hot standby; this command changes the database. Point --database-url at the primary",
                self.params
            );
        }
        if read_only {
            bail!(
                "{} has default_transaction_read_only = on; this command changes the database. Use a role or database that allows writes",
                self.params
            );
        }
        Ok(())
    }
}

/// Connects, checks the server version, and sets the session up for pgmend's work.
pub fn connect(params: &ConnParams) -> Result<Session> {
    let mut config = postgres::Config::new();
    if params.is_unix_socket() {
        config.host_path(&params.host);
    } else {
        config.host(&params.host);
    }
    config
        .port(params.port)
        .user(&params.user)
        .dbname(&params.dbname)
        .application_name(&params.application_name)
        .connect_timeout(params.connect_timeout)
        .keepalives(true)
        .ssl_mode(match effective_sslmode(params) {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Allow | SslMode::Prefer => postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                postgres::config::SslMode::Require
            }
        });
    if let Some(password) = &params.password {
        config.password(password);
    }
    if let Some(options) = &params.options {
        config.options(options);
    }
    config.notice_callback(|notice| {
        crate::say!("server {}: {}", notice.severity(), notice.message());
    });

    let tls = tls_connector(params)?;
    let mut client = connect_within(config, tls, params.connect_timeout)
        .with_context(|| format!("could not connect to {params}; check that the server is running and reachable, the host and port (--database-url, DATABASE_URL or PGHOST/PGPORT), and sslmode"))?
        .map_err(|e| {
        let failure = describe(&e);
        let advice = connect_advice(params, &failure);
        anyhow::Error::new(failure).context(format!("could not connect to {params}; {advice}"))
    })?;

    // The settings come first, each statement on its own, so that a role's timeout of a
    // millisecond cannot cancel even the next one. These and the version query use the
    // simple protocol: through a pooler in transaction mode a prepared statement can vanish
    // before it runs, and the pre-flight must get to say so.
    for set in SESSION_SETTINGS {
        client
            .batch_execute(set)
            .doing(format!("setting pgmend's session settings ({set})"))?;
    }
    let [server_version_num, server_version, backend_pid] = simple_row(
        &mut client,
        "SELECT current_setting('server_version_num'), current_setting('server_version'), pg_backend_pid()",
    )
    .doing("reading the server version")?;
    let server_version_num: i32 = server_version_num.parse().unwrap_or_default();
    let backend_pid: i32 = backend_pid.parse().unwrap_or_default();
    check_server_version(params, server_version_num, &server_version)?;
    if server_version_num >= 170_000 {
        client
            .batch_execute("SET transaction_timeout = 0")
            .doing("setting pgmend's session settings (SET transaction_timeout = 0)")?;
    }
    Ok(Session {
        client,
        holds_runner_lock: false,
        params: params.clone(),
        server_version_num,
        server_version,
        backend_pid,
    })
}

/// The one row of a query run with the simple protocol, as text (NULL as an empty string).
pub fn simple_row<const N: usize>(
    client: &mut Client,
    sql: &str,
) -> std::result::Result<[String; N], postgres::Error> {
    let mut values: [String; N] = std::array::from_fn(|_| String::new());
    for message in client.simple_query(sql)? {
        if let postgres::SimpleQueryMessage::Row(row) = message {
            for (i, value) in values.iter_mut().enumerate() {
                *value = row.get(i).unwrap_or_default().to_string();
            }
        }
    }
    Ok(values)
}

/// The `postgres` crate bounds only the TCP connect by `connect_timeout`; a server that
/// accepts the connection and never answers would hang it. libpq bounds the whole
/// establishment, and so does pgmend: the attempt runs on a thread, and past the timeout it
/// is abandoned (the process is about to exit with the error anyway).
fn connect_within(
    config: postgres::Config,
    tls: MakeTlsConnector,
    timeout: std::time::Duration,
) -> Result<Result<Client, postgres::Error>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(config.connect(tls));
    });
    receiver.recv_timeout(timeout + std::time::Duration::from_millis(500)).map_err(|_| {
        anyhow::anyhow!(
            "the server did not complete the connection within the connect timeout ({}s; PGCONNECT_TIMEOUT or connect_timeout=...)",
            timeout.as_secs()
        )
    })
}

/// What to do about a failed connection, from the SQLSTATE or, for TLS, the client's error.
fn connect_advice(params: &ConnParams, failure: &crate::error::DbFailure) -> String {
    let text = failure.to_string();
    let mode = params.sslmode.as_str();
    if text.contains("certificate verify failed") {
        if text.contains("mismatch") {
            return format!(
                "the server's certificate does not name the host {:?} (sslmode={mode} checks that it does): connect with a host name the certificate lists in its subjectAltName, or use sslmode=verify-ca to check only that a trusted authority signed it",
                params.host
            );
        }
        let root = root_certificate(params)
            .map_or_else(|| "(none)".to_string(), |path| path.display().to_string());
        return format!(
            "the server's certificate could not be verified with the root certificate {root} (sslmode={mode}): set PGSSLROOTCERT (or sslrootcert=...) to the PEM file of the certificate authority that signed the server's certificate"
        );
    }
    if text.contains("server does not support TLS") {
        return format!(
            "sslmode={mode} needs TLS and the server does not offer it: turn ssl on in the server's configuration, or check that host and port point at the server you meant"
        );
    }
    // The driver's own "password missing" (the server asked for one and none was given; it
    // has no SQLSTATE), or the server refusing an empty one.
    let no_password = text.contains("password missing")
        || text.contains("no password supplied")
        || (params.password.is_none() && failure.sqlstate.as_deref() == Some("28P01"));
    if no_password {
        return format!(
            "the server asks for a password for user {:?} and no password was given: put it in the URL (postgresql://user:PASSWORD@host/dbname, percent-encoded) or password='...', set PGPASSWORD, or add a line host:port:dbname:user:PASSWORD to ~/.pgpass (or the file PGPASSFILE or passfile names; chmod 600)",
            params.user
        );
    }
    match failure.sqlstate.as_deref() {
        Some("28000") if text.contains("no encryption") => format!(
            "the server's pg_hba.conf admits this connection only over TLS and sslmode={mode} did not use it: use sslmode=verify-full with PGSSLROOTCERT (or at least sslmode=require)"
        ),
        Some("28P01") | Some("28000") => {
            "check the user and password (the URL, PGUSER, PGPASSWORD, ~/.pgpass) and pg_hba.conf"
                .into()
        }
        Some("3D000") => "check the database name (the URL path or PGDATABASE)".into(),
        _ => "check that the server is running and reachable, the host and port (--database-url, DATABASE_URL or PGHOST/PGPORT), and sslmode".into(),
    }
}

/// libpq never asks for TLS over a unix socket (the server does not offer it there), so
/// sslmode applies to TCP connections only.
fn effective_sslmode(params: &ConnParams) -> SslMode {
    if params.is_unix_socket() {
        SslMode::Disable
    } else {
        params.sslmode
    }
}

/// Refuses servers older than 14.4 (exit 2).
pub fn check_server_version(params: &ConnParams, version_num: i32, version: &str) -> Result<()> {
    if version_num < MIN_SERVER_VERSION {
        bail!(
            "{params} runs PostgreSQL {version}; pgmend needs 14.4 or newer (14.0 to 14.3 could corrupt indexes built CONCURRENTLY). Upgrade the server before the release"
        );
    }
    Ok(())
}

/// TLS the way libpq's sslmode means it: `prefer`/`require` encrypt without checking the
/// certificate (unless a root certificate is given, when `require` acts as `verify-ca`),
/// `verify-ca` checks the chain, `verify-full` the chain and the host name.
fn tls_connector(params: &ConnParams) -> Result<MakeTlsConnector> {
    let mut builder = SslConnector::builder(SslMethod::tls_client())
        .context("initialising OpenSSL for TLS connections")?;
    let root = root_certificate(params);
    let verify = match effective_sslmode(params) {
        SslMode::VerifyCa | SslMode::VerifyFull => true,
        SslMode::Require => root.is_some(),
        _ => false,
    };
    if verify {
        match &root {
            Some(path) if path.as_os_str() == "system" => {
                builder
                    .set_default_verify_paths()
                    .context("loading the system's certificate authorities")?;
            }
            Some(path) => builder.set_ca_file(path).with_context(|| {
                format!(
                    "cannot load the root certificate {}; check sslrootcert / PGSSLROOTCERT",
                    path.display()
                )
            })?,
            None => bail!(
                "sslmode={} needs the certificate authority that signed the server's certificate: set PGSSLROOTCERT (or sslrootcert=...) to its PEM file, or sslrootcert=system for the system's store",
                params.sslmode.as_str()
            ),
        }
        builder.set_verify(SslVerifyMode::PEER);
    } else {
        builder.set_verify(SslVerifyMode::NONE);
    }
    let mut connector = MakeTlsConnector::new(builder.build());
    let check_host = effective_sslmode(params) == SslMode::VerifyFull;
    connector.set_callback(move |config, _domain| {
        config.set_verify_hostname(check_host);
        Ok(())
    });
    Ok(connector)
}

/// `sslrootcert`, else libpq's default `~/.postgresql/root.crt` when it exists.
fn root_certificate(params: &ConnParams) -> Option<PathBuf> {
    if let Some(path) = &params.sslrootcert {
        return Some(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME")?;
    let default = PathBuf::from(home).join(".postgresql/root.crt");
    default.is_file().then_some(default)
}

/// A READ ONLY transaction: the server refuses any write made in it.
pub fn read_only(client: &mut postgres::Client) -> Result<postgres::Transaction<'_>> {
    client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a read-only transaction")
}

/// One REPEATABLE READ, READ ONLY snapshot: every query in it sees the same moment, and the
/// server refuses any write (a hot standby will do).
pub fn snapshot(client: &mut postgres::Client) -> Result<postgres::Transaction<'_>> {
    client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .doing("opening a read-only snapshot")
}

/// Whether `client` still talks to server backend `backend_pid` (the one its session started
/// on): through a pooler that does not keep sessions it would not, and the runner lock and
/// session settings would be lost. Checked by the pre-flight and before every release step.
pub fn ensure_backend(client: &mut postgres::Client, backend_pid: i32) -> Result<()> {
    for _ in 0..2 {
        let [pid] = simple_row(client, "SELECT pg_backend_pid()")
            .doing("checking that the server session is still the same")?;
        let pid: i32 = pid.parse().unwrap_or_default();
        if pid != backend_pid {
            // The lock stays with the server connection that took it, which through such a
            // pool need not be the one the session started on: name the ones holding it now.
            let lock = match super::runner_lock::holder_pids(client) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_older_than_14_4_are_refused() {
        let p = crate::db::conninfo::resolve(Some("host=h user=u password=hunter2"), &|_| None)
            .unwrap();
        let e = check_server_version(&p, 140_003, "14.3")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("14.4 or newer") && e.contains("14.3") && !e.contains("hunter2"),
            "{e}"
        );
        assert!(check_server_version(&p, 130_010, "13.10").is_err());
        assert!(check_server_version(&p, 140_004, "14.4").is_ok());
        assert!(check_server_version(&p, 180_001, "18.1").is_ok());
    }
}
