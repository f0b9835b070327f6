//! The command line, as clap definitions. Option groups are shared with `flatten`.
//!
//! The clap definitions: the subcommands (`migrate status|plan|apply|baseline|validate`, `repair
//! list|plan|apply|status|log|undo|abandon|pause|resume|throttle`, `report overruns`, top-level `plan`, `apply`,
//! `verify`, `demo`, `completions`, `man`, `init`) and the option groups flattened into them —
//! `ConnectionArgs` (`--database-url` / `DATABASE_URL`), `ReleaseArgs` (`--release` /
//! `PGMEND_RELEASE`), within `MigrationsArgs` (with `--migrations-dir` / `PGMEND_MIGRATIONS_DIR`;
//! not taken by `validate`), `RepairsArgs` (with `--repairs-dir` / `PGMEND_REPAIRS_DIR`) and
//! `ProjectArgs` (all three, for the top-level `plan` and `apply`), `SafetyArgs` (`--yes`, `--lock-timeout` 500ms, `--lock-retry-for` 1m,
//! `--statement-timeout` 1m, `--validate-timeout` 1h, `--build-wait` 5m, `--runner-wait` 0s), `BatchArgs` (`--batch-target`
//! 200ms, the health signals' thresholds and `--health-pause-limit`) and the global `OutputArgs` (`--format
//! human|json|csv|markdown|html|xlsx`, an `Option`: not given is not `human`, so `report overruns
//! --output r.csv` can take the format from the file name and `demo` can refuse even `--format
//! human`). `misplaced_option_hint` turns clap's bare "unexpected argument" for an option the
//! command does not take into a hint naming the commands that do; `redacted` is clap's error with
//! every argument that may hold a password replaced (clap repeats unexpected arguments). `PlanArgs`
//! / `ApplyArgs` (with `--target`) belong to the migration commands; the top-level `plan` and
//! `apply` have their own `ReleasePlanArgs` (`--sample` 20, `--output FILE`, `--compare FILE`) and `ReleaseApplyArgs` (`--confirm
//! GATE`, repeatable, plus the safety and batch options). `RepairPlanArgs` takes `--sample` 20 and
//! `--all`; `RepairRunArgs` (undo, abandon) a run id.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    parse_autovacuum_pause, parse_count_threshold, parse_duration, parse_duration_threshold,
    parse_share, AutovacuumPause, Threshold,
};

#[derive(Debug, Parser)]
#[command(
    name = "pgmend",
    version,
    about = "Migrate a live PostgreSQL database that already holds broken data, repair it safely, and report what the breakage cost.",
    after_help = "Exit codes: 0 done; 1 stopped safely because of the database's state (nothing half-done), a question answered no, or a check found problems; 2 an error in the input or the environment; 130, 143, 129 a second SIGINT, SIGTERM or SIGHUP (the first stops `apply`, `migrate apply` and `repair apply` cleanly, within 20 s, with 1)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub output: OutputArgs,
    /// What pgmend writes on stderr: lines for people (human, the default), or one JSON object
    /// per line (json; docs/progress.schema.json) for CI logs and log shippers.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "PGMEND_PROGRESS",
        value_name = "MODE"
    )]
    pub progress: Option<ProgressMode>,
}

/// `--progress`: how stderr is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    Human,
    Json,
}

/// Whether the command line (`argv`) or `PGMEND_PROGRESS` (`env`) asks for JSON lines, read
/// before clap parses, so that a usage error is a JSON line too.
pub fn json_progress_requested(argv: &[String], env: Option<&str>) -> bool {
    let given = argv
        .windows(2)
        .filter(|w| w[0] == "--progress")
        .map(|w| w[1].as_str())
        .chain(argv.iter().filter_map(|a| a.strip_prefix("--progress=")))
        .last();
    given.or(env) == Some("json")
}

/// The command line as pgmend parses it: [`Cli`], with each command's own `--format` (clap
/// would copy the one global option, all six values, into every command). A command takes a
/// copy of it that names only the formats it renders, and `demo`, `completions` and `man`,
/// which render none, a hidden one (main refuses --format there). The copies stay global, so
/// the value reaches `Cli::output` wherever it is given.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let root = Cli::command();
    let format = root
        .get_arguments()
        .find(|a| a.get_id() == "format")
        .cloned()
        .expect("the global --format");
    with_formats(root, "", &format)
}

