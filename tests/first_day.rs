//! The release engineer's first day (issue 38): each paper cut a new user met, as a test
//! named after what broke. Messages say what happened first, then what to do; exit codes are
//! the table's (0 done, 1 stopped safely or a check found problems, 2 an error).

mod common;

use std::process::{Command, Stdio};

use common::*;

/// A legacy database of `members` members, migrated to V3 and voided (run 1): a run to log
/// and undo.
fn voided_at_v3(members: i32) -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(members);
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    db
}

/// A database whose whole release is done, gate included.
fn complete_release() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(60);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("The release is complete"), "{}", r.stdout);
    db
}

/// Finding 7: `apply` on a complete release is "nothing to do": exit 0 and no question, with
/// or without `--yes`, with or without a terminal (it used to refuse without a terminal, exit
/// 2, and ask on one).
#[test]
fn apply_on_a_complete_release_says_nothing_to_apply_and_asks_nothing() {
    let db = complete_release();
    let before = snapshot(&db);
    for args in [&["apply"][..], &["apply", "--yes"][..]] {
        let r = db.run(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.both());
        assert!(
            r.stdout
                .contains("Nothing to apply: the release is complete"),
            "{args:?}: {}",
            r.stdout
        );
        assert!(!r.stderr.contains("no terminal"), "{args:?}: {}", r.stderr);
    }
    let r = db.run(&["apply", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["complete"], true, "{doc}");
    assert_eq!(doc["steps"], serde_json::json!([]), "{doc}");
    let (code, shown) = in_terminal(&db, "apply", "");
    assert_eq!(code, 0, "{shown}");
    assert!(!shown.contains("[y/N]"), "{shown}");
    assert!(shown.contains("Nothing to apply"), "{shown}");
    assert_eq!(snapshot(&db), before, "nothing changed");
}

/// Finding 8: answering no is not an input error but a safe stop: exit 1 (so that `pgmend
/// apply && deploy` does not deploy), saying what happened and how to go on.
#[test]
fn declining_the_question_exits_1_and_says_how_to_go_on() {
    let db = fresh_db();
    db.make_legacy_baselined(60);
    let before = snapshot(&db);
    let (code, shown) = in_terminal(&db, "apply", "n\n");
    assert_eq!(code, 1, "{shown}");
    assert!(shown.contains("[y/N]"), "{shown}");
    assert!(shown.contains("pgmend: stopped: "), "{shown}");
    assert!(shown.contains("nothing was changed"), "{shown}");
    assert!(shown.contains("--yes"), "says how to go on: {shown}");
    assert!(!shown.contains("pgmend: error"), "{shown}");
    assert_eq!(snapshot(&db), before);
}

/// Finding 8, the documents: the exit-code tables give a declined question exit 1.
#[test]
fn the_exit_code_tables_say_a_declined_question_is_exit_1() {
    for file in ["README.md", "docs/exit-codes.md"] {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        let row = |code: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("| {code} |")))
                .unwrap_or_else(|| panic!("{file} has no row for exit {code}"))
                .to_string()
        };
        assert!(
            row("1").contains("a question answered no"),
            "{file}: {}",
            row("1")
        );
        assert!(!row("2").contains("refused or unanswered"), "{file}");
    }
}

/// Finding 14: `--output` with an extension pgmend does not write is refused (exit 2) before
/// anything is written, naming the ones it writes (it used to write a text table into
/// `overruns.xls`).
#[test]
fn report_output_with_an_extension_pgmend_does_not_write_is_refused() {
    let db = fresh_db();
    db.make_legacy_baselined(30);
    let dir = tempfile::tempdir().unwrap();
    for name in ["overruns.xls", "overruns.pdf", "overruns.docx"] {
        let path = dir.path().join(name);
        let r = db.run(&["report", "overruns", "--output", path.to_str().unwrap()]);
        assert_eq!(r.code, 2, "{name}: {}", r.both());
        for ext in [".xlsx", ".csv", ".json", ".md", ".html", ".txt"] {
            assert!(r.stderr.contains(ext), "{name} names {ext}: {}", r.stderr);
        }
        assert!(!path.exists(), "{name} was written");
    }
}

