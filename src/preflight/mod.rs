//! The pre-flight of the environment, run on every session pgmend opens for a command, before
//! the command reads or changes anything: what stands between pgmend and the server, which
//! schema the release is about, whether row-level security could hide rows from pgmend, and
//! the session settings that would change what its statements mean. Each problem is an error
//! (exit 2) that says what was found and what to do; nothing has been changed at that point,
//! not even pgmend's own tables.
//!
//! What the session sets for itself (row_security, the timeouts) is in
//! [`db::connect`](mod@crate::db::connect).
//!
//! `check` runs on every session `commands::open` opens, before the command's first statement:
//! something between pgmend and the server (the server's port or socket against the one pgmend
//! connected to; refused unless `--pooler session`, and then `db::runner_lock::ensure_backend`
//! checks the backend before the runner lock and every release step), the released schema (the
//! legacy tables elsewhere, or `pgmend.released_schema` naming another), row-level security that
//! applies to the role, `session_replication_role`. What it found (`Environment`) is printed by
//! `plan` and `verify`.

pub mod privileges;
pub mod reading;

use std::fmt;

use anyhow::{bail, Result};

use crate::db::Session;
use crate::error::PgContext;

/// What the pre-flight found, for the summaries of `plan` and `verify`.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The schema the release is about (`current_schema()`).
    pub schema: String,
    pub role: String,
    /// Whether something stands between pgmend and the server (then `--pooler session`
    /// was given).
    pub intermediary: Option<String>,
    /// The role bypasses row-level security (superuser or BYPASSRLS).
    pub bypasses_rls: bool,
}

impl fmt::Display for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pre-flight: schema {}, role {}{}; {}; no row-level security hides rows from pgmend; session settings set by pgmend (row_security off, its own timeouts)",
            self.schema,
            self.role,
            if self.bypasses_rls {
                " (bypasses row-level security)"
            } else {
                ""
            },
            match &self.intermediary {
                None => "connected to the server directly".to_string(),
                Some(what) => format!(
                    "{what}, taken to keep sessions (--pooler session); the server backend is checked at every step"
                ),
            }
        )
    }
}

