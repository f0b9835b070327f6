//! Connection parameters the way libpq users expect them: a URL or a `key=value` string,
//! with the `PG*` environment variables filling in whatever it leaves out.
//!
//! The `postgres` crate ignores the environment and knows only three `sslmode`s, so pgmend
//! parses both forms itself and sets the crate's `Config` field by field. The password is
//! kept out of every rendering of these parameters, and out of every parse error: a
//! malformed string can put (part of) a password where a key, a port or an sslmode was
//! expected, so an error repeats a piece of the string only when it cannot be one (see
//! `shown`), and otherwise says which parameter by name or by number.
//!
//! Connection parameters the way libpq users expect them, without a server: parses a URL or a
//! `key=value` string (pgmend's own parsers; the `postgres` crate ignores the environment and knows
//! three `sslmode`s), fills what is left out from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
//! `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGCONNECT_TIMEOUT`, `PGAPPNAME`, `PGOPTIONS`, then
//! applies defaults (`application_name` `pgmend`, `connect_timeout` 10s, `sslmode` `prefer`). When
//! no password is given, `password_from_file` reads the password file as libpq does (`passfile`,
//! `PGPASSFILE`, else `$HOME/.pgpass`; `*` wildcards, `\` escapes, first match; `localhost` also
//! matches a unix socket; a file others can read is ignored with a warning). `resolve` takes the
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
        Some(s) if looks_like_a_url(s) => bail!(
            "the connection string looks like a URL but does not start with postgresql:// or postgres:// (it is not repeated here because it may hold a password); check the scheme's colon and two slashes: postgresql://user@host:port/dbname?sslmode=..."
        ),
        Some(s) => parse_keyword_value(s)
            .context("the connection string is malformed (it is not repeated here because it may hold a password); expected key=value pairs such as \"host=db port=5432 dbname=app\"")?,
    };
    // Where each value came from, for messages: a value from a variable is safe to repeat
    // (none but PGPASSWORD holds a password, and it is never repeated).
    let mut from_env: BTreeMap<&str, &str> = BTreeMap::new();
    for (var, key) in ENV_KEYS {
        if !given.contains_key(*key) {
            if let Some(value) = env(var).filter(|v| !v.is_empty()) {
                given.insert((*key).to_string(), value);
                from_env.insert(key, var);
            }
        }
    }
    let password = given.get("password").cloned();
    // How a bad value is named in a message: `port "x"` when it is safe to repeat, else
    // `the port in the connection string` (or `in PGPORT`).
    let named = |key: &str, value: &str| match from_env.get(key) {
        Some(var) if *var != "PGPASSWORD" => format!("{key} {value:?} (from {var})"),
        _ => match shown(value, password.as_deref()) {
            Some(value) => format!("{key} {value}"),
            None => format!("the {key} in the connection string"),
        },
    };
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
            .with_context(|| {
                format!("{} is not a number between 1 and 65535", named("port", &p))
            })?,
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
        Some(mode) => SslMode::parse(&mode).with_context(|| {
            format!(
                "{} is not one of disable, allow, prefer, require, verify-ca, verify-full",
                named("sslmode", &mode)
            )
        })?,
        None => SslMode::Prefer,
    };
    let connect_timeout = match get("connect_timeout") {
        Some(t) => {
            let seconds: u64 = t.parse().with_context(|| {
                format!(
                    "{} is not a whole number of seconds",
                    named("connect_timeout", &t)
                )
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
    let password = match password {
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

/// Parses `postgresql://[user[:password]@][host][:port][/dbname][?key=value&...]`.
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
    let hostport = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => {
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
        out.insert("host".into(), decode(host, "the host")?);
    }
    if let Some(p) = port.filter(|p| !p.is_empty()) {
        // Without an '@', `user:password/db` reads as host:port: never repeat that "port".
        let valid = p.chars().all(|c| c.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n != 0);
        if !authority.contains('@') && !valid {
            bail!("the port after the host is not a number between 1 and 65535; if this is user:password, an '@' and the host must follow it: postgresql://user:password@host/dbname");
        }
        out.insert("port".into(), p.to_string());
    }
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
}
