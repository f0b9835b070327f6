//! Hints that point the right way: each refusal names what the user should run or fix, and
//! exits with the code the exit table gives it.

mod common;

use common::*;

/// Without a terminal and without `--yes`, each changing command refuses (exit 2) and names
/// its own dry run.
#[test]
fn without_a_terminal_each_command_names_its_own_dry_run() {
    let db = fresh_db();
    db.make_legacy_baselined(60);
    let refused = |args: &[&str], dry_run: &str| {
        let r = db.run(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("there is no terminal to ask on")
                && r.stderr
                    .contains(&format!("(`{dry_run}`), then rerun with --yes")),
            "{args:?} should name `{dry_run}`: {}",
            r.stderr
        );
        if dry_run != "pgmend migrate plan" {
            assert!(!r.stderr.contains("migrate plan"), "{args:?}: {}", r.stderr);
        }
    };
    refused(&["apply"], "pgmend plan");
    refused(&["migrate", "apply"], "pgmend migrate plan");
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    refused(
        &["repair", "apply", "void-duplicate-coupons"],
        "pgmend repair plan void-duplicate-coupons",
    );
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    refused(&["repair", "undo", "1"], "pgmend repair log 1");
    // Nothing was changed by the refusals: the run is still there, not undone.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs"),
        1,
        "the refused undo started a run"
    );
}

/// A database without the release's tables is the wrong database, not a legacy one: verify
/// says so and exits 2, as the report does.
#[test]
fn verify_on_a_database_without_the_coupon_tables_says_they_are_missing() {
    let db = fresh_db();
    for args in [&["verify"][..], &["verify", "--format", "json"][..]] {
        let r = db.run(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr
                .contains("this database has none of the tables release coupon-incident works on (campaigns, issued_coupons,"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(!r.both().contains("legacy state"), "{args:?}: {}", r.both());
    }
    let r = db.run(&["report", "overruns"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r
        .stderr
        .contains("has no campaigns and issued_coupons tables"));
    // A real legacy database still verifies as one (exit 1).
    db.make_legacy();
    let r = db.run(&["verify"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stdout.contains("legacy state"), "{}", r.stdout);
}
