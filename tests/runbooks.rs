//! Every runbook in `runbooks/` is executable: each fenced shell block (```` ```sh ```` or
//! ```` ```bash ````) is run, in the order of the file, with bash and `set -euo pipefail`,
//! against a throwaway database prepared for that runbook, with the `pgmend` under test first
//! on `PATH`, `DATABASE_URL` pointing at the test database, `PGMEND_RELEASE` at the coupon
//! release at the repository root (a runbook's reader exports it with the connection, in a `sh
//! no-test` block), `HOME` and the working directory in a temporary directory, and no stray
//! `PG*` variables.
//!
//! The convention, for whoever writes a runbook:
//!
//! - ```` ```sh ```` / ```` ```bash ````: run by this test. Write it so that it works when
//!   pasted into a shell at 3 a.m.: no placeholders (set a variable from
//!   `pgmend ... --format json | python3 -c ...` instead), and a command that is expected to
//!   exit nonzero says so itself, e.g. `pgmend verify || test $? -eq 1`.
//! - ```` ```sh no-test ````: shown to people, never run here (setting the production
//!   connection, deploying the application, installing a crontab, a step that needs a person to
//!   press Ctrl-C). The runbook says why in its text, and every runbook that has such a block
//!   carries the one-line note about the convention (checked below).
//! - Anything else (```` ``` ```` for output samples, `sql`, `json`, `crontab`, ...) is not run.
//!
//! Shell variables set by one block are visible to the blocks after it (as in one terminal
//! session). Each runbook has a preparation in [`RUNBOOKS`] (the database state it starts
//! from, optional hooks that play the application or a person between two sections, and
//! checks of the end state); a runbook without one fails `every_runbook_is_tested`, so a new
//! runbook cannot be added untested.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The note a runbook with `sh no-test` blocks carries.
const NO_TEST_NOTE: &str = "`sh no-test`";

/// How long one block may take before the test kills it.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Markdown

#[derive(Debug, Clone)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    /// The nearest heading above the block.
    heading: String,
    lang: String,
    tags: Vec<String>,
    code: String,
}

impl Block {
    fn is_shell(&self) -> bool {
        self.lang == "sh" || self.lang == "bash"
    }

    fn runs(&self) -> bool {
        self.is_shell() && !self.tags.iter().any(|t| t == "no-test")
    }
}

/// Every fenced block of a Markdown file, indented ones (inside list items) included.
fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut heading = String::new();
    // The block being read, the indentation of its fence, and its lines so far.
    let mut open: Option<(Block, usize, Vec<String>)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let mut words = info.split_whitespace().map(str::to_string);
                    let block = Block {
                        line: i + 1,
                        heading: heading.clone(),
                        lang: words.next().unwrap_or_default(),
                        tags: words.collect(),
                        code: String::new(),
                    };
                    open = Some((block, indent, Vec::new()));
                } else if trimmed.starts_with('#') && indent == 0 {
                    heading = trimmed.to_string();
                }
            }
            Some((_, fence_indent, lines)) => {
                if trimmed.trim_end() == "```" {
                    let (mut block, _, lines) = open.take().unwrap();
                    block.code = lines.join("\n");
                    out.push(block);
                } else {
                    let strip = indent.min(*fence_indent);
                    lines.push(line[strip..].to_string());
                }
            }
        }
    }
    assert!(open.is_none(), "an unclosed fenced block");
    out
}

fn runbooks_dir() -> PathBuf {
    repo().join("runbooks")
}

