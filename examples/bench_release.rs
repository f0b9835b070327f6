//! Benchmark: the one-shot SQL of seed 000 versus `pgmend apply`, on identical copies of the
//! same legacy data, in one run on one throwaway server (so the figures are ratios of the
//! same machine's moment).
//!
//!     cargo run --release --example bench_release -- 30000 300000
//!
//! For each member count: wall time of each, their ratio, rows/s, pgmend's batch transaction
//! times (p50/p99/max per repair), pgmend's peak RSS (VmHWM, polled), and WAL bytes written.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pgmend::localpg::LocalPg;

/// Seed 000's migration, as one transaction (its CREATE UNIQUE INDEX is the plain,
/// locking kind: that is what "one-shot" means).
const ONE_SHOT: &str = "
BEGIN;
ALTER TABLE issued_coupons
  ADD COLUMN voided_at timestamptz,
  ADD COLUMN legacy_duplicate boolean NOT NULL DEFAULT false;
WITH ranked AS (
  SELECT coupon_id, redeemed_at,
         row_number() OVER (PARTITION BY campaign_id, member_id
                            ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn
    FROM issued_coupons)
UPDATE issued_coupons i
   SET voided_at        = CASE WHEN r.redeemed_at IS NULL THEN now() END,
       legacy_duplicate = true
  FROM ranked r
 WHERE i.coupon_id = r.coupon_id AND r.rn > 1;
CREATE UNIQUE INDEX one_coupon_per_member ON issued_coupons (campaign_id, member_id)
  WHERE NOT legacy_duplicate;
CREATE TABLE campaign_budgets AS
SELECT c.campaign_id, c.discount_yen, c.budget_yen,
       COALESCE(SUM(i.amount_yen) FILTER (WHERE i.voided_at IS NULL), 0)::int AS issued_yen
  FROM campaigns c LEFT JOIN issued_coupons i USING (campaign_id)
 GROUP BY 1, 2, 3;
ALTER TABLE campaign_budgets ADD PRIMARY KEY (campaign_id);
ALTER TABLE campaign_budgets
  ADD CONSTRAINT issued_within_budget CHECK (issued_yen BETWEEN 0 AND budget_yen) NOT VALID;
CREATE TABLE member_monthly_usage AS
SELECT member_id, month, SUM(amount_yen)::int AS used_yen
  FROM issued_coupons WHERE voided_at IS NULL GROUP BY 1, 2;
ALTER TABLE member_monthly_usage ADD PRIMARY KEY (member_id, month);
COMMIT;";

fn wal_lsn(c: &mut postgres::Client) -> Result<i64> {
    Ok(c.query_one(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
        &[],
    )?
    .get(0))
}

fn state(c: &mut postgres::Client) -> Result<String> {
    Ok(c.query_one(
        "SELECT format('%s coupons, %s legacy duplicates, %s voided, budgets %s, usage rows with yen %s',
                count(*), count(*) FILTER (WHERE legacy_duplicate), count(*) FILTER (WHERE voided_at IS NOT NULL),
                (SELECT string_agg(campaign_id || '=' || issued_yen, ' ' ORDER BY campaign_id) FROM campaign_budgets),
                (SELECT count(*) FILTER (WHERE used_yen > 0) FROM member_monthly_usage))
           FROM issued_coupons",
        &[],
    )?
    .get(0))
}

