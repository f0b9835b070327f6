//! The one exit path: run the command, print the error chain, map to 0/1/2.
//!
//! The one exit path. Parses the command line, dispatches to `commands::*`, and maps the result:
//! `Outcome::Done` → 0, `Outcome::Findings` → 1, an error whose chain holds `error::Stopped` or
//! `error::Violators` → 1, any other error → 2 (printed to stderr as `pgmend: stopped: ...` or
//! `pgmend: error: ...` with the whole cause chain, `{:#}`). clap usage errors exit 2, `--help` and
//! `--version` 0. A closed stdout pipe never reaches here as an error: every result is written
//! through `output::stdout`, so the command keeps its own exit code. A `--format` the command
//! cannot render is refused here (exit 2): `csv` is for `repair log` and `report overruns`,
//! `markdown`, `html` and `xlsx` for `report overruns`; `demo`, `completions` and `man` take none.
//! `completions SHELL` and `man` are answered here too, from `cli::command()` (clap_complete,
//! and `manpage` over clap_mangen), so they always match the parser. The only other exit
//! codes, 130, 143 and 129, come from `signals` (a second SIGINT, SIGTERM or SIGHUP). After an error, it also prints what a stop
//! left behind (`signals::leftovers`), when anything is. Every line to stderr goes through `say!`
//! (`src/signals.rs`), which ignores a failing stderr instead of panicking as `eprintln!` does.

use std::io::Write;
use std::process::ExitCode;

use clap::FromArgMatches;

use pgmend::cli::{Cli, Command, Format, MigrateCommand, RepairCommand, ReportCommand};
use pgmend::commands::{demo, migrate, release, repair, report, verify};
use pgmend::error::{exit_code_for, Outcome};
use pgmend::output;

fn main() -> ExitCode {
    {
        let argv: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let env = std::env::var("PGMEND_PROGRESS").ok();
        output::set_json_lines(pgmend::cli::json_progress_requested(&argv, env.as_deref()));
    }
    let cli = match pgmend::cli::command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
    {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // (Lossy: an argument that is not UTF-8 must not make this panic, and the panic
            // would print it whole.)
            let argv: Vec<String> = std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let text = pgmend::cli::redacted(&e, &argv);
            if output::json_lines() {
                output::event(
                    "error",
                    text.trim_end(),
                    serde_json::json!({ "exit_code": 2 }),
                );
            } else {
                let _ = write!(std::io::stderr(), "{text}");
            }
            if let Some(hint) = pgmend::cli::misplaced_option_hint(&argv, &e) {
                pgmend::say!("hint: {hint}");
            }
            return ExitCode::from(2);
        }
    };
    // Not given is not `human`: `report overruns --output r.csv` takes it from the file name.
    let given = cli.output.format;
    let format = given.unwrap_or(Format::Human);
    // These write one fixed thing (the tour, a script, a page); a format would mean nothing.
    let formatless = match cli.command {
        Command::Demo(_) => Some("demo"),
        Command::Completions(_) => Some("completions"),
        Command::Man => Some("man"),
        _ => None,
    };
    if let Some(command) = formatless.filter(|_| given.is_some()) {
        pgmend::say!(
            "pgmend: error: --format {} means nothing to `pgmend {command}`, which has one output; leave --format out",
            format.name()
        );
        return ExitCode::from(2);
    }
    let report = matches!(cli.command, Command::Report(_));
    let csv_ok = report || matches!(cli.command, Command::Repair(RepairCommand::Log(_)));
    let markdown_ok = report || matches!(cli.command, Command::Plan(_));
    let metrics_ok = matches!(
        cli.command,
        Command::Verify(_) | Command::Repair(RepairCommand::Status(_))
    );
    if (format == Format::Csv && !csv_ok)
        || (format == Format::Markdown && !markdown_ok)
        || (matches!(format, Format::Html | Format::Xlsx) && !report)
        || (format == Format::Openmetrics && !metrics_ok)
    {
        pgmend::say!(
            "pgmend: error: --format {} is only for {}; use human or json",
            format.name(),
            match format {
                Format::Csv => "`pgmend repair log` and `pgmend report overruns`",
                Format::Markdown => "`pgmend plan` and `pgmend report overruns`",
                Format::Openmetrics => "`pgmend verify` and `pgmend repair status`",
                _ => "`pgmend report overruns`",
            }
        );
        return ExitCode::from(2);
    }
    let result = match &cli.command {
        Command::Migrate(MigrateCommand::Status(a)) => migrate::status(a, format),
        Command::Migrate(MigrateCommand::Plan(a)) => migrate::plan(a, format),
        Command::Migrate(MigrateCommand::Apply(a)) => migrate::apply(a, format),
        Command::Plan(a) => release::plan(a, format),
        Command::Apply(a) => release::apply(a, format),
        Command::Repair(RepairCommand::List(a)) => repair::list(a, format),
        Command::Repair(RepairCommand::Plan(a)) => repair::plan(a, format),
        Command::Repair(RepairCommand::Apply(a)) => repair::apply(a, format),
        Command::Repair(RepairCommand::Status(a)) => repair::status(a, format),
        Command::Repair(RepairCommand::Log(a)) => repair::log(a, format),
        Command::Repair(RepairCommand::Undo(a)) => repair::undo(a, format),
        Command::Repair(RepairCommand::Abandon(a)) => repair::abandon(a, format),
        Command::Repair(RepairCommand::Pause(a)) => {
            repair::steer(&a.conn, a.run_id, Some(true), None, None, format)
        }
        Command::Repair(RepairCommand::Resume(a)) => {
            repair::steer(&a.conn, a.run_id, Some(false), None, None, format)
        }
        Command::Repair(RepairCommand::Throttle(a)) => repair::steer(
            &a.run.conn,
            a.run.run_id,
            None,
            a.pause,
            a.duty_cycle,
            format,
        ),
        Command::Migrate(MigrateCommand::Baseline(a)) => migrate::baseline(a, format),
        Command::Migrate(MigrateCommand::Validate(a)) => migrate::validate(a, format),
        Command::Verify(a) => verify::run(a, format),
        Command::Report(ReportCommand::Overruns(a)) => report::overruns(a, given),
        Command::Demo(a) => demo::run(a),
        Command::Init(a) => demo::init(a),
        // Both write through `output::stdout`, which a closed pipe cannot fail (clap_complete
        // panics on a failed write).
        Command::Completions(a) => {
            clap_complete::generate(
                a.shell,
                &mut pgmend::cli::command(),
                "pgmend",
                &mut output::stdout(),
            );
            Ok(Outcome::Done)
        }
        Command::Man => pgmend::manpage::render(&mut output::stdout())
            .map(|()| Outcome::Done)
            .map_err(Into::into),
    };
    // A closed stdout is no error: `output::stdout` swallowed it, and the command ran to its
    // own outcome. (An EPIPE that still arrives here is from elsewhere, such as the server's
    // socket, and is an error like any other.)
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Findings) => ExitCode::from(1),
        Err(e) => {
            let code = exit_code_for(&e);
            let what = if code == 1 { "stopped" } else { "error" };
            pgmend::output::event(
                what,
                &format!("pgmend: {what}: {e:#}"),
                serde_json::json!({ "exit_code": code }),
            );
            if let Some(left) = pgmend::signals::leftovers() {
                pgmend::say!("pgmend: {left}");
            }
            ExitCode::from(code)
        }
    }
}