/// Runs every check on a fresh session. `pooler_keeps_sessions` is `--pooler session`. With
/// `reads_for` (a command that only reads), whether the role may read pgmend's tables and
/// `tables` ([`reading::check`]) comes right after the check for something in between and
/// before anything reads pgmend's records: through a pool in transaction mode its prepared
/// statements may be lost, and the pool must be named for what it is, not as a lost statement.
pub fn check(
    session: &mut Session,
    pooler_keeps_sessions: bool,
    reads_for: Option<&str>,
    tables: &[String],
) -> Result<Environment> {
    let intermediary = intermediary(session)?;
    if let Some(what) = &intermediary {
        if !pooler_keeps_sessions {
            bail!(
                "{what}: something stands between pgmend and the server (a connection pooler such as PgBouncer, a proxy or a port forward). A pooler in transaction or statement mode hands each transaction to whichever server connection is free, which loses pgmend's runner lock and its prepared statements in the middle of a release. Connect to the server itself (its host and port, or its unix socket), or, if what is in between keeps each client on one server session for the whole connection (PgBouncer's pool_mode = session, a TCP proxy, a port forward), say so with --pooler session (PGMEND_POOLER=session); nothing was changed"
            );
        }
        ensure_session_kept(session)?;
    }
    if let Some(command) = reads_for {
        reading::check(&mut session.client, command, tables)?;
    }
    let row = session
        .client
        .query_one(
            "SELECT current_user::text, current_schema()::text,
                    current_setting('session_replication_role'),
                    (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user)",
            &[],
        )
        .doing("reading the session's role, schema and settings")?;
    let (role, schema, replication_role, bypasses_rls): (String, Option<String>, String, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if replication_role != "origin" {
        bail!(
            "session_replication_role is {replication_role:?} for role {role} on {}: triggers and foreign keys do not fire in such a session, so pgmend's guard and the schema's own checks would be skipped. Remove the setting (ALTER ROLE {role} RESET session_replication_role, or the database's), then rerun; nothing was changed",
            session.params
        );
    }
    let Some(schema) = schema else {
        bail!(
            "the search_path of this session names no schema that exists, so pgmend cannot tell which schema holds the legacy tables. Name it with --schema SCHEMA (PGMEND_SCHEMA); nothing was changed"
        );
    };
    check_schema(session, &schema, tables)?;
    if !bypasses_rls {
        check_row_security(session, &schema, &role)?;
    }
    Ok(Environment {
        schema,
        role,
        intermediary,
        bypasses_rls,
    })
}

/// Something in between shows as a difference between where pgmend connected and where the
/// server says the connection arrived: another port, or TCP on one side and a unix socket on
/// the other. (The server cannot report a pooler's mode, and one client alone often keeps
/// its server backend, so comparing `pg_backend_pid()` across transactions proves nothing.)
fn intermediary(session: &mut Session) -> Result<Option<String>> {
    let [server_tcp_port, server_port] = crate::db::connect::simple_row(
        &mut session.client,
        "SELECT inet_server_port(), current_setting('port')",
    )
    .doing("comparing the server's end of the connection with pgmend's")?;
    let server_tcp_port: Option<i32> = server_tcp_port.parse().ok();
    let server_port: i32 = server_port.parse().unwrap_or_default();
    let params = &session.params;
    let ours = i32::from(params.port);
    let found = if params.is_unix_socket() {
        match server_tcp_port {
            Some(port) => Some(format!(
                "pgmend connected through the unix socket {}/.s.PGSQL.{ours}, but the server received the connection over TCP on port {port}",
                params.host
            )),
            None if server_port != ours => Some(format!(
                "pgmend connected through the unix socket {}/.s.PGSQL.{ours}, but the server listens on port {server_port}",
                params.host
            )),
            None => None,
        }
    } else {
        match server_tcp_port {
            None => Some(format!(
                "pgmend connected to {}:{ours} over TCP, but the server received the connection through a unix socket",
                params.host
            )),
            Some(port) if port != ours => Some(format!(
                "pgmend connected to {}:{ours}, but the server received the connection on port {port}",
                params.host
            )),
            Some(_) => None,
        }
    };
    Ok(found)
}

/// With `--pooler session`: the server backend must be the one the session started on, in
/// every transaction. A pooler in transaction mode that the user took for session mode is
/// caught here at the latest, before the runner lock or a step relies on the session.
pub fn ensure_session_kept(session: &mut Session) -> Result<()> {
    crate::db::runner_lock::ensure_backend(&mut session.client, session.backend_pid)
}

/// The release is tied to the schema that holds the tables it works on (`tables`): refuses a
/// session whose schema has none of them while another schema has some, and a session on
/// another schema than the one pgmend's own records were made for.
fn check_schema(session: &mut Session, schema: &str, tables: &[String]) -> Result<()> {
    let row = session
        .client
        .query_one(
            "SELECT (SELECT count(DISTINCT c.relname) FROM pg_class c
                      WHERE c.relnamespace = $1::text::regnamespace AND c.relname::text = ANY($2::text[])
                        AND c.relkind IN ('r', 'p')),
                    (SELECT coalesce(array_agg(DISTINCT n.nspname::text ORDER BY n.nspname::text), '{}')
                       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE c.relname::text = ANY($2::text[]) AND c.relkind IN ('r', 'p')
                        AND n.nspname::text <> $1::text AND n.nspname::text <> $3::text)",
            &[&schema, &tables, &crate::store::SCHEMA],
        )
        .doing("finding the schema that holds the release's tables")?;
    let (here, elsewhere): (i64, Vec<String>) = (row.get(0), row.get(1));
    if here == 0 && !elsewhere.is_empty() {
        bail!(
            "the tables this works on ({}) are in schema {}, not in {schema}, the schema this session works in (the first existing schema of its search_path): a release here would create new, empty tables in {schema} and repair those. Name the schema with --schema {} (PGMEND_SCHEMA), then rerun; nothing was changed",
            tables.join(", "),
            elsewhere.join(", "),
            elsewhere[0]
        );
    }
    {
        let released = crate::store::records::released_schema(&mut session.client)?;
        if let Some(released) = released.filter(|r| r != schema) {
            bail!(
                "pgmend's records in this database (schema pgmend: the release's steps, gates and repair runs) belong to the release of schema {released}, and this session works in schema {schema}: their steps would be taken as done here. Run pgmend with --schema {released} to continue that release; nothing was changed"
            );
        }
    }
    Ok(())
}