fn with_formats(command: clap::Command, path: &str, format: &clap::Arg) -> clap::Command {
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names.into_iter().fold(command, |command, name| {
        let path = format!("{path} {name}").trim_start().to_string();
        command.mut_subcommand(&name, |sub| {
            if sub.has_subcommands() {
                return with_formats(sub, &path, format);
            }
            let own = format.clone().hide_possible_values(true);
            let offered = match path.as_str() {
                "demo" | "completions" | "man" => return sub.arg(own.hide(true)),
                "report overruns" => return sub.arg(format.clone()),
                "repair log" => "human, json or csv",
                "plan" => "human, json or markdown",
                "verify" | "repair status" => "human, json or openmetrics",
                _ => "human or json",
            };
            sub.arg(own.help(format!(
                "{offered}: human (the default) for people, json for programs (a stable, documented document)"
            )))
        })
    })
}

/// clap's error, with every argument that may hold a password replaced: clap repeats an
/// unexpected argument verbatim (`pgmend verify postgresql://u:pw@h/db`, the
/// `--database-url` forgotten), and pgmend never shows a password.
pub fn redacted(error: &clap::Error, argv: &[String]) -> String {
    let mut text = error.render().to_string();
    let mut replaced = false;
    for arg in argv.iter().skip(1) {
        let lower = arg.to_ascii_lowercase();
        let secret = lower.contains("password") || (arg.contains('@') && arg.contains(':'));
        if secret && text.contains(arg.as_str()) {
            text = text.replace(
                arg.as_str(),
                "<a connection string, not repeated: it may hold a password>",
            );
            replaced = true;
        }
    }
    // clap counts an option filled from its environment variable as given, and writes it into
    // the usage line as if it were required (`repair log --database-url <URL> <RUN_ID>`).
    for option in [
        "--database-url <URL>",
        "--schema <SCHEMA>",
        "--pooler <MODE>",
        "--migrations-dir <DIR>",
        "--repairs-dir <DIR>",
    ] {
        let long = option.split(' ').next().unwrap_or(option);
        if !argv.iter().any(|a| a.starts_with(long)) {
            text = text
                .lines()
                .map(|l| match l.starts_with("Usage: ") {
                    true => l.replace(&format!(" {option}"), ""),
                    false => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
                + if text.ends_with('\n') { "\n" } else { "" };
        }
    }
    if replaced && error.kind() == clap::error::ErrorKind::UnknownArgument {
        text.push_str(
            "hint: a connection string goes after --database-url (or into DATABASE_URL)\n",
        );
    }
    text
}

/// A hint for an option given to a command that does not take it, when clap has none: the
/// commands that do take it (`pgmend migrate status --yes`: `--yes` belongs to `pgmend
/// apply`, ...); for an option given before the subcommand that takes it, where it goes
/// (clap gives a tip one level above the subcommand only); for a short `-y`, the long option
/// the letter stands for (`pgmend apply --yes`).
pub fn misplaced_option_hint(argv: &[String], error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory;
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let root = Cli::command();
    let mut given = vec!["pgmend".to_string()];
    let mut command = &root;
    for word in argv.iter().skip(1) {
        if let Some(sub) = command.find_subcommand(word) {
            given.push(sub.get_name().to_string());
            command = sub;
        }
    }
    let longs = || command.get_arguments().filter_map(|a| a.get_long());
    // `-y`: pgmend's options are long; name the one the letter most likely meant.
    if let Some(letter) = arg.strip_prefix('-').filter(|a| !a.starts_with('-')) {
        let mut close = longs().filter(|l| letter.len() == 1 && l.starts_with(letter));
        return match (close.next(), close.next()) {
            (Some(long), None) => Some(format!(
                "pgmend's options have long names only: {} --{long}",
                given.join(" ")
            )),
            _ => None,
        };
    }
    let long = arg.strip_prefix("--")?.split('=').next()?;
    if longs().any(|l| l == long) {
        // Given before the subcommand that takes it: clap gives a tip one level above it,
        // none further up (`pgmend --lang ja report overruns`).
        if error.render().to_string().contains("tip:") {
            return None;
        }
        return Some(format!(
            "--{long} goes after the command that takes it: {} --{long} ...",
            given.join(" ")
        ));
    }
    fn takers(command: &clap::Command, path: &str, long: &str, out: &mut Vec<String>) {
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if sub.get_arguments().any(|a| a.get_long() == Some(long)) {
                out.push(format!("`{path}`"));
            }
            takers(sub, &path, long, out);
        }
    }
    let mut out = Vec::new();
    takers(&root, "pgmend", long, &mut out);
    let list = match out.len() {
        0 => return None,
        n if n <= 8 => out.join(", "),
        n => format!("{} and {} more", out[..6].join(", "), n - 6),
    };
    Some(format!(
        "--{long} is not an option of `{}`; it belongs to {list}",
        given.join(" ")
    ))
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Versioned migrations: status, plan, apply, baseline.
    #[command(subcommand)]
    Migrate(MigrateCommand),
    /// The pending release, as a dry run: migrations (SQL, locks, censuses), repair diffs, gates.
    Plan(ReleasePlanArgs),
    /// Apply the pending release in order, up to the next unconfirmed gate.
    Apply(ReleaseApplyArgs),
    /// Repairs: list, plan (dry-run diff), apply, status, log, undo, abandon.
    #[command(subcommand)]
    Repair(RepairCommand),
    /// Check the invariants (counters equal the coupons, one live coupon per member, the
    /// unique index and the check in place, no INVALID index) and list anomalies.
    Verify(VerifyArgs),
    /// Reports for finance: what the breakage cost, from one consistent snapshot.
    #[command(subcommand)]
    Report(ReportCommand),
    /// A throwaway local PostgreSQL with dirty legacy data, adopted and migrated.
    Demo(DemoArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(CompletionsArgs),
    /// Print the man page (roff) to stdout: `pgmend man > /usr/local/share/man/man1/pgmend.1`.
    Man,
    /// Write the coupon release built into pgmend to DIR (release.toml, migrations/,
    /// repairs/), as a starting point for a release of your own.
    Init(InitArgs),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The directory to write the release to (created when missing; no file is overwritten).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for, e.g. `pgmend completions bash > /etc/bash_completion.d/pgmend`.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// Campaign overruns, members past the monthly cap, what the repair voided and what
    /// duplicates cost. Read-only; works on a hot standby and before the release.
    /// Formats: table (default), csv, json, markdown, html, xlsx.
    Overruns(OverrunsArgs),
}

#[derive(Debug, Args)]
pub struct OverrunsArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub release: ReleaseArgs,
    /// Write the report to FILE (atomically: a temporary file beside it, then a rename)
    /// instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace FILE if it exists.
    #[arg(long, requires = "output")]
    pub force: bool,
    /// With --format csv: start with a UTF-8 byte order mark, so Excel reads the file as
    /// UTF-8.
    #[arg(long)]
    pub excel: bool,
    /// The monthly cap per member, in yen.
    #[arg(long, value_name = "YEN", default_value_t = 2000, value_parser = clap::value_parser!(i64).range(0..))]
    pub monthly_cap_yen: i64,
    /// With --format csv: the one section to write (a CSV holds one section, so a column
    /// never sums totals with rows). Without it, --output NAME.csv writes NAME-summary.csv,
    /// NAME-campaigns.csv and NAME-members.csv from the same snapshot.
    #[arg(long, value_enum)]
    pub section: Option<CsvSection>,
    /// The language of the table, Markdown, HTML, workbook and CSV headers (en, ja). Ids,
    /// JSON keys and error messages never change.
    #[arg(long, value_enum, default_value = "en")]
    pub lang: ReportLang,
    /// How many member-months over the cap the table, Markdown and HTML list: a number or
    /// `all`. Default: the first 20 on a terminal, the first 200 on the HTML page, all
    /// elsewhere. JSON, CSV and the workbook always hold every row.
    #[arg(long, value_name = "N|all", value_parser = parse_limit)]
    pub members: Option<Limit>,
}

/// How many rows a listing shows: `report overruns --members`, `repair log --limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    All,
    First(u64),
}