fn runbook_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(runbooks_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------
// Running a runbook

type Hook = Box<dyn Fn(&TestDb, &Path)>;

/// The state a runbook starts from.
struct Prepared {
    db: TestDb,
    /// Extra environment for every block (e.g. a decision a person would type in).
    env: Vec<(&'static str, String)>,
    /// Run before the first runnable block under the first heading that starts with the
    /// given text: the application or a person acting between two sections.
    hooks: Vec<(&'static str, Hook)>,
}

impl Prepared {
    fn new(db: TestDb) -> Prepared {
        Prepared {
            db,
            env: Vec::new(),
            hooks: Vec::new(),
        }
    }

    fn hook(mut self, heading: &'static str, f: impl Fn(&TestDb, &Path) + 'static) -> Self {
        self.hooks.push((heading, Box::new(f)));
        self
    }
}

struct Runbook {
    file: &'static str,
    prepare: fn() -> Prepared,
    /// Checks of the end state, beyond every block's exit code. Gets the working directory.
    check: fn(&TestDb, &Path),
}

const RUNBOOKS: &[Runbook] = &[
    Runbook {
        file: "adding-a-foreign-key-with-orphans.md",
        prepare: prepare_shop,
        check: check_adding_a_foreign_key_with_orphans,
    },
    Runbook {
        file: "adding-a-not-null-column.md",
        prepare: prepare_shop,
        check: check_adding_a_not_null_column,
    },
    Runbook {
        file: "adopting-production.md",
        prepare: prepare_adopting_production,
        check: check_adopting_production,
    },
    Runbook {
        file: "daily-reconciliation.md",
        prepare: prepare_daily_reconciliation,
        check: check_daily_reconciliation,
    },
    Runbook {
        file: "failed-concurrent-index-build.md",
        prepare: prepare_failed_concurrent_index_build,
        check: check_failed_concurrent_index_build,
    },
    Runbook {
        file: "failover-during-a-release.md",
        prepare: prepare_failover_during_a_release,
        check: check_failover_during_a_release,
    },
    Runbook {
        file: "finance-overrun-report.md",
        prepare: prepare_finance_overrun_report,
        check: check_finance_overrun_report,
    },
    Runbook {
        file: "production-cutover.md",
        prepare: prepare_production_cutover,
        check: check_production_cutover,
    },
    Runbook {
        file: "resuming-an-interrupted-repair.md",
        prepare: prepare_resuming_an_interrupted_repair,
        check: check_resuming_an_interrupted_repair,
    },
    Runbook {
        file: "rollback.md",
        prepare: prepare_rollback,
        check: check_rollback,
    },
    Runbook {
        file: "staging-dry-run.md",
        prepare: prepare_staging_dry_run,
        check: check_staging_dry_run,
    },
];

/// The prologue of every block: the shell options, and the variables earlier blocks set.
const PROLOGUE: &str = r#"set -euo pipefail
__rb_base=" $(compgen -v | tr '\n' ' ') "
if [ -f "$RUNBOOK_STATE" ]; then . "$RUNBOOK_STATE"; fi
"#;

/// Saves the variables the block set (or restored) for the next block.
const EPILOGUE: &str = r#"
for __rb_v in $(compgen -v); do
  case "$__rb_v" in __rb_*|BASH*|FUNCNAME|PIPESTATUS|_|COLUMNS|LINES|OPTIND|OPTARG) continue ;; esac
  case "$__rb_base" in *" $__rb_v "*) ;; *) declare -p "$__rb_v" ;; esac
done > "$RUNBOOK_STATE.next"
mv "$RUNBOOK_STATE.next" "$RUNBOOK_STATE"
"#;

fn pgmend_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_pgmend"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn bash(db: &TestDb, work: &Path, env: &[(&'static str, String)], script: &str) -> Run {
    let file = work.join(".block.sh");
    std::fs::write(&file, script).unwrap();
    let c = pgmend_command();
    let mut cmd = Command::new("bash");
    // The same environment as pgmend_command() (no stray PG* variables), then ours.
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![pgmend_dir()];
    paths.extend(std::env::split_paths(&path));
    cmd.arg(&file)
        .current_dir(work)
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env("DATABASE_URL", db.conninfo())
        .env("PGMEND_RELEASE", repo())
        .env("HOME", work.join("home"))
        .env("RUNBOOK_STATE", work.join(".state.sh"))
        .env("TZ", "Asia/Tokyo")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().expect("running bash");
    let pid = child.id();
    // Drain the pipes in threads, so a chatty block cannot fill them and stall.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut s).unwrap();
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut s).unwrap();
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BLOCK_TIMEOUT {
            // The block's own process group: bash and whatever it started.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
            let _ = child.wait();
            panic!("the block ran longer than {BLOCK_TIMEOUT:?}:\n{script}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out_t.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_t.join().unwrap()).into_owned(),
    };
    let password = db.password();
    if !password.is_empty() {
        assert!(
            !run.both().contains(&password),
            "the password leaked into the output:\n{}",
            run.both()
        );
    }
    run
}

fn run_runbook(file: &str) {
    let runbook = RUNBOOKS
        .iter()
        .find(|r| r.file == file)
        .unwrap_or_else(|| panic!("no preparation for runbooks/{file}"));
    let markdown = std::fs::read_to_string(runbooks_dir().join(file)).unwrap();
    let all = blocks(&markdown);
    let runnable: Vec<&Block> = all.iter().filter(|b| b.runs()).collect();
    assert!(
        !runnable.is_empty(),
        "runbooks/{file} has no runnable block"
    );

    let prepared = (runbook.prepare)();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("home")).unwrap();
    let mut hooks_used = vec![false; prepared.hooks.len()];
    for block in runnable {
        for (i, (heading, hook)) in prepared.hooks.iter().enumerate() {
            let under = block.heading.trim_start_matches('#').trim_start();
            if !hooks_used[i] && under.starts_with(heading) {
                eprintln!("--- runbooks/{file}: hook before {heading:?}");
                hook(&prepared.db, work.path());
                hooks_used[i] = true;
            }
        }
        eprintln!(
            "--- runbooks/{file}:{} ({})\n{}",
            block.line, block.heading, block.code
        );
        let script = format!("{PROLOGUE}{}\n{EPILOGUE}", block.code);
        let started = Instant::now();
        let run = bash(&prepared.db, work.path(), &prepared.env, &script);
        eprintln!(
            "exit {} in {:?}\nstdout:\n{}\nstderr:\n{}",
            run.code,
            started.elapsed(),
            tail(&run.stdout),
            tail(&run.stderr)
        );
        assert_eq!(
            run.code,
            0,
            "runbooks/{file}:{} (under {:?}) exited {}:\n{}\n--- stdout:\n{}\n--- stderr:\n{}",
            block.line,
            block.heading,
            run.code,
            block.code,
            tail(&run.stdout),
            tail(&run.stderr)
        );
    }
    for (i, (heading, _)) in prepared.hooks.iter().enumerate() {
        assert!(
            hooks_used[i],
            "runbooks/{file}: no runnable block under a heading starting with {heading:?} (was it renamed?)"
        );
    }
    (runbook.check)(&prepared.db, work.path());
}

