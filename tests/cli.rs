//! The command line itself: shell completions and the man page come from the clap
//! definition, and formats a command cannot render are refused before anything runs.

mod common;

use common::*;

fn output(args: &[&str]) -> Run {
    run_without_password(pgmend_command().args(args))
}

#[test]
fn completions_are_generated_for_every_shell_and_bash_parses_its_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let r = output(&["completions", shell]);
        assert_eq!(r.code, 0, "{shell}: {}", r.both());
        for word in ["report", "overruns", "monthly-cap-yen", "confirm"] {
            assert!(r.stdout.contains(word), "{shell} completion lacks {word}");
        }
    }
    let script = output(&["completions", "bash"]).stdout;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgmend.bash");
    std::fs::write(&path, script).unwrap();
    let status = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success(), "bash -n rejects the completion script");
    assert_eq!(output(&["completions", "tcsh"]).code, 2);
}

#[test]
fn the_man_page_is_roff_and_lists_the_commands() {
    let r = output(&["man"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains(".TH pgmend 1"), "{}", &r.stdout[..200]);
    for command in [
        "migrate", "plan", "apply", "repair", "verify", "report", "demo",
    ] {
        assert!(
            r.stdout.contains(&format!("pgmend\\-{command}")) || r.stdout.contains(command),
            "the man page does not mention {command}"
        );
    }
}

#[test]
fn a_format_the_command_cannot_render_is_refused_with_exit_2() {
    for (args, what) in [
        (&["verify", "--format", "html"][..], "report overruns"),
        (&["migrate", "status", "--format", "csv"][..], "repair log"),
        // `plan` renders Markdown (the change ticket), not HTML.
        (&["plan", "--format", "html"][..], "report overruns"),
        (
            &["verify", "--format", "markdown"][..],
            "only for `pgmend plan` and `pgmend report overruns`",
        ),
        // One fixed output each: no format means anything to them.
        (
            // (--members 0 is refused too, after the format: so the old code ran no demo)
            &["demo", "--members", "0", "--format", "json"][..],
            "means nothing to `pgmend demo`",
        ),
        (
            &["--format", "json", "completions", "bash"][..],
            "means nothing to `pgmend completions`",
        ),
        (
            &["man", "--format", "csv"][..],
            "means nothing to `pgmend man`",
        ),
    ] {
        let r = output(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(r.stderr.contains(what), "{args:?}: {}", r.stderr);
    }
}

/// An option given to a command that does not take it: clap says only "unexpected
/// argument"; pgmend adds which commands take it. Before the subcommand, clap's own tip
/// (`'verify --database-url' exists`) is enough, and no second hint is added.
#[test]
fn an_option_on_the_wrong_command_says_which_commands_take_it() {
    for (args, hint) in [
        (
            &["migrate", "status", "--yes"][..],
            "hint: --yes is not an option of `pgmend migrate status`; it belongs to `pgmend migrate apply`",
        ),
        (
            &["report", "overruns", "--target", "3"][..],
            "hint: --target is not an option of `pgmend report overruns`; it belongs to `pgmend migrate plan`, `pgmend migrate apply`",
        ),
        (
            &["repair", "log", "1", "--repairs-dir=/tmp"][..],
            "hint: --repairs-dir is not an option of `pgmend repair log`",
        ),
        (
            &["demo", "--database-url", "x"][..],
            "hint: --database-url is not an option of `pgmend demo`; it belongs to `pgmend migrate status`",
        ),
    ] {
        let r = output(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(r.stderr.contains(hint), "{args:?}: {}", r.stderr);
    }
    for args in [
        &["--database-url", "x", "verify"][..],
        &["migrate", "--yes", "apply"][..],
    ] {
        let r = output(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("tip:") && !r.stderr.contains("hint:"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = output(&["verify", "--bogus"]);
    assert_eq!(r.code, 2);
    assert!(!r.stderr.contains("hint:"), "{}", r.stderr);
}