fn parse_limit(text: &str) -> Result<Limit, String> {
    if text == "all" {
        return Ok(Limit::All);
    }
    text.parse()
        .map(Limit::First)
        .map_err(|_| format!("{text:?} is neither a number nor `all`"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportLang {
    En,
    Ja,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CsvSection {
    /// Where and when the figures come from, and every total.
    Summary,
    /// One row per campaign.
    Campaigns,
    /// One row per member-month over the monthly cap.
    Members,
}

#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Every known migration and its state. Changes nothing.
    Status(StatusArgs),
    /// Dry run: the pending migrations, their SQL and the locks they take.
    Plan(PlanArgs),
    /// Apply the pending migrations in order.
    Apply(ApplyArgs),
    /// Adopt an existing legacy database: check its schema against V1, then record V1.
    Baseline(BaselineArgs),
    /// VALIDATE a NOT VALID check or foreign key, once its census finds no violating row.
    Validate(ValidateArgs),
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The constraint's name, e.g. issued_within_budget.
    pub name: String,
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub safety: SafetyArgs,
}

#[derive(Debug, Args)]
pub struct ReleasePlanArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub project: ProjectArgs,
    #[command(flatten)]
    pub long_locks: LongLockArgs,
    /// How many changed rows each repair's diff shows.
    #[arg(long, default_value_t = 20)]
    pub sample: usize,
    /// Save the plan (the `--format json` document, with its fingerprint and digest) to FILE,
    /// for `pgmend apply --plan FILE`. Not written when the plan has blockers.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Compare the plan made here with STAGING-PLAN.json (the file `plan --output` wrote on
    /// staging), step by step: files, table shapes, counts, estimated durations, and the steps
    /// the rehearsal did not exercise. Shows the comparison instead of the plan.
    #[arg(long, value_name = "STAGING-PLAN.json")]
    pub compare: Option<PathBuf>,
    /// Check that the server can serve `apply --jobs N` now (N + 2 connections): if not, the
    /// plan has a blocker. `--jobs` alone (or `--jobs auto`) says how many workers `apply`'s
    /// default, `--jobs auto`, may use here.
    #[arg(long, value_parser = crate::config::parse_jobs, value_name = "N|auto", num_args = 0..=1, default_missing_value = "auto")]
    pub jobs: Option<crate::config::Jobs>,
    /// With --jobs auto: the most workers it may use.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64), value_name = "N")]
    pub max_jobs: u16,
}

#[derive(Debug, Args)]
pub struct ReleaseApplyArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub project: ProjectArgs,
    #[command(flatten)]
    pub long_locks: LongLockArgs,
    #[command(flatten)]
    pub safety: SafetyArgs,
    #[command(flatten)]
    pub batch: BatchArgs,
    /// Pass this gate (recorded with who and when), e.g. deploy-new-application.
    #[arg(long, value_name = "GATE")]
    pub confirm: Vec<String>,
    #[command(flatten)]
    pub saved: SavedPlanArgs,
}

/// Applying a saved plan (`pgmend plan --output FILE`).
#[derive(Debug, Args)]
pub struct SavedPlanArgs {
    /// Apply this saved plan and nothing else: refused when the database, the files or the
    /// tables differ from what it was made from; stops at the next gate.
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// The plan's SHA-256 as reviewed (from the change ticket); refused unless the file's is.
    #[arg(long, value_name = "HEX", requires = "plan")]
    pub plan_sha256: Option<String>,
    /// Refuse a plan made longer ago than this.
    #[arg(long, value_name = "DURATION", default_value = "1d", value_parser = parse_duration, requires = "plan")]
    pub max_plan_age: Duration,
    /// How far the next data step's counts may have moved since the plan, as a share of each
    /// (never less than 100 rows), e.g. 0.05 or 5%.
    #[arg(long, value_name = "SHARE", default_value = "5%", value_parser = parse_share, requires = "plan")]
    pub max_drift: f64,
}

#[derive(Debug, Subcommand)]
pub enum RepairCommand {
    /// The repair definitions.
    List(RepairListArgs),
    /// Dry run: what the repair would change, as diffs, in a read-only transaction.
    Plan(RepairPlanArgs),
    /// Run the repair (or resume its unfinished run) in batches.
    Apply(RepairApplyArgs),
    /// Every run, its progress and checkpoint.
    Status(RepairStatusArgs),
    /// Every row a run changed, before and after.
    Log(RepairLogArgs),
    /// Restore what a run changed.
    Undo(RepairRunArgs),
    /// Give up an unfinished run (its changes stay, and can be undone).
    Abandon(RepairRunArgs),
    /// Ask the pgmend walking a run to stop between batches until `repair resume`.
    Pause(SteerArgs),
    /// Let a paused run go on.
    Resume(SteerArgs),
    /// Change a running run's --pause and --duty-cycle from another session.
    Throttle(ThrottleArgs),
}

/// A run to steer from another session: the request is recorded on the run's row and read by
/// the pgmend walking it before its next batch; no --yes, no runner lock.
#[derive(Debug, Args)]
pub struct SteerArgs {
    pub run_id: i64,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

#[derive(Debug, Args)]
pub struct ThrottleArgs {
    #[command(flatten)]
    pub run: SteerArgs,
    /// Pause this long after each batch (as `repair apply --pause`).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub pause: Option<Duration>,
    /// Spend at most this percent of the time in batches (as `repair apply --duty-cycle`).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=100), value_name = "PERCENT")]
    pub duty_cycle: Option<u8>,
}

#[derive(Debug, Args)]
pub struct RepairsArgs {
    #[command(flatten)]
    pub release: ReleaseArgs,
    /// Read repair definitions from this directory instead of the release's repairs/.
    #[arg(long, env = "PGMEND_REPAIRS_DIR", value_name = "DIR")]
    pub repairs_dir: Option<PathBuf>,
}

/// Where the release is: `--release DIR`, else the current directory when it holds a
/// release.toml (`release::project::find`).
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The release directory (release.toml, migrations/, repairs/); default: the current
    /// directory, when it holds a release.toml.
    #[arg(long, env = "PGMEND_RELEASE", value_name = "DIR")]
    pub release: Option<PathBuf>,
}

/// The release and its parts, for `plan` and `apply`: `--migrations-dir` and `--repairs-dir`
/// override the release's migrations/ and repairs/.
#[derive(Debug, Args)]
pub struct ProjectArgs {
    #[command(flatten)]
    pub release: ReleaseArgs,
    /// Read migrations from this directory instead of the release's migrations/.
    #[arg(long, env = "PGMEND_MIGRATIONS_DIR", value_name = "DIR")]
    pub migrations_dir: Option<PathBuf>,
    /// Read repair definitions from this directory instead of the release's repairs/.
    #[arg(long, env = "PGMEND_REPAIRS_DIR", value_name = "DIR")]
    pub repairs_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RepairListArgs {
    #[command(flatten)]
    pub repairs: RepairsArgs,
}

#[derive(Debug, Args)]
pub struct RepairPlanArgs {
    pub name: String,
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub repairs: RepairsArgs,
    /// How many changed rows to show as diffs.
    #[arg(long, default_value_t = 20)]
    pub sample: usize,
    /// Show every changed row (streamed).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct RepairApplyArgs {
    pub name: String,
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub repairs: RepairsArgs,
    #[command(flatten)]
    pub safety: SafetyArgs,
    #[command(flatten)]
    pub batch: BatchArgs,
}

#[derive(Debug, Args)]
pub struct RepairStatusArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub release: ReleaseArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

#[derive(Debug, Args)]
pub struct RepairLogArgs {
    pub run_id: i64,
    /// How many entries to show: a number or `all`. Default: the first 200 in the table;
    /// JSON and CSV hold every entry unless --limit is given. Says how many it left out.
    #[arg(long, value_name = "N|all", value_parser = parse_limit)]
    pub limit: Option<Limit>,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

#[derive(Debug, Args)]
pub struct RepairRunArgs {
    pub run_id: i64,
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub repairs: RepairsArgs,
    #[command(flatten)]
    pub safety: SafetyArgs,
}

#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Aim for batch transactions of about this long (default 200ms; 100ms for a run in ranges
    /// under --jobs auto whose CPU probe finds the application at work as it starts).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub batch_target: Option<Duration>,
    /// Pause batches while a replica replays later than this (default 30s; off: not watched).
    #[arg(long, value_parser = parse_duration_threshold, value_name = "DURATION|off")]
    pub max_replica_lag: Option<Threshold<Duration>>,
    /// Pause batches while more WAL segments than this wait to be archived (default 42; off:
    /// not watched). Read only when archive_mode is on.
    #[arg(long, value_parser = parse_count_threshold, value_name = "SEGMENTS|off")]
    pub max_archive_backlog: Option<Threshold<i64>>,
    /// Pause batches while autovacuum works on a repaired table: wraparound (the default: one
    /// that prevents wraparound), any, or off.
    #[arg(long, value_parser = parse_autovacuum_pause, value_name = "wraparound|any|off")]
    pub autovacuum_pause: Option<Threshold<AutovacuumPause>>,
    /// Pause batches while the server requested more checkpoints than this in the last
    /// minute (default 2; off: not watched).
    #[arg(long, value_parser = parse_count_threshold, value_name = "COUNT|off")]
    pub max_requested_checkpoints: Option<Threshold<i64>>,
    /// Pause batches while another session has waited longer than this for a lock (default
    /// 1s; off: not watched).
    #[arg(long, value_parser = parse_duration_threshold, value_name = "DURATION|off")]
    pub max_lock_wait: Option<Threshold<Duration>>,
    /// With --jobs auto, while the application runs statements: remove a worker when a fixed
    /// probe query runs this many times as long as before the batches, its CPUs full (default
    /// 1.5; off: not watched).
    #[arg(long, value_parser = crate::config::parse_ratio_threshold, value_name = "RATIO|off")]
    pub max_cpu_slowdown: Option<Threshold<u32>>,
    /// Stop (exit 1) when a health signal has held the batches paused this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub health_pause_limit: Duration,
    /// Batch workers for a run whose targets are ranges of keys, each on its own connection.
    /// `auto` (the default) starts with two (one while the application is at work) and adds
    /// one while the throughput grows enough for it, removes one when it falls or the server's health says so, up to --max-jobs and a
    /// quarter of the free connection slots; a number keeps that many (N + 2 connections in
    /// all; 1 walks the batches on the main session).
    #[arg(long, default_value = "auto", value_parser = crate::config::parse_jobs, value_name = "N|auto", env = "PGMEND_JOBS")]
    pub jobs: crate::config::Jobs,
    /// With --jobs auto: the most workers it may use.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64), value_name = "N")]
    pub max_jobs: u16,
    /// Pause this long after each batch (each worker after its own), leaving the server to the
    /// application.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub pause: Duration,
    /// Spend at most this percent of the time in batches: after a batch that took T, pause
    /// T x (100 - P) / P (50: as long again as the batch took).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=100), value_name = "PERCENT")]
    pub duty_cycle: u8,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub migrations: MigrationsArgs,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub migrations: MigrationsArgs,
    /// Stop at this version (inclusive) instead of the newest.
    #[arg(long, value_name = "VERSION")]
    pub target: Option<i32>,
    #[command(flatten)]
    pub long_locks: LongLockArgs,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub safety: SafetyArgs,
}

#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub migrations: MigrationsArgs,
    #[command(flatten)]
    pub safety: SafetyArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(flatten)]
    pub project: ProjectArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// Where `--format openmetrics` goes.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// With --format openmetrics: write the metrics to FILE atomically (for node_exporter's
    /// textfile collector), also when the check cannot run (then `_up` is 0).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many members the generated campaign data has.
    #[arg(long, default_value_t = 300_000)]
    pub members: u32,
    /// Leave the server running and print how to connect to it.
    #[arg(long)]
    pub keep: bool,
    /// Where the finance reports (overruns.xlsx, overruns-*.csv, overruns.json, overruns.html) are written;
    /// created if missing, files in it replaced.
    #[arg(long, value_name = "DIR", default_value = "pgmend-demo-reports")]
    pub reports_dir: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct ConnectionArgs {
    /// postgresql://user@host:port/dbname?sslmode=... or "host=... dbname=..."; the PG*
    /// variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT,
    /// PGCONNECT_TIMEOUT, PGAPPNAME) fill in what it leaves out.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// The schema that holds the legacy tables (campaigns, issued_coupons), and so the one the
    /// release changes: pgmend sets search_path to it alone. Without it, the search_path the
    /// connection has decides (the server's default finds `public`).
    #[arg(long, env = "PGMEND_SCHEMA", value_name = "SCHEMA")]
    pub schema: Option<String>,
    /// What stands between pgmend and the server. `none` (the default): pgmend refuses when it
    /// finds something in between (the server sees another port or socket than pgmend
    /// connected to), since a transaction-mode pooler loses session state. `session`: a
    /// pooler in session mode, a port forward or a TCP proxy, which keeps one server session
    /// per connection; pgmend checks that its server backend never changes.
    #[arg(long, env = "PGMEND_POOLER", value_enum, default_value_t = Pooler::None, value_name = "MODE")]
    pub pooler: Pooler,
}

/// What `--pooler` says stands between pgmend and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pooler {
    None,
    Session,
}

