//! Connection parameters the way libpq users expect them: a URL or a `key=value` string,
//! with the `PG*` environment variables filling in whatever it leaves out, and a list of
//! hosts tried in order (libpq's since PostgreSQL 10) with the kind of server to accept.
//!
//! The `postgres` crate ignores the environment and knows only three `sslmode`s, so pgmend
//! parses both forms itself and sets the crate's `Config` field by field. The password is
//! kept out of every rendering of these parameters, and out of every parse error: a
//! malformed string can put (part of) a password where a key, a port, a host list or an
//! sslmode was expected, so an error repeats a piece of the string only when it cannot be one
//! (see `shown`), and otherwise says which parameter by name or by number.
//!
//! Connection parameters the way libpq users expect them, without a server: parses a URL or a
//! `key=value` string (pgmend's own parsers; the `postgres` crate ignores the environment and knows
//! three `sslmode`s), fills what is left out from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
//! `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGCONNECT_TIMEOUT`, `PGAPPNAME`, `PGOPTIONS`,
//! `PGPASSFILE`, `PGTARGETSESSIONATTRS`, then applies defaults (`application_name` `pgmend`,
//! `connect_timeout` 10s, `sslmode` `prefer`, `target_session_attrs` `any`, and keepalives that
//! notice a dead peer in about a minute: on, 30 s idle, 3 probes 10 s apart, `tcp_user_timeout`
//! 60000 ms). Several hosts are accepted as libpq accepts them, tried in order: in a URL
//! `postgresql://h1:5432,h2,[::1]:5433,%2Ftmp/db` (a host without a port takes `PGPORT` when that
//! names one port, else 5432), or `host=a,/tmp port=5432,5433` and `PGHOST`/`PGPORT` lists (one
//! port per host in order, or one for all; an empty host, or counts that do not pair, are
//! refused); the first host is `host`/`port`, the rest `other_hosts`, and `pinned_to` narrows the
//! parameters to the endpoint a run reached.
//! `target_session_attrs` takes libpq's six values; `keepalives`, `keepalives_idle`,
//! `keepalives_interval`, `keepalives_count` and `tcp_user_timeout` take whole numbers (0: the
//! system's default). When no password is given, `password_from_file` reads the password file as
//! libpq does (`passfile`, `PGPASSFILE`, else `$HOME/.pgpass`; `*` wildcards, `\` escapes, first
//! match; `localhost` also matches a unix socket; a file others can read is ignored with a
//! warning), for the first host, and `pinned_to` looks again for another. `resolve` takes the
//! environment as a function so it is tested without touching the process environment.
//! `environment_variables` lists every variable pgmend reads (the libpq ones, `DATABASE_URL`, the
//! migrations and repairs directories); the test harnesses, the kill campaign and the replica and
//! terminal tests clear exactly that list. `ConnParams`' `Display` and `Debug` leave the password
//! out, and parse errors never repeat the input: `shown` decides which piece of it a message may
//! quote (one that cannot be part of a password), `check_key` names an unknown key or its number
//! and suggests the known key it misspells (`closest_key`), and `looks_like_a_url` catches a URL
//! whose scheme lost its `://`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// libpq's `sslmode`, all six of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// `None` for anything else; the caller says what was wrong, without repeating a value
    /// that may not be safe to show.
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// libpq's `target_session_attrs`: which kind of server a connection must reach, the hosts
/// being tried in order until one is of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    PreferStandby,
}

impl TargetSessionAttrs {
    const ALL: [TargetSessionAttrs; 6] = [
        TargetSessionAttrs::Any,
        TargetSessionAttrs::ReadWrite,
        TargetSessionAttrs::ReadOnly,
        TargetSessionAttrs::Primary,
        TargetSessionAttrs::Standby,
        TargetSessionAttrs::PreferStandby,
    ];

    /// `None` for anything else, as [`SslMode::parse`].
    fn parse(value: &str) -> Option<TargetSessionAttrs> {
        Self::ALL.into_iter().find(|t| t.as_str() == value)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }
}

/// One server to try: a host name, an IP address or an absolute unix-socket directory, and its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

/// Everything needed to open a connection, resolved from the string and the environment.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnParams {
    /// The first server to try: a host name, an IP address, or an absolute directory holding
    /// the unix socket.
    pub host: String,
    /// The first server's port.
    pub port: u16,
    /// The rest of the host list, in the order libpq tries them; empty with one host.
    pub other_hosts: Vec<Endpoint>,
    /// Which kind of server the connection must reach (`any` unless given).
    pub target_session_attrs: TargetSessionAttrs,
    /// TCP keepalives on (libpq's `keepalives=1`, pgmend's default).
    pub keepalives: bool,
    /// Idle time before the first probe (default 30 s); `Duration::ZERO`: the system's default.
    pub keepalives_idle: Duration,
    /// Time between probes (default 10 s); `Duration::ZERO`: the system's default.
    pub keepalives_interval: Duration,
    /// Unanswered probes before the peer counts as dead (default 3); 0: the system's default.
    pub keepalives_count: u32,
    /// How long sent data may stay unacknowledged before the connection is dropped
    /// (`TCP_USER_TIMEOUT`, default 60 s); `Duration::ZERO`: the system's default.
    pub tcp_user_timeout: Duration,
    pub user: String,
    pub password: Option<String>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<String>,
    pub connect_timeout: Duration,
    pub application_name: String,
    pub options: Option<String>,
    /// The password file the password was looked up in, which [`ConnParams::pinned_to`] reads
    /// again for another endpoint: set when no password was given and the file could be used.
    pub password_file: Option<String>,
}

impl fmt::Debug for ConnParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnParams({self})")
    }
}

/// Renders the target without the password: `host=db.internal port=5432 dbname=coupons user=release`,
/// or with several hosts `host=h1,h2 port=5432,5433 dbname=coupons user=release`.
impl fmt::Display for ConnParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints = self.endpoints();
        let hosts: Vec<&str> = endpoints.iter().map(|e| e.host.as_str()).collect();
        let ports: Vec<String> = endpoints.iter().map(|e| e.port.to_string()).collect();
        write!(
            f,
            "host={} port={} dbname={} user={}",
            hosts.join(","),
            ports.join(","),
            self.dbname,
            self.user
        )
    }
}

impl ConnParams {
    /// Whether the first host is a unix-socket directory.
    pub fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
    }

    /// Every endpoint in the order libpq tries them: (host, port) first, then other_hosts.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let first = Endpoint {
            host: self.host.clone(),
            port: self.port,
        };
        std::iter::once(first)
            .chain(self.other_hosts.iter().cloned())
            .collect()
    }

    /// These parameters with only `endpoint` (other_hosts emptied): what every further
    /// connection of a run uses once the first one has reached a server. When the password came
    /// from the password file, it is looked up again for this endpoint (libpq matches the file
    /// per host; a file that can no longer be read gives no password); a password given
    /// explicitly stays.
    pub fn pinned_to(&self, endpoint: &Endpoint) -> ConnParams {
        let password = match &self.password_file {
            Some(path) => password_from_file(
                Some(path.clone()),
                &endpoint.host,
                endpoint.port,
                &self.dbname,
                &self.user,
            )
            .ok()
            .flatten()
            .and_then(|(password, _)| password),
            None => self.password.clone(),
        };
        ConnParams {
            host: endpoint.host.clone(),
            port: endpoint.port,
            other_hosts: Vec::new(),
            password,
            ..self.clone()
        }
    }
}