fn main() -> Result<()> {
    let sizes: Vec<i32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().context("member counts"))
        .collect::<Result<_>>()?;
    let sizes = if sizes.is_empty() {
        vec![30_000, 300_000]
    } else {
        sizes
    };
    let exe = std::env::current_exe()?
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("pgmend");
    anyhow::ensure!(
        exe.is_file(),
        "build the binary first: cargo build --release ({} missing)",
        exe.display()
    );
    let pg = LocalPg::start(false)?;
    let mut admin = postgres::Client::connect(&pg.conninfo("postgres"), postgres::NoTls)?;
    println!("| members | coupons | duplicates changed | one-shot | pgmend | ratio (one-shot/pgmend) | pgmend rows/s | batches p50/p99/max ms | peak RSS | WAL one-shot | WAL pgmend |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for members in sizes {
        for sql in [
            "DROP DATABASE IF EXISTS src",
            "DROP DATABASE IF EXISTS oneshot",
            "DROP DATABASE IF EXISTS viapgmend",
            "CREATE DATABASE src",
        ] {
            admin
                .batch_execute(sql)
                .map_err(|e| anyhow::anyhow!("{sql}: {}", pgmend::error::describe(&e)))?;
        }
        {
            let mut c = postgres::Client::connect(&pg.conninfo("src"), postgres::NoTls)?;
            let v1 = std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/migrations/V1__legacy_baseline.sql"
            ))?;
            c.batch_execute(&v1)?;
            pgmend::commands::demo::generate_dirty_data(&mut c, members)?;
        }
        for sql in [
            "CREATE DATABASE oneshot TEMPLATE src",
            "CREATE DATABASE viapgmend TEMPLATE src",
            "CHECKPOINT",
        ] {
            admin
                .batch_execute(sql)
                .map_err(|e| anyhow::anyhow!("{sql}: {}", pgmend::error::describe(&e)))?;
        }

        let mut one = postgres::Client::connect(&pg.conninfo("oneshot"), postgres::NoTls)?;
        let coupons: i64 = one
            .query_one("SELECT count(*) FROM issued_coupons", &[])?
            .get(0);
        let wal0 = wal_lsn(&mut one)?;
        let t = Instant::now();
        one.batch_execute(ONE_SHOT)
            .map_err(|e| anyhow::anyhow!("one-shot SQL: {}", pgmend::error::describe(&e)))?;
        let one_time = t.elapsed();
        let one_wal = wal_lsn(&mut one)? - wal0;
        let one_state = state(&mut one)?;

        let url = pg.url("viapgmend");
        let status = Command::new(&exe)
            .args(["migrate", "baseline", "--yes"])
            .env("DATABASE_URL", &url)
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "baseline failed");
        let mut via = postgres::Client::connect(&pg.conninfo("viapgmend"), postgres::NoTls)?;
        admin.batch_execute("CHECKPOINT")?;
        let wal0 = wal_lsn(&mut via)?;
        let t = Instant::now();
        let mut child = Command::new(&exe)
            .args([
                "apply",
                "--yes",
                "--confirm",
                "deploy-new-application",
                "--format",
                "json",
            ])
            .env("DATABASE_URL", &url)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(format!(
                "/tmp/bench-pgmend-{members}.log"
            ))?)
            .spawn()?;
        let pid = child.id();
        let mut peak_kb: u64 = 0;
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || std::io::read_to_string(stdout));
        loop {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                for line in status.lines().filter(|l| l.starts_with("VmHWM:")) {
                    let kb: u64 = line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    peak_kb = peak_kb.max(kb);
                }
            }
            if child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let via_time = t.elapsed();
        let out = reader.join().unwrap()?;
        let via_wal = wal_lsn(&mut via)? - wal0;
        let via_state = state(&mut via)?;
        anyhow::ensure!(
            one_state == via_state,
            "end states differ:\n one-shot: {one_state}\n pgmend:   {via_state}"
        );
        let doc: serde_json::Value = serde_json::from_str(&out).context("pgmend's JSON")?;
        let runs: Vec<&serde_json::Value> = doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s.get("run"))
            .collect();
        let changed: i64 = runs
            .iter()
            .map(|r| r["run"]["changed"].as_i64().unwrap_or(0))
            .sum();
        let void_changed = runs
            .first()
            .map(|r| r["run"]["changed"].as_i64().unwrap_or(0))
            .unwrap_or(0);
        let batches: Vec<String> = runs
            .iter()
            .map(|r| {
                format!(
                    "{} {}/{}/{}",
                    r["run"]["repair"].as_str().unwrap_or("?"),
                    r["batch_ms_p50"],
                    r["batch_ms_p99"],
                    r["batch_ms_max"]
                )
            })
            .collect();
        println!(
            "| {members} | {coupons} | {void_changed} | {:.1}s | {:.1}s | {:.2}x | {:.0} | {} | {:.1} MB | {:.1} MB | {:.1} MB |",
            one_time.as_secs_f64(),
            via_time.as_secs_f64(),
            one_time.as_secs_f64() / via_time.as_secs_f64(),
            changed as f64 / via_time.as_secs_f64(),
            batches.join("; "),
            peak_kb as f64 / 1024.0,
            one_wal as f64 / 1e6,
            via_wal as f64 / 1e6,
        );
        eprintln!("end state (both): {via_state}");
    }
    Ok(())
}