fn tail(s: &str) -> String {
    const KEEP: usize = 6000;
    if s.len() <= KEEP {
        return s.to_string();
    }
    let mut start = s.len() - KEEP;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[...]{}", &s[start..])
}

// ---------------------------------------------------------------------------------------
// The registry of runbooks and the conventions

#[test]
fn every_runbook_is_tested() {
    let files = runbook_files();
    for file in &files {
        assert!(
            RUNBOOKS.iter().any(|r| r.file == file),
            "runbooks/{file} has no preparation in tests/runbooks.rs: add one to RUNBOOKS and a #[test] that runs it"
        );
    }
    for r in RUNBOOKS {
        assert!(
            files.iter().any(|f| f == r.file),
            "RUNBOOKS names runbooks/{}, which does not exist",
            r.file
        );
    }
    // Each registered runbook has its own #[test] in this file.
    let me = std::fs::read_to_string(repo().join("tests/runbooks.rs")).unwrap();
    for r in RUNBOOKS {
        let call = format!("run_runbook(\"{}\")", r.file);
        assert_eq!(me.matches(&call).count(), 1, "a #[test] calling {call}");
    }
    for file in &files {
        let markdown = std::fs::read_to_string(runbooks_dir().join(file)).unwrap();
        let all = blocks(&markdown);
        assert!(
            all.iter().any(Block::runs),
            "runbooks/{file} has no runnable shell block"
        );
        for b in all.iter().filter(|b| b.is_shell()) {
            for tag in &b.tags {
                assert_eq!(
                    tag, "no-test",
                    "runbooks/{file}:{}: unknown tag {tag:?} on a shell block (only no-test)",
                    b.line
                );
            }
        }
        if all.iter().any(|b| b.is_shell() && !b.runs()) {
            assert!(
                markdown.contains(NO_TEST_NOTE),
                "runbooks/{file} has `sh no-test` blocks but no note saying what they mean"
            );
        }
        for b in all.iter().filter(|b| b.runs()) {
            for placeholder in ["RUN_ID>", "<run", "RUN_ID --", "RUN_ID.csv"] {
                assert!(
                    !b.code.contains(placeholder),
                    "runbooks/{file}:{}: a placeholder in a runnable block: set a variable instead",
                    b.line
                );
            }
        }
    }
}

#[test]
fn the_block_parser_reads_indented_blocks_tags_and_headings() {
    let md = "# T\n\n## A\n\n```sh\necho 1\n```\n\n- item:\n\n  ```sh no-test\n  read -rs X\n  ```\n\n```\noutput\n```\n\n### B\n\n```bash\n# a comment, not a heading\necho 2\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 4);
    assert!(b[0].runs() && b[0].heading == "## A" && b[0].code == "echo 1");
    assert!(b[1].is_shell() && !b[1].runs() && b[1].code == "read -rs X");
    assert!(!b[2].is_shell());
    assert!(b[3].runs() && b[3].heading == "### B" && b[3].line == 21);
}

// ---------------------------------------------------------------------------------------
// Helpers for the preparations

const MEMBERS: i32 = 300;

fn ok(db: &TestDb, args: &[&str]) -> Run {
    let r = db.run(args);
    assert_eq!(r.code, 0, "pgmend {}: {}", args.join(" "), r.both());
    r
}

fn released() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(MEMBERS);
    ok(
        &db,
        &["apply", "--yes", "--confirm", "deploy-new-application"],
    );
    db
}

/// Runs pgmend while another session holds `lock_sql` (a `SELECT ... FOR UPDATE`), with a
/// short lock budget: the run stops on it (exit 1) and stays unfinished, as after a crash.
fn run_while_locked(db: &TestDb, lock_sql: &str, args: &[&str]) -> Run {
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    let locked = tx.query(lock_sql, &[]).unwrap();
    assert!(!locked.is_empty(), "nothing locked by {lock_sql}");
    let r = db.run(args);
    tx.rollback().unwrap();
    r
}

fn running_runs(db: &TestDb) -> i64 {
    db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'running'")
}