const KNOWN_KEYS: &[&str] = &[
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "application_name",
    "options",
    "passfile",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
];

/// The libpq environment variables pgmend honours, and the parameter each one stands for.
const ENV_KEYS: &[(&str, &str)] = &[
    ("PGHOST", "host"),
    ("PGPORT", "port"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGDATABASE", "dbname"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGAPPNAME", "application_name"),
    ("PGOPTIONS", "options"),
    ("PGPASSFILE", "passfile"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
];

/// Every environment variable that changes what pgmend connects to or reads: the libpq ones
/// above, `DATABASE_URL`, and the release, migrations and repairs directories. Test harnesses clear
/// them all, so that the caller's environment cannot leak into a run.
pub fn environment_variables() -> impl Iterator<Item = &'static str> {
    [
        "DATABASE_URL",
        "PGMEND_RELEASE",
        "PGMEND_MIGRATIONS_DIR",
        "PGMEND_REPAIRS_DIR",
        "PGMEND_SCHEMA",
        "PGMEND_POOLER",
        "PGMEND_PROGRESS",
        "PGMEND_JOBS",
    ]
    .into_iter()
    .chain(ENV_KEYS.iter().map(|(var, _)| *var))
}

/// The longest connect timeout pgmend takes (libpq's 0, "forever", included): a day.
pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 86_400;

