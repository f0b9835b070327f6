//! Shared by the benchmarks: the release binary, the legacy data, a child process's peak
//! resident memory, waiting for a database's server processes to exit, the speed settings,
//! WAL and checkpoint readings, and comparing two databases' rows row for row.

// Each example includes this module and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::Result;

/// The source tree: `PGMEND_BENCH_TREE`, else the one the example was built in (a copy of the
/// tree on another machine sets it: `scripts/bench-many-cores.sh`).
pub fn tree() -> PathBuf {
    std::env::var_os("PGMEND_BENCH_TREE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

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
    let newest = newest_change(&tree().join("src"))?;
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
    let v1 = std::fs::read_to_string(tree().join("migrations/V1__legacy_baseline.sql"))?;
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

/// The speed benchmark's server settings, after `LocalPg`'s `fsync=off`,
/// `synchronous_commit=off` and `full_page_writes=off` (later lines of `postgresql.conf` win):
/// full-page images written as in production, and no checkpoint inside either timed run (each
/// starts right after a `CHECKPOINT`; one the WAL volume forces is reported).
pub const SPEED_SETTINGS: [(&str, &str); 3] = [
    ("full_page_writes", "on"),
    ("max_wal_size", "32GB"),
    ("checkpoint_timeout", "1h"),
];

/// Differing rows shown per table when the end states differ.
pub const SHOWN: usize = 5;

/// Where the next WAL record goes: the insert position (`pg_current_wal_lsn()` is the write
/// position, which lags it by what is still in `wal_buffers`, up to 4 MB here).
pub fn wal_lsn(c: &mut postgres::Client) -> Result<i64> {
    Ok(c.query_one(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint",
        &[],
    )?
    .get(0))
}

/// The whole cluster's full-page images and WAL bytes so far (`pg_stat_wal`): only what the
/// server processes have flushed to the cumulative statistics (see [`flush_stats`]), so the
/// reading session flushes its own first (the admin's `CREATE DATABASE`s write whole pages).
pub fn wal_stats(c: &mut postgres::Client) -> Result<(i64, i64)> {
    flush_stats(c)?;
    let row = c.query_one("SELECT wal_fpi, wal_bytes::bigint FROM pg_stat_wal", &[])?;
    Ok((row.get(0), row.get(1)))
}

/// Has the backend of `c` flush its pending statistics before it answers again (PostgreSQL 15+:
/// otherwise a backend flushes at most once a second, and up to 10 s after it went idle).
pub fn flush_stats(c: &mut postgres::Client) -> Result<()> {
    c.batch_execute("SELECT pg_stat_force_next_flush()")?;
    Ok(())
}

/// Checkpoints the server has begun so far (timed and requested).
pub fn checkpoints(c: &mut postgres::Client) -> Result<i64> {
    let version: i32 = c
        .query_one("SELECT current_setting('server_version_num')::int", &[])?
        .get(0);
    let sql = if version >= 170000 {
        "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    } else {
        "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    };
    Ok(c.query_one(sql, &[])?.get(0))
}

/// The tables of the connected database that autovacuum vacuumed or analyzed so far (the
/// database is a fresh copy, so: during the timed run), as `table (vacuum N, analyze M)`.
/// Autovacuum shares the two cores with the run it follows.
pub fn autovacuums(c: &mut postgres::Client) -> Result<Vec<String>> {
    Ok(c.query(
        "SELECT relname::text, autovacuum_count, autoanalyze_count FROM pg_stat_all_tables
              WHERE autovacuum_count + autoanalyze_count > 0 ORDER BY relname",
        &[],
    )?
    .iter()
    .map(|r| {
        format!(
            "{} (vacuum {}, analyze {})",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2)
        )
    })
    .collect())
}

/// Runs a `CHECKPOINT` and returns the checkpoint count once it includes that one (the
/// checkpointer reports its count just after it wakes the waiting backend), so that a later
/// count above it means a checkpoint during what came in between.
pub fn checkpoint(admin: &mut postgres::Client) -> Result<i64> {
    let before = checkpoints(admin)?;
    admin.batch_execute("CHECKPOINT")?;
    let started = Instant::now();
    loop {
        let now = checkpoints(admin)?;
        if now > before || started.elapsed() > Duration::from_secs(5) {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One side's rows, read through a cursor 10,000 at a time, so that memory stays flat at any
/// size. Each row is its key (the first `keys` columns) and its value (the rest); the query
/// orders by the key, and [`Rows::next`] checks that it did.
pub struct Rows<'a> {
    tx: postgres::Transaction<'a>,
    fetched: std::vec::IntoIter<postgres::Row>,
    keys: usize,
    last: Option<Vec<String>>,
    done: bool,
}

impl<'a> Rows<'a> {
    fn open(c: &'a mut postgres::Client, sql: &str, keys: usize) -> Result<Rows<'a>> {
        let mut tx = c.transaction()?;
        tx.batch_execute(&format!("DECLARE bench_rows NO SCROLL CURSOR FOR {sql}"))?;
        Ok(Rows {
            tx,
            fetched: Vec::new().into_iter(),
            keys,
            last: None,
            done: false,
        })
    }

    fn next(&mut self) -> Result<Option<(Vec<String>, String)>> {
        loop {
            if let Some(row) = self.fetched.next() {
                let text = |i: usize| -> String {
                    row.get::<_, Option<String>>(i)
                        .unwrap_or_else(|| "NULL".into())
                };
                let key: Vec<String> = (0..self.keys).map(text).collect();
                let value = (self.keys..row.len())
                    .map(text)
                    .collect::<Vec<_>>()
                    .join(", ");
                // The merge below needs the server's order to be Rust's (byte order: the
                // throwaway cluster has no locale).
                anyhow::ensure!(
                    self.last.as_ref().is_none_or(|last| *last < key),
                    "rows not in key order: {:?} after {:?}",
                    key,
                    self.last
                );
                self.last = Some(key.clone());
                return Ok(Some((key, value)));
            }
            if self.done {
                return Ok(None);
            }
            let rows = self.tx.query("FETCH 10000 FROM bench_rows", &[])?;
            self.done = rows.is_empty();
            self.fetched = rows.into_iter();
        }
    }
}

/// Compares `sql`'s rows on both sides row for row, by key, streaming both in key order (a
/// merge: exact, and constant memory at millions of rows). Returns the number of rows on the
/// one-shot's side and the differing rows, the first [`SHOWN`] of them described.
pub fn compare_rows(
    one: &mut postgres::Client,
    via: &mut postgres::Client,
    sql: &str,
    keys: usize,
) -> Result<(u64, u64, Vec<String>)> {
    let mut a = Rows::open(one, sql, keys)?;
    let mut b = Rows::open(via, sql, keys)?;
    let (mut x, mut y) = (a.next()?, b.next()?);
    let (mut rows, mut differing, mut shown) = (0u64, 0u64, Vec::new());
    let mut differ = |key: &[String], one: Option<&str>, via: Option<&str>| {
        differing += 1;
        if shown.len() < SHOWN {
            shown.push(format!(
                "{}: one-shot {}, pgmend {}",
                key.join(" "),
                one.unwrap_or("(no row)"),
                via.unwrap_or("(no row)")
            ));
        }
    };
    loop {
        match (&x, &y) {
            (None, None) => break,
            (Some((k, v)), None) => {
                differ(k, Some(v), None);
                rows += 1;
                x = a.next()?;
            }
            (None, Some((k, v))) => {
                differ(k, None, Some(v));
                y = b.next()?;
            }
            (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                std::cmp::Ordering::Less => {
                    differ(ka, Some(va), None);
                    rows += 1;
                    x = a.next()?;
                }
                std::cmp::Ordering::Greater => {
                    differ(kb, None, Some(vb));
                    y = b.next()?;
                }
                std::cmp::Ordering::Equal => {
                    if va != vb {
                        differ(ka, Some(va), Some(vb));
                    }
                    rows += 1;
                    x = a.next()?;
                    y = b.next()?;
                }
            },
        }
    }
    Ok((rows, differing, shown))
}

/// Runs each statement as the admin, naming the one that fails.
pub fn execute_each(admin: &mut postgres::Client, statements: &[&str]) -> Result<()> {
    for sql in statements {
        admin
            .batch_execute(sql)
            .map_err(|e| anyhow::anyhow!("{sql}: {}", pgmend::error::describe(&e)))?;
    }
    Ok(())
}

/// "repair p50/p99/max" of each run in an apply's JSON steps, batch times in ms.
pub fn batch_times<'a>(runs: impl Iterator<Item = &'a serde_json::Value>) -> Vec<String> {
    runs.map(|r| {
        format!(
            "{} {}/{}/{}",
            r["run"]["repair"].as_str().unwrap_or("?"),
            r["batch_ms_p50"],
            r["batch_ms_p99"],
            r["batch_ms_max"]
        )
    })
    .collect()
}