/// An unfinished run of rebuild-member-monthly-usage: one counter drifted, its row held by
/// another session while the repair runs with a 1-second lock budget.
fn interrupt_usage_rebuild(db: &TestDb, extra: &[&str]) {
    db.client()
        .batch_execute(
            "UPDATE member_monthly_usage SET used_yen = used_yen + 1000
              WHERE (member_id, month) = (SELECT member_id, month FROM member_monthly_usage ORDER BY 1, 2 LIMIT 1)",
        )
        .unwrap();
    let before = running_runs(db);
    let mut args = vec![
        "repair",
        "apply",
        "rebuild-member-monthly-usage",
        "--yes",
        "--lock-retry-for",
        "1s",
    ];
    args.extend_from_slice(extra);
    let r = run_while_locked(
        db,
        "SELECT 1 FROM member_monthly_usage
          WHERE (member_id, month) = (SELECT member_id, month FROM member_monthly_usage ORDER BY 1, 2 LIMIT 1)
            FOR UPDATE",
        &args,
    );
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stderr.contains("gave up after"), "{}", r.stderr);
    assert_eq!(running_runs(db), before + 1);
}

/// A coupon issued the way the old code does it: a new member, and the legacy counter
/// `campaigns.issued_yen` updated in the same transaction; nothing else.
fn old_code_issues_a_coupon(db: &TestDb, campaign: &str, member: &str) {
    db.client()
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), campaign_id, '{member}', '2026-09', discount_yen FROM campaigns WHERE campaign_id = '{campaign}';
             UPDATE campaigns SET issued_yen = issued_yen + discount_yen WHERE campaign_id = '{campaign}';
             COMMIT;"
        ))
        .unwrap();
}

/// A coupon issued the way the new application does it: both counters in the same
/// transaction.
fn new_code_issues_a_coupon(db: &TestDb, campaign: &str, member: &str) {
    db.client()
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), campaign_id, '{member}', '2026-09', discount_yen FROM campaign_budgets WHERE campaign_id = '{campaign}';
             UPDATE campaign_budgets SET issued_yen = issued_yen + discount_yen WHERE campaign_id = '{campaign}';
             INSERT INTO member_monthly_usage SELECT '{member}', '2026-09', discount_yen FROM campaign_budgets WHERE campaign_id = '{campaign}'
             ON CONFLICT (member_id, month) DO UPDATE SET used_yen = member_monthly_usage.used_yen + excluded.used_yen;
             COMMIT;"
        ))
        .unwrap();
}

fn verify_code(db: &TestDb) -> i32 {
    db.run(&["verify"]).code
}

/// Every campaign's counters, legacy and new, against the sum of its non-voided coupons.
fn counters(db: &TestDb) -> Vec<(String, i64, Option<i64>, i64)> {
    db.client()
        .query(
            "SELECT c.campaign_id, c.issued_yen::int8, b.issued_yen::int8,
                    coalesce((SELECT sum(amount_yen) FROM issued_coupons i
                               WHERE i.campaign_id = c.campaign_id AND voided_at IS NULL), 0)::int8
               FROM campaigns c LEFT JOIN campaign_budgets b USING (campaign_id) ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn files_matching(dir: &Path, prefix: &str, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .into_owned();
            name.starts_with(prefix) && name.ends_with(suffix)
        })
        .count()
}

fn json_file(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------
// adopting-production.md: a legacy database pgmend has never seen.

fn prepare_adopting_production() -> Prepared {
    let db = fresh_db();
    db.make_legacy_data(MEMBERS);
    Prepared::new(db)
}

fn check_adopting_production(db: &TestDb, _work: &Path) {
    let versions: Vec<i32> = db.history().into_iter().map(|(v, _)| v).collect();
    assert_eq!(versions, [1, 2]);
    assert!(db.exists("campaign_budgets") && db.exists("notification_outbox"));
    assert_eq!(db.scalar_i64("SELECT count(*) FROM campaign_budgets"), 0);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM issued_coupons WHERE legacy_duplicate OR voided_at IS NOT NULL"
        ),
        0,
        "adopting changes no row"
    );
}

#[test]
fn adopting_production() {
    run_runbook("adopting-production.md");
}

// ---------------------------------------------------------------------------------------
// failed-concurrent-index-build.md: V3 applied, the duplicates voided, then a late duplicate
// made a real `CREATE UNIQUE INDEX CONCURRENTLY` fail, leaving one_coupon_per_member INVALID;
// the late duplicate was voided afterwards, so V4's census is clean.

fn prepare_failed_concurrent_index_build() -> Prepared {
    let db = fresh_db();
    db.make_legacy_baselined(MEMBERS);
    ok(&db, &["migrate", "apply", "--yes", "--target", "3"]);
    ok(&db, &["repair", "apply", "void-duplicate-coupons", "--yes"]);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
         SELECT gen_random_uuid(), campaign_id, member_id, month, amount_yen
           FROM issued_coupons WHERE NOT legacy_duplicate ORDER BY coupon_id LIMIT 1",
    )
    .unwrap();
    let failed = c.batch_execute(
        "CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member
           ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate",
    );
    assert!(failed.is_err(), "the build fails on the late duplicate");
    assert_eq!(db.invalid_indexes(), 1);
    ok(&db, &["repair", "apply", "void-duplicate-coupons", "--yes"]);
    let r = db.run(&["migrate", "status"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stdout.contains("INVALID"), "{}", r.stdout);
    Prepared::new(db)
}

