//! Connection parameters the way libpq users expect them: a URL or a `key=value` string,
//! with the `PG*` environment variables filling in whatever it leaves out.
//!
//! The `postgres` crate ignores the environment and knows only three `sslmode`s, so pgmend
//! parses both forms itself and sets the crate's `Config` field by field. The password is
//! kept out of every rendering of these parameters.

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
    fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => bail!(
                "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ),
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

/// Everything needed to open a connection, resolved from the string and the environment.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnParams {
    /// A host name, an IP address, or an absolute directory holding the unix socket.
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<String>,
    pub connect_timeout: Duration,
    pub application_name: String,
    pub options: Option<String>,
}

impl fmt::Debug for ConnParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnParams({self})")
    }
}

/// Renders the target without the password: `host=db.internal port=5432 dbname=coupons user=release`.
impl fmt::Display for ConnParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host={} port={} dbname={} user={}",
            self.host, self.port, self.dbname, self.user
        )
    }
}

impl ConnParams {
    pub fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
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
];

/// Every environment variable that changes what pgmend connects to or reads: the libpq ones
/// above, `DATABASE_URL`, and the migrations and repairs directories. Test harnesses clear
/// them all, so that the caller's environment cannot leak into a run.
pub fn environment_variables() -> impl Iterator<Item = &'static str> {
    [
        "DATABASE_URL",
        "PGMEND_MIGRATIONS_DIR",
        "PGMEND_REPAIRS_DIR",
        "PGMEND_SCHEMA",
        "PGMEND_POOLER",
    ]
    .into_iter()
    .chain(ENV_KEYS.iter().map(|(var, _)| *var))
}

/// The longest connect timeout pgmend takes (libpq's 0, "forever", included): a day.
pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 86_400;

/// Resolves a connection: `conninfo` (a URL or `key=value` string, possibly empty) first,
/// then the `PG*` variables from `env` for whatever it leaves out, then libpq's defaults
/// (except `application_name`, which defaults to `pgmend`).
pub fn resolve(conninfo: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<ConnParams> {
    let mut given = match conninfo.map(str::trim) {
        None | Some("") => BTreeMap::new(),
        Some(s) if s.starts_with("postgres://") || s.starts_with("postgresql://") => {
            parse_url(s).context("the connection URL is malformed (it is not repeated here because it may hold a password); expected postgresql://user@host:port/dbname?sslmode=...")?
        }
        Some(s) => parse_keyword_value(s)
            .context("the connection string is malformed (it is not repeated here because it may hold a password); expected key=value pairs such as \"host=db port=5432 dbname=app\"")?,
    };
    for (var, key) in ENV_KEYS {
        if !given.contains_key(*key) {
            if let Some(value) = env(var).filter(|v| !v.is_empty()) {
                given.insert((*key).to_string(), value);
            }
        }
    }
    // A NUL cannot travel in the startup packet; say so here rather than fail obscurely.
    // (The value is not repeated: it may be the password.)
    if let Some((key, _)) = given.iter().find(|(_, v)| v.contains('\0')) {
        bail!("the value of {key} contains a NUL character; remove it");
    }
    let get = |key: &str| given.get(key).cloned();

    let host = get("host").unwrap_or_else(default_host);
    let port = match get("port") {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|n| *n != 0 && p.chars().all(|c| c.is_ascii_digit()))
            .with_context(|| format!("port {p:?} is not a number between 1 and 65535"))?,
        None => 5432,
    };
    let user = match get("user") {
        Some(u) => u,
        None => env("USER")
            .or_else(|| env("LOGNAME"))
            .context("no database user given: set user in the URL or PGUSER")?,
    };
    let dbname = get("dbname").unwrap_or_else(|| user.clone());
    let sslmode = match get("sslmode") {
        Some(mode) => SslMode::parse(&mode)?,
        None => SslMode::Prefer,
    };
    let connect_timeout = match get("connect_timeout") {
        Some(t) => {
            let seconds: u64 = t.parse().with_context(|| {
                format!("connect_timeout {t:?} is not a whole number of seconds")
            })?;
            // libpq: 0 means wait forever. pgmend never waits forever; a day at most.
            Duration::from_secs(if seconds == 0 {
                MAX_CONNECT_TIMEOUT_SECS
            } else {
                seconds.clamp(2, MAX_CONNECT_TIMEOUT_SECS)
            })
        }
        None => Duration::from_secs(10),
    };
    let password = match get("password") {
        Some(p) => Some(p),
        None => password_from_file(
            get("passfile").or_else(|| env("HOME").map(|h| format!("{h}/.pgpass"))),
            &host,
            port,
            &dbname,
            &user,
        )?,
    };
    Ok(ConnParams {
        host,
        port,
        password,
        user,
        dbname,
        sslmode,
        sslrootcert: get("sslrootcert"),
        connect_timeout,
        application_name: get("application_name").unwrap_or_else(|| "pgmend".to_string()),
        options: get("options"),
    })
}

