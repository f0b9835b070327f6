//! The one exit path: run the command, print the error chain, map to 0/1/2.

use std::process::ExitCode;

use clap::Parser;

use pgmend::cli::{Cli, Command, Format, MigrateCommand, RepairCommand};
use pgmend::commands::{demo, migrate, release, repair, verify};
use pgmend::error::{exit_code_for, Outcome};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let format = cli.output.format;
    if format == Format::Csv && !matches!(cli.command, Command::Repair(RepairCommand::Log(_))) {
        eprintln!("pgmend: error: --format csv is only for `pgmend repair log`; use human or json");
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
        Command::Migrate(MigrateCommand::Baseline(a)) => migrate::baseline(a, format),
        Command::Migrate(MigrateCommand::Validate(a)) => migrate::validate(a, format),
        Command::Verify(a) => verify::run(a, format),
        Command::Demo(a) => demo::run(a),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Findings) => ExitCode::from(1),
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let code = exit_code_for(&e);
            eprintln!(
                "pgmend: {}: {e:#}",
                if code == 1 { "stopped" } else { "error" }
            );
            ExitCode::from(code)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}