fn check_failed_concurrent_index_build(db: &TestDb, _work: &Path) {
    let versions: Vec<i32> = db.history().into_iter().map(|(v, _)| v).collect();
    assert_eq!(versions, [1, 2, 3, 4]);
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass('one_coupon_per_member')
               AND indisvalid AND indisready AND indisunique
               AND pg_get_expr(indpred, indrelid) = '(NOT legacy_duplicate)'"
        ),
        1
    );
}

#[test]
fn failed_concurrent_index_build() {
    run_runbook("failed-concurrent-index-build.md");
}

// ---------------------------------------------------------------------------------------
// failover-during-a-release.md: the release (`pgmend apply --yes`) is in the middle of the
// void run when every connection it has is cut, as when the primary goes away: a session
// holds the coupons of the last duplicate group FOR SHARE, so the batch that reaches them
// waits (the earlier batches have committed), and then every pgmend backend is terminated.
// The server stands in for the promoted standby: what it holds is what the batches
// committed, as on a standby that received them.

/// How long the interrupted release may take to notice its connections are gone.
const LOST_PRIMARY_EXIT_WITHIN: Duration = Duration::from_secs(60);

fn lose_the_primary_in_the_middle_of_the_void_run(db: &TestDb) -> Run {
    let mut holder = db.client();
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM issued_coupons WHERE (campaign_id, member_id) =
               (SELECT campaign_id, member_id FROM issued_coupons GROUP BY 1, 2 HAVING count(*) > 1
                 ORDER BY member_id DESC, campaign_id DESC LIMIT 1) FOR SHARE",
        )
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (out.path().join("stdout"), out.path().join("stderr"));
    let mut child = db
        .pgmend()
        .args([
            "apply",
            "--yes",
            "--batch-target",
            "5ms",
            "--lock-timeout",
            "60s",
        ])
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut watch = db.client();
    let started = Instant::now();
    loop {
        let waiting = watch
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()
                    AND application_name = 'pgmend' AND wait_event_type = 'Lock'
                    AND query LIKE '%FOR UPDATE%'",
                &[],
            )
            .unwrap();
        if !waiting.is_empty() {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the release ended before its void run reached the held group:\n{}",
            std::fs::read_to_string(&stderr).unwrap()
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no void batch waited for the held group"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The primary goes away: every connection pgmend has ends at once.
    let terminated = watch
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'pgmend'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0);
    assert!(terminated >= 1);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LOST_PRIMARY_EXIT_WITHIN {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "pgmend did not exit within {LOST_PRIMARY_EXIT_WITHIN:?} of losing its connections:\n{}",
                std::fs::read_to_string(&stderr).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    holder.batch_execute("COMMIT").unwrap();
    Run {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(&stdout).unwrap(),
        stderr: std::fs::read_to_string(&stderr).unwrap(),
    }
}

fn prepare_failover_during_a_release() -> Prepared {
    let db = fresh_db();
    // Enough members for several ranges of targets, so that batches commit before the last.
    db.make_legacy_baselined(1000);
    ok(&db, &["migrate", "apply", "--yes", "--target", "3"]);
    let r = lose_the_primary_in_the_middle_of_the_void_run(&db);
    eprintln!("the release when its primary went away:\n{}", r.both());
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("pgmend apply --yes"),
        "stderr names the command that continues:\n{}",
        r.stderr
    );
    assert_eq!(running_runs(&db), 1);
    assert!(
        db.scalar_i64("SELECT checkpoint FROM pgmend.repair_runs WHERE run_id = 1") > 0,
        "batches committed before the failover"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgmend'"
        ),
        0,
        "no pgmend session is left"
    );
    Prepared::new(db)
}

fn check_failover_during_a_release(db: &TestDb, work: &Path) {
    assert_eq!(running_runs(db), 0);
    // One void run, resumed and finished: its targets all done, one ledger record per
    // coupon it marked, and exactly the coupons ranked after the first of their group marked.
    let row = db
        .client()
        .query_one(
            "SELECT state, processed, (SELECT count(*) FROM pgmend.repair_targets t WHERE t.run_id = r.run_id),
                    (SELECT count(*) FROM pgmend.ledger_records l WHERE l.run_id = r.run_id)
               FROM pgmend.repair_runs r WHERE repair = 'void-duplicate-coupons'",
            &[],
        )
        .unwrap();
    let (state, processed, targets, ledger): (String, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(state, "finished");
    assert_eq!(processed, targets);
    let ranked_after_first = db.scalar_i64(
        "SELECT count(*) FROM (SELECT row_number() OVER (PARTITION BY campaign_id, member_id
                                   ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rank
                                 FROM issued_coupons) r WHERE rank > 1",
    );
    assert!(ranked_after_first > 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate"),
        ranked_after_first
    );
    assert_eq!(
        ledger, ranked_after_first,
        "each marked coupon once in the ledger"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.repair_runs WHERE state = 'finished'
                AND repair IN ('rebuild-campaign-budgets', 'rebuild-member-monthly-usage')"
        ),
        2
    );
    // The release went on to the gate, and the rerun said it resumed the run.
    assert_eq!(db.history().len(), 4);
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.gates"), 0);
    let log = std::fs::read_to_string(work.join("apply-after-failover.log")).unwrap();
    assert!(log.contains("resuming run 1"), "{log}");
    assert_eq!(files_matching(work, "ledger-1-after-failover", ".csv"), 1);
    every_check_but_the_budget_passes(db);
}