/// Resolves a connection: `conninfo` (a URL or `key=value` string, possibly empty) first,
/// then the `PG*` variables from `env` for whatever it leaves out, then libpq's defaults
/// (except `application_name`, which defaults to `pgmend`, and the keepalives, which notice a
/// dead peer in about a minute).
pub fn resolve(conninfo: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<ConnParams> {
    let given = Given::read(conninfo, env)?;
    let mut endpoints = endpoints(&given, env)?.into_iter();
    let Endpoint { host, port } = endpoints.next().expect("at least one host");
    let user = match given.get("user") {
        Some(u) => u,
        None => match env("USER").or_else(|| env("LOGNAME")) {
            Some(u) => u,
            None if conninfo.is_none_or(|c| c.trim().is_empty())
                && ENV_KEYS.iter().all(|(var, _)| env(var).is_none()) =>
            {
                bail!("no database to connect to: neither --database-url nor DATABASE_URL nor any PG* variable is set. Point pgmend at the database: export DATABASE_URL='postgresql://USER@HOST:PORT/DBNAME' (or pass --database-url, or set PGHOST, PGPORT, PGUSER and PGDATABASE); see docs/connecting.md")
            }
            None => bail!("no database user given: set user in the URL (postgresql://USER@HOST/DBNAME) or PGUSER"),
        },
    };
    let dbname = given.get("dbname").unwrap_or_else(|| user.clone());
    let sslmode = given
        .parsed(
            "sslmode",
            SslMode::parse,
            "is not one of disable, allow, prefer, require, verify-ca, verify-full",
        )?
        .unwrap_or(SslMode::Prefer);
    let target_session_attrs = given
        .parsed(
            "target_session_attrs",
            TargetSessionAttrs::parse,
            &format!(
                "is not one of {}",
                TargetSessionAttrs::ALL
                    .map(TargetSessionAttrs::as_str)
                    .join(", ")
            ),
        )?
        .unwrap_or(TargetSessionAttrs::Any);
    let connect_timeout = given
        .parsed(
            "connect_timeout",
            |t| t.parse::<u64>().ok(),
            "is not a whole number of seconds",
        )?
        // libpq: 0 means wait forever. pgmend never waits forever; a day at most.
        .map(|seconds| match seconds {
            0 => MAX_CONNECT_TIMEOUT_SECS,
            s => s.clamp(2, MAX_CONNECT_TIMEOUT_SECS),
        })
        .map_or(Duration::from_secs(10), Duration::from_secs);
    let keepalive = Keepalive::read(&given)?;
    let (password, password_file) = match given.get("password") {
        Some(p) => (Some(p), None),
        None => match password_from_file(
            given
                .get("passfile")
                .or_else(|| env("HOME").map(|h| format!("{h}/.pgpass"))),
            &host,
            port,
            &dbname,
            &user,
        )? {
            Some((password, file)) => (password, Some(file)),
            None => (None, None),
        },
    };
    Ok(ConnParams {
        host,
        port,
        other_hosts: endpoints.collect(),
        target_session_attrs,
        keepalives: keepalive.on,
        keepalives_idle: keepalive.idle,
        keepalives_interval: keepalive.interval,
        keepalives_count: keepalive.count,
        tcp_user_timeout: keepalive.user_timeout,
        password,
        user,
        dbname,
        sslmode,
        sslrootcert: given.get("sslrootcert"),
        connect_timeout,
        application_name: given
            .get("application_name")
            .unwrap_or_else(|| "pgmend".to_string()),
        options: given.get("options"),
        password_file,
    })
}

/// The parameters as given, by key: from the connection string, else from the `PG*`
/// variables, with the variable each of those came from.
struct Given {
    values: BTreeMap<String, String>,
    /// A value from a variable is safe to repeat in a message (none but PGPASSWORD holds a
    /// password, and it is never repeated).
    from_env: BTreeMap<&'static str, &'static str>,
}

impl Given {
    fn read(conninfo: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Given> {
        let mut values = match conninfo.map(str::trim) {
            None | Some("") => BTreeMap::new(),
            Some(s) if s.starts_with("postgres://") || s.starts_with("postgresql://") => {
                parse_url(s).context("the connection URL is malformed (it is not repeated here because it may hold a password); expected postgresql://user@host:port/dbname?sslmode=...")?
            }
            Some(s) if looks_like_a_url(s) => bail!(
                "the connection string looks like a URL but does not start with postgresql:// or postgres:// (it is not repeated here because it may hold a password); check the scheme's colon and two slashes: postgresql://user@host:port/dbname?sslmode=..."
            ),
            Some(s) => parse_keyword_value(s)
                .context("the connection string is malformed (it is not repeated here because it may hold a password); expected key=value pairs such as \"host=db port=5432 dbname=app\"")?,
        };
        let mut from_env = BTreeMap::new();
        for (var, key) in ENV_KEYS {
            if !values.contains_key(*key) {
                if let Some(value) = env(var).filter(|v| !v.is_empty()) {
                    values.insert((*key).to_string(), value);
                    from_env.insert(*key, *var);
                }
            }
        }
        // A NUL cannot travel in the startup packet; say so here rather than fail obscurely.
        // (The value is not repeated: it may be the password.)
        if let Some((key, _)) = values.iter().find(|(_, v)| v.contains('\0')) {
            bail!("the value of {key} contains a NUL character; remove it");
        }
        Ok(Given { values, from_env })
    }

    fn get(&self, key: &str) -> Option<String> {
        self.values.get(key).cloned()
    }

    /// How a bad value is named in a message: `port "x"` when it is safe to repeat (with
    /// ` (from PGPORT)` when a variable gave it), else `the port in the connection string`.
    fn named(&self, key: &str, value: &str) -> String {
        match self.from_env.get(key) {
            Some(var) if *var != "PGPASSWORD" => format!("{key} {value:?} (from {var})"),
            _ => match shown(value, self.values.get("password").map(String::as_str)) {
                Some(value) => format!("{key} {value}"),
                None => format!("the {key} in the connection string"),
            },
        }
    }

    /// ` (from PGHOST)` when a variable gave `key`, else nothing.
    fn source(&self, key: &str) -> String {
        self.from_env
            .get(key)
            .map_or(String::new(), |var| format!(" (from {var})"))
    }

    /// The value of `key` read by `parse`, or `None` when not given; a value `parse` refuses
    /// is named in an error that ends with `refused` ("is not one of ...").
    fn parsed<T>(
        &self,
        key: &str,
        parse: impl Fn(&str) -> Option<T>,
        refused: &str,
    ) -> Result<Option<T>> {
        self.values
            .get(key)
            .map(|value| {
                parse(value).with_context(|| format!("{} {refused}", self.named(key, value)))
            })
            .transpose()
    }
}

/// The host list paired with the port list as libpq pairs them: one port per host in order,
/// or one port for them all. An empty element of the port list (a URL's host without a port)
/// is the default port: `PGPORT` when it names one port, else 5432.
fn endpoints(given: &Given, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Endpoint>> {
    let hosts = host_list(given)?;
    let ports = match given.get("port") {
        Some(list) => port_list(given, &list)?,
        None => vec![None],
    };
    let ports = match ports.len() {
        1 => vec![ports[0]; hosts.len()],
        n if n == hosts.len() => ports,
        n => bail!(
            "{}{} but {}{}: give one port per host, in the same order, or one port for them all (host=a,b port=5432,5433 or port=5432)",
            counted(hosts.len(), "host"),
            given.source("host"),
            counted(n, "port"),
            given.source("port"),
        ),
    };
    let default_port = env("PGPORT").and_then(|p| port_number(&p)).unwrap_or(5432);
    Ok(hosts
        .into_iter()
        .zip(ports)
        .map(|(host, port)| Endpoint {
            host,
            port: port.unwrap_or(default_port),
        })
        .collect())
}

/// `host=a,b,c` (or `PGHOST`) split on its commas; the default host when none is given.
fn host_list(given: &Given) -> Result<Vec<String>> {
    let Some(list) = given.get("host").filter(|h| !h.is_empty()) else {
        return Ok(vec![default_host()]);
    };
    let hosts: Vec<String> = list.split(',').map(str::to_string).collect();
    if let Some(i) = hosts.iter().position(String::is_empty) {
        bail!(
            "host number {} of the {} in the host list{} is empty; separate hosts with single commas: host=a,b (in a URL, postgresql://a:5432,b:5433/dbname)",
            i + 1,
            hosts.len(),
            given.source("host"),
        );
    }
    Ok(hosts)
}

/// `port=5432,5433` (or `PGPORT`) split on its commas, an empty element `None` (the default).
fn port_list(given: &Given, list: &str) -> Result<Vec<Option<u16>>> {
    let ports: Vec<&str> = list.split(',').collect();
    let which = |i: usize| match ports.len() {
        1 => String::new(),
        n => format!(" (number {} of the {n} in the port list)", i + 1),
    };
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if p.is_empty() {
                return Ok(None);
            }
            port_number(p).map(Some).with_context(|| {
                format!(
                    "{}{} is not a number between 1 and 65535",
                    given.named("port", p),
                    which(i)
                )
            })
        })
        .collect()
}

/// A port: digits only, 1 to 65535.
fn port_number(p: &str) -> Option<u16> {
    p.parse::<u16>()
        .ok()
        .filter(|n| *n != 0 && p.chars().all(|c| c.is_ascii_digit()))
}

/// `1 host`, `3 ports`.
fn counted(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// libpq's keepalive keys, with pgmend's defaults: a peer that vanished (a failover, a cut
/// cable) is noticed in about a minute rather than after the system's two hours.
struct Keepalive {
    on: bool,
    idle: Duration,
    interval: Duration,
    count: u32,
    user_timeout: Duration,
}

impl Keepalive {
    fn read(given: &Given) -> Result<Keepalive> {
        let whole = |key: &str, unit: &str, max: u32, default: u32| -> Result<u32> {
            let refused = format!("is not a whole number{unit} between 0 and {max}");
            let number = |v: &str| {
                v.parse::<u32>()
                    .ok()
                    .filter(|n| *n <= max && v.chars().all(|c| c.is_ascii_digit()))
            };
            Ok(given.parsed(key, number, &refused)?.unwrap_or(default))
        };
        let on_off = |v: &str| match v {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        };
        let (secs, ms) = (" of seconds", " of milliseconds");
        Ok(Keepalive {
            on: given
                .parsed("keepalives", on_off, "is not 1 (on) or 0 (off)")?
                .unwrap_or(true),
            idle: Duration::from_secs(
                whole("keepalives_idle", secs, MAX_KEEPALIVE_SECS, 30)?.into(),
            ),
            interval: Duration::from_secs(
                whole("keepalives_interval", secs, MAX_KEEPALIVE_SECS, 10)?.into(),
            ),
            count: whole("keepalives_count", "", MAX_KEEPALIVE_COUNT, 3)?,
            user_timeout: Duration::from_millis(
                whole("tcp_user_timeout", ms, MAX_TCP_USER_TIMEOUT_MS, 60_000)?.into(),
            ),
        })
    }
}

/// Linux's limits on `TCP_KEEPIDLE` and `TCP_KEEPINTVL` (seconds) and `TCP_KEEPCNT`, and
/// libpq's `int` for `tcp_user_timeout` (milliseconds): a larger value is refused while
/// parsing, with the key named, rather than by the socket later.
const MAX_KEEPALIVE_SECS: u32 = 32_767;
const MAX_KEEPALIVE_COUNT: u32 = 127;
const MAX_TCP_USER_TIMEOUT_MS: u32 = 2_147_483_647;

/// The password file, as libpq reads it (`passfile`, `PGPASSFILE`, else `~/.pgpass`): lines of
/// `host:port:database:user:password`, `*` matching anything, `\:` and `\\` escaped, `#`
/// comments; the first line that matches wins. `localhost` also matches a unix socket. A file
/// that group or others can read is ignored with a warning, as libpq does. A missing file is
/// no error; an unreadable one is (it was meant to be used). `None` when the file was not
/// used; else the password found, if any, and the file's path.
fn password_from_file(
    path: Option<String>,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Result<Option<(Option<String>, String)>> {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = path else { return Ok(None) };
    let meta = match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => m,
        _ => return Ok(None),
    };
    if meta.permissions().mode() & 0o077 != 0 {
        crate::say!(
            "warning: password file {path} has group or world access and is ignored; run chmod 600 {path}"
        );
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the password file {path}"))?;
    let port = port.to_string();
    let socket = host.starts_with('/');
    let password = text
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(split_passfile_line)
        .find_map(|fields| {
            let [h, p, d, u, password] = fields.as_slice() else {
                return None;
            };
            let matches = |field: &str, value: &str| field == "*" || field == value;
            ((matches(h, host) || (socket && h == "localhost"))
                && matches(p, &port)
                && matches(d, dbname)
                && matches(u, user))
            .then(|| password.clone())
        });
    Ok(Some((password, path)))
}

/// Splits a password-file line on its unescaped colons, the last field taking the rest.
fn split_passfile_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().expect("one field").push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

fn default_host() -> String {
    ["/var/run/postgresql", "/tmp"]
        .iter()
        .find(|dir| std::path::Path::new(dir).is_dir())
        .map(|dir| dir.to_string())
        .unwrap_or_else(|| "localhost".to_string())
}

/// A piece of the connection string, quoted for a message, or `None` when it could be (part
/// of) a password: only short pieces made of the characters of a key, an sslmode or a number
/// (lower case, digits, `_`, `-`, `.`), and none that overlaps the password given.
fn shown(piece: &str, password: Option<&str>) -> Option<String> {
    let plain = !piece.is_empty()
        && piece.len() <= 32
        && piece
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c));
    // A piece of three characters or more that the password holds, or one that holds it.
    let overlaps = password
        .filter(|p| !p.is_empty())
        .is_some_and(|p| (piece.len() >= 3 && p.contains(piece)) || piece.contains(p));
    (plain && !overlaps).then(|| format!("{piece:?}"))
}

/// The known key `key` is most likely a misspelling of: one or two letters away.
fn closest_key(key: &str) -> Option<&'static str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut previous = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let substitute = previous + usize::from(ca != *cb);
                previous = row[j + 1];
                row[j + 1] = substitute.min(row[j] + 1).min(previous + 1);
            }
        }
        row[b.len()]
    }
    let lower = key.to_ascii_lowercase();
    KNOWN_KEYS
        .iter()
        .map(|k| (distance(&lower, k), *k))
        .filter(|(d, k)| *d <= 2 && *d < k.len() / 2 + 1)
        .min()
        .map(|(_, k)| k)
}

