//! `pgmend demo`: a throwaway PostgreSQL holding the incident's dirty legacy data, adopted
//! and migrated with the same commands a release engineer would type.
//!
//! It starts a `LocalPg`, creates V1 and generates the incident's dirty data with
//! `demo_data::generate_dirty_data` (every row derived from a hash of campaign and member, so the
//! same `--members` gives the same data, coupon ids aside). Before the release it tells the lost
//! updates, read with `report::legacy_counter::read`. Then it runs the pgmend binary itself
//! (`current_exe`) with `DATABASE_URL` set, step by step, so the tour uses the code paths a release
//! engineer would: `migrate status`, `migrate baseline --yes`, `plan --sample 3`, `apply --yes`
//! (which stops at the gate), `apply --yes --confirm deploy-new-application`, `verify`, `repair
//! status`, `migrate status`, `report overruns` as a table, and the same report written with
//! `--output` as a workbook, CSV (`--excel`), JSON and HTML into `--reports-dir` (default
//! `./pgmend-demo-reports`). Any exit code but 0 stops the demo, except exit 1 from `migrate
//! status`. A signal ends it with 128 + its number, after a line saying what becomes of the
//! throwaway server.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cli::DemoArgs;
use crate::demo_data::generate_dirty_data;
use crate::error::Outcome;
use crate::localpg::LocalPg;
use crate::migrate::source::Source;

pub fn run(args: &DemoArgs) -> Result<Outcome> {
    if args.members == 0 || args.members > 10_000_000 {
        bail!("--members must be between 1 and 10000000");
    }
    let on_stop = on_signal("nothing was started yet".into());
    say("Starting a throwaway PostgreSQL from this machine's server binaries...");
    let pg = LocalPg::start(args.keep)?;
    let url = pg.url("postgres");
    *lock(&on_stop) = if args.keep {
        format!(
            "the throwaway server keeps running (--keep), its files in {root}. Stop it and remove them with:\n  {stop} && rm -rf {root}",
            root = pg.root.display(),
            stop = pg.stop_command(),
        )
    } else {
        "the throwaway server and its files are being removed; nothing else was touched. Run `pgmend demo` again to start over".into()
    };
    // The tour runs the coupon release built into pgmend, written out beside the server's files.
    let target = Target {
        url: url.clone(),
        release: pg.root.join("release"),
    };
    crate::release::project::init(&target.release)?;
    let v1 = Source::Embedded
        .load()?
        .into_iter()
        .find(|m| m.version == 1)
        .context("the built-in migrations have no V1")?;

    say(&format!(
        "Playing production: the legacy schema (V1) with {} members' Silver Week coupons, duplicates and drifted counters...",
        crate::human::int(args.members)
    ));
    let mut client = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)
        .context("connecting to the throwaway server")?;
    client
        .batch_execute(&v1.sql)
        .context("creating the legacy schema")?;
    let members = i32::try_from(args.members)?;
    generate_dirty_data(&mut client, members)?;
    let (coupons, duplicates) = crate::demo_data::coupons_and_duplicates(&mut client)?;
    say(&format!(
        "{} coupons, of which {} are duplicates of a (campaign, member) pair.",
        crate::human::int(coupons),
        crate::human::int(duplicates)
    ));
    let legacy = crate::report::legacy_counter::read(&mut client)?;
    let (counter, issued) = legacy.campaigns.values().fold((0, 0), |(c, i), f| {
        (c + f.legacy_counter_yen, i + f.old_system_issued_yen)
    });
    say(&format!(
        "The old system's counter (campaigns.issued_yen) says {} yen were issued; its coupons add up to {} yen: {} yen of lost updates, double taps that read the counter at the same moment. The counter stops at the deploy and the rollback repair rewrites it, so pgmend records both figures when the release passes the deploy gate; the finance report shows them per campaign.",
        crate::human::int(counter),
        crate::human::int(issued),
        crate::human::int(issued - counter),
    ));

    step(
        &target,
        "What does pgmend know about this database? Nothing yet: V1 is unrecorded.",
        &["migrate", "status"],
    )?;
    step(
        &target,
        "Adopt the live schema as V1 (checked against the file, not run).",
        &["migrate", "baseline", "--yes"],
    )?;
    step(
        &target,
        "Preview the whole release, in read-only transactions: migrations with their locks and censuses, and the repairs as diffs of the rows they would change.",
        &["plan", "--sample", "3"],
    )?;
    step(
        &target,
        "Apply it: expand (V2), void the duplicates in batches, build the unique index concurrently, rebuild the counters, and stop at the deploy gate.",
        &["apply", "--yes"],
    )?;
    say("Here a release engineer deploys the new application (it maintains the counters exactly and upserts against the unique index). There is no application in this demo, so we confirm at once: the counters are rebuilt again, then the NOT VALID budget check is added.");
    step(
        &target,
        "Pass the gate.",
        &["apply", "--yes", "--confirm", "deploy-new-application"],
    )?;
    step(&target, "Check the invariants: counters equal the coupons, one live coupon per member, the index and the check in place.", &["verify"])?;
    step(
        &target,
        "Every repair run, with its ledger behind it (`pgmend repair log RUN_ID`).",
        &["repair", "status"],
    )?;
    step(&target, "And the migrations.", &["migrate", "status"])?;
    step(
        &target,
        "The finance report: what the incident already cost (the constraints only stop new overruns), from one read-only snapshot.",
        &["report", "overruns"],
    )?;
    std::fs::create_dir_all(&args.reports_dir).with_context(|| {
        format!(
            "creating the reports directory {}",
            args.reports_dir.display()
        )
    })?;
    let mut written = Vec::new();
    for (format, extra) in [
        ("xlsx", None),
        ("csv", Some("--excel")),
        ("json", None),
        ("html", None),
    ] {
        // A CSV holds one section: `overruns.csv` becomes overruns-summary.csv, -campaigns.csv
        // and -members.csv.
        let path = args.reports_dir.join(format!("overruns.{format}"));
        let path_arg = path.display().to_string();
        let mut report_args = vec![
            "report", "overruns", "--format", format, "--output", &path_arg, "--force",
        ];
        report_args.extend(extra);
        step(
            &target,
            &if format == "xlsx" {
                "The same report as an Excel workbook, the file accounting works in: summary, campaigns with a chart, the member-months over the cap and the redeemed duplicates, amounts as numbers in yen.".to_string()
            } else {
                format!(
                    "The same report as {format}, for the spreadsheet, the scripts and the eyes."
                )
            },
            &report_args,
        )?;
        if format == "csv" {
            written.push(
                args.reports_dir
                    .join("overruns-{summary,campaigns,members}.csv")
                    .display()
                    .to_string(),
            );
        } else {
            written.push(path_arg);
        }
    }
    say(&format!(
        "The reports are in {}. On a real database, point DATABASE_URL at it (a read-only replica will do) and run:\n  pgmend report overruns --output overruns.xlsx        (add --lang ja for Japanese headers)",
        written.join(", ")
    ));

    if args.keep {
        say(&format!(
            "The server keeps running, and its files (data directory, socket, log) stay in {root} until you remove them. Point pgmend at it with:\n  export DATABASE_URL='{url}'\nthen try `pgmend migrate status` or `pgmend repair status`. Connect with psql:\n  psql '{url}'\nStop the server and remove its files with:\n  {stop} && rm -rf {root}",
            root = pg.root.display(),
            stop = pg.stop_command(),
        ));
    } else {
        say("Done; the throwaway server is being removed. On a real database, set DATABASE_URL (or PGHOST, PGUSER, ...) and run the same commands.");
    }
    Ok(Outcome::Done)
}

