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
    assert!(
        r.stderr
            .contains("V3__one_coupon_per_member was not attempted"),
        "{}",
        r.stderr
    );
    // The final status: V1 and V2 applied, V3 (online) and V4 pending.
    let last_status = r.stdout.rsplit(" version | name").next().unwrap();
    assert_eq!(
        last_status.matches("| applied | transactional").count(),
        2,
        "{last_status}"
    );
    assert_eq!(
        last_status.matches("| pending ").count(),
        2,
        "{last_status}"
    );
}
