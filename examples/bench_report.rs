//! Benchmark: `pgmend report overruns` versus the bare aggregate SQL it needs (the campaign
//! sums and the member-months past the cap, every row fetched by a client), in one run on
//! one throwaway server, so the figures are ratios of the same machine's moment.
//!
//!     cargo build --release && cargo run --release --example bench_report -- 300000
//!
//! Measured twice: on the legacy data (the report ranks the unmarked duplicates itself) and
//! after `pgmend apply --confirm deploy-new-application` (released). Each timing is the best of
//! three, taken alternately, with pgmend writing to a file (`--output`) and its peak RSS polled.
//! On the released data it also times `pgmend verify` (the daily reconciliation).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pgmend::localpg::LocalPg;

mod support;

/// What a person would type to get the report's figures, before the release: nothing is
/// voided yet, duplicates are found with the release's ranking.
const BARE_LEGACY: [&str; 2] = [
    "SELECT campaign_id, sum(amount_yen), count(*),
            count(*) FILTER (WHERE rn > 1 AND redeemed_at IS NOT NULL),
            sum(amount_yen) FILTER (WHERE rn > 1 AND redeemed_at IS NOT NULL)
       FROM (SELECT campaign_id, amount_yen, redeemed_at,
                    row_number() OVER (PARTITION BY campaign_id, member_id
                                       ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn
               FROM issued_coupons) c
      GROUP BY campaign_id",
    "SELECT member_id, month, sum(amount_yen) FROM issued_coupons
      GROUP BY member_id, month HAVING sum(amount_yen) > 2000 ORDER BY member_id, month",
];

/// The same after the release: the flags are columns.
const BARE_RELEASED: [&str; 2] = [
    "SELECT campaign_id,
            sum(amount_yen) FILTER (WHERE voided_at IS NULL), count(*) FILTER (WHERE voided_at IS NULL),
            count(*) FILTER (WHERE voided_at IS NOT NULL), sum(amount_yen) FILTER (WHERE voided_at IS NOT NULL),
            count(*) FILTER (WHERE legacy_duplicate AND voided_at IS NULL AND redeemed_at IS NOT NULL),
            sum(amount_yen) FILTER (WHERE legacy_duplicate AND voided_at IS NULL AND redeemed_at IS NOT NULL),
            count(*) FILTER (WHERE voided_at IS NOT NULL AND redeemed_at IS NOT NULL)
       FROM issued_coupons GROUP BY campaign_id",
    "SELECT member_id, month, sum(amount_yen) FROM issued_coupons WHERE voided_at IS NULL
      GROUP BY member_id, month HAVING sum(amount_yen) > 2000 ORDER BY member_id, month",
];

fn bare(c: &mut postgres::Client, sql: &[&str]) -> Result<(Duration, usize)> {
    let t = Instant::now();
    let mut rows = 0;
    let mut tx = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    for s in sql {
        rows = tx.query(*s, &[])?.len();
    }
    tx.rollback()?;
    Ok((t.elapsed(), rows))
}

fn report(exe: &std::path::Path, url: &str, format: &str) -> Result<(Duration, u64)> {
    let out = format!("/tmp/bench-report.{format}");
    let t = Instant::now();
    let mut child = Command::new(exe)
        .args([
            "report", "overruns", "--format", format, "--output", &out, "--force",
        ])
        .env("DATABASE_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let peak = support::wait_with_peak_rss(&mut child)?;
    let elapsed = t.elapsed();
    let output = child.wait_with_output()?;
    anyhow::ensure!(
        output.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((elapsed, peak))
}

fn main() -> Result<()> {
    let members: i32 = std::env::args()
        .nth(1)
        .map(|a| a.parse().context("member count"))
        .transpose()?
        .unwrap_or(300_000);
    let exe = support::release_binary()?;
    let pg = LocalPg::start(false)?;
    let mut admin = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)?;
    admin.batch_execute("CREATE DATABASE bench")?;
    let url = pg.url("bench");
    let mut c = postgres::Client::connect(&pg.conninfo("bench"), postgres::NoTls)?;
    support::make_legacy(&mut c, members)?;
    c.batch_execute("VACUUM ANALYZE")?;
    let coupons: i64 = c
        .query_one("SELECT count(*) FROM issued_coupons", &[])?
        .get(0);
    println!("{members} members, {coupons} coupons");
    println!("| state | member-months over the cap | bare SQL | report json | csv | table | html | peak RSS |");
    println!("|---|---|---|---|---|---|---|---|");

    for state in ["legacy", "released"] {
        if state == "released" {
            for args in [
                &["migrate", "baseline", "--yes"][..],
                &["apply", "--yes", "--confirm", "deploy-new-application"][..],
            ] {
                let status = Command::new(&exe)
                    .args(args)
                    .env("DATABASE_URL", &url)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()?;
                anyhow::ensure!(status.success(), "pgmend {args:?} failed");
            }
            c.batch_execute("VACUUM ANALYZE")?;
        }
        let sql = if state == "legacy" {
            &BARE_LEGACY
        } else {
            &BARE_RELEASED
        };
        let formats = ["json", "csv", "table", "html"];
        let mut best_bare = Duration::MAX;
        let mut best = [Duration::MAX; 4];
        let mut peak_kb = 0;
        let mut over = 0;
        for _ in 0..3 {
            let (t, rows) = bare(&mut c, sql)?;
            best_bare = best_bare.min(t);
            over = rows;
            for (i, f) in formats.iter().enumerate() {
                let (t, kb) = report(&exe, &url, f)?;
                best[i] = best[i].min(t);
                peak_kb = peak_kb.max(kb);
            }
        }
        let cell = |d: Duration| {
            format!(
                "{:.2}s ({:.2}x)",
                d.as_secs_f64(),
                d.as_secs_f64() / best_bare.as_secs_f64()
            )
        };
        if state == "released" {
            let mut best_verify = Duration::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                let status = Command::new(&exe)
                    .args(["verify", "--format", "json"])
                    .env("DATABASE_URL", &url)
                    .stdout(Stdio::null())
                    .status()?;
                anyhow::ensure!(status.success(), "verify found problems after the release");
                best_verify = best_verify.min(t.elapsed());
            }
            eprintln!(
                "pgmend verify on the released data: {:.2}s (best of three)",
                best_verify.as_secs_f64()
            );
        }
        println!(
            "| {state} | {over} | {:.2}s | {} | {} | {} | {} | {:.1} MB |",
            best_bare.as_secs_f64(),
            cell(best[0]),
            cell(best[1]),
            cell(best[2]),
            cell(best[3]),
            peak_kb as f64 / 1024.0
        );
    }
    Ok(())
}
