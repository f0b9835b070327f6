//! Kill campaign: the whole release, SIGKILLed at random moments and restarted until it
//! finishes, compared with an uninterrupted run on an identical copy of the same data.
//!
//!     cargo build --release && cargo build --release --example kill_campaign
//!     cargo run --release --example kill_campaign -- --iterations 1000 --members 2000 [--seed S]
//!         [--batch-target 20ms] [--jobs N|auto] [--max-minutes 45] [--exe target/release/pgmend]
//!
//! One throwaway server (`LocalPg`). A source database gets the legacy schema (V1), the demo's
//! dirty data (`generate_dirty_data`) and `migrate baseline`; every other database is a
//! `CREATE DATABASE ... TEMPLATE` copy of it, so all copies share coupon ids. One copy runs
//! `pgmend apply --yes --confirm deploy-new-application` uninterrupted: the reference, whose
//! stderr lines are timed. Then, per iteration, a fresh copy runs the same command, which is
//! SIGKILLed at a random moment of the reference (5 ms up to its duration for the first run
//! of an iteration, up to 1.2 times it for the later ones, so kills land in migrations,
//! concurrent index builds, freezes, batches and between them) and started again, until a
//! run exits 0. The moment is taken as a point of progress (as many stderr lines as the
//! reference had printed by then, and as long after the last one), so that a loaded machine
//! moves the kill with the run rather than past its end; the same seed (`--seed`, or
//! `PGMEND_KILL_SEED`) draws the same points.
//! A run that exits 1 or 2 by itself is read and rerun, as the runbooks say; five such exits
//! in a row stop the campaign as a finding. The end state must equal the reference's: every
//! coupon's `legacy_duplicate` and voided-or-not, every `campaign_budgets` row, every
//! non-zero `member_monthly_usage` row, the finance report (`as_of` and `database` aside),
//! the ledger (per repair, the multiset of (table, row key, action)), the history and the
//! gate; besides, no row is recorded twice by the void repair, no run is left unfinished, no
//! index is INVALID, and `pgmend verify` exits 0. A mismatch prints the differences and stops.
//!
//! The phase each kill landed in is read from pgmend's stderr so far (the last `== step`
//! line, whether the repair had frozen its targets or finished) and from `pg_stat_activity`
//! sampled just before the signal (a `CONCURRENTLY` statement running, the main session
//! inside a transaction or idle between statements).
//!
//! `tests/faults.rs` includes this file and runs a bounded campaign.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The release, with the gate confirmed from the start (there is no application to deploy).
pub const CONFIRM: [&str; 4] = ["apply", "--yes", "--confirm", "deploy-new-application"];

const V1: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/migrations/V1__legacy_baseline.sql"
));

/// A pgmend command against `conninfo`, with no stray `PG*` variables and stdin closed.
pub fn pgmend(exe: &Path, conninfo: &str) -> Command {
    let mut c = Command::new(exe);
    for var in pgmend::db::conninfo::environment_variables().chain(["NO_COLOR"]) {
        c.env_remove(var);
    }
    // One stream unless the arguments say `--jobs`: the campaign draws its workers itself, and
    // the fault tests that use this were written for one stream.
    c.env("DATABASE_URL", conninfo)
        .env("PGMEND_JOBS", "1")
        .stdin(Stdio::null());
    c
}

/// What a finished pgmend run gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run_pgmend(exe: &Path, conninfo: &str, args: &[&str]) -> Result<Outcome> {
    let out = pgmend(exe, conninfo)
        .args(args)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    Ok(Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// When each line of a run's stderr appeared, in ms from its start, and how long it took:
/// the kill schedule's map from moments of the reference run to points of progress.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub lines_ms: Vec<u64>,
    pub total_ms: u64,
}

/// A kill point: once the run has printed `lines` lines of stderr, `after_ms` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillPoint {
    pub lines: usize,
    pub after_ms: u64,
}

impl Timeline {
    /// Where the reference was `t` ms after its start: the lines it had printed by then and
    /// how long after the last of them.
    pub fn at(&self, t: u64) -> KillPoint {
        let lines = self.lines_ms.iter().take_while(|&&m| m <= t).count();
        let last = lines.checked_sub(1).map_or(0, |i| self.lines_ms[i]);
        KillPoint {
            lines,
            after_ms: t - last,
        }
    }
}

