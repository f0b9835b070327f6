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
//! slower (4.0 s against 2.7 s on 1.1 million coupons). `connect` opens the socket itself (TCP
//! with the keepalives and `tcp_user_timeout` of `ConnParams`, or the unix socket) and runs the
//! client over `deadline::Watched`, so that no wait on the server goes without a bound; with
//! several hosts it tries them in order until one has the `target_session_attrs` asked for, and
//! pins the session's parameters to it. It sets the server's TCP keepalives for its own session
//! and prints server notices to stderr. `Session::ensure_writable` refuses hot standbys and
//! `default_transaction_read_only`. A `Session`'s close waits `deadline::CLOSE_BOUND` at most for
//! the server to hang up. A closed connection's error says what usually closes one (the driver
//! does not always keep the server's last FATAL message).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres::Client;
use postgres_openssl::MakeTlsConnector;

use super::conninfo::{ConnParams, SslMode, TargetSessionAttrs};
use super::deadline::Watched;
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
///   for as long as a person reads. Commands that write set 30 s once they hold the runner
///   lock, and every transaction under a lock policy sets it with `SET LOCAL`
///   (`runner_lock::IDLE_IN_TRANSACTION`).
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
    pub params: ConnParams,
    pub server_version_num: i32,
    pub server_version: String,
    /// The server backend the session started on (`pg_backend_pid()`): a session that keeps
    /// it has kept its session state (see [`super::runner_lock::ensure_backend`]).
    pub backend_pid: i32,
    /// Last, so that it drops after the client: bounds the client's close (see `Drop`).
    closing: super::deadline::Closing,
}