/// A string that is meant as a URL but lacks the scheme's `://`: `postgresql//u:pw@h/db`,
/// `postgresql:/...`, `jdbc:postgresql://...`. Its first word has a ':', '/' or '@' before
/// any '=', which no `key=value` pair has.
fn looks_like_a_url(s: &str) -> bool {
    let first = s.split_whitespace().next().unwrap_or("");
    first
        .find([':', '/', '@', '='])
        .is_some_and(|i| first.as_bytes()[i] != b'=')
}

/// Refuses an unknown key. It is named only when [`shown`] allows (given the `password`
/// read so far) and it does not follow `after` (the pair before it when that may have run
/// into it: a password with a space, or a value whose closing quote the key is glued to); the
/// known key it most likely misspells is suggested.
fn check_key(key: &str, number: usize, after: Option<&str>, password: Option<&str>) -> Result<()> {
    if KNOWN_KEYS.contains(&key) {
        return Ok(());
    }
    let which = match (after, shown(key, password)) {
        (Some(before), _) => format!("the parameter after {before} is not a known key"),
        (None, Some(key)) => format!("unknown connection parameter {key}"),
        (None, None) => format!("parameter number {number} is not a known key"),
    };
    let hint = closest_key(key).map_or(String::new(), |k| format!(" (did you mean {k}?)"));
    let quoting = match after {
        Some(before) => format!(" If it is the rest of the value of {before} instead, quote that value ({before}='...', a quote inside it written \\') or, in a URL, percent-encode it (%20 for a space, %26 for '&')."),
        None => String::new(),
    };
    bail!(
        "{which}{hint}.{quoting} pgmend understands {}",
        KNOWN_KEYS.join(", ")
    )
}

/// Percent-decodes one part of a URL; a '%' must start a %XX escape, as libpq requires.
fn decode(part: &str, what: &str) -> Result<String> {
    let bytes = part.as_bytes();
    let bad_escape = bytes.iter().enumerate().any(|(i, b)| {
        *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if bad_escape {
        bail!("{what} has a '%' that does not start a %XX escape (a '%' itself is written %25)");
    }
    percent_encoding::percent_decode_str(part)
        .decode_utf8()
        .map(|c| c.into_owned())
        // (Not the decoder's error: it gives the offset into what may be the password.)
        .map_err(|_| anyhow::anyhow!("{what} decodes to bytes that are not valid UTF-8"))
}

/// Parses `postgresql://[user[:password]@][host[:port][,host[:port]...]][/dbname][?key=value&...]`.
/// A host may be a percent-encoded socket directory (`%2Fvar%2Frun%2Fpostgresql`).
fn parse_url(s: &str) -> Result<BTreeMap<String, String>> {
    let rest = s.split_once("://").map(|(_, r)| r).unwrap_or(s);
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    // `postgresql://u:pa/ss@host/db` or `u:p@ss/word@host/db`: a '/' or '?' in the
    // password ends the authority early, and the rest of the password would be read as the
    // host, port or path, then shown in messages. An '@' after the authority is that
    // mistake far more often than a database name holding '@': refuse it as a whole.
    if path.is_some_and(|p| p.contains('@')) || query.is_some_and(|q| q.contains('@')) {
        bail!("an '@' comes after the host: if the user name or password holds '/', '?', '#' or '@', percent-encode them (%2F, %3F, %23, %40); an '@' in the database name or a parameter is written %40");
    }
    let mut out = BTreeMap::new();
    let hostports = match authority.rsplit_once('@') {
        Some((userinfo, hostports)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                out.insert("user".into(), decode(user, "the user name")?);
            }
            if let Some(p) = password {
                out.insert("password".into(), decode(p, "the password")?);
            }
            hostports
        }
        None => authority,
    };
    url_hosts(hostports, authority.contains('@'), &mut out)?;
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        out.insert("dbname".into(), decode(db, "the database name")?);
    }
    let mut after_password = false;
    for (n, pair) in query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        // Not repeated: after `password=a&b`, the pair is the rest of the password.
        let (k, v) = pair.split_once('=').with_context(|| {
            format!(
                "URL parameter number {} has no '=' (expected ?key=value&key=value; an '&' inside a value is written %26)",
                n + 1
            )
        })?;
        let key = decode(k, &format!("the key of URL parameter number {}", n + 1))?;
        // After `password=a&b=c`, "b" may be the rest of the password: never repeat it.
        check_key(
            &key,
            n + 1,
            after_password.then_some("password"),
            out.get("password").map(String::as_str),
        )?;
        after_password = key == "password";
        let what = format!("the value of {key}");
        out.insert(key, decode(&v.replace('+', " "), &what)?);
    }
    Ok(out)
}