/// Runs pgmend to its end like [`run_pgmend`], noting when each stderr line appeared.
pub fn run_pgmend_timed(exe: &Path, conninfo: &str, args: &[&str]) -> Result<(Outcome, Timeline)> {
    use std::io::{BufRead, Read};
    let started = Instant::now();
    let mut child = pgmend(exe, conninfo)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", exe.display()))?;
    let mut stdout_pipe = child.stdout.take().expect("piped");
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout_pipe.read_to_string(&mut text);
        text
    });
    let mut stderr = String::new();
    let mut lines_ms = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().expect("piped")).lines() {
        lines_ms.push(started.elapsed().as_millis() as u64);
        stderr.push_str(&line?);
        stderr.push('\n');
    }
    let status = child.wait()?;
    let outcome = Outcome {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap_or_default(),
        stderr,
    };
    let total_ms = started.elapsed().as_millis() as u64;
    Ok((outcome, Timeline { lines_ms, total_ms }))
}

/// The kill campaign's seed: `PGMEND_KILL_SEED` when set (to replay a run), else a new one.
pub fn seed_from_env() -> Result<u64> {
    match std::env::var("PGMEND_KILL_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .with_context(|| format!("PGMEND_KILL_SEED={s:?} is not a number")),
        Err(_) => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64
            ^ u64::from(std::process::id())),
    }
}

pub fn connect(conninfo: &str) -> Result<postgres::Client> {
    postgres::Client::connect(conninfo, postgres::NoTls).context("connecting to the test server")
}

/// A connection string for a database of the campaign's server, by name.
pub type Conn<'a> = &'a dyn Fn(&str) -> String;

/// Creates `name` holding the legacy schema with the demo's data for `members` members,
/// adopted with `migrate baseline --yes`. Nothing stays connected to it afterwards, so it
/// can serve as a template.
pub fn create_legacy_source(exe: &Path, conn: Conn, name: &str, members: i32) -> Result<()> {
    let mut admin = connect(&conn("postgres"))?;
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
    admin.batch_execute(&format!("CREATE DATABASE {name}"))?;
    {
        let mut c = connect(&conn(name))?;
        c.batch_execute(V1)?;
        pgmend::demo_data::generate_dirty_data(&mut c, members)?;
    }
    let out = run_pgmend(exe, &conn(name), &["migrate", "baseline", "--yes"])?;
    if out.code != 0 {
        bail!("migrate baseline exited {}: {}", out.code, out.stderr);
    }
    Ok(())
}

/// `name` as a fresh copy of `source` (which nothing may be connected to).
pub fn copy_database(conn: Conn, source: &str, name: &str) -> Result<()> {
    let mut admin = connect(&conn("postgres"))?;
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
    // A session of the source that is just closing can still be counted for a moment.
    let mut tries = 0;
    loop {
        match admin.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {source}")) {
            Ok(()) => return Ok(()),
            Err(e) if tries < 50 => {
                tries += 1;
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).context(format!("CREATE DATABASE {name} TEMPLATE {source}")),
        }
    }
}

pub fn drop_database(conn: Conn, name: &str) -> Result<()> {
    connect(&conn("postgres"))?
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
    Ok(())
}

/// What the release leaves behind, in the terms the campaign compares.
#[derive(Debug, Clone, PartialEq)]
pub struct EndState {
    /// (coupon_id, legacy_duplicate, voided), by coupon_id.
    pub coupons: Vec<(String, bool, bool)>,
    /// Every campaign_budgets row, all columns.
    pub budgets: Vec<String>,
    /// Every member_monthly_usage row with a non-zero used_yen (a missing row means 0).
    pub usage: Vec<String>,
    /// `report overruns --format json` without `as_of`, `database` and the legacy counter's
    /// `recorded_at`.
    pub report: serde_json::Value,
    /// Per repair: "table row_key action" of every ledger record, sorted; runs that were
    /// undone, and the undo runs themselves, are left out (see `undo_runs`).
    pub ledger: BTreeMap<String, Vec<String>>,
    /// "run N of REPAIR undone by run M" (not compared: the campaign runs no undo).
    pub undo_runs: Vec<String>,
    pub history: Vec<i32>,
    pub gates: Vec<String>,
    /// Absolute checks (must be empty / 0 whatever the reference says).
    pub invalid_indexes: Vec<String>,
    pub void_rows_recorded_twice: Vec<String>,
    pub unfinished_runs: Vec<String>,
    /// Runs whose counts disagree with their ledger: see [`RUNS_OUT_OF_STEP`].
    pub runs_out_of_step: Vec<String>,
    pub verify: (i32, String),
}