/// What a signal leaves: said before the demo exits as the shell expects (128 + the
/// signal's number; the pgmend step running then gets the signal too and stops itself).
type OnStop = std::sync::Arc<std::sync::Mutex<String>>;

fn lock(on_stop: &OnStop) -> std::sync::MutexGuard<'_, String> {
    on_stop
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Says, on SIGINT, SIGTERM or SIGHUP, that the demo was interrupted and what becomes of the
/// throwaway server (the clean-up watchdog removes it), then exits.
fn on_signal(leaves: String) -> OnStop {
    let on_stop: OnStop = std::sync::Arc::new(std::sync::Mutex::new(leaves));
    let said = on_stop.clone();
    crate::signals::exit_on_signal(move |signal| {
        format!(
            "\npgmend: the demo was interrupted ({}); {}.",
            signal.name(),
            lock(&said)
        )
    });
    on_stop
}

fn say(line: &str) {
    crate::say!("\n>>> {line}");
}

/// Where the tour's commands run: the throwaway server, and the built-in release written out
/// beside its files (`PGMEND_RELEASE`).
struct Target {
    url: String,
    release: std::path::PathBuf,
}

fn step(target: &Target, explanation: &str, args: &[&str]) -> Result<()> {
    say(explanation);
    crate::say!("$ pgmend {}", args.join(" "));
    let exe = std::env::current_exe().context("finding the pgmend binary")?;
    let status = Command::new(exe)
        .args(args)
        .env("DATABASE_URL", &target.url)
        .env("PGMEND_RELEASE", &target.release)
        .status()
        .context("running pgmend")?;
    match status.code() {
        Some(0) => Ok(()),
        // A status with findings is part of the story.
        Some(1) if args == ["migrate", "status"] => Ok(()),
        code => bail!("`pgmend {}` exited with {code:?}", args.join(" ")),
    }
}

/// `pgmend init DIR`: writes the built-in coupon release to DIR as a starting point.
pub fn init(args: &crate::cli::InitArgs) -> Result<Outcome> {
    use std::io::Write;
    let written = crate::release::project::init(&args.dir)?;
    let mut out = crate::output::stdout();
    writeln!(
        out,
        "Wrote the coupon release built into pgmend to {} ({} files): release.toml, migrations/ and repairs/.",
        args.dir.display(),
        written.len()
    )?;
    writeln!(
        out,
        "Make it yours: give it a name of its own (name = \"...\" at the top of release.toml), replace the steps, migrations and repairs, then preview it with: pgmend plan --release {}",
        args.dir.display()
    )?;
    Ok(Outcome::Done)
}