/// The password file, as libpq reads it (`passfile`, `PGPASSFILE`, else `~/.pgpass`): lines of
/// `host:port:database:user:password`, `*` matching anything, `\:` and `\\` escaped, `#`
/// comments; the first line that matches wins. `localhost` also matches a unix socket. A file
/// that group or others can read is ignored with a warning, as libpq does. A missing file is
/// no error; an unreadable one is (it was meant to be used).
fn password_from_file(
    path: Option<String>,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Result<Option<String>> {
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
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_passfile_line(line);
        let [h, p, d, u, password] = fields.as_slice() else {
            continue;
        };
        let matches = |field: &str, value: &str| field == "*" || field == value;
        if (matches(h, host) || (socket && h == "localhost"))
            && matches(p, &port)
            && matches(d, dbname)
            && matches(u, user)
        {
            return Ok(Some(password.clone()));
        }
    }
    Ok(None)
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

fn check_key(key: &str) -> Result<()> {
    if KNOWN_KEYS.contains(&key) {
        Ok(())
    } else {
        bail!(
            "unknown connection parameter {key:?}; pgmend understands {}",
            KNOWN_KEYS.join(", ")
        )
    }
}

/// Parses `postgresql://[user[:password]@][host][:port][/dbname][?key=value&...]`.
/// A host may be a percent-encoded socket directory (`%2Fvar%2Frun%2Fpostgresql`).
fn parse_url(s: &str) -> Result<BTreeMap<String, String>> {
    let decode = |part: &str| -> Result<String> {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|c| c.into_owned())
            .context("a percent-encoded part is not valid UTF-8")
    };
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
    let hostport = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                out.insert("user".into(), decode(user)?);
            }
            if let Some(p) = password {
                out.insert("password".into(), decode(p)?);
            }
            hostport
        }
        None => authority,
    };
    if hostport.contains(',') {
        bail!("several hosts in one URL are not supported; give one host");
    }
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        let (h, after) = bracketed
            .split_once(']')
            .context("an IPv6 host is missing its closing ']'")?;
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if !host.is_empty() {
        out.insert("host".into(), decode(host)?);
    }
    if let Some(p) = port.filter(|p| !p.is_empty()) {
        out.insert("port".into(), p.to_string());
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        out.insert("dbname".into(), decode(db)?);
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
        let key = decode(k)?;
        // After `password=a&b=c`, "b" is the rest of the password: never repeat it.
        if after_password && !KNOWN_KEYS.contains(&key.as_str()) {
            bail!("URL parameter number {} is not a known parameter; if the password holds '&', write it %26", n + 1);
        }
        check_key(&key)?;
        after_password = key == "password";
        out.insert(key, decode(&v.replace('+', " "))?);
    }
    Ok(out)
}

/// Parses libpq's `key = value` form; values may be single-quoted with `\'` and `\\`.
fn parse_keyword_value(s: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    let mut after_password = false;
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
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
        // After an unquoted password, a "key" may be the rest of a password that holds a
        // space: never repeat it then.
        if after_password && !KNOWN_KEYS.contains(&key.as_str()) {
            bail!("the parameter after password is not a known key=value pair; a password that holds spaces must be quoted: password='...'");
        }
        if chars.next() != Some('=') {
            bail!("parameter {key:?} is missing its '=' (expected key=value)");
        }
        check_key(&key)?;
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        let quoted = chars.peek() == Some(&'\'');
        after_password = key == "password" && !quoted;
        if quoted {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.push(chars.next().context("a backslash ends the string")?),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => bail!("the quoted value of {key:?} has no closing quote"),
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
        out.insert(key, value);
    }
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
        ] {
            let err = resolve(Some(bad), &no_env).unwrap_err();
            let text = format!("{err:#} {err:?}");
            assert!(!text.contains("hunter2"), "{bad}: {text}");
        }
        let p = resolve(Some("postgresql://u:hunter2@h/d"), &no_env).unwrap();
        assert!(!format!("{p} {p:?}").contains("hunter2"));
    }
}
