//! `pgmend demo`: a throwaway PostgreSQL holding the incident's dirty legacy data, adopted
//! and migrated with the same commands a release engineer would type.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cli::DemoArgs;
use crate::error::Outcome;
use crate::localpg::LocalPg;
use crate::migrate::source::Source;

/// Silver Week: three 1,000-yen campaigns, budgets of the seed (100,000 / 300,000 /
/// 300,000 yen for 300 members) scaled to the member count, double taps that left
/// duplicates (some redeemed), and a campaigns.issued_yen that lost updates. Deterministic:
/// the same --members gives the same rows (coupon ids aside).
const DIRTY_DATA_SQL: &str = "
INSERT INTO campaigns (campaign_id, discount_yen, budget_yen, issued_yen)
SELECT id, 1000, (budget::bigint * $1::int / 300)::int, 0
  FROM (VALUES ('SW-A', 100000), ('SW-B', 300000), ('SW-C', 300000)) v(id, budget);
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at)
SELECT gen_random_uuid(), c.campaign_id, 'm' || lpad(m::text, 7, '0'), '2026-09', c.discount_yen,
       timestamptz '2026-09-19 09:00+09' + (h.r % 432000) * interval '1 second' + k * interval '180 milliseconds',
       CASE WHEN (h.r / 7 + k * 13) % 100 < 35 THEN timestamptz '2026-09-25 12:00+09' + (h.r % 1000) * interval '1 minute' END
  FROM generate_series(1, $1::int) m
 CROSS JOIN campaigns c
 CROSS JOIN LATERAL (SELECT hashtext(c.campaign_id || ':' || m)::bigint & 2147483647 AS r) h
 CROSS JOIN LATERAL generate_series(1, CASE WHEN h.r % 100 < $4::int THEN 3 WHEN h.r % 100 < $4::int + $5::int THEN 2 ELSE 1 END) k
 WHERE (h.r / 100) % 100 < CASE c.campaign_id WHEN 'SW-A' THEN $2::int ELSE $3::int END;
UPDATE campaigns c SET issued_yen = (s.total * 0.93)::int
  FROM (SELECT campaign_id, sum(amount_yen) AS total FROM issued_coupons GROUP BY 1) s
 WHERE s.campaign_id = c.campaign_id;
ANALYZE campaigns, issued_coupons;";

pub fn run(args: &DemoArgs) -> Result<Outcome> {
    if args.members == 0 || args.members > 10_000_000 {
        bail!("--members must be between 1 and 10000000");
    }
    say("Starting a throwaway PostgreSQL from this machine's server binaries...");
    let pg = LocalPg::start(args.keep)?;
    let url = pg.url("postgres");
    let v1 = Source::Embedded
        .load()?
        .into_iter()
        .find(|m| m.version == 1)
        .context("the built-in migrations have no V1")?;

    say(&format!(
        "Playing production: the legacy schema (V1) with {} members' Silver Week coupons, duplicates and drifted counters...",
        args.members
    ));
    let mut client = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)
        .context("connecting to the throwaway server")?;
    client
        .batch_execute(&v1.sql)
        .context("creating the legacy schema")?;
    let members = i32::try_from(args.members)?;
    generate_dirty_data(&mut client, members)?;
    let row = client.query_one(
        "SELECT count(*), count(*) - count(DISTINCT (campaign_id, member_id)) FROM issued_coupons",
        &[],
    )?;
    say(&format!(
        "{} coupons, of which {} are duplicates of a (campaign, member) pair.",
        row.get::<_, i64>(0),
        row.get::<_, i64>(1)
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
        &url,
        "What does pgmend know about this database? Nothing yet: V1 is unrecorded.",
        &["migrate", "status"],
    )?;
    step(
        &url,
        "Adopt the live schema as V1 (checked against the file, not run).",
        &["migrate", "baseline", "--yes"],
    )?;
    step(
        &url,
        "Preview the whole release, in read-only transactions: migrations with their locks and censuses, and the repairs as diffs of the rows they would change.",
        &["plan", "--sample", "3"],
    )?;
    step(
        &url,
        "Apply it: expand (V2), void the duplicates in batches, build the unique index concurrently, rebuild the counters, and stop at the deploy gate.",
        &["apply", "--yes"],
    )?;
    say("Here a release engineer deploys the new application (it maintains the counters exactly and upserts against the unique index). There is no application in this demo, so we confirm at once: the counters are rebuilt again, then the NOT VALID budget check is added.");
    step(
        &url,
        "Pass the gate.",
        &["apply", "--yes", "--confirm", "deploy-new-application"],
    )?;
    step(&url, "Check the invariants: counters equal the coupons, one live coupon per member, the index and the check in place.", &["verify"])?;
    step(
        &url,
        "Every repair run, with its ledger behind it (`pgmend repair log RUN_ID`).",
        &["repair", "status"],
    )?;
    step(&url, "And the migrations.", &["migrate", "status"])?;
    step(
        &url,
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
            &url,
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
            "The server keeps running, and its files (data directory, socket, log) stay in {root} until you remove them. Connect with:\n  psql '{url}'\nStop the server and remove its files with:\n  {stop} && rm -rf {root}",
            root = pg.root.display(),
            stop = pg.stop_command(),
        ));
    } else {
        say("Done; the throwaway server is being removed. On a real database, set DATABASE_URL (or PGHOST, PGUSER, ...) and run the same commands.");
    }
    Ok(Outcome::Done)
}

/// Fills a legacy (V1) schema with the Silver Week data for `members` members.
pub fn generate_dirty_data(client: &mut postgres::Client, members: i32) -> Result<()> {
    generate_dirty_data_shaped(client, members, &Shape::SEED)
}

/// How many members take each campaign and how many of their coupons are duplicated.
pub struct Shape {
    /// Percent of members with a coupon of SW-A, and of SW-B and SW-C.
    pub takes_a: i32,
    pub takes_b_c: i32,
    /// Percent of (campaign, member) groups with three coupons, and with two.
    pub triples: i32,
    pub doubles: i32,
}

impl Shape {
    /// The demo's and the tests' data: about 2.5 coupons per member, one in six a duplicate.
    pub const SEED: Shape = Shape {
        takes_a: 55,
        takes_b_c: 75,
        triples: 5,
        doubles: 10,
    };
}

pub fn generate_dirty_data_shaped(
    client: &mut postgres::Client,
    members: i32,
    shape: &Shape,
) -> Result<()> {
    for statement in DIRTY_DATA_SQL.split(';').filter(|s| !s.trim().is_empty()) {
        if statement.contains("$2") {
            client.execute(
                statement,
                &[
                    &members,
                    &shape.takes_a,
                    &shape.takes_b_c,
                    &shape.triples,
                    &shape.doubles,
                ],
            )
        } else if statement.contains("$1") {
            client.execute(statement, &[&members])
        } else {
            client.execute(statement, &[])
        }
        .context("generating the dirty data")?;
    }
    Ok(())
}

fn say(line: &str) {
    crate::say!("\n>>> {line}");
}

fn step(url: &str, explanation: &str, args: &[&str]) -> Result<()> {
    say(explanation);
    crate::say!("$ pgmend {}", args.join(" "));
    let exe = std::env::current_exe().context("finding the pgmend binary")?;
    let status = Command::new(exe)
        .args(args)
        .env("DATABASE_URL", url)
        .status()
        .context("running pgmend")?;
    match status.code() {
        Some(0) => Ok(()),
        // A status with findings is part of the story.
        Some(1) if args == ["migrate", "status"] => Ok(()),
        code => bail!("`pgmend {}` exited with {code:?}", args.join(" ")),
    }
}
