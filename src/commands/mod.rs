//! One module per group of subcommands: each opens what it needs, calls the library
//! parts, and renders the result.

pub mod demo;
pub mod migrate;
pub mod release;
pub mod repair;
pub mod report;
pub mod verify;

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};

use crate::cli::{ConnectionArgs, Pooler};
use crate::db::{self, conninfo, Session};

/// Opens a session from `--database-url` / `DATABASE_URL` and the PG* variables, in the
/// schema `--schema` names, and runs the pre-flight of the environment on it
/// ([`db::preflight`]): every command goes through here before its first statement.
pub fn open(conn: &ConnectionArgs) -> Result<Session> {
    let mut params = conninfo::resolve(conn.database_url.as_deref(), &|k| std::env::var(k).ok())?;
    if let Some(schema) = &conn.schema {
        params.options = Some(with_search_path(params.options.as_deref(), schema)?);
    }
    let mut session = db::connect(&params)?;
    let environment = db::preflight::check(&mut session, conn.pooler == Pooler::Session)?;
    session.environment = Some(environment);
    Ok(session)
}

/// The connection's `options` with `-c search_path=SCHEMA` added last, so that every
/// connection pgmend opens (an online build's too) works in that schema alone. The schema is
/// quoted as an identifier, and blanks and backslashes escaped as the options string needs.
fn with_search_path(options: Option<&str>, schema: &str) -> Result<String> {
    if schema.is_empty() || schema.contains('\0') {
        bail!("--schema {schema:?}: give the name of the schema that holds the legacy tables");
    }
    let quoted = crate::db::sql_text::Ident::new(schema).to_string();
    let escaped: String = quoted
        .chars()
        .flat_map(|c| match c {
            ' ' | '\\' | '\t' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let set = format!("-c search_path={escaped}");
    Ok(match options {
        Some(o) if !o.trim().is_empty() => format!("{o} {set}"),
        _ => set,
    })
}

/// A READ ONLY transaction: the server refuses any write made in it.
pub fn read_only(client: &mut postgres::Client) -> Result<postgres::Transaction<'_>> {
    use crate::error::PgContext;
    client
        .build_transaction()
        .read_only(true)
        .start()
        .doing("opening a read-only transaction")
}

/// One REPEATABLE READ, READ ONLY snapshot: every query in it sees the same moment, and the
/// server refuses any write (a hot standby will do).
pub fn snapshot(client: &mut postgres::Client) -> Result<postgres::Transaction<'_>> {
    use crate::error::PgContext;
    client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .doing("opening a read-only snapshot")
}

/// Asks on the terminal before a change; refuses without one unless `--yes` was given,
/// saying `review`: how to see first what this command would do (its own dry run).
pub fn confirm(yes: bool, question: &str, review: &str) -> Result<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        bail!("this command changes the database and there is no terminal to ask on; {review}, then rerun with --yes");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        bail!("not confirmed; nothing was changed")
    }
}

/// Writes a JSON document to stdout, followed by a newline.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = crate::output::stdout();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}
