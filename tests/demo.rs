//! `pgmend demo` runs the quick start end to end on its own throwaway server.

mod common;

use common::*;

#[test]
fn the_demo_tells_the_whole_release_on_a_dirty_legacy_database() {
    let reports = tempfile::tempdir().unwrap();
    let dir = reports.path().join("reports");
    let r = run_without_password(pgmend_command().args([
        "demo",
        "--members",
        "500",
        "--reports-dir",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains("are duplicates of a (campaign, member) pair"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout.contains("recorded it as applied (not run)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("The release stopped at gate deploy-new-application"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("The release is complete"), "{}", r.stdout);
    assert!(r.stdout.contains("Every invariant holds."), "{}", r.stdout);
    // The final status: all five migrations applied.
    let last_status = r.stdout.rsplit(" version | name").next().unwrap();
    assert_eq!(
        last_status.matches("| applied |").count(),
        5,
        "{last_status}"
    );

    // The finance report shows the campaign the incident pushed over its budget.
    let table = r.stdout.rsplit("Coupon overrun report").next().unwrap();
    let sw_a = table
        .lines()
        .find(|l| l.trim_start().starts_with("SW-A"))
        .expect("the report lists SW-A");
    let overrun: i64 = sw_a
        .split('|')
        .nth(3)
        .unwrap()
        .trim()
        .replace(',', "")
        .parse()
        .unwrap();
    assert!(overrun > 0, "{sw_a}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("overruns.json")).unwrap()).unwrap();
    assert_eq!(json["state"], "released");
    assert_eq!(json["campaigns"][0]["overrun_yen"], overrun);
    // The legacy counter against the truth: told in the story, recorded at the deploy gate.
    // No coupon is issued after the gate in the demo, so what the old system issued is every
    // coupon there is: the live ones and the voided ones.
    assert!(r.stderr.contains("yen of lost updates"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("pgmend report overruns --output overruns.xlsx"),
        "the demo ends pointing at the workbook: {}",
        r.stderr
    );
    assert!(std::fs::read(dir.join("overruns.xlsx"))
        .unwrap()
        .starts_with(b"PK"));
    assert_eq!(json["legacy_counter"]["source"], "deploy_gate");
    for c in json["campaigns"].as_array().unwrap() {
        let n = |k: &str| c[k].as_i64().unwrap();
        assert_eq!(
            n("old_system_issued_yen"),
            n("issued_yen") + n("voided_yen"),
            "{c}"
        );
        assert_eq!(
            n("lost_update_yen"),
            n("old_system_issued_yen") - n("legacy_counter_yen")
        );
        assert!(
            n("lost_update_yen") > 0,
            "the demo's counter lost updates: {c}"
        );
    }
    for section in ["summary", "campaigns", "members"] {
        assert!(std::fs::read(dir.join(format!("overruns-{section}.csv")))
            .unwrap()
            .starts_with("\u{feff}".as_bytes()));
    }
    assert!(std::fs::read_to_string(dir.join("overruns.html"))
        .unwrap()
        .contains("class=\"pair\""));
}

/// The README's quick start, as written: its `cargo run --release -- ARGS` line is run as
/// `pgmend ARGS` (same binary, debug build) in a fresh directory, and must succeed.
#[test]
fn the_readme_quick_start_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("## Quick start")
        .nth(1)
        .expect("a Quick start section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block in the quick start");
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 2, "two quick-start commands: {lines:?}");
    assert_eq!(lines[1], "cargo test");
    let args: Vec<&str> = lines[0]
        .strip_prefix("cargo run --release -- ")
        .expect("the first command runs pgmend through cargo")
        .split_whitespace()
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let r = run_without_password(pgmend_command().args(&args).current_dir(dir.path()));
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("Every invariant holds."), "{}", r.stdout);
    for file in [
        "overruns-summary.csv",
        "overruns-campaigns.csv",
        "overruns-members.csv",
        "overruns.json",
        "overruns.html",
        "overruns.xlsx",
    ] {
        assert!(
            dir.path().join("pgmend-demo-reports").join(file).is_file(),
            "{file} was not written where the demo says"
        );
    }
}

/// Ctrl-C in the middle of the demo: the throwaway server is stopped and its files removed
/// (the cleanup watchdog outlives the demo process).
#[test]
fn ctrl_c_during_the_demo_removes_the_throwaway_server() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    let tmp = tempfile::tempdir().unwrap();
    let mut child = pgmend_command()
        .args(["demo", "--members", "3000", "--reports-dir"])
        .arg(tmp.path().join("reports"))
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    // Wait until the server runs and the data is being generated.
    loop {
        let line = lines
            .next()
            .expect("the demo ended before it started its server")
            .unwrap();
        if line.contains("Playing production") {
            break;
        }
    }
    let server_dirs = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("pgmend-pg-"))
            .count()
    };
    assert_eq!(server_dirs(), 1, "the throwaway server lives in TMPDIR");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let _ = child.wait().unwrap();
    let started = Instant::now();
    while server_dirs() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the throwaway server's files are still there 30 s after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // No process left running from that directory (the server's command line names it).
    // The cleanup watchdog names it too: it notices the demo's exit within a second (it polls
    // with `kill -0`), finds nothing left to stop and exits, so it gets a few seconds.
    let dir = tmp.path().display().to_string();
    let running = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&dir))
            .collect()
    };
    let started = Instant::now();
    loop {
        let left = running();
        if left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still running 10 s after the files went: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `demo --keep` says where the server's files stay, and the command it prints to stop the
/// server and remove them works as printed (as root too, where a bare `pg_ctl` refuses).
#[test]
fn demo_keep_prints_a_stop_command_that_works_and_says_where_the_files_are() {
    let reports = tempfile::tempdir().unwrap();
    let r = demo_keep(reports.path());
    let stop = r
        .stderr
        .lines()
        .skip_while(|l| !l.contains("Stop the server and remove its files with:"))
        .nth(1)
        .map(|l| l.trim().to_string());
    // Whatever happens below, the kept server goes.
    struct Cleanup(Option<String>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Some(stop) = &self.0 {
                let _ = std::process::Command::new("sh").args(["-c", stop]).status();
            }
        }
    }
    let mut cleanup = Cleanup(stop.clone());
    assert_eq!(r.code, 0, "{}", r.both());
    let stop = stop.unwrap_or_else(|| panic!("no stop command in {}", r.stderr));
    let root = stop
        .rsplit("rm -rf ")
        .next()
        .map(std::path::PathBuf::from)
        .unwrap();
    assert!(
        r.stderr.contains(&format!(
            "its files (data directory, socket, log) stay in {}",
            root.display()
        )),
        "{}",
        r.stderr
    );
    assert!(root.join("data").is_dir(), "{stop}");
    let root_user = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap();
    assert_eq!(
        stop.starts_with("runuser -u postgres -- "),
        root_user,
        "{stop}"
    );
    let status = std::process::Command::new("sh")
        .args(["-c", &stop])
        .status()
        .unwrap();
    assert!(status.success(), "{stop} failed");
    assert!(!root.exists(), "{stop} left {}", root.display());
    cleanup.0 = None;
}