/// Every repair run (undo runs and counter runs that made a second pass left out: a pass
/// over a key already corrected counts it again and keeps its one record) whose progress
/// disagrees with its ledger: `changed` is the number of its ledger records, and `processed`
/// its checkpoint. The checkpoint commits with the batch's changes and records, so a fault
/// at any moment leaves them in step; a checkpoint written in a transaction of its own
/// leaves `changed` short of the ledger once a fault falls between the two commits.
pub const RUNS_OUT_OF_STEP: &str = "
    SELECT format('run %s of %s (%s): changed %s, processed %s, checkpoint %s, %s ledger records',
                  r.run_id, r.repair, r.state, r.changed, r.processed, r.checkpoint,
                  (SELECT count(*) FROM pgmend.ledger_records l WHERE l.run_id = r.run_id))
      FROM pgmend.repair_runs r
     WHERE r.kind <> 'undo' AND r.repass_from IS NULL
       AND (r.changed <> (SELECT count(*) FROM pgmend.ledger_records l WHERE l.run_id = r.run_id)
            OR r.processed <> r.checkpoint)
     ORDER BY r.run_id";

fn strings(c: &mut postgres::Client, sql: &str) -> Result<Vec<String>> {
    Ok(c.query(sql, &[])
        .with_context(|| sql.to_string())?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Reads the end state of the database behind `conninfo`.
pub fn end_state(exe: &Path, conninfo: &str) -> Result<EndState> {
    let mut c = connect(conninfo)?;
    let coupons = c
        .query(
            "SELECT coupon_id::text, legacy_duplicate, voided_at IS NOT NULL FROM issued_coupons ORDER BY coupon_id",
            &[],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let budgets = strings(
        &mut c,
        "SELECT format('%s discount %s budget %s issued %s', campaign_id, discount_yen, budget_yen, issued_yen)
           FROM campaign_budgets ORDER BY campaign_id COLLATE \"C\"",
    )?;
    let usage = strings(
        &mut c,
        "SELECT format('%s/%s %s', member_id, month, used_yen) FROM member_monthly_usage
          WHERE used_yen <> 0 ORDER BY member_id COLLATE \"C\", month COLLATE \"C\"",
    )?;
    let mut ledger: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in c.query(
        "SELECT r.repair, format('%s %s %s', l.target_table, l.row_key::text, l.action)
           FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id)
          WHERE r.kind <> 'undo' AND r.undone_by_run IS NULL",
        &[],
    )? {
        ledger.entry(r.get(0)).or_default().push(r.get(1));
    }
    for records in ledger.values_mut() {
        records.sort();
    }
    let undo_runs = strings(
        &mut c,
        "SELECT format('run %s of %s undone by run %s', run_id, repair, undone_by_run)
           FROM pgmend.repair_runs WHERE undone_by_run IS NOT NULL ORDER BY run_id",
    )?;
    let history = c
        .query(
            "SELECT version FROM refinery_schema_history ORDER BY version",
            &[],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let gates = strings(&mut c, "SELECT gate FROM pgmend.gates ORDER BY gate")?;
    let invalid_indexes = strings(
        &mut c,
        "SELECT indexrelid::regclass::text || ' on ' || indrelid::regclass::text
           FROM pg_index WHERE NOT indisvalid OR NOT indisready ORDER BY 1",
    )?;
    let void_rows_recorded_twice = strings(
        &mut c,
        "SELECT format('%s %s recorded %s times (runs %s)', l.target_table, l.row_key::text, count(*), string_agg(l.run_id::text, ','))
           FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id)
          WHERE r.repair = 'void-duplicate-coupons' AND r.undone_by_run IS NULL
          GROUP BY l.target_table, l.row_key HAVING count(*) > 1 ORDER BY 1 LIMIT 20",
    )?;
    let unfinished_runs = strings(
        &mut c,
        "SELECT format('run %s of %s: %s, %s/%s', run_id, repair, state, checkpoint, targets)
           FROM pgmend.repair_runs WHERE state <> 'finished' ORDER BY run_id",
    )?;
    let runs_out_of_step = strings(&mut c, RUNS_OUT_OF_STEP)?;
    drop(c);
    let out = run_pgmend(exe, conninfo, &["report", "overruns", "--format", "json"])?;
    if out.code != 0 {
        bail!(
            "report overruns exited {}: {}{}",
            out.code,
            out.stdout,
            out.stderr
        );
    }
    let mut report: serde_json::Value =
        serde_json::from_str(&out.stdout).context("the report's JSON")?;
    if let Some(o) = report.as_object_mut() {
        o.remove("as_of");
        o.remove("database");
        // The moment the deploy gate was passed differs from run to run; its figures do not.
        if let Some(l) = o.get_mut("legacy_counter").and_then(|l| l.as_object_mut()) {
            l.remove("recorded_at");
        }
    }
    let v = run_pgmend(exe, conninfo, &["verify"])?;
    Ok(EndState {
        coupons,
        budgets,
        usage,
        report,
        ledger,
        undo_runs,
        history,
        gates,
        invalid_indexes,
        void_rows_recorded_twice,
        unfinished_runs,
        runs_out_of_step,
        verify: (v.code, format!("{}{}", v.stdout, v.stderr)),
    })
}

/// Lines in one list and not the other, as "- reference" / "+ this copy".
fn list_diff(what: &str, reference: &[String], got: &[String], out: &mut Vec<String>) {
    fn count(v: &[String]) -> BTreeMap<&str, i64> {
        let mut m: BTreeMap<&str, i64> = BTreeMap::new();
        for s in v {
            *m.entry(s.as_str()).or_default() += 1;
        }
        m
    }
    let (a, b) = (count(reference), count(got));
    let mut shown = 0;
    for key in a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (x, y) = (
            a.get(key).copied().unwrap_or(0),
            b.get(key).copied().unwrap_or(0),
        );
        if x != y {
            if shown < 20 {
                out.push(format!("{what}: {key}: {x} in the reference, {y} here"));
            }
            shown += 1;
        }
    }
    if shown > 20 {
        out.push(format!("{what}: ... {} more differences", shown - 20));
    }
}

/// Every difference between the reference's end state and `got`, plus every absolute check
/// `got` fails.
pub fn differences(reference: &EndState, got: &EndState) -> Vec<String> {
    let mut out = Vec::new();
    let fmt_coupons = |v: &[(String, bool, bool)]| -> Vec<String> {
        v.iter()
            .map(|(id, dup, voided)| format!("{id} legacy_duplicate={dup} voided={voided}"))
            .collect()
    };
    list_diff(
        "coupon",
        &fmt_coupons(&reference.coupons),
        &fmt_coupons(&got.coupons),
        &mut out,
    );
    list_diff(
        "campaign_budgets",
        &reference.budgets,
        &got.budgets,
        &mut out,
    );
    list_diff(
        "member_monthly_usage",
        &reference.usage,
        &got.usage,
        &mut out,
    );
    if reference.report != got.report {
        let (a, b) = (
            serde_json::to_string_pretty(&reference.report).unwrap_or_default(),
            serde_json::to_string_pretty(&got.report).unwrap_or_default(),
        );
        let a: Vec<String> = a.lines().map(String::from).collect();
        let b: Vec<String> = b.lines().map(String::from).collect();
        list_diff("report line", &a, &b, &mut out);
    }
    for repair in reference.ledger.keys().chain(got.ledger.keys()) {
        let empty = Vec::new();
        list_diff(
            &format!("ledger of {repair}"),
            reference.ledger.get(repair).unwrap_or(&empty),
            got.ledger.get(repair).unwrap_or(&empty),
            &mut out,
        );
    }
    out.dedup();
    if reference.history != got.history {
        out.push(format!(
            "history: {:?} in the reference, {:?} here",
            reference.history, got.history
        ));
    }
    if reference.gates != got.gates {
        out.push(format!(
            "gates: {:?} in the reference, {:?} here",
            reference.gates, got.gates
        ));
    }
    for i in &got.invalid_indexes {
        out.push(format!("INVALID index left: {i}"));
    }
    for r in &got.void_rows_recorded_twice {
        out.push(format!("void ledger: {r}"));
    }
    for r in &got.unfinished_runs {
        out.push(format!("run not finished: {r}"));
    }
    for r in &got.runs_out_of_step {
        out.push(format!("run out of step with its ledger: {r}"));
    }
    if got.verify.0 != 0 {
        out.push(format!(
            "pgmend verify exited {}:\n{}",
            got.verify.0, got.verify.1
        ));
    }
    out
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// How a [`kill_then_finish`] went.
#[allow(dead_code)] // the tests' (tests/repair.rs, tests/repair_kinds.rs), not this example's
pub struct Killed {
    /// Runs SIGKILLed.
    pub kills: usize,
    /// Whether the last run finished (with exit 0: one that exits otherwise is an error).
    pub completed: bool,
}

/// The tests' small campaign: starts `command` (stdout and stderr are set here) up to
/// `attempts` times, SIGKILLs each of the first `kills` runs at a random moment `window_ms`
/// after its start, unless it ends first, and leaves the next one 600 s to finish. A run
/// that ends by itself must exit 0: otherwise the error holds its stderr.
#[allow(dead_code)] // the tests' (tests/repair.rs, tests/repair_kinds.rs), not this example's
pub fn kill_then_finish(
    mut command: impl FnMut() -> Command,
    rng: &mut Rng,
    attempts: usize,
    kills: usize,
    window_ms: (u64, u64),
) -> Result<Killed> {
    let dir = tempfile::tempdir()?;
    let mut killed = Killed {
        kills: 0,
        completed: false,
    };
    for attempt in 0..attempts {
        let err_path = dir.path().join(format!("stderr-{attempt}"));
        let mut child = command()
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err_path)?)
            .spawn()
            .context("starting pgmend")?;
        let delay = if killed.kills < kills {
            Duration::from_millis(rng.between(window_ms.0, window_ms.1))
        } else {
            Duration::from_secs(600)
        };
        let started = Instant::now();
        let mut finished = None;
        while started.elapsed() < delay {
            if let Some(status) = child.try_wait()? {
                finished = Some(status);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match finished {
            Some(status) => {
                if status.code() != Some(0) {
                    bail!(
                        "attempt {attempt} exited {:?}: {}",
                        status.code(),
                        std::fs::read_to_string(&err_path).unwrap_or_default()
                    );
                }
                killed.completed = true;
                break;
            }
            None => {
                child.kill()?; // SIGKILL
                child.wait()?;
                killed.kills += 1;
            }
        }
    }
    Ok(killed)
}

/// What a campaign counted.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub iterations: u64,
    /// pgmend processes started (killed or not).
    pub runs: u64,
    pub kills: u64,
    /// Kills per phase.
    pub phases: BTreeMap<String, u64>,
    /// Runs that exited 1 or 2 by themselves, by their error line (digits blanked).
    pub exits: BTreeMap<String, u64>,
    /// Kills after which a pgmend statement was still running on the server (an orphaned
    /// CONCURRENTLY build or a statement the backend had not yet noticed was orphaned).
    pub orphaned_statements: u64,
    /// Kills after which an INVALID index was in the catalog.
    pub invalid_index_after_kill: u64,
    pub most_runs_in_one_iteration: u64,
    pub reference_ms: u64,
    pub elapsed: Duration,
}

impl Tally {
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} iterations, {} pgmend runs, {} SIGKILLs ({:.1} per iteration, at most {} runs in one iteration); reference run {} ms; {:.0} s in all\n",
            self.iterations,
            self.runs,
            self.kills,
            self.kills as f64 / self.iterations.max(1) as f64,
            self.most_runs_in_one_iteration,
            self.reference_ms,
            self.elapsed.as_secs_f64()
        );
        s.push_str("kills per phase:\n");
        for (phase, n) in &self.phases {
            s.push_str(&format!("  {n:6}  {phase}\n"));
        }
        s.push_str(&format!(
            "kills after which a pgmend statement still ran on the server: {}\nkills after which an INVALID index was in the catalog: {}\n",
            self.orphaned_statements, self.invalid_index_after_kill
        ));
        if self.exits.is_empty() {
            s.push_str("no run exited non-zero by itself\n");
        } else {
            s.push_str("runs that exited non-zero by themselves (then rerun):\n");
            for (line, n) in &self.exits {
                s.push_str(&format!("  {n:6}  {line}\n"));
            }
        }
        s
    }
}

