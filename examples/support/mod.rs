//! Shared by the benchmarks: the release binary, the legacy data, a child process's peak
//! resident memory, and waiting for a database's server processes to exit.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// `target/release/pgmend`, beside the running example; refuses when it was not built.
pub fn release_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("pgmend"))
        .ok_or_else(|| anyhow::anyhow!("cannot locate target/release"))?;
    anyhow::ensure!(
        exe.is_file(),
        "build the binary first: cargo build --release ({} missing)",
        exe.display()
    );
    // `cargo build --release --examples` does not rebuild the binary: measuring a stale one
    // would report figures of code that is no longer there.
    let built = std::fs::metadata(&exe)?.modified()?;
    let newest = newest_change(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    )))?;
    anyhow::ensure!(
        newest <= built,
        "{} is older than the sources: cargo build --release first",
        exe.display()
    );
    Ok(exe)
}

/// The newest modification time of a file under `dir`.
fn newest_change(dir: &std::path::Path) -> std::io::Result<std::time::SystemTime> {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let when = if entry.file_type()?.is_dir() {
            newest_change(&entry.path())?
        } else {
            entry.metadata()?.modified()?
        };
        newest = newest.max(when);
    }
    Ok(newest)
}

/// The legacy schema (V1) with the demo's Silver Week data for `members` members.
pub fn make_legacy(c: &mut postgres::Client, members: i32) -> anyhow::Result<()> {
    let v1 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/V1__legacy_baseline.sql"
    ))?;
    c.batch_execute(&v1)?;
    // The size the issue names: about 1.1 million coupons and 300,000 duplicates at 300,000
    // members (the demo's shape gives 740,000 and 120,000).
    pgmend::demo_data::generate_dirty_data_shaped(
        c,
        members,
        &pgmend::demo_data::Shape {
            takes_a: 90,
            takes_b_c: 90,
            triples: 7,
            doubles: 23,
            // 100 yen a coupon above 1,000,000 members, so that a campaign's total fits the
            // legacy `integer` columns (3,000,000 members issue about 3.7 billion yen at 1,000).
            discount_yen: if members > 1_000_000 { 100 } else { 1000 },
        },
    )
}

/// Waits for `child`, polling its peak resident set (VmHWM) every 20 ms; returns the peak in
/// KiB. The kernel keeps VmHWM as a high-water mark, so polling misses nothing but the last
/// 20 ms of a process's life.
pub fn wait_with_peak_rss(child: &mut Child) -> std::io::Result<u64> {
    let pid = child.id();
    let mut peak_kb: u64 = 0;
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
            return Ok(peak_kb);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until no backend connected to `dbname` remains among the children of the server whose
/// data directory is `data_dir`, except the processes in `except`; false if some remain after
/// `timeout`. A backend flushes its cumulative statistics (`pg_stat_wal`, say) when it exits, and
/// leaves `pg_stat_activity` just before that, so the view cannot tell when its figures are in;
/// the process's exit can. Backends are recognised by their process title, `postgres: USER
/// DATABASE HOST ACTIVITY` (autovacuum workers are not waited for).
#[allow(dead_code)] // bench_report includes this module too and does not wait
pub fn wait_for_backends_to_exit(
    data_dir: &Path,
    dbname: &str,
    except: &[u32],
    timeout: Duration,
) -> anyhow::Result<bool> {
    let postmaster: u32 = std::fs::read_to_string(data_dir.join("postmaster.pid"))?
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no pid in {}/postmaster.pid", data_dir.display()))?;
    let started = Instant::now();
    loop {
        let mut remaining = false;
        for entry in std::fs::read_dir("/proc")?.filter_map(Result::ok) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if except.contains(&pid) {
                continue;
            }
            // "PID (COMM) STATE PPID ...": COMM may hold spaces, so read after the last ')'.
            let ppid = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                });
            if ppid != Some(postmaster) {
                continue;
            }
            // A zombie's command line is empty: it has exited, statistics flushed.
            let title = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let title = String::from_utf8_lossy(&title).replace('\0', " ");
            let words: Vec<&str> = title.split_whitespace().collect();
            if words.first() == Some(&"postgres:")
                && words.get(1) != Some(&"autovacuum")
                && words.get(2) == Some(&dbname)
            {
                remaining = true;
                break;
            }
        }
        if !remaining {
            return Ok(true);
        }
        if started.elapsed() > timeout {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Seed 000's migration, as one transaction (its CREATE UNIQUE INDEX is the plain,
/// locking kind: that is what "one-shot" means).
pub const ONE_SHOT: &str = "
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