/// The URL's `host[:port],host[:port],...` into the `host` and `port` lists libpq keeps: each
/// host percent-decoded, a host without a port an empty element of the port list (the default
/// port). `after_at`: whether an '@' came before; without one, `user:password` reads as
/// `host:port`, and such a "port" is never repeated.
fn url_hosts(hostports: &str, after_at: bool, out: &mut BTreeMap<String, String>) -> Result<()> {
    let elements: Vec<&str> = hostports.split(',').collect();
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    for (i, element) in elements.iter().enumerate() {
        let what = match elements.len() {
            1 => "the host".to_string(),
            n => format!("host number {} of the {n} in the URL", i + 1),
        };
        let (host, port) = split_host_port(element)?;
        if host.is_empty() && elements.len() > 1 {
            bail!("{what} is empty; separate hosts with single commas: postgresql://user@host1:5432,host2:5433/dbname");
        }
        let port = port.unwrap_or("");
        if !after_at && !port.is_empty() && port_number(port).is_none() {
            bail!("the port after the host is not a number between 1 and 65535; if this is user:password, an '@' and the host must follow it: postgresql://user:password@host/dbname");
        }
        let host = decode(host, &what)?;
        if host.contains(',') {
            bail!("{what} decodes to a name holding a ',' (%2C): hosts are separated by a plain ',' and none may hold one");
        }
        hosts.push(host);
        ports.push(port);
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        out.insert("host".into(), hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        out.insert("port".into(), ports.join(","));
    }
    Ok(())
}

/// `host[:port]` or `[ipv6][:port]`, still percent-encoded; the port `None` when absent.
fn split_host_port(element: &str) -> Result<(&str, Option<&str>)> {
    let Some(bracketed) = element.strip_prefix('[') else {
        return Ok(match element.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (element, None),
        });
    };
    let (host, after) = bracketed
        .split_once(']')
        .context("an IPv6 host is missing its closing ']'")?;
    let port = match after {
        "" => None,
        _ => Some(after.strip_prefix(':').context(
            "an IPv6 host's closing ']' is followed by something other than :port or a ','",
        )?),
    };
    Ok((host, port))
}