#[test]
fn failover_during_a_release() {
    run_runbook("failover-during-a-release.md");
}

// ---------------------------------------------------------------------------------------
// production-cutover.md: adopted, V2 applied; the old code issues a coupon while the new
// application is deployed at the gate.

fn prepare_production_cutover() -> Prepared {
    let db = fresh_db();
    db.make_legacy_baselined(MEMBERS);
    ok(&db, &["migrate", "apply", "--yes", "--target", "2"]);
    Prepared::new(db).hook("4. Confirm the gate", |db, _| {
        assert_eq!(db.history().len(), 4, "stopped at the gate, V5 not applied");
        old_code_issues_a_coupon(db, "SW-B", "m-late-old-code");
    })
}

fn check_production_cutover(db: &TestDb, work: &Path) {
    assert_eq!(db.history().len(), 5);
    assert_eq!(verify_code(db), 0);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pgmend.gates"), 1);
    let runs = db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'finished'");
    assert_eq!(running_runs(db), 0);
    // The ledgers were saved before the gate: one file per run that existed then.
    assert!(files_matching(work, "ledger-", ".csv") >= 3);
    assert!((files_matching(work, "ledger-", ".csv") as i64) < runs);
    assert!(json_file(&work.join("release-plan.json"))["steps"].is_array());
}

#[test]
fn production_cutover() {
    run_runbook("production-cutover.md");
}

// ---------------------------------------------------------------------------------------
// resuming-an-interrupted-repair.md: the release's void run gave up on its lock budget (a
// session held the rows of one duplicate group), leaving run 1 unfinished. Later, a counter
// run under an edited definition is left unfinished too, for the "changed definition" part.

fn prepare_resuming_an_interrupted_repair() -> Prepared {
    let db = fresh_db();
    db.make_legacy_baselined(MEMBERS);
    ok(&db, &["migrate", "apply", "--yes", "--target", "3"]);
    let r = run_while_locked(
        &db,
        "SELECT 1 FROM issued_coupons
          WHERE (campaign_id, member_id) = (SELECT campaign_id, member_id FROM issued_coupons
                                             GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 1 DESC, 2 DESC LIMIT 1)
            FOR UPDATE",
        &["apply", "--yes", "--lock-retry-for", "2s"],
    );
    assert_eq!(r.code, 1, "{}", r.both());
    assert_eq!(running_runs(&db), 1);
    Prepared::new(db).hook("Not a resumable interruption", |db, work| {
        // The same definition with a comment added: another checksum.
        let dir = work.join("edited-repairs");
        std::fs::create_dir_all(&dir).unwrap();
        let shipped =
            std::fs::read_to_string(repo().join("repairs/rebuild-member-monthly-usage.toml"))
                .unwrap();
        std::fs::write(
            dir.join("rebuild-member-monthly-usage.toml"),
            format!("{shipped}\n# edited\n"),
        )
        .unwrap();
        interrupt_usage_rebuild(db, &["--repairs-dir", dir.to_str().unwrap()]);
        let r = db.run(&["repair", "apply", "rebuild-member-monthly-usage", "--yes"]);
        assert_eq!(r.code, 1, "{}", r.both());
        assert!(r.stderr.contains("repair abandon"), "{}", r.stderr);
    })
}

fn check_resuming_an_interrupted_repair(db: &TestDb, work: &Path) {
    assert_eq!(running_runs(db), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE state = 'abandoned'"),
        1
    );
    let first: String = db
        .client()
        .query_one("SELECT state FROM pgmend.repair_runs WHERE run_id = 1", &[])
        .unwrap()
        .get(0);
    assert_eq!(first, "finished");
    assert_eq!(files_matching(work, "ledger-1-before-resume", ".csv"), 1);
    // The release went on to the gate.
    assert_eq!(db.history().len(), 4);
    every_check_but_the_budget_passes(db);
}

