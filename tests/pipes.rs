//! A closed stdout (`pgmend ... | head`) is not an error: every command with a long result,
//! its pipe closed before the first byte or after a few, exits as it does without the pipe
//! (`verify` 1 while an invariant fails), without a panic or a "Broken pipe".

mod common;

use std::io::Read;
use std::process::{Command, Stdio};

use common::*;

/// Runs `command` with stdout into a pipe whose reader reads `first` bytes and goes
/// (before the command starts when `first` is 0). Returns the exit code and stderr.
fn into_closed_pipe(mut command: Command, first: usize) -> (i32, String) {
    command.stderr(Stdio::piped());
    let mut child = if first == 0 {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        command.stdout(writer).spawn().unwrap()
    } else {
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let mut head = vec![0; first];
        child.stdout.take().unwrap().read_exact(&mut head).unwrap();
        child // the reader is dropped here, read end closed
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (child.wait().unwrap().code().unwrap_or(-1), stderr)
}

/// Runs `args` plainly, then twice into a closed pipe; the codes must agree. Returns what
/// went wrong, so that one run of the test lists every command that fails.
fn same_outcome(db: &TestDb, args: &[&str], expected: i32) -> Vec<String> {
    let plain = db.run(args);
    assert_eq!(
        plain.code,
        expected,
        "{args:?} without a pipe: {}",
        plain.both()
    );
    // Long enough that the reader goes while the command still writes.
    let first = 16;
    assert!(
        plain.stdout.len() > first,
        "{args:?}: too little output to test"
    );
    let mut wrong = Vec::new();
    for closed_after in [0, first] {
        let mut command = db.pgmend();
        command.args(args);
        let (code, stderr) = into_closed_pipe(command, closed_after);
        if code != expected || stderr.contains("panicked") || stderr.contains("Broken pipe") {
            wrong.push(format!(
                "{args:?} with stdout closed after {closed_after} bytes: exit {code} (not {expected}): {stderr}"
            ));
        }
        assert!(!stderr.contains(&db.password()));
    }
    wrong
}

#[test]
fn every_long_output_into_a_closed_pipe_keeps_its_exit_code() {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    let mut wrong = Vec::new();
    // The release's dry run, with every diff, before anything changed.
    wrong.extend(same_outcome(&db, &["plan", "--sample", "1000"], 0));
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    // Duplicates are still there: verify fails (exit 1), piped or not.
    wrong.extend(same_outcome(&db, &["verify"], 1));
    wrong.extend(same_outcome(&db, &["verify", "--format", "json"], 1));
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let log = db.run(&["--format", "csv", "repair", "log", "1"]);
    assert!(
        log.stdout.len() > 256 * 1024,
        "the log must outgrow the pipe's buffer: {} bytes",
        log.stdout.len()
    );
    for (args, code) in [
        (&["--format", "csv", "repair", "log", "1"][..], 0),
        (&["repair", "log", "1"][..], 0),
        (&["repair", "log", "1", "--format", "json"][..], 0),
        (&["report", "overruns"][..], 0),
        (
            &[
                "report",
                "overruns",
                "--format",
                "csv",
                "--section",
                "members",
            ][..],
            0,
        ),
        (&["report", "overruns", "--format", "html"][..], 0),
        (&["migrate", "status"][..], 0),
        (&["repair", "status"][..], 0),
        (&["completions", "bash"][..], 0),
        (&["completions", "zsh"][..], 0),
        (&["man"][..], 0),
    ] {
        wrong.extend(same_outcome(&db, args, code));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