/// Parses libpq's `key = value` form; values may be single-quoted with `\'` and `\\`.
fn parse_keyword_value(s: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    // The key of the pair before, when the next "key" may be the rest of its value (a
    // password with a space in it): that "key" is never repeated.
    let mut previous: Option<String> = None;
    for number in 1.. {
        let mut spaced = number == 1;
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
            spaced = true;
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        // A key glued to the closing quote of the value before it is the rest of that value.
        let after = previous
            .take()
            .filter(|before| before == "password" || !spaced);
        if chars.next() != Some('=') {
            let which = if KNOWN_KEYS.contains(&key.as_str()) {
                key.clone()
            } else {
                format!("parameter number {number}")
            };
            let hint = match &after {
                Some(before) => format!("; if it is the rest of the value of {before}, quote that value: {before}='...' (a quote inside it written \\')"),
                None => String::new(),
            };
            bail!("{which} is missing its '=' (expected key=value){hint}");
        }
        check_key(
            &key,
            number,
            after.as_deref(),
            out.get("password").map(String::as_str),
        )?;
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.push(chars.next().context("a backslash ends the string")?),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => bail!("the quoted value of {key} has no closing quote (a quote inside it is written \\')"),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().context("a backslash ends the string")?);
                } else {
                    value.push(c);
                }
            }
        }
        previous = Some(key.clone());
        out.insert(key, value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// Resolves `conninfo` with PGPASSFILE pointing at a file holding `lines` with `mode`.
    fn with_passfile(conninfo: &str, lines: &str, mode: u32) -> Option<String> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, lines).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let file = path.display().to_string();
        let env = move |k: &str| (k == "PGPASSFILE").then(|| file.clone());
        resolve(Some(conninfo), &env).unwrap().password
    }

    #[test]
    fn the_password_file_is_read_like_libpq_reads_it() {
        let url = "postgresql://app@db.internal:5433/coupons";
        let file = "# comment\n\
                    other:5433:coupons:app:wrong-host\n\
                    db.internal:5432:coupons:app:wrong-port\n\
                    db.internal:5433:*:app:pa\\:ss\\\\word\n\
                    *:*:*:*:too-late\n";
        assert_eq!(
            with_passfile(url, file, 0o600).as_deref(),
            Some("pa:ss\\word")
        );
        assert_eq!(
            with_passfile(url, "*:*:*:*:any\n", 0o600).as_deref(),
            Some("any")
        );
        assert_eq!(with_passfile(url, "*:*:*:other:x\n", 0o600), None);
        // Group or world access: ignored, as libpq does.
        assert_eq!(with_passfile(url, "*:*:*:*:any\n", 0o644), None);
        // A password in the URL wins over the file.
        assert_eq!(
            with_passfile("postgresql://app:given@db/coupons", "*:*:*:*:file\n", 0o600).as_deref(),
            Some("given")
        );
        // localhost also matches a unix socket.
        assert_eq!(
            with_passfile(
                "host=/var/run/postgresql user=app dbname=x",
                "localhost:5432:x:app:sock\n",
                0o600
            )
            .as_deref(),
            Some("sock")
        );
        // No file: no password, no error.
        let env = |k: &str| (k == "PGPASSFILE").then(|| "/nonexistent/pgpass".to_string());
        assert_eq!(resolve(Some(url), &env).unwrap().password, None);
    }

    fn with_env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn url_with_everything() {
        let p = resolve(
            Some("postgresql://rel%40ops:s3cr%3At@db.internal:6543/coupons?sslmode=verify-full&application_name=rel"),
            &no_env,
        )
        .unwrap();
        assert_eq!(p.user, "rel@ops");
        assert_eq!(p.password.as_deref(), Some("s3cr:t"));
        assert_eq!(
            (p.host.as_str(), p.port, p.dbname.as_str()),
            ("db.internal", 6543, "coupons")
        );
        assert_eq!(p.sslmode, SslMode::VerifyFull);
        assert_eq!(p.application_name, "rel");
    }

    #[test]
    fn url_with_socket_directory_and_ipv6() {
        let p = resolve(
            Some("postgres://u@%2Fvar%2Frun%2Fpostgresql:5433/d"),
            &no_env,
        )
        .unwrap();
        assert!(p.is_unix_socket());
        assert_eq!((p.host.as_str(), p.port), ("/var/run/postgresql", 5433));
        let p = resolve(Some("postgres://u@[::1]:7/d"), &no_env).unwrap();
        assert_eq!((p.host.as_str(), p.port), ("::1", 7));
    }

    #[test]
    fn keyword_value_with_quotes() {
        let p = resolve(
            Some("host=/tmp port=5499 user=u password='it''s' dbname = 'my db' sslmode=disable"),
            &no_env,
        );
        // libpq escapes a quote with a backslash, not by doubling it.
        assert!(p.is_err());
        let p = resolve(
            Some(r"host=/tmp port=5499 user=u password='it\'s' dbname = 'my db' sslmode=disable"),
            &no_env,
        )
        .unwrap();
        assert_eq!(p.password.as_deref(), Some("it's"));
        assert_eq!(p.dbname, "my db");
        assert_eq!(p.sslmode, SslMode::Disable);
    }

    #[test]
    fn environment_fills_what_the_string_leaves_out() {
        let env = with_env(&[
            ("PGHOST", "envhost"),
            ("PGPORT", "6000"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpw"),
            ("PGAPPNAME", "nightly"),
            ("PGSSLMODE", "require"),
            ("PGCONNECT_TIMEOUT", "3"),
        ]);
        let p = resolve(Some("postgresql://urluser@urlhost/db"), &env).unwrap();
        assert_eq!((p.host.as_str(), p.user.as_str()), ("urlhost", "urluser"));
        assert_eq!(p.port, 6000);
        assert_eq!(p.password.as_deref(), Some("envpw"));
        assert_eq!(p.application_name, "nightly");
        assert_eq!(p.sslmode, SslMode::Require);
        assert_eq!(p.connect_timeout, Duration::from_secs(3));
        let p = resolve(None, &env).unwrap();
        assert_eq!((p.host.as_str(), p.dbname.as_str()), ("envhost", "envuser"));
    }

    #[test]
    fn application_name_defaults_to_pgmend() {
        let p = resolve(Some("host=h user=u"), &no_env).unwrap();
        assert_eq!(p.application_name, "pgmend");
    }

    #[test]
    fn errors_and_renderings_never_show_the_password() {
        for bad in [
            "postgresql://u:hunter2@h:notaport/d",
            "postgresql://u:hunter2@h/d?sslmode=bogus",
            "postgresql://u:hunter2@h/d?password",
            "user=u password=hunter2 bogus=1",
            "user=u password='hunter2",
            // The scheme's colon missing: not a URL to pgmend, nor a key=value string.
            "postgresql//u:hunter2@h/x",
            "postgresql:/u:hunter2@h/x",
            "jdbc:postgresql://h/x?password=hunter2",
            // Without '@', user:password reads as host:port.
            "postgresql://u:hunter2/x",
            "postgresql://u:2718281/x",
            "postgresql://u:hunter2@h/x?sslmode=hunter2",
            "postgresql://u:hun%zzter2@h/x",
            "postgresql://u:hun%fftr2@h/x",
            "postgresql://u@h/x?password=hun&ter2=1",
            "host=h password=hun ter2=x",
            "host=h password=hunter2 sslmode=hunter2",
            "host=h password=hunter2 port=hunter2",
            "host=h password='hun'ter2 x=1",
            "host=h password='hun'ter2",
            // The password itself as a key, later on.
            "host=h password=hunter2 port=1 hunter2=x",
            "postgresql://u:hunter2@h/d?sslmode=disable&hunter2=x",
        ] {
            let err = resolve(Some(bad), &no_env).unwrap_err();
            let text = format!("{err:#} {err:?}");
            assert!(!text.contains("hunter2"), "{bad}: {text}");
        }
        let p = resolve(Some("postgresql://u:hunter2@h/d"), &no_env).unwrap();
        assert!(!format!("{p} {p:?}").contains("hunter2"));
    }

    #[test]
    fn a_misspelt_key_is_named_and_the_likely_key_suggested() {
        let err = |s: &str| format!("{:#}", resolve(Some(s), &no_env).unwrap_err());
        let e = err("host=h passwort=x");
        assert!(
            e.contains("unknown connection parameter \"passwort\" (did you mean password?)"),
            "{e}"
        );
        // After a password the key may be the rest of it: not repeated, but the likely
        // misspelling comes first.
        let e = err("host=h password=x dbnme=y");
        assert!(
            e.contains("the parameter after password is not a known key (did you mean dbname?)")
                && !e.contains("dbnme"),
            "{e}"
        );
        let e = err("host=h Q7X2=y");
        assert!(e.contains("parameter number 2 is not a known key"), "{e}");
        assert_eq!(closest_key("sslmod"), Some("sslmode"));
        assert_eq!(closest_key("prot"), Some("port"));
        assert_eq!(closest_key("timeout"), None);
        assert_eq!(closest_key("ab"), None);
    }

    fn endpoint(host: &str, port: u16) -> Endpoint {
        Endpoint {
            host: host.to_string(),
            port,
        }
    }

    fn error(conninfo: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
        format!("{:#}", resolve(Some(conninfo), env).unwrap_err())
    }

    #[test]
    fn a_url_names_several_hosts_each_with_its_port_or_the_default() {
        let url = "postgresql://u:pw@h1:5433,h2,[::1]:5434,%2Ftmp%2Fsock/db?target_session_attrs=read-write";
        let p = resolve(Some(url), &no_env).unwrap();
        assert_eq!((p.host.as_str(), p.port), ("h1", 5433));
        assert_eq!(
            p.other_hosts,
            [
                endpoint("h2", 5432),
                endpoint("::1", 5434),
                endpoint("/tmp/sock", 5432)
            ]
        );
        assert_eq!(p.endpoints()[0], endpoint("h1", 5433));
        assert_eq!(p.endpoints().len(), 4);
        assert!(!p.is_unix_socket());
        assert_eq!(p.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(
            p.to_string(),
            "host=h1,h2,::1,/tmp/sock port=5433,5432,5434,5432 dbname=db user=u"
        );
        // A host without a port takes PGPORT when it names one port.
        let p = resolve(Some(url), &with_env(&[("PGPORT", "6000")])).unwrap();
        assert_eq!(p.other_hosts[0], endpoint("h2", 6000));
        assert_eq!(p.other_hosts[2], endpoint("/tmp/sock", 6000));
        // The first host a socket directory; no port at all: every host on the default.
        let p = resolve(
            Some("postgres://u@%2Fvar%2Frun%2Fpostgresql,db2/d"),
            &no_env,
        )
        .unwrap();
        assert!(p.is_unix_socket());
        assert_eq!(
            p.endpoints(),
            [endpoint("/var/run/postgresql", 5432), endpoint("db2", 5432)]
        );
        // One host: as before, nothing else to try, and the same rendering.
        let p = resolve(Some("postgresql://u@db:5433/d"), &no_env).unwrap();
        assert!(p.other_hosts.is_empty());
        assert_eq!(p.endpoints(), [endpoint("db", 5433)]);
        assert_eq!(p.to_string(), "host=db port=5433 dbname=d user=u");
    }

    #[test]
    fn key_value_hosts_pair_with_their_ports_by_position_or_share_one() {
        let p = resolve(Some("host=a,b,c port=5432,5433,5434 user=u"), &no_env).unwrap();
        assert_eq!(
            p.endpoints(),
            [
                endpoint("a", 5432),
                endpoint("b", 5433),
                endpoint("c", 5434)
            ]
        );
        assert_eq!(
            p.to_string(),
            "host=a,b,c port=5432,5433,5434 dbname=u user=u"
        );
        let p = resolve(Some("host=a,/var/run/postgresql port=6000 user=u"), &no_env).unwrap();
        assert_eq!(
            p.endpoints(),
            [endpoint("a", 6000), endpoint("/var/run/postgresql", 6000)]
        );
        // No port at all: 5432 for every host; an empty element: the default, as libpq.
        let p = resolve(Some("host=a,b user=u"), &no_env).unwrap();
        assert_eq!(p.endpoints(), [endpoint("a", 5432), endpoint("b", 5432)]);
        let p = resolve(Some("host=a,b port=,5433 user=u"), &no_env).unwrap();
        assert_eq!(p.endpoints(), [endpoint("a", 5432), endpoint("b", 5433)]);
    }

    #[test]
    fn pghost_and_pgport_may_be_lists() {
        let env = with_env(&[("PGHOST", "a,b"), ("PGPORT", "5433,5434"), ("PGUSER", "u")]);
        let p = resolve(None, &env).unwrap();
        assert_eq!(p.endpoints(), [endpoint("a", 5433), endpoint("b", 5434)]);
        let env = with_env(&[("PGHOST", "a,/tmp"), ("PGPORT", "6000"), ("PGUSER", "u")]);
        let p = resolve(None, &env).unwrap();
        assert_eq!(p.endpoints(), [endpoint("a", 6000), endpoint("/tmp", 6000)]);
        // The string's hosts replace PGHOST's; PGPORT's list must then pair with them.
        let env = with_env(&[("PGHOST", "a,b"), ("PGPORT", "5433,5434")]);
        let p = resolve(Some("host=x,y user=u"), &env).unwrap();
        assert_eq!(p.endpoints(), [endpoint("x", 5433), endpoint("y", 5434)]);
        let e = error("host=x user=u", &env);
        assert!(
            e.contains("1 host but 2 ports (from PGPORT): give one port per host"),
            "{e}"
        );
    }

    #[test]
    fn a_host_list_that_is_malformed_or_does_not_pair_is_refused_clearly() {
        for (conninfo, expect) in [
            ("host=a,b,c port=1,2 user=u", "3 hosts but 2 ports: give one port per host, in the same order, or one port for them all"),
            ("host=a port=1,2 user=u", "1 host but 2 ports"),
            ("host=a,,b user=u", "host number 2 of the 3 in the host list is empty"),
            ("host=a,b, user=u", "host number 3 of the 3 in the host list is empty"),
            ("host=,a user=u", "host number 1 of the 2 in the host list is empty"),
            ("host=a,b port=5432,x5 user=u", "port \"x5\" (number 2 of the 2 in the port list) is not a number between 1 and 65535"),
            ("host=a,b port=5432,0 user=u", "port \"0\" (number 2 of the 2 in the port list)"),
            ("postgresql://u@h1,,h2/d", "host number 2 of the 3 in the URL is empty"),
            ("postgresql://u@h1:5432,/d", "host number 2 of the 2 in the URL is empty"),
            ("postgresql://u@h1,:5433/d", "host number 2 of the 2 in the URL is empty"),
            ("postgresql://u@h1:5432,h2:abc/d", "port \"abc\" (number 2 of the 2 in the port list) is not a number"),
            ("postgresql://u@h1,[::1/d", "an IPv6 host is missing its closing ']'"),
            ("postgresql://u@h1,[::1]x/d", "closing ']' is followed by something other than :port"),
            ("postgresql://u@h1,h%2Cx/d", "host number 2 of the 2 in the URL decodes to a name holding a ','"),
            ("postgresql://u@h1,h%zz/d", "host number 2 of the 2 in the URL has a '%'"),
        ] {
            let e = error(conninfo, &no_env);
            assert!(e.contains(expect), "{conninfo}: expected {expect:?} in {e}");
        }
        let env = with_env(&[("PGHOST", "a,b"), ("PGPORT", "1,2,3"), ("PGUSER", "u")]);
        let e = error("", &env);
        assert!(
            e.contains("2 hosts (from PGHOST) but 3 ports (from PGPORT)"),
            "{e}"
        );
        let env = with_env(&[("PGHOST", "a,,b"), ("PGUSER", "u")]);
        let e = error("", &env);
        assert!(
            e.contains("host number 2 of the 3 in the host list (from PGHOST) is empty"),
            "{e}"
        );
        let env = with_env(&[("PGPORT", "5432,x"), ("PGUSER", "u")]);
        let e = error("host=a,b", &env);
        assert!(
            e.contains("port \"x\" (from PGPORT) (number 2 of the 2"),
            "{e}"
        );
    }

    #[test]
    fn target_session_attrs_in_either_form_or_from_the_environment() {
        let p = resolve(Some("host=h user=u"), &no_env).unwrap();
        assert_eq!(p.target_session_attrs, TargetSessionAttrs::Any);
        for t in TargetSessionAttrs::ALL {
            let url = format!("postgresql://u@h1,h2/d?target_session_attrs={}", t.as_str());
            assert_eq!(
                resolve(Some(&url), &no_env).unwrap().target_session_attrs,
                t
            );
            let kv = format!("host=h user=u target_session_attrs={}", t.as_str());
            assert_eq!(resolve(Some(&kv), &no_env).unwrap().target_session_attrs, t);
        }
        let env = with_env(&[("PGTARGETSESSIONATTRS", "prefer-standby")]);
        let p = resolve(Some("host=h user=u"), &env).unwrap();
        assert_eq!(p.target_session_attrs, TargetSessionAttrs::PreferStandby);
        let p = resolve(Some("host=h user=u target_session_attrs=primary"), &env).unwrap();
        assert_eq!(p.target_session_attrs, TargetSessionAttrs::Primary);
        assert!(environment_variables().any(|v| v == "PGTARGETSESSIONATTRS"));

        let accepted = "is not one of any, read-write, read-only, primary, standby, prefer-standby";
        let e = error("host=h user=u target_session_attrs=master", &no_env);
        assert!(
            e.contains(&format!("target_session_attrs \"master\" {accepted}")),
            "{e}"
        );
        let e = error(
            "postgresql://u@h/d?target_session_attrs=Read-Write",
            &no_env,
        );
        assert!(
            e.contains(&format!(
                "the target_session_attrs in the connection string {accepted}"
            )),
            "{e}"
        );
        let env = with_env(&[("PGTARGETSESSIONATTRS", "writable")]);
        let e = error("host=h user=u", &env);
        assert!(
            e.contains(&format!(
                "target_session_attrs \"writable\" (from PGTARGETSESSIONATTRS) {accepted}"
            )),
            "{e}"
        );
    }

    #[test]
    fn keepalives_default_to_noticing_a_dead_peer_in_about_a_minute() {
        let p = resolve(Some("host=h user=u"), &no_env).unwrap();
        assert!(p.keepalives);
        assert_eq!(p.keepalives_idle, Duration::from_secs(30));
        assert_eq!(p.keepalives_interval, Duration::from_secs(10));
        assert_eq!(p.keepalives_count, 3);
        assert_eq!(p.tcp_user_timeout, Duration::from_millis(60_000));
        assert_eq!(
            p.keepalives_idle + p.keepalives_interval * p.keepalives_count,
            Duration::from_secs(60)
        );

        let p = resolve(
            Some("host=h user=u keepalives=0 keepalives_idle=5 keepalives_interval=2 keepalives_count=7 tcp_user_timeout=1500"),
            &no_env,
        )
        .unwrap();
        assert!(!p.keepalives);
        assert_eq!(
            (p.keepalives_idle, p.keepalives_interval, p.keepalives_count),
            (Duration::from_secs(5), Duration::from_secs(2), 7)
        );
        assert_eq!(p.tcp_user_timeout, Duration::from_millis(1500));
        // 0: the system's default, as libpq.
        let p = resolve(
            Some("postgresql://u@h/d?keepalives=1&keepalives_idle=0&keepalives_count=0&tcp_user_timeout=0"),
            &no_env,
        )
        .unwrap();
        assert!(p.keepalives);
        assert_eq!(p.keepalives_idle, Duration::ZERO);
        assert_eq!(p.keepalives_count, 0);
        assert_eq!(p.tcp_user_timeout, Duration::ZERO);

        for (kv, expect) in [
            ("keepalives=yes", "keepalives \"yes\" is not 1 (on) or 0 (off)"),
            ("keepalives=2", "keepalives \"2\" is not 1 (on) or 0 (off)"),
            ("keepalives_idle=-1", "keepalives_idle \"-1\" is not a whole number of seconds between 0 and 32767"),
            ("keepalives_idle=32768", "keepalives_idle \"32768\" is not a whole number of seconds"),
            ("keepalives_interval=1.5", "keepalives_interval \"1.5\" is not a whole number of seconds between 0 and 32767"),
            ("keepalives_interval=+3", "the keepalives_interval in the connection string is not a whole number"),
            ("keepalives_count=128", "keepalives_count \"128\" is not a whole number between 0 and 127"),
            ("tcp_user_timeout=1m", "tcp_user_timeout \"1m\" is not a whole number of milliseconds between 0 and 2147483647"),
            ("tcp_user_timeout=2147483648", "tcp_user_timeout \"2147483648\" is not a whole number of milliseconds"),
        ] {
            let e = error(&format!("host=h user=u {kv}"), &no_env);
            assert!(e.contains(expect), "{kv}: expected {expect:?} in {e}");
            let url = format!("postgresql://u@h/d?{kv}").replace('+', "%2B");
            let e = error(&url, &no_env);
            assert!(e.contains(expect), "{url}: expected {expect:?} in {e}");
        }
    }

    #[test]
    fn pinned_to_keeps_one_endpoint_and_looks_the_password_up_again_for_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, "h1:5432:x:app:first\nh2:5433:x:app:second\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = path.display().to_string();
        let env = move |k: &str| (k == "PGPASSFILE").then(|| file.clone());
        let p = resolve(
            Some("host=h1,h2,h3 port=5432,5433,5434 user=app dbname=x"),
            &env,
        )
        .unwrap();
        assert_eq!(p.password.as_deref(), Some("first"));
        let second = p.pinned_to(&p.other_hosts[0]);
        assert_eq!((second.host.as_str(), second.port), ("h2", 5433));
        assert!(second.other_hosts.is_empty());
        assert_eq!(second.endpoints(), [endpoint("h2", 5433)]);
        assert_eq!(second.password.as_deref(), Some("second"));
        assert_eq!(second.to_string(), "host=h2 port=5433 dbname=x user=app");
        assert_eq!(
            (
                second.dbname.as_str(),
                second.user.as_str(),
                second.keepalives
            ),
            ("x", "app", true)
        );
        assert_eq!(p.pinned_to(&p.other_hosts[1]).password, None);
        assert_eq!(p.pinned_to(&endpoint("h1", 5432)), {
            let mut only_first = p.clone();
            only_first.other_hosts.clear();
            only_first
        });
        // A password given explicitly stays, whatever the file says.
        let p = resolve(
            Some("host=h1,h2 port=5432,5433 user=app dbname=x password=given"),
            &env,
        )
        .unwrap();
        assert_eq!(p.password_file, None);
        let second = p.pinned_to(&p.other_hosts[0]);
        assert_eq!(second.password.as_deref(), Some("given"));
        assert_eq!((second.host.as_str(), second.port), ("h2", 5433));
    }

    #[test]
    fn host_lists_and_the_new_keys_never_show_the_password() {
        for bad in [
            "postgresql://u:hunter2@h1:hunter2,h2/d",
            "postgresql://u:hunter2@h1,hunter2:x/d",
            "postgresql://u:hunter2@h1,,h2/d",
            "postgresql://u:hunter2@h1,[hunter2/d",
            "postgresql://u:hunter2@h1,[::1]hunter2/d",
            "postgresql://u:hunter2@h1,h%2Chunter2/d",
            // Without '@', user:password reads as host:port, in a list too.
            "postgresql://u:hunter2,h2:5432/d",
            "postgresql://h1,u:hunter2/d",
            "postgresql://u:hunter2@h1,h2/d?target_session_attrs=hunter2",
            "postgresql://u:hunter2@h/d?keepalives_count=hunter2",
            "postgresql://u:hunter2@h/d?tcp_user_timeout=hunter2",
            "host=a,,b password=hunter2",
            "host=a,b port=1,2,3 password=hunter2",
            "host=a,b password=hunter2 port=hunter2,5432",
            "host=a,b password=hunter2 port=5432,hunter2",
            "host=a password=hunter2 target_session_attrs=hunter2",
            "host=a password=hunter2 keepalives=hunter2",
            "host=a password=hunter2 keepalives_idle=hunter2",
            "host=a password=hunter2 keepalives_interval=hunter2",
            "host=a password=hunter2 tcp_user_timeout=hunter2",
        ] {
            let err = resolve(Some(bad), &no_env).unwrap_err();
            let text = format!("{err:#} {err:?}");
            assert!(!text.contains("hunter2"), "{bad}: {text}");
        }
        // The password from PGPASSWORD, the lists broken elsewhere.
        let env = with_env(&[("PGPASSWORD", "hunter2"), ("PGPORT", "1,2,3")]);
        for bad in [
            "host=a,b user=u",
            "host=a,,b user=u",
            "host=a user=u keepalives=x",
        ] {
            let text = format!("{:#}", resolve(Some(bad), &env).unwrap_err());
            assert!(!text.contains("hunter2"), "{bad}: {text}");
        }
        let p = resolve(
            Some("postgresql://u:hunter2@h1:5433,h2,[::1]/d?target_session_attrs=standby"),
            &no_env,
        )
        .unwrap();
        let pinned = p.pinned_to(&p.other_hosts[1]);
        for shown in [format!("{p} {p:?}"), format!("{pinned} {pinned:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }
}
