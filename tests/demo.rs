//! `pgmend demo` runs the quick start end to end on its own throwaway server.

mod common;

use common::*;

#[test]
fn the_demo_tells_the_whole_release_on_a_dirty_legacy_database() {
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
}