#[derive(Debug, Args)]
pub struct MigrationsArgs {
    #[command(flatten)]
    pub release: ReleaseArgs,
    /// Read migrations from this directory instead of the release's migrations/.
    #[arg(long, env = "PGMEND_MIGRATIONS_DIR", value_name = "DIR")]
    pub migrations_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct LongLockArgs {
    /// Refuse a statement that would hold a strong lock while it reads or rewrites a table of
    /// more rows than this (a FOREIGN KEY without NOT VALID, SET NOT NULL without a valid check,
    /// a rewriting type change, CREATE INDEX without CONCURRENTLY, ...), unless its migration
    /// accepts it with a `-- pgmend:long-lock <why>` line right before it.
    #[arg(long, default_value_t = crate::migrate::long_locks::DEFAULT_ROWS, value_parser = clap::value_parser!(i64).range(0..), value_name = "ROWS")]
    pub long_lock_rows: i64,
}

#[derive(Debug, Args)]
pub struct SafetyArgs {
    /// Do not ask for confirmation (required without a terminal).
    #[arg(long)]
    pub yes: bool,
    /// How long one DDL statement may wait for its lock before it gives up and is retried.
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    pub lock_timeout: Duration,
    /// The total time to keep retrying a step that could not get its lock.
    #[arg(long, default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    pub lock_retry_for: Duration,
    /// The longest any one statement may run.
    #[arg(long, default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    pub statement_timeout: Duration,
    /// The longest a VALIDATE CONSTRAINT may scan its table (instead of --statement-timeout;
    /// it holds only SHARE UPDATE EXCLUSIVE): past it the server cancels it, nothing is
    /// changed, and pgmend stops with exit 1.
    #[arg(long, default_value = crate::config::DEFAULT_VALIDATE_TIMEOUT, value_parser = parse_duration, value_name = "DURATION")]
    pub validate_timeout: Duration,
    /// How long a CONCURRENTLY build or drop may wait for other sessions before it is
    /// cancelled (its INVALID index dropped) and pgmend stops with exit 1.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub build_wait: Duration,
    /// How long to wait for another pgmend working on the same database (0s: refuse at once).
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub runner_wait: Duration,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// human (alias table; the default) for people, json for programs (a stable, documented
    /// document); csv for `repair log` and `report overruns`; markdown and html for `report
    /// overruns`, which takes it from --output's extension when --format is not given.
    #[arg(long, global = true, value_enum)]
    pub format: Option<Format>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[value(alias = "table")]
    Human,
    Json,
    Csv,
    Markdown,
    Html,
    /// An Excel workbook; `report overruns` only, with --output FILE.xlsx.
    Xlsx,
    /// The OpenMetrics (Prometheus) text format; `verify` and `repair status` only (hidden from
    /// the lists of the commands that do not take it; theirs say so).
    #[value(hide = true)]
    Openmetrics,
}

impl Format {
    /// As `--format` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Human => "human",
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Markdown => "markdown",
            Format::Html => "html",
            Format::Xlsx => "xlsx",
            Format::Openmetrics => "openmetrics",
        }
    }
}
