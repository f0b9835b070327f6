//! `pgmend man`: one page for every command. clap_mangen's page lists the subcommands as
//! pgmend-migrate(1), pgmend-repair(1), ..., pages that are never generated; this one names
//! each command in full (`pgmend migrate status`) with what it does, and adds the ENVIRONMENT
//! and EXIT STATUS sections a man page reader looks for.

use std::io::Write;

/// Writes the page (roff).
pub fn render(out: &mut impl Write) -> std::io::Result<()> {
    let cli = crate::cli::command();
    let man = clap_mangen::Man::new(cli.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    writeln!(out, ".SH COMMANDS")?;
    writeln!(
        out,
        "Each command's own options: \\fBpgmend COMMAND \\-\\-help\\fR."
    )?;
    for (path, about) in commands(&cli, "pgmend") {
        writeln!(out, ".TP\n\\fB{}\\fR\n{}", text(&path), text(&about))?;
    }
    writeln!(out, ".SH ENVIRONMENT")?;
    for (var, what) in ENVIRONMENT {
        writeln!(out, ".TP\n\\fB{}\\fR\n{}", text(var), text(what))?;
    }
    writeln!(out, ".SH EXIT STATUS")?;
    let exit = cli
        .get_after_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    writeln!(out, "{}", text(exit.trim_start_matches("Exit codes: ")))?;
    man.render_version_section(out)
}

/// Every command that does something (not the groups), as its full path and its about line.
fn commands(command: &clap::Command, path: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        let path = format!("{path} {}", sub.get_name());
        if sub.has_subcommands() {
            out.extend(commands(sub, &path));
        } else {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            out.push((path, about));
        }
    }
    out
}

/// The environment pgmend reads (docs/connecting.md has the whole story).
const ENVIRONMENT: &[(&str, &str)] = &[
    ("DATABASE_URL", "The database, as --database-url takes it: a postgresql:// URL or \"host=... dbname=...\"."),
    ("PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT, PGCONNECT_TIMEOUT, PGAPPNAME, PGOPTIONS, PGPASSFILE, PGTARGETSESSIONATTRS", "libpq's variables, for whatever the URL leaves out."),
    ("PGMEND_RELEASE", "The release directory (release.toml, migrations/, repairs/), as --release takes it; default: the current directory, when it holds a release.toml."),
    ("PGMEND_MIGRATIONS_DIR", "Read the migrations from this directory instead of the release's migrations/ (--migrations-dir)."),
    ("PGMEND_REPAIRS_DIR", "Read the repair definitions from this directory instead of the release's repairs/ (--repairs-dir)."),
    ("PGMEND_SCHEMA", "The schema that holds the legacy tables (--schema)."),
    ("PGMEND_POOLER", "What stands between pgmend and the server (--pooler)."),
    ("PGMEND_PROGRESS", "human or json: what pgmend writes on stderr (--progress)."),
    ("NO_COLOR", "When set, no colour even on a terminal."),
];

/// Text as roff reads it: backslashes and hyphens escaped, no line taken for a request.
fn text(s: &str) -> String {
    let escaped = s.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|l| match l.starts_with('.') || l.starts_with('\'') {
            true => format!("\\&{l}"),
            false => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