/// Closing a client waits for the server to hang up after pgmend's goodbye; on a silent path
/// it never does, so the close is bounded by [`CLOSE_BOUND`](super::deadline::CLOSE_BOUND).
impl Drop for Session {
    fn drop(&mut self) {
        self.closing.begin();
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
///
/// With several hosts (`host=a,b`, `postgresql://a:1,b:2/db`) they are tried in order, as
/// libpq does, until one accepts the connection and has the `target_session_attrs` asked for;
/// the session's parameters then name that server alone, so every further connection of the
/// run (workers, an online build, the lease) reaches the same one.
pub fn connect(params: &ConnParams) -> Result<Session> {
    let endpoints = params.endpoints();
    if endpoints.len() == 1 {
        return connect_one(params);
    }
    let mut failures = Vec::new();
    // prefer-standby: a first round for a standby, a second one for anything.
    let rounds: &[TargetSessionAttrs] = match params.target_session_attrs {
        TargetSessionAttrs::PreferStandby => {
            &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
        }
        wanted => &[wanted],
    };
    for &wanted in rounds {
        for endpoint in &endpoints {
            let mut pinned = params.pinned_to(endpoint);
            pinned.target_session_attrs = wanted;
            match connect_one(&pinned) {
                Ok(mut session) => {
                    session.params.target_session_attrs = params.target_session_attrs;
                    return Ok(session);
                }
                Err(e) => failures.push(format!("{}:{}: {e:#}", endpoint.host, endpoint.port)),
            }
        }
    }
    bail!(
        "none of the {} servers in the connection string could be used (target_session_attrs={}): {}",
        endpoints.len(),
        params.target_session_attrs.as_str(),
        failures.join("; ")
    )
}

/// [`connect`] to the one server `params` names first.
fn connect_one(params: &ConnParams) -> Result<Session> {
    let mut config = postgres::Config::new();
    config
        .user(&params.user)
        .dbname(&params.dbname)
        .application_name(&params.application_name)
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
    let mut client = connect_within(config, tls, params)
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
    if let Some(keepalives) = server_keepalives(params) {
        client
            .batch_execute(&keepalives)
            .doing("setting pgmend's session settings (the server's TCP keepalives)")?;
    }
    let [server_version_num, server_version, backend_pid, in_recovery, read_only] = simple_row(
        &mut client,
        "SELECT current_setting('server_version_num'), current_setting('server_version'), pg_backend_pid(),
                pg_is_in_recovery(), current_setting('default_transaction_read_only')",
    )
    .doing("reading the server version")?;
    let server_version_num: i32 = server_version_num.parse().unwrap_or_default();
    let backend_pid: i32 = backend_pid.parse().unwrap_or_default();
    check_server_version(params, server_version_num, &server_version)?;
    check_session_attrs(params, in_recovery == "t", read_only == "on")?;
    if server_version_num >= 170_000 {
        client
            .batch_execute("SET transaction_timeout = 0")
            .doing("setting pgmend's session settings (SET transaction_timeout = 0)")?;
    }
    Ok(Session {
        client,
        params: params.clone(),
        server_version_num,
        server_version,
        backend_pid,
        closing: Default::default(),
    })
}

/// Refuses a server that lacks the `target_session_attrs` asked for, as libpq does (`standby`
/// and `primary` by `pg_is_in_recovery()`, `read-write` and `read-only` by
/// `default_transaction_read_only` as well).
fn check_session_attrs(params: &ConnParams, in_recovery: bool, read_only: bool) -> Result<()> {
    let fits = match params.target_session_attrs {
        TargetSessionAttrs::Any | TargetSessionAttrs::PreferStandby => true,
        TargetSessionAttrs::ReadWrite => !in_recovery && !read_only,
        TargetSessionAttrs::ReadOnly => in_recovery || read_only,
        TargetSessionAttrs::Primary => !in_recovery,
        TargetSessionAttrs::Standby => in_recovery,
    };
    if !fits {
        bail!(
            "{params} is {}, not what target_session_attrs={} asks for",
            if in_recovery {
                "a standby in recovery"
            } else if read_only {
                "a primary with default_transaction_read_only = on"
            } else {
                "a primary that accepts writes"
            },
            params.target_session_attrs.as_str()
        );
    }
    Ok(())
}

/// The server's side of the keepalives, for its own session: a backend whose client died
/// notices in about a minute (the server's default waits for the kernel's two hours). Same
/// values as the client's, which libpq's keys set.
fn server_keepalives(params: &ConnParams) -> Option<String> {
    if params.is_unix_socket() || !params.keepalives {
        return None;
    }
    Some(format!(
        "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = {}; SET tcp_keepalives_count = {}; SET tcp_user_timeout = {}",
        params.keepalives_idle.as_secs(),
        params.keepalives_interval.as_secs(),
        params.keepalives_count,
        params.tcp_user_timeout.as_millis()
    ))
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

/// Opens the socket itself (TCP with keepalives and `tcp_user_timeout`, or the unix socket),
/// wrapped in [`Watched`] so that no wait on this connection goes without a deadline, and runs
/// the connection's start-up over it. The whole establishment is bounded by `connect_timeout`,
/// as libpq bounds it (the `postgres` crate bounds only the TCP connect): the attempt runs on a
/// thread, and past the timeout it is abandoned.
fn connect_within(
    config: postgres::Config,
    mut tls: MakeTlsConnector,
    params: &ConnParams,
) -> Result<Result<Client, postgres::Error>> {
    let timeout = params.connect_timeout;
    let params = params.clone();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _bounded = super::deadline::within(timeout.saturating_sub(super::deadline::MARGIN));
        let attempt = (|| -> Result<Result<Client, postgres::Error>> {
            let socket = open_socket(&params)?;
            let tls = postgres::tls::MakeTlsConnect::<Watched<Socket>>::make_tls_connect(
                &mut tls,
                if params.is_unix_socket() {
                    "localhost"
                } else {
                    &params.host
                },
            )
            .context("preparing TLS for the connection")?;
            Ok(config.connect_raw(move || socket.into_tokio(), tls)?)
        })();
        let _ = sender.send(attempt);
    });
    receiver.recv_timeout(timeout + std::time::Duration::from_millis(500)).map_err(|_| {
        anyhow::anyhow!(
            "the server did not complete the connection within the connect timeout ({}s; PGCONNECT_TIMEOUT or connect_timeout=...)",
            timeout.as_secs()
        )
    })?
}

/// A connected socket before it joins the connection's runtime.
enum StdSocket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

/// The socket a connection runs over.
#[derive(Debug)]
pub enum Socket {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl StdSocket {
    /// Registers the socket with the runtime this runs in.
    fn into_tokio(self) -> std::io::Result<Watched<Socket>> {
        Ok(Watched::new(match self {
            StdSocket::Tcp(s) => {
                s.set_nonblocking(true)?;
                Socket::Tcp(tokio::net::TcpStream::from_std(s)?)
            }
            StdSocket::Unix(s) => {
                s.set_nonblocking(true)?;
                Socket::Unix(tokio::net::UnixStream::from_std(s)?)
            }
        }))
    }
}

/// Connects to the first host of `params`: every address it resolves to in turn over TCP,
/// or the socket `.s.PGSQL.PORT` in its directory.
fn open_socket(params: &ConnParams) -> Result<StdSocket> {
    if params.is_unix_socket() {
        let path = std::path::Path::new(&params.host).join(format!(".s.PGSQL.{}", params.port));
        let stream = std::os::unix::net::UnixStream::connect(&path)
            .with_context(|| format!("connecting to the unix socket {}", path.display()))?;
        return Ok(StdSocket::Unix(stream));
    }
    let addresses = std::net::ToSocketAddrs::to_socket_addrs(&(params.host.as_str(), params.port))
        .with_context(|| format!("resolving the host name {:?}", params.host))?;
    let mut last = None;
    for address in addresses {
        match tcp_connect(params, address) {
            Ok(stream) => return Ok(StdSocket::Tcp(stream)),
            Err(e) => {
                last = Some(anyhow::Error::new(e).context(format!("connecting to {address}")))
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        anyhow::anyhow!("the host name {:?} resolved to no address", params.host)
    }))
}

/// One TCP connection with the keepalives and `tcp_user_timeout` of `params` (pgmend's
/// defaults notice a dead peer in about a minute; the kernel's, in two hours).
fn tcp_connect(
    params: &ConnParams,
    address: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Protocol, SockRef, Type};
    let socket = socket2::Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.connect_timeout(
        &address.into(),
        params
            .connect_timeout
            .max(std::time::Duration::from_secs(1)),
    )?;
    let stream: std::net::TcpStream = socket.into();
    stream.set_nodelay(true)?;
    let sock = SockRef::from(&stream);
    if params.keepalives {
        // Zero leaves the system's value, as in libpq.
        let mut keepalive = socket2::TcpKeepalive::new();
        if !params.keepalives_idle.is_zero() {
            keepalive = keepalive.with_time(params.keepalives_idle);
        }
        if !params.keepalives_interval.is_zero() {
            keepalive = keepalive.with_interval(params.keepalives_interval);
        }
        if params.keepalives_count > 0 {
            keepalive = keepalive.with_retries(params.keepalives_count);
        }
        sock.set_tcp_keepalive(&keepalive)?;
    }
    if !params.tcp_user_timeout.is_zero() {
        sock.set_tcp_user_timeout(Some(params.tcp_user_timeout))?;
    }
    Ok(stream)
}

impl tokio::io::AsyncRead for Socket {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Socket {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Socket::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
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