/// One `pg_stat_activity` row of a pgmend backend, sampled just before a kill.
#[derive(Debug)]
struct Activity {
    in_transaction: bool,
    active: bool,
    query: String,
}

fn activity(monitor: &mut postgres::Client, dbname: &str) -> Vec<Activity> {
    monitor
        .query(
            "SELECT xact_start IS NOT NULL, coalesce(state = 'active', false), left(query, 80) FROM pg_stat_activity
              WHERE datname = $1 AND application_name = 'pgmend' AND pid <> pg_backend_pid()",
            &[&dbname],
        )
        .map(|rows| {
            rows.iter()
                .map(|r| Activity {
                    in_transaction: r.get(0),
                    active: r.get(1),
                    query: r.get::<_, Option<String>>(2).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The phase a kill landed in, from pgmend's stderr so far and the activity sampled just
/// before the signal.
fn phase(stderr: &str, activity: &[Activity]) -> String {
    let concurrently = activity.iter().find(|a| {
        a.active && {
            let q = a.query.to_ascii_uppercase();
            q.contains("INDEX CONCURRENTLY")
        }
    });
    let in_tx = activity.iter().any(|a| a.in_transaction);
    let Some(pos) = stderr
        .match_indices("== step ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || stderr.as_bytes()[i - 1] == b'\n')
        .last()
    else {
        return if stderr.contains("waiting up to") {
            "startup: waiting for the runner lock (the killed run's session still held it)".into()
        } else {
            "startup: connecting, runner lock, privileges, before the first step".into()
        };
    };
    let tail = &stderr[pos..];
    let label = tail
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("== ")
        .to_string();
    let sub = if label.contains("repair ") {
        let frozen = tail.contains(": froze ") || tail.contains("resuming run ");
        let finished = tail.lines().any(|l| {
            l.starts_with("run ") && (l.contains(" rows changed") || l.contains(" row changed"))
        });
        if finished {
            "after the run finished (recording the step)"
        } else if !frozen {
            if in_tx {
                "freezing the targets (in the transaction)"
            } else {
                "before the freeze"
            }
        } else if in_tx {
            "in a batch transaction"
        } else {
            "between batches"
        }
    } else if label.contains("migration V3") || label.contains("migration V4") {
        if let Some(a) = concurrently {
            if a.query.to_ascii_uppercase().contains("DROP INDEX") {
                "DROP INDEX CONCURRENTLY running"
            } else {
                "CREATE INDEX CONCURRENTLY running"
            }
        } else if tail.contains("\nbuilt ") {
            "after the build (recording the migration)"
        } else if tail.contains("building ") {
            "build starting"
        } else if tail.contains("running void-duplicate-coupons again") {
            "void pass for late duplicates"
        } else {
            "census and preflight"
        }
    } else if label.contains("migration") {
        if in_tx {
            "in the DDL transaction"
        } else {
            "outside a transaction"
        }
    } else {
        "recording the gate"
    };
    // The label keeps the step number: steps 6/9 and 7/10 run the same repairs.
    format!("{label}: {sub}")
}

/// The line of stderr that says why a run stopped, digits blanked so that pids and times
/// group together.
fn reason(stderr: &str) -> String {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("pgmend: "))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("(no output)");
    let blanked: String = line
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    blanked.chars().take(220).collect()
}

pub struct IterationOptions<'a> {
    pub exe: &'a Path,
    pub conninfo: &'a str,
    pub dbname: &'a str,
    pub batch_target: &'a str,
    /// `--jobs` of the iteration's first run; each later run draws its own from 1 to this.
    /// 0: `--jobs auto` for every run.
    pub jobs: u16,
    /// The reference run's stderr lines over time. Every run is killed at a moment of the
    /// reference drawn anew (within its run time for an iteration's first run, up to 1.2
    /// times it after that), taken as a point of progress: once the run has printed as many
    /// lines as the reference had by then, that much later than the reference's last one.
    /// On a loaded machine the kill so lands where it would have landed on an idle one.
    pub reference: &'a Timeline,
}

/// Runs the release on `dbname`, killing it at random, until a run exits 0. Non-zero exits
/// by themselves are rerun; five in a row are a finding (the error). Returns the number of
/// runs it took.
pub fn kill_until_done(
    o: &IterationOptions,
    monitor: &mut postgres::Client,
    rng: &mut Rng,
    tally: &mut Tally,
    log: &mut dyn FnMut(&str),
) -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let mut runs = 0u64;
    let mut failures_in_a_row: Vec<String> = Vec::new();
    loop {
        runs += 1;
        tally.runs += 1;
        if runs > 400 {
            bail!("no run exited 0 after 400 runs");
        }
        let err_path = dir.path().join(format!("stderr-{runs}"));
        let out_path = dir.path().join(format!("stdout-{runs}"));
        // 0 is `--jobs auto`, for every run.
        let jobs = if runs == 1 || o.jobs <= 1 {
            o.jobs
        } else {
            rng.between(1, u64::from(o.jobs)) as u16
        };
        let jobs = match jobs {
            0 => "auto".to_string(),
            n => n.to_string(),
        };
        let mut child = pgmend(o.exe, o.conninfo)
            .args(CONFIRM)
            .args(["--batch-target", o.batch_target, "--runner-wait", "60s"])
            .args(["--jobs", &jobs])
            .stdout(std::fs::File::create(&out_path)?)
            .stderr(std::fs::File::create(&err_path)?)
            .spawn()
            .context("starting pgmend")?;
        let last = if runs == 1 {
            o.reference.total_ms.max(5)
        } else {
            o.reference.total_ms * 6 / 5 + 20
        };
        // Drawn as a fraction of the reference's run time, so that a replay on a faster or
        // slower machine (or under another load) picks the same points of progress.
        let fraction = rng.between(0, 1_000_000) as f64 / 1_000_000.0;
        let point = o
            .reference
            .at(5 + (fraction * last.saturating_sub(5) as f64) as u64);
        let mut status = None;
        let mut stderr_so_far = std::fs::File::open(&err_path)?;
        let (mut lines, mut buf) = (0usize, [0u8; 8192]);
        let mut reached = (point.lines == 0).then(Instant::now);
        loop {
            if let Some(s) = child.try_wait()? {
                status = Some(s);
                break;
            }
            if reached.is_none() {
                use std::io::Read;
                loop {
                    let n = stderr_so_far.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    lines += buf[..n].iter().filter(|&&b| b == b'\n').count();
                }
                if lines >= point.lines {
                    reached = Some(Instant::now());
                }
            }
            if reached.is_some_and(|at| at.elapsed() >= Duration::from_millis(point.after_ms)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let status = match status {
            Some(s) => s,
            None => {
                let sampled = activity(monitor, o.dbname);
                match child.try_wait()? {
                    Some(s) => s,
                    None => {
                        child.kill()?; // SIGKILL
                        child.wait()?;
                        tally.kills += 1;
                        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
                        *tally.phases.entry(phase(&stderr, &sampled)).or_default() += 1;
                        std::thread::sleep(Duration::from_millis(2));
                        if activity(monitor, o.dbname).iter().any(|a| a.active) {
                            tally.orphaned_statements += 1;
                        }
                        if count_invalid(o.conninfo) > 0 {
                            tally.invalid_index_after_kill += 1;
                        }
                        failures_in_a_row.clear();
                        continue;
                    }
                }
            }
        };
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        match status.code() {
            Some(0) => {
                tally.most_runs_in_one_iteration = tally.most_runs_in_one_iteration.max(runs);
                return Ok(runs);
            }
            code => {
                let why = format!("exit {}: {}", code.unwrap_or(-1), reason(&stderr));
                log(&format!("  run {runs} {why}"));
                *tally.exits.entry(why).or_default() += 1;
                failures_in_a_row.push(format!(
                    "run {runs} exited {code:?}; stderr:\n{stderr}\nstdout:\n{}",
                    std::fs::read_to_string(&out_path).unwrap_or_default()
                ));
                if failures_in_a_row.len() >= 5 {
                    bail!(
                        "FINDING: pgmend did not recover by itself; the last runs exited non-zero with no kill in between:\n{}",
                        failures_in_a_row.join("\n---\n")
                    );
                }
            }
        }
    }
}

fn count_invalid(conninfo: &str) -> i64 {
    connect(conninfo)
        .and_then(|mut c| {
            Ok(c.query_one(
                "SELECT count(*) FROM pg_index WHERE NOT indisvalid OR NOT indisready",
                &[],
            )?
            .get(0))
        })
        .unwrap_or(0)
}

pub struct CampaignOptions {
    pub exe: PathBuf,
    pub iterations: u64,
    pub members: i32,
    pub seed: u64,
    pub batch_target: String,
    /// `--jobs` of each iteration's first run (later runs draw 1 to this); the reference
    /// runs with one worker.
    pub jobs: u16,
    /// Start no new iteration after this long.
    pub max_time: Option<Duration>,
    /// Prefix of the campaign's database names.
    pub prefix: String,
}

/// The whole campaign; a mismatch or a run that does not recover is an error carrying the
/// differences.
pub fn campaign(o: &CampaignOptions, conn: Conn, log: &mut dyn FnMut(&str)) -> Result<Tally> {
    let started = Instant::now();
    let (source, reference, copy) = (
        format!("{}_src", o.prefix),
        format!("{}_ref", o.prefix),
        format!("{}_it", o.prefix),
    );
    create_legacy_source(&o.exe, conn, &source, o.members)?;
    copy_database(conn, &source, &reference)?;
    let (r, timeline) = run_pgmend_timed(
        &o.exe,
        &conn(&reference),
        &[
            CONFIRM[0],
            CONFIRM[1],
            CONFIRM[2],
            CONFIRM[3],
            "--batch-target",
            &o.batch_target,
        ],
    )?;
    let reference_ms = timeline.total_ms;
    if r.code != 0 {
        bail!(
            "the reference run exited {}:\n{}{}",
            r.code,
            r.stdout,
            r.stderr
        );
    }
    let expected = end_state(&o.exe, &conn(&reference))?;
    if let Some(problems) = Some(differences(&expected, &expected)).filter(|d| !d.is_empty()) {
        bail!(
            "the uninterrupted reference run fails a check:\n{}",
            problems.join("\n")
        );
    }
    log(&format!(
        "reference: {} members, {} coupons, {} marked, {} ledger records, {reference_ms} ms, {} stderr lines; seed {} (replay with PGMEND_KILL_SEED={})",
        o.members,
        expected.coupons.len(),
        expected.coupons.iter().filter(|c| c.1).count(),
        expected.ledger.values().map(Vec::len).sum::<usize>(),
        timeline.lines_ms.len(),
        o.seed,
        o.seed
    ));
    let mut tally = Tally {
        reference_ms,
        ..Tally::default()
    };
    let mut monitor = connect(&conn("postgres"))?;
    for i in 1..=o.iterations {
        if o.max_time.is_some_and(|m| started.elapsed() >= m) {
            log(&format!(
                "time limit reached: stopping after {} iterations",
                i - 1
            ));
            break;
        }
        copy_database(conn, &source, &copy)?;
        let t = Instant::now();
        let kills_before = tally.kills;
        // One generator per iteration: an iteration that took more runs (kills land a little
        // differently from one machine to the next) does not shift the later ones' draws.
        let mut rng = Rng::new(o.seed ^ i.wrapping_mul(0xd1b5_4a32_d192_ed03));
        let runs = kill_until_done(
            &IterationOptions {
                exe: &o.exe,
                conninfo: &conn(&copy),
                dbname: &copy,
                batch_target: &o.batch_target,
                jobs: o.jobs,
                reference: &timeline,
            },
            &mut monitor,
            &mut rng,
            &mut tally,
            log,
        )
        .with_context(|| format!("iteration {i}"))?;
        let got = end_state(&o.exe, &conn(&copy))?;
        let diff = differences(&expected, &got);
        tally.iterations = i;
        tally.elapsed = started.elapsed();
        log(&format!(
            "iteration {i}: {} kills, {runs} runs, {:.1} s{}",
            tally.kills - kills_before,
            t.elapsed().as_secs_f64(),
            if diff.is_empty() {
                ", end state equal to the reference".to_string()
            } else {
                String::new()
            }
        ));
        if !diff.is_empty() {
            bail!(
                "MISMATCH in iteration {i}:\n{}\n\n{}",
                diff.join("\n"),
                tally.summary()
            );
        }
    }
    tally.elapsed = started.elapsed();
    for db in [&source, &reference, &copy] {
        drop_database(conn, db)?;
    }
    Ok(tally)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let exe = value("--exe").map(PathBuf::from).unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.parent()?.join("pgmend")))
            .unwrap_or_else(|| PathBuf::from("target/release/pgmend"))
    });
    anyhow::ensure!(
        exe.is_file(),
        "build the binary first: cargo build --release ({} missing)",
        exe.display()
    );
    let seed = match value("--seed") {
        Some(s) => s.parse().context("--seed")?,
        None => seed_from_env()?,
    };
    let options = CampaignOptions {
        exe,
        iterations: value("--iterations")
            .map(|s| s.parse())
            .transpose()
            .context("--iterations")?
            .unwrap_or(10),
        members: value("--members")
            .map(|s| s.parse())
            .transpose()
            .context("--members")?
            .unwrap_or(2000),
        seed,
        batch_target: value("--batch-target").unwrap_or_else(|| "20ms".into()),
        jobs: value("--jobs")
            .map(|s| if s == "auto" { Ok(0) } else { s.parse() })
            .transpose()
            .context("--jobs")?
            .unwrap_or(1),
        max_time: value("--max-minutes")
            .map(|s| s.parse::<u64>())
            .transpose()
            .context("--max-minutes")?
            .map(|m| Duration::from_secs(m * 60)),
        prefix: "kc".into(),
    };
    let pg = pgmend::localpg::LocalPg::start(false)?;
    let conn = |db: &str| pg.conninfo(db);
    let mut log = |line: &str| {
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), "{line}");
    };
    match campaign(&options, &conn, &mut log) {
        Ok(tally) => {
            println!(
                "\nOK: every iteration ended in the reference's state.\n{}",
                tally.summary()
            );
            Ok(())
        }
        Err(e) => {
            println!("\n{e:#}");
            std::process::exit(1);
        }
    }
}