/// Finding 4: a legacy database not yet adopted. `migrate status` says to baseline it, and
/// `plan` puts that blocker before the pending steps, not after 400 lines of SQL.
#[test]
fn a_forgotten_baseline_is_said_first() {
    let db = fresh_db();
    db.make_legacy_data(30);
    let r = db.run(&["migrate", "status"]);
    assert!(r.stdout.contains("pgmend migrate baseline"), "{}", r.stdout);
    for plan in [&["plan"][..], &["migrate", "plan"]] {
        let r = db.run(plan);
        assert_eq!(r.code, 2, "{plan:?}: {}", r.both());
        let first = r
            .stdout
            .lines()
            .position(|l| l.contains("pgmend migrate baseline"))
            .unwrap_or_else(|| panic!("{plan:?}: no baseline hint: {}", r.stdout));
        assert!(
            first < 10,
            "{plan:?}: the blocker is on line {first}: {}",
            r.stdout
        );
    }
}

/// Finding 6: with no connection settings at all, say that none was found and how to give
/// one (it used to say "no database user given").
#[test]
fn no_connection_settings_at_all_says_how_to_give_one() {
    let r = run_without_password(
        pgmend_command()
            .args(["migrate", "status"])
            .env_remove("USER")
            .env_remove("LOGNAME"),
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr
            .starts_with("pgmend: error: no database to connect to"),
        "{}",
        r.stderr
    );
    for part in ["DATABASE_URL", "--database-url", "PGHOST"] {
        assert!(r.stderr.contains(part), "{part}: {}", r.stderr);
    }
}

/// Finding 9: close misses get a hint: `-y` for `--yes`, and an option given before the
/// subcommand that takes it.
#[test]
fn close_misses_get_a_hint() {
    let r = run_without_password(pgmend_command().args(["apply", "-y"]));
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("hint: "), "{}", r.stderr);
    assert!(r.stderr.contains("pgmend apply --yes"), "{}", r.stderr);
    let r = run_without_password(pgmend_command().args(["--lang", "ja", "report", "overruns"]));
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains(
            "hint: --lang goes after the command that takes it: pgmend report overruns --lang"
        ),
        "{}",
        r.stderr
    );
}

