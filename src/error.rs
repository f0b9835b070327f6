//! Error kinds that decide the exit code, and readable renderings of PostgreSQL errors.
//!
//! Exit codes: 0 done, 1 stopped safely because of the database's state, 2 an error in the input or
//! the environment. Anything that is not a [`Stopped`] or a [`Violators`] is a 2.
//!
//! `Stopped` (a `thiserror` type) marks "stopped on purpose because of the database's state,
//! nothing half-done"; `Violators` is the kind of stop a census makes (rows break what the next
//! step needs), which the release answers with a step's `retry_with` repair. They are the only
//! errors that exit 1. `Outcome` is what a command that ran to the end reports. `describe` renders
//! a `postgres::Error` with severity, message, SQLSTATE, detail, hint, table and constraint (the
//! crate itself prints only "db error"). The `PgContext::doing` extension turns a postgres result
//! into an `anyhow` error that says what pgmend was doing.

use std::fmt;

/// The command stopped on purpose because of the database's state, with nothing half-done
/// (a census found violators, a lock budget ran out, another pgmend holds the runner lock).
/// Exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Stopped(pub String);

impl Stopped {
    pub fn error(message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Stopped(message.into()))
    }
}

/// A census found rows that break what the next step needs (a unique index's duplicates, a
/// precondition's violators), or a unique index build kept failing on new duplicates. Exit 1,
/// like [`Stopped`]; the release reacts to this one alone by running the step's `retry_with`
/// repair and trying again. A lock budget or `--build-wait` running out is a plain `Stopped`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Violators(pub String);

impl Violators {
    pub fn error(message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Violators(message.into()))
    }
}

/// What a command reports when it ran to the end: nothing wrong (0), or a check found
/// problems (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Findings,
}

/// Exit code for an error chain: 1 when it is a [`Stopped`] or [`Violators`], 2 otherwise.
pub fn exit_code_for(error: &anyhow::Error) -> u8 {
    if error
        .chain()
        .any(|cause| cause.is::<Stopped>() || cause.is::<Violators>())
    {
        1
    } else {
        2
    }
}

/// A PostgreSQL error rendered with its SQLSTATE, detail and hint; `postgres::Error`
/// itself prints only "db error".
#[derive(Debug)]
pub struct DbFailure {
    pub sqlstate: Option<String>,
    text: String,
}

impl fmt::Display for DbFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for DbFailure {}

impl From<postgres::Error> for DbFailure {
    fn from(error: postgres::Error) -> Self {
        describe(&error)
    }
}

/// Renders a postgres error: the server's message with SQLSTATE, or the client-side cause.
pub fn describe(error: &postgres::Error) -> DbFailure {
    if let Some(db) = error.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; detail: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        if let Some(table) = db.table() {
            text.push_str(&format!("; table: {table}"));
        }
        if let Some(constraint) = db.constraint() {
            text.push_str(&format!("; constraint: {constraint}"));
        }
        if db.code().code() == "57014" && db.message().contains("statement timeout") {
            text.push_str("; the statement_timeout in force was pgmend's own, never a role's or database's: --statement-timeout (default 1m) for DDL and repair batches (at least 10 min for batches), 10 min for every other statement");
        }
        if db.code().code() == "26000" && db.message().starts_with("prepared statement") {
            text.push_str("; the server lost a statement pgmend prepared on this session: a pooler in transaction or statement mode stands between pgmend and the server (was --pooler session given for a pool that does not keep sessions?). pgmend's runner lock may stay with a pooled server connection: restart the pool, then connect to the server directly or through a pool in session mode");
        }
        return DbFailure {
            sqlstate: Some(db.code().code().to_string()),
            text,
        };
    }
    let mut text = error.to_string();
    let broken_io = {
        let mut cause = std::error::Error::source(error);
        let mut broken = false;
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                broken |= matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                );
            }
            cause = c.source();
        }
        broken
    };
    if error.is_closed() || broken_io {
        // The driver does not always keep the server's last message (a FATAL from
        // pg_terminate_backend or a shutdown): say what this usually means.
        text.push_str(
            " (the server ended this session: it was terminated, the server restarted, or the network dropped)",
        );
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    DbFailure {
        sqlstate: error.code().map(|c| c.code().to_string()),
        text,
    }
}

/// The SQLSTATE of a postgres error, if the server sent one.
pub fn sqlstate(error: &postgres::Error) -> Option<&str> {
    error.code().map(|c| c.code())
}

/// Extension for `Result<T, postgres::Error>`: convert into an anyhow error that says what
/// pgmend was doing, followed by the server's own words.
pub trait PgContext<T> {
    fn doing(self, what: impl fmt::Display) -> anyhow::Result<T>;
}

impl<T> PgContext<T> for Result<T, postgres::Error> {
    fn doing(self, what: impl fmt::Display) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::Error::new(describe(&e)).context(format!("{what}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopped_maps_to_one_even_with_context() {
        let e = Stopped::error("census found 3 groups").context("applying V3");
        assert_eq!(exit_code_for(&e), 1);
        assert_eq!(exit_code_for(&anyhow::anyhow!("bad flag")), 2);
    }
}
