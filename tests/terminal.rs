//! The paths only a terminal takes, on a real pseudo-terminal (util-linux `script`): the
//! question before a change, answered yes and no, and the repair's progress bar.

mod common;

use common::*;

fn expanded() -> TestDb {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    db
}

#[test]
fn on_a_terminal_the_question_is_asked_and_no_changes_nothing() {
    let db = expanded();
    let (code, shown) = in_terminal(&db, "repair apply rebuild-campaign-budgets", "n\n");
    // A declined question is a safe stop (exit 1), not an input error (issue 38).
    assert_eq!(code, 1, "{shown}");
    assert!(shown.contains("[y/N]"), "{shown}");
    assert!(shown.contains("nothing was changed"), "{shown}");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM campaign_budgets"), 0);
    assert!(
        !db.exists("pgmend.ledger_records")
            || db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records") == 0
    );
}

#[test]
fn on_a_terminal_yes_applies_and_the_progress_bar_is_drawn() {
    let db = expanded();
    let (code, shown) = in_terminal(
        &db,
        "repair apply rebuild-member-monthly-usage --batch-target 20ms",
        "y\n",
    );
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("[y/N]"), "{shown}");
    // The bar's template: `NAME [=====>   ] POS/LEN targets, RATE, ETA ...`, redrawn in
    // place, instead of the plain progress lines a pipe gets.
    assert!(
        shown.contains("rebuild-member-monthly-usage [") && shown.contains("targets, "),
        "{shown}"
    );
    assert!(shown.contains("=>") || shown.contains("=="), "{shown}");
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT member_id, month FROM issued_coupons GROUP BY 1, 2) k"
        ),
        db.scalar_i64("SELECT count(*) FROM member_monthly_usage"),
        "every member-month got its row"
    );
}

/// Member-month rows of a report table: ` m0000003 | 2026-09 | ...`.
fn member_rows(text: &str) -> usize {
    text.lines()
        .filter(|l| l.trim_start().starts_with('m') && l.contains(" | 2026-"))
        .count()
}

#[test]
fn on_a_terminal_the_report_shows_the_totals_campaigns_and_first_members_and_says_how_to_get_all() {
    let db = fresh_db();
    db.make_legacy_baselined(600);
    let over = db.scalar_i64(
        "SELECT count(*) FROM (SELECT 1 FROM issued_coupons GROUP BY member_id, month
                                HAVING sum(amount_yen) > 2000) m",
    );
    assert!(over > 20, "{over}");
    let (code, shown) = in_terminal(&db, "report overruns", "");
    assert_eq!(code, 0, "{shown}");
    for part in ["Totals", "Campaigns (3)", "Members over the monthly cap"] {
        assert!(shown.contains(part), "{part}: {shown}");
    }
    assert_eq!(member_rows(&shown), 20, "{shown}");
    let more = format!(
        "... and {} more member-months over the cap",
        pgmend::human::int(over - 20)
    );
    assert!(shown.contains(&more), "{more}: {shown}");
    assert!(
        shown.contains("--members all") && shown.contains("--output overruns.xlsx"),
        "{shown}"
    );

    let (code, shown) = in_terminal(&db, "report overruns --members all", "");
    assert_eq!(code, 0, "{shown}");
    assert_eq!(member_rows(&shown) as i64, over);
    assert!(!shown.contains("more member-months"));

    // A pipe gets everything.
    let r = db.run(&["report", "overruns"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(member_rows(&r.stdout) as i64, over);
    assert!(!r.stdout.contains("more member-months"));
    // --members works anywhere the table goes; JSON always holds every row.
    let r = db.run(&["report", "overruns", "--members", "5"]);
    assert_eq!(member_rows(&r.stdout), 5);
    assert!(r
        .stdout
        .contains(&format!("... and {} more", pgmend::human::int(over - 5))));
    let r = db.run(&["report", "overruns", "--format", "json", "--members", "5"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--members only applies"), "{}", r.stderr);
}