/// Finding 16: `repair log` takes `--limit` and says how many entries it left out; the table
/// stops at 200 by default, JSON and CSV hold every entry unless `--limit` is given; the usage
/// line does not show `--database-url` as if it were required.
#[test]
fn repair_log_takes_a_limit_and_says_how_many_it_left_out() {
    let db = voided_at_v3(2000);
    let csv = db.run(&["--format", "csv", "repair", "log", "1"]);
    assert_eq!(csv.code, 0, "{}", csv.both());
    let total = csv.stdout.lines().count() - 1;
    assert!(total > 200, "{total} entries");
    let entries = |text: &str| text.lines().filter(|l| l.contains(" -> ")).count();

    let r = db.run(&["repair", "log", "1", "--limit", "5"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(entries(&r.stdout), 5, "{}", r.stdout);
    let more = format!(
        "... and {} more entries",
        pgmend::human::int(total as i64 - 5)
    );
    assert!(r.stdout.contains(&more), "{more}: {}", r.stdout);
    assert!(r.stdout.contains("--limit all"), "{}", r.stdout);

    let r = db.run(&["repair", "log", "1"]);
    assert_eq!(entries(&r.stdout), 200, "the table stops at 200");
    assert!(r.stdout.contains(&format!(
        "... and {} more entries",
        pgmend::human::int(total as i64 - 200)
    )));
    let r = db.run(&["repair", "log", "1", "--limit", "all"]);
    assert_eq!(entries(&r.stdout), total);
    assert!(!r.stdout.contains("more entries"));

    let r = db.run(&["--format", "json", "repair", "log", "1"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc.as_array().unwrap().len(), total, "JSON is never cut");
    let r = db.run(&["--format", "json", "repair", "log", "1", "--limit", "3"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc.as_array().unwrap().len(), 3);
    assert!(
        r.stderr.contains(&format!(
            "left out {} more entries",
            pgmend::human::int(total as i64 - 3)
        )),
        "{}",
        r.stderr
    );
    let r = db.run(&["--format", "csv", "repair", "log", "1", "--limit", "3"]);
    assert_eq!(r.stdout.lines().count(), 4, "{}", r.stdout);

    let r = db.run(&["repair", "log"]);
    assert_eq!(r.code, 2, "{}", r.both());
    let usage = r.stderr.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(!usage.contains("--database-url"), "{usage}");
}

/// Finding 2: `demo --keep` prints a ready `export DATABASE_URL=...` that pgmend connects
/// with.
#[test]
fn demo_keep_prints_a_ready_database_url_for_pgmend() {
    let reports = tempfile::tempdir().unwrap();
    let r = demo_keep(reports.path());
    let line = |after: &str| {
        r.stderr
            .lines()
            .skip_while(|l| !l.contains(after))
            .nth(1)
            .map(|l| l.trim().to_string())
    };
    struct Cleanup(Option<String>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Some(stop) = &self.0 {
                let _ = Command::new("sh").args(["-c", stop]).status();
            }
        }
    }
    let _cleanup = Cleanup(line("Stop the server and remove its files with:"));
    assert_eq!(r.code, 0, "{}", r.both());
    let export = r
        .stderr
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("export DATABASE_URL="))
        .unwrap_or_else(|| panic!("no export line: {}", r.stderr));
    let out = Command::new("sh")
        .args([
            "-c",
            &format!(
                "{export} && {} migrate status",
                env!("CARGO_BIN_EXE_pgmend")
            ),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Finding 1: the README says how to install the binary and where it goes.
#[test]
fn the_readme_says_how_to_install_the_binary() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(readme.contains("cargo install --path ."), "README");
    assert!(readme.contains("~/.cargo/bin"), "README says where it goes");
}

/// Finding 3: one verdict per step. The plan of a fresh legacy release counts V4's census now
/// (duplicates the void step before it will clear) and predicts it after that step: only the
/// prediction may say whether apply stops there.
#[test]
fn the_plan_gives_one_verdict_per_census() {
    let db = fresh_db();
    db.make_legacy_baselined(300);
    let r = db.run(&["plan", "--sample", "1"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let v4 = r
        .stdout
        .split("\n## step ")
        .find(|s| s.contains(": migration V4"))
        .unwrap_or_else(|| panic!("no V4 step: {}", r.stdout));
    assert!(v4.contains("predicted"), "{v4}");
    assert!(v4.contains("counted now"), "{v4}");
    // The census counted now finds the duplicates; the prediction, none: its verdict is the
    // only one.
    assert!(!v4.contains("apply stops here"), "{v4}");
    assert_eq!(v4.matches("apply passes").count(), 1, "{v4}");
}

/// Finding 5: the NOT VALID budget check with rows breaking it. The census names the
/// constraint to validate (not `NAME`) and says how to accept the rows; `migrate validate`
/// says so too; `verify` says the check is NOT VALID and how many rows break it.
#[test]
fn a_not_valid_check_with_rows_breaking_it_is_named_and_explained() {
    let db = fresh_db();
    db.make_legacy_baselined(300);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let breaking = db.scalar_i64(
        "SELECT count(*) FROM campaign_budgets WHERE NOT (issued_yen BETWEEN 0 AND budget_yen)",
    );
    assert!(breaking > 0, "the demo's data overruns a budget");
    assert!(!r.stderr.contains("validate NAME"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("`pgmend migrate validate issued_within_budget`"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("leave the check NOT VALID"),
        "{}",
        r.stderr
    );

    let r = db.run(&["migrate", "validate", "issued_within_budget", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("leave the check NOT VALID"),
        "{}",
        r.stderr
    );

    let r = db.run(&["verify"]);
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("check_issued_within_budget"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(line.contains("NOT VALID"), "{line}");
    assert!(
        line.contains(&format!("{} row", pgmend::human::int(breaking))),
        "{line}"
    );
    let r = db.run(&["verify", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let check = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "check_issued_within_budget")
        .unwrap()
        .clone();
    assert_eq!(check["ok"], true, "the check is in place: {check}");
    assert!(
        check["detail"].as_str().unwrap().contains("NOT VALID"),
        "{check}"
    );
}

/// The widest line of a table in `text`, in characters (the terminal's columns it needs).
fn widest_table(text: &str) -> usize {
    text.lines()
        .filter(|l| l.contains(" | ") || l.contains("-+-"))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
}

/// Finding 15: no human table wider than about 120 columns: a failed check's samples go
/// below the table, not into a cell that pads every row; the report's campaign table fits,
/// with headers in words, not snake_case.
#[test]
fn human_tables_fit_in_120_columns() {
    let db = complete_release();
    // Counters that drifted: verify fails, with JSON samples of the broken keys.
    db.client()
        .batch_execute(
            "ALTER TABLE member_monthly_usage DISABLE TRIGGER USER;
             UPDATE member_monthly_usage SET used_yen = used_yen + 1;",
        )
        .unwrap();
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(widest_table(&r.stdout) <= 120, "{}", r.stdout);
    assert!(
        r.stdout.contains("\"member_id\""),
        "the samples are still shown: {}",
        r.stdout
    );
    let r = db.run(&["report", "overruns"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let header = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Campaigns"))
        .find(|l| l.contains(" | "))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(!header.contains('_'), "{header}");
    for args in [
        &["report", "overruns"][..],
        &["repair", "status"][..],
        &["migrate", "status"][..],
    ] {
        let r = db.run(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.both());
        assert!(widest_table(&r.stdout) <= 120, "{args:?}:\n{}", r.stdout);
    }
}

/// Finding 11: Ctrl-C during the demo says what happened and what becomes of the throwaway
/// server, and exits 130 (it used to end with no word).
#[test]
fn ctrl_c_during_the_demo_says_what_happens_to_the_server() {
    use std::io::{BufRead, BufReader, Read};

    let tmp = tempfile::tempdir().unwrap();
    let mut child = pgmend_command()
        .args(["demo", "--members", "3000", "--reports-dir"])
        .arg(tmp.path().join("reports"))
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the demo ended before it started its server: {seen}"
        );
        seen.push_str(&line);
        if line.contains("Playing production") {
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    stderr.read_to_string(&mut seen).unwrap();
    let code = child.wait().unwrap().code();
    assert_eq!(code, Some(130), "{seen}");
    assert!(
        seen.contains("pgmend: the demo was interrupted (SIGINT)"),
        "{seen}"
    );
    assert!(
        seen.contains("the throwaway server and its files are being removed"),
        "{seen}"
    );
}

/// Finding 12: `verify` and `report overruns` as a role without the grants they need: what the
/// role may not read and the GRANTs, instead of a raw `permission denied`.
#[test]
fn a_reporting_role_without_grants_is_told_which_to_ask_for() {
    let db = complete_release();
    let role = LoginRole::create(&db, "reader", "Reader-Pass-3", "");
    for args in [&["verify"][..], &["report", "overruns"][..]] {
        let r = role.run(&db, args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.starts_with(&format!(
                "pgmend: error: role {} may not read what",
                role.name
            )),
            "{args:?}: {}",
            r.stderr
        );
        for grant in [
            format!("GRANT USAGE ON SCHEMA pgmend TO {}", role.name),
            "GRANT SELECT ON ".to_string(),
        ] {
            assert!(r.stderr.contains(&grant), "{args:?} {grant}: {}", r.stderr);
        }
        assert!(!r.stderr.contains("permission denied"), "{}", r.stderr);
    }
    let doc = std::fs::read_to_string(repo().join("docs/connecting.md")).unwrap();
    assert!(doc.contains("## A role for verify and the report"), "docs");
}

/// Finding 13: `repair undo` as a read-only role lists every missing GRANT first, as
/// `repair apply` does (it used to fail on a raw `permission denied for table repair_runs`).
#[test]
fn repair_undo_as_a_read_only_role_lists_the_missing_grants() {
    let db = voided_at_v3(60);
    let role = LoginRole::create(
        &db,
        "readonly",
        "Read-Only-Pass-5",
        "GRANT USAGE ON SCHEMA pgmend TO {role};
         GRANT SELECT ON ALL TABLES IN SCHEMA pgmend, public TO {role};",
    );
    let before = snapshot(&db);
    let r = role.run(&db, &["repair", "undo", "1", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains(&format!(
            "role {} lacks privileges that undoing run 1 needs; nothing was changed",
            role.name
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("GRANT UPDATE"), "{}", r.stderr);
    assert!(!r.stderr.contains("permission denied"), "{}", r.stderr);
    assert_eq!(snapshot(&db), before);
}

/// Finding 18: the man page names every command in full instead of pointing at pages that
/// are never generated (pgmend-migrate(1), ...), and has ENVIRONMENT and EXIT STATUS sections.
#[test]
fn the_man_page_names_every_command_and_the_environment() {
    let r = run_without_password(pgmend_command().arg("man"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let page = &r.stdout;
    assert!(!page.contains("(1)"), "a reference to another page: {page}");
    for part in [
        ".SH COMMANDS",
        "pgmend migrate status",
        "pgmend repair log",
        "pgmend report overruns",
        ".SH ENVIRONMENT",
        "DATABASE_URL",
        "PGMEND_MIGRATIONS_DIR",
        ".SH EXIT STATUS",
    ] {
        assert!(page.contains(part), "{part}: {page}");
    }
}

/// Finding 10: Ctrl-C on a terminal during `repair apply`: the stop notice gets a line of its
/// own, and the progress bar's next redraw does not overwrite it (it used to be written after
/// the bar on the bar's line, and redrawn over: "...a guard trigger i").
#[test]
fn the_stop_notice_is_not_overwritten_by_the_progress_bar() {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    let exe = env!("CARGO_BIN_EXE_pgmend");
    // In the background of a non-interactive shell stdin is /dev/null (hence --yes); stderr
    // is the terminal, so the bar is drawn.
    let shell = format!(
        "{exe} repair apply rebuild-member-monthly-usage --yes --batch-target 20ms --pause 1s & p=$!; sleep 2; kill -INT $p; wait $p; echo exit=$?"
    );
    let mut script = Command::new("script");
    for var in pgmend::db::conninfo::environment_variables() {
        script.env_remove(var);
    }
    script.env("PGMEND_JOBS", "1");
    let out = script
        .args(["-q", "-e", "-c", &shell, "/dev/null"])
        .env("DATABASE_URL", db.conninfo())
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("util-linux script");
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!shown.contains(&db.password()));
    assert!(shown.contains("exit=1"), "{shown}");
    assert!(
        shown.contains("rebuild-member-monthly-usage ["),
        "a bar: {shown}"
    );
    let notice = "pgmend: SIGINT: stopping cleanly";
    let at = shown
        .find(notice)
        .unwrap_or_else(|| panic!("no notice: {shown}"));
    // What the terminal shows on the notice's line before it: nothing but escape codes.
    let line_start = shown[..at].rfind(['\n', '\r']).map_or(0, |i| i + 1);
    let before = visible(&shown[line_start..at]);
    assert!(
        before.is_empty(),
        "the notice shares a line with {before:?}: {shown:?}"
    );
    // The whole notice, then a new line: nothing drawn over its end.
    let rest = &shown[at..];
    let end = rest
        .find("a second signal stops at once)")
        .expect("the notice whole");
    let after = &rest[end + "a second signal stops at once)".len()..];
    assert!(
        after.starts_with("\r\n") || after.starts_with('\n'),
        "{:?}",
        &after[..after.len().min(40)]
    );
}

/// `text` without its terminal escape sequences (CSI: ESC [ parameters, then a letter).
fn visible(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Finding 17: `repair undo` shows the progress `repair apply` shows (a bar on a terminal; a
/// line at most every 2 s elsewhere, not one per batch of 1,000 records), and `repair status`
/// shows no undo checkpoint larger than the total (it is a ledger record id, not a count).
#[test]
fn undo_shows_progress_as_apply_does_and_status_a_checkpoint_that_makes_sense() {
    let db = voided_at_v3(8000);
    let records = db
        .run(&["--format", "csv", "repair", "log", "1"])
        .stdout
        .lines()
        .count()
        - 1;
    let batches = records.div_ceil(1000);
    assert!(batches >= 3, "{records} records");
    let copy = copy_of(&db);

    let r = db.run(&["repair", "undo", "1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let lines = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("undo of run 1"))
        .count();
    assert!(
        lines < batches,
        "{lines} progress lines for {batches} batches:\n{}",
        r.stderr
    );
    let r = db.run(&["repair", "status"]);
    let undo = r
        .stdout
        .lines()
        .find(|l| l.contains("undoes run 1"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(!undo.contains("checkpoint"), "{undo}");

    let (code, shown) = in_terminal(&copy, "repair undo 1 --yes", "");
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("undo of run 1 ["), "a bar: {shown}");
}

/// Finding 18, --help: each command's help offers the formats it renders, and the commands
/// that take none (`demo`, `man`, `completions`) do not advertise --format.
#[test]
fn help_offers_only_the_formats_a_command_renders() {
    let help = |args: &[&str]| {
        let r = run_without_password(pgmend_command().args(args).arg("--help"));
        assert_eq!(r.code, 0, "{args:?}: {}", r.both());
        r.stdout
    };
    for args in [&["demo"][..], &["man"][..], &["completions"][..]] {
        assert!(!help(args).contains("--format"), "{args:?}");
    }
    for (args, offered, not) in [
        (&["verify"][..], "human, json or openmetrics", "xlsx"),
        (
            &["repair", "status"][..],
            "human, json or openmetrics",
            "xlsx",
        ),
        (&["migrate", "status"][..], "human or json", "csv"),
        (&["repair", "log"][..], "human, json or csv", "xlsx"),
        (&["plan"][..], "human, json or markdown", "xlsx"),
        (&["report", "overruns"][..], "xlsx", "\u{0}"),
    ] {
        let text = help(args);
        assert!(text.contains("--format"), "{args:?}: {text}");
        assert!(text.contains(offered), "{args:?} {offered}: {text}");
        assert!(!text.contains(not), "{args:?} {not}: {text}");
    }
    // The option still works before and after the command.
    for args in [
        &["verify", "--format", "html"][..],
        &["--format", "html", "verify"][..],
    ] {
        let r = run_without_password(pgmend_command().args(args));
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("--format html is only for"),
            "{}",
            r.stderr
        );
    }
}