/// `verify`'s checks at the gate: all pass but the budget check, which V5 (after the gate) fixes.
fn every_check_but_the_budget_passes(db: &TestDb) {
    let r = db.run(&["verify", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    for check in doc["checks"].as_array().unwrap() {
        if check["name"] != "check_issued_within_budget" {
            assert_eq!(check["ok"], true, "{check}");
        }
    }
}

#[test]
fn resuming_an_interrupted_repair() {
    run_runbook("resuming-an-interrupted-repair.md");
}

// ---------------------------------------------------------------------------------------
// rollback.md: the release is complete and the new application has issued a coupon since;
// the old code, deployed in step 3, issues one before step 4.

fn prepare_rollback() -> Prepared {
    let db = released();
    new_code_issues_a_coupon(&db, "SW-B", "m-new-code");
    Prepared::new(db).hook("4. Restore them again", |db, _| {
        // The new application's last coupon before it stopped, then the old code's first.
        new_code_issues_a_coupon(db, "SW-B", "m-new-code-last");
        old_code_issues_a_coupon(db, "SW-C", "m-old-code-again");
    })
}

fn check_rollback(db: &TestDb, _work: &Path) {
    for (campaign, legacy, budgets, real) in counters(db) {
        assert_eq!(legacy, real, "{campaign}: campaigns.issued_yen");
        assert_eq!(
            budgets,
            Some(real),
            "{campaign}: campaign_budgets.issued_yen"
        );
    }
    assert_eq!(verify_code(db), 0);
}

#[test]
fn rollback() {
    run_runbook("rollback.md");
}

// ---------------------------------------------------------------------------------------
// staging-dry-run.md: a copy of production, never adopted. In step 5 the person presses
// Ctrl-C; here a session holding a counter row stops the run instead (the same state).

fn prepare_staging_dry_run() -> Prepared {
    let db = fresh_db();
    db.make_legacy_data(MEMBERS);
    Prepared::new(db).hook("5. Rehearse an interruption", |db, _| {
        interrupt_usage_rebuild(db, &[]);
    })
}

fn check_staging_dry_run(db: &TestDb, work: &Path) {
    assert_eq!(db.history().len(), 5);
    assert_eq!(running_runs(db), 0);
    assert_eq!(verify_code(db), 0);
    for f in [
        "staging-plan.txt",
        "void-diff.txt",
        "budgets-diff.txt",
        "usage-diff.txt",
    ] {
        assert!(
            std::fs::metadata(work.join(f)).unwrap().len() > 0,
            "{f} is empty"
        );
    }
    assert_eq!(
        json_file(&work.join("staging-apply-1.json"))["stopped_at_gate"],
        "deploy-new-application"
    );
    assert_eq!(
        json_file(&work.join("staging-apply-2.json"))["complete"],
        true
    );
    let runs = json_file(&work.join("staging-runs.json"));
    assert_eq!(
        files_matching(work, "staging-ledger-", ".csv"),
        runs.as_array().unwrap().len()
    );
}

#[test]
fn staging_dry_run() {
    run_runbook("staging-dry-run.md");
}

// ---------------------------------------------------------------------------------------
// finance-overrun-report.md: released; the old cart redeemed a voided coupon; a coupon issued
// later on the over-budget campaign SW-A made the counter rebuild skip it (exit 1); finance
// decided to raise SW-A's budget to cover it (the decision, given as the environment).

fn prepare_finance_overrun_report() -> Prepared {
    let db = released();
    db.client()
        .batch_execute(
            "UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id =
               (SELECT coupon_id FROM issued_coupons WHERE voided_at IS NOT NULL ORDER BY coupon_id LIMIT 1)",
        )
        .unwrap();
    old_code_issues_a_coupon(&db, "SW-A", "m-late");
    ok(
        &db,
        &["repair", "apply", "rebuild-member-monthly-usage", "--yes"],
    );
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.both().contains("issued_within_budget"), "{}", r.both());
    let real = counters(&db).into_iter().find(|c| c.0 == "SW-A").unwrap().3;
    let mut p = Prepared::new(db);
    p.env.push(("CAMPAIGN", "SW-A".into()));
    p.env
        .push(("NEW_BUDGET_YEN", ((real / 10_000 + 1) * 10_000).to_string()));
    p
}

fn check_finance_overrun_report(db: &TestDb, work: &Path) {
    let budget =
        db.scalar_i64("SELECT budget_yen::int8 FROM campaign_budgets WHERE campaign_id = 'SW-A'");
    let real = counters(db).into_iter().find(|c| c.0 == "SW-A").unwrap();
    assert_eq!(real.2, Some(real.3), "the rebuild wrote SW-A's true value");
    assert!(budget >= real.3 && budget % 10_000 == 0, "{budget}");
    assert_eq!(running_runs(db), 0);
    assert_eq!(verify_code(db), 0);
    let dir = std::fs::read_dir(work)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("overrun-report-")
        })
        .expect("the report directory");
    for section in ["summary", "campaigns", "members"] {
        let csv = std::fs::read(dir.join(format!("overruns-{section}.csv"))).unwrap();
        assert!(csv.starts_with("\u{feff}\"".as_bytes()), "Excel's BOM");
        assert!(dir
            .join(format!("overruns-cap-3000-{section}.csv"))
            .exists());
    }
    assert!(
        !dir.join("overruns.csv").exists(),
        "one file per section, no mixed file"
    );
    let doc = json_file(&dir.join("overruns.json"));
    assert_eq!(doc["state"], "released");
    assert_eq!(doc["totals"]["voided_then_redeemed"], 1);
    assert!(std::fs::read_to_string(dir.join("overruns.html"))
        .unwrap()
        .contains("<svg"));
    assert!(dir.join("overruns.md").exists());
    let xlsx = std::fs::read(dir.join("overruns-ja.xlsx")).unwrap();
    assert!(xlsx.starts_with(b"PK"), "a workbook (a zip)");
}