/// Refuses when row-level security applies to pgmend's role on any table of the released
/// schema or of pgmend's own: the server would filter rows out of every sum, census and
/// report (with `row_security = off` it raises an error instead, but only when a statement
/// reaches the table, possibly after earlier steps changed things).
fn check_row_security(session: &mut Session, schema: &str, role: &str) -> Result<()> {
    let rows = session
        .client
        .query(
            "SELECT format('%I.%I', n.nspname, c.relname), c.relforcerowsecurity,
                    (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname::text IN ($1::text, 'pgmend') AND c.relkind IN ('r', 'p')
                AND c.relrowsecurity AND row_security_active(c.oid)
              ORDER BY 1",
            &[&schema],
        )
        .doing("checking for row-level security that applies to pgmend's role")?;
    if rows.is_empty() {
        return Ok(());
    }
    let tables: Vec<String> = rows
        .iter()
        .map(|r| {
            let (name, forced, policies): (String, bool, i64) = (r.get(0), r.get(1), r.get(2));
            format!(
                "{name} (row level security enabled{}, {policies} polic{})",
                if forced {
                    " and forced for its owner"
                } else {
                    ""
                },
                if policies == 1 { "y" } else { "ies" }
            )
        })
        .collect();
    bail!(
        "row-level security applies to role {role} on {}: its policies would hide rows from pgmend, so counters, censuses and reports would be computed over the visible rows only. Run pgmend as a role that bypasses row-level security (ALTER ROLE {role} BYPASSRLS, as a superuser), or as a superuser; nothing was changed",
        tables.join(", ")
    )
}

/// `--jobs N`: a run in ranges uses the main session and N worker connections, and an online
/// build one more: N + 2 in all. Refuses (exit 2, before any change) when the server's free
/// connection slots, the role's connection limit or the database's cannot serve N + 1 more
/// beside this session ([`connection_slots_for`]); says on stderr how many it will use.
pub fn connection_slots(client: &mut postgres::Client, jobs: usize) -> Result<()> {
    match connection_slots_for(client, jobs)? {
        Ok(line) => {
            crate::say!("{line}");
            Ok(())
        }
        Err(short) => bail!("{short}; nothing was changed"),
    }
}

/// The share of the connection slots `--jobs auto` may take: a quarter of what the server, the
/// role and the database could still open now (less the runner lock's lease and an online
/// build's connection), so three quarters stay the application's.
pub const AUTO_SHARE: i32 = 4;

/// How many workers `--jobs auto` may use here, at most `max_jobs`: a quarter of the slots the
/// server, the role and the database have free now ([`AUTO_SHARE`]), at least one; with the
/// line that says so.
pub fn auto_jobs(client: &mut postgres::Client, max_jobs: usize) -> Result<(usize, String)> {
    let row = client
        .query_one(SLOTS_SQL, &[])
        .doing("counting the server's free connection slots for --jobs auto")?;
    let (free, role_limit, role_used, db_limit, db_used): (i32, i32, i32, i32, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let mut open = free;
    if role_limit >= 0 {
        open = open.min(role_limit - role_used);
    }
    if db_limit >= 0 {
        open = open.min(db_limit - db_used);
    }
    // The lease and an online build's connection come first.
    let others = 1 + i32::from(crate::db::runner_lock::lease_pid().is_none());
    let share = ((open - others) / AUTO_SHARE).max(1) as usize;
    let jobs = share.min(max_jobs.max(1));
    Ok((
        jobs,
        format!(
            "--jobs auto: up to {jobs} batch workers (--max-jobs {max_jobs}; a quarter of the {} connection slots free now, the rest left to the application), starting with {}",
            open.max(0),
            jobs.min(2)
        ),
    ))
}

/// Free slots on the server, the role's limit and use, the database's limit and use.
const SLOTS_SQL: &str = "SELECT current_setting('max_connections')::int
                    - current_setting('superuser_reserved_connections')::int
                    - coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0)
                    - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
                    (SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user),
                    (SELECT count(*) FROM pg_stat_activity WHERE usename = current_user AND backend_type = 'client backend')::int,
                    (SELECT datconnlimit FROM pg_database WHERE datname = current_database()),
                    (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend')::int";

/// What `--jobs jobs` needs against what the server, the role and the database can serve now:
/// Ok with the line that says how many connections it uses, or Err with what is short (for
/// `plan`, a blocker; for `apply`, a refusal).
pub fn connection_slots_for(
    client: &mut postgres::Client,
    jobs: usize,
) -> Result<std::result::Result<String, String>> {
    let row = client
        .query_one(SLOTS_SQL, &[])
        .doing("counting the server's free connection slots for --jobs")?;
    let (free, role_limit, role_used, db_limit, db_used): (i32, i32, i32, i32, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    // This session, the runner lock's lease, the workers and an online build's connection;
    // the lease is open already when `apply` asks, not when `plan` does.
    let total = jobs as i32 + 3;
    let more = total - 1 - i32::from(crate::db::runner_lock::lease_pid().is_some());
    let mut short = Vec::new();
    if free < more {
        short.push(format!("the server has {free} free connection slots (max_connections less the reserved slots and the client connections open now)"));
    }
    if role_limit >= 0 && role_limit - role_used < more {
        short.push(format!(
            "role {} may open {} more (CONNECTION LIMIT {role_limit}, {role_used} open)",
            current_user(client)?,
            (role_limit - role_used).max(0)
        ));
    }
    if db_limit >= 0 && db_limit - db_used < more {
        short.push(format!(
            "this database may take {} more (CONNECTION LIMIT {db_limit}, {db_used} open)",
            (db_limit - db_used).max(0)
        ));
    }
    if !short.is_empty() {
        return Ok(Err(format!(
            "--jobs {jobs} needs {total} connections ({jobs} workers, this session, the runner lock's lease and one for an online build), {more} more than are open, but {}. Lower --jobs, or free connections",
            short.join(", and ")
        )));
    }
    Ok(Ok(format!(
        "--jobs {jobs}: {total} connections to the server ({jobs} batch workers, this session, the runner lock's lease, one for an online build); {free} free slots now"
    )))
}

fn current_user(client: &mut postgres::Client) -> Result<String> {
    Ok(client
        .query_one("SELECT current_user::text", &[])
        .doing("reading the role's name")?
        .get(0))
}
