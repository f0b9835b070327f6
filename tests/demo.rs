//! `pgmend demo` runs the quick start end to end on its own throwaway server.

mod common;

use common::*;

#[test]
fn the_demo_adopts_and_migrates_a_dirty_legacy_database() {
    let r = run(pgmend_command().args(["demo", "--members", "500"]), "");
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
    assert!(r.stdout.contains("is now at V2"), "{}", r.stdout);
    // The final status lists both migrations as applied.
    assert_eq!(
        r.stdout.matches("| applied | transactional").count(),
        2,
        "{}",
        r.stdout
    );
}