#[test]
fn finance_overrun_report() {
    run_runbook("finance-overrun-report.md");
}

// ---------------------------------------------------------------------------------------
// daily-reconciliation.md: released and healthy; before each "what to do" section, the hook
// breaks the invariant that section is about.

fn prepare_daily_reconciliation() -> Prepared {
    let db = released();
    Prepared::new(db)
        .hook("campaign_budgets_match_coupons", |db, _| {
            db.client()
                .batch_execute("UPDATE campaign_budgets SET issued_yen = issued_yen - 1000 WHERE campaign_id = 'SW-B'")
                .unwrap();
            assert_eq!(verify_code(db), 1);
        })
        .hook("member_monthly_usage_matches_coupons", |db, _| {
            db.client()
                .batch_execute(
                    "UPDATE member_monthly_usage SET used_yen = used_yen + 1000
                      WHERE (member_id, month) = (SELECT member_id, month FROM member_monthly_usage ORDER BY 1, 2 LIMIT 1)",
                )
                .unwrap();
            assert_eq!(verify_code(db), 1);
        })
        .hook("unique_index_one_coupon_per_member", |db, _| {
            db.client()
                .batch_execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'one_coupon_per_member'::regclass")
                .unwrap();
            assert_eq!(verify_code(db), 1);
        })
        .hook("check_issued_within_budget", |db, _| {
            db.client()
                .batch_execute("ALTER TABLE campaign_budgets DROP CONSTRAINT issued_within_budget")
                .unwrap();
            assert_eq!(verify_code(db), 1);
        })
        .hook("voided_then_redeemed", |db, _| {
            db.client()
                .batch_execute(
                    "UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id =
                       (SELECT coupon_id FROM issued_coupons WHERE voided_at IS NOT NULL ORDER BY coupon_id LIMIT 1)",
                )
                .unwrap();
        })
}

fn check_daily_reconciliation(db: &TestDb, work: &Path) {
    assert_eq!(verify_code(db), 0);
    assert_eq!(db.invalid_indexes(), 0);
    let dir = work.join("home/pgmend-reconcile");
    assert!(files_matching(&dir, "verify-", ".json") >= 1);
}

#[test]
fn daily_reconciliation() {
    run_runbook("daily-reconciliation.md");
}

/// The second example release's database: the shop's legacy schema (V1, adopted) and its
/// broken rows, with `PGMEND_RELEASE` at `examples/shop-orders`.
fn prepare_shop() -> Prepared {
    let db = fresh_db();
    let shop = repo().join("examples/shop-orders");
    let mut c = db.client();
    c.batch_execute(
        &std::fs::read_to_string(shop.join("migrations/V1__shop_baseline.sql")).unwrap(),
    )
    .unwrap();
    c.batch_execute(&std::fs::read_to_string(shop.join("seed.sql")).unwrap())
        .unwrap();
    ok(
        &db,
        &[
            "migrate",
            "baseline",
            "--yes",
            "--release",
            shop.to_str().unwrap(),
        ],
    );
    let mut prepared = Prepared::new(db);
    prepared
        .env
        .push(("PGMEND_RELEASE", shop.display().to_string()));
    prepared
}

fn check_adding_a_not_null_column(db: &TestDb, _: &Path) {
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_attribute WHERE attrelid = 'order_lines'::regclass AND attname = 'total_cents' AND attnotnull"),
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines WHERE total_cents IS DISTINCT FROM quantity::bigint * unit_cents"),
        0
    );
}

fn check_adding_a_foreign_key_with_orphans(db: &TestDb, _: &Path) {
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_constraint WHERE conrelid = 'order_lines'::regclass AND contype = 'f' AND convalidated"),
        2
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM order_lines_quarantine q WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = q.order_id)"),
        db.scalar_i64("SELECT count(*) FROM order_lines_quarantine")
    );
    assert!(db.scalar_i64("SELECT count(*) FROM order_lines_quarantine") > 0);
}

#[test]
fn adding_a_not_null_column() {
    run_runbook("adding-a-not-null-column.md");
}

#[test]
fn adding_a_foreign_key_with_orphans() {
    run_runbook("adding-a-foreign-key-with-orphans.md");
}
