//! The plan as a change ticket and as a rehearsal (issue 18, items 4 and 5): `plan --format
//! markdown` read back by a real Markdown parser, the estimates it shows, and `plan --compare`
//! between a staging database and a production-like one.

mod common;

use common::{fresh_db, TestDb};
use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use serde_json::Value;

const HOSTILE: &str = "<script>alert(1)</script>|x";

/// What a Markdown parser reads in `text`: the HTML it would pass through, the tables (each a
/// list of rows of cell texts), and the fenced code blocks (info string, text).
struct Read {
    html: Vec<String>,
    tables: Vec<Vec<Vec<String>>>,
    code: Vec<(String, String)>,
}

fn read(text: &str) -> Read {
    let mut r = Read {
        html: Vec::new(),
        tables: Vec::new(),
        code: Vec::new(),
    };
    let (mut cell, mut row, mut in_code) = (None::<String>, Vec::new(), None::<(String, String)>);
    for event in Parser::new_ext(text, Options::ENABLE_TABLES) {
        match event {
            Event::Html(h) | Event::InlineHtml(h) => r.html.push(h.to_string()),
            Event::Start(Tag::Table(_)) => r.tables.push(Vec::new()),
            Event::Start(Tag::TableCell) => cell = Some(String::new()),
            Event::End(TagEnd::TableCell) => row.push(cell.take().unwrap()),
            Event::End(TagEnd::TableRow) | Event::End(TagEnd::TableHead) => {
                r.tables.last_mut().unwrap().push(std::mem::take(&mut row))
            }
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                in_code = Some((info.to_string(), String::new()))
            }
            Event::End(TagEnd::CodeBlock) => r.code.extend(in_code.take()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(c) = cell.as_mut() {
                    c.push_str(&t);
                } else if let Some((_, c)) = in_code.as_mut() {
                    c.push_str(&t);
                }
            }
            _ => {}
        }
    }
    r
}

/// A legacy database with the demo's data and a campaign whose id is HTML and a cell break,
/// with a duplicate coupon, adopted.
fn hostile_db() -> TestDb {
    let db = fresh_db();
    db.make_legacy_data(100);
    db.client()
        .execute(
            "INSERT INTO campaigns VALUES ($1, 1000, 100000, 0)",
            &[&HOSTILE],
        )
        .unwrap();
    db.client()
        .execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), $1, 'm0000001', '2026-09', 1000 FROM generate_series(1, 2)",
            &[&HOSTILE],
        )
        .unwrap();
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    db
}

#[test]
fn the_markdown_plan_parses_as_tables_and_code_and_shows_a_hostile_campaign_id_as_text() {
    let db = hostile_db();
    let r = db.run(&["plan", "--format", "markdown"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let md = read(&r.stdout);
    assert!(
        md.html.is_empty(),
        "raw HTML in the Markdown: {:?}",
        md.html
    );
    // The summary: one row per step of the release (11) under its header, an estimate for
    // each pending step but the gate.
    let summary = &md.tables[0];
    assert_eq!(
        summary[0],
        [
            "step",
            "what",
            "status",
            "estimated duration",
            "estimate from"
        ]
    );
    assert_eq!(summary.len(), 12, "{summary:?}");
    for row in &summary[1..] {
        assert_eq!(row.len(), 5, "{row:?}");
        let without = row[1].starts_with("gate ") || row[2] == "done";
        assert_eq!(row[3].is_empty(), without, "{row:?}");
        assert!(without || row[4].starts_with("calibration"), "{row:?}");
    }
    assert_eq!(summary[1][2], "done", "V1 is baselined");
    // The void's yen per campaign: the hostile id is one cell, as text.
    let totals = md
        .tables
        .iter()
        .find(|t| t.iter().any(|row| row[0] == HOSTILE))
        .unwrap_or_else(|| panic!("no table cell holds {HOSTILE:?}:\n{}", r.stdout));
    let row = totals.iter().find(|row| row[0] == HOSTILE).unwrap();
    assert_eq!(row, &[HOSTILE, "1,000"]);
    // Statements and locks as tables, the SQL as code.
    assert!(md
        .tables
        .iter()
        .any(|t| t[0] == ["line", "statement", "locks"]));
    assert!(
        md.code.iter().any(|(info, text)| info == "sql"
            && text.contains("CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member")),
        "{:?}",
        md.code
    );
    // A sample of the diffs, as a table.
    assert!(md
        .tables
        .iter()
        .any(|t| t[0] == ["table", "key", "column", "before", "after", "why"] && t.len() > 1));
}

/// A pending step's estimate in the plan's JSON.
fn estimate(doc: &Value, step: usize) -> (u64, String) {
    let e = &doc["steps"][step - 1]["estimate"];
    (
        e["milliseconds"].as_u64().unwrap_or_else(|| panic!("{e}")),
        e["from"].as_str().unwrap().to_string(),
    )
}

fn plan_json(db: &TestDb, extra: &[&str]) -> Value {
    let mut args = vec!["plan", "--format", "json"];
    args.extend_from_slice(extra);
    let r = db.run(&args);
    assert_eq!(r.code, 0, "{}", r.both());
    serde_json::from_str(&r.stdout).unwrap()
}

/// New coupons for `n` new members of SW-B: no duplicates, but counters out of step.
fn new_coupons(db: &TestDb, n: i32) {
    db.client()
        .execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             SELECT gen_random_uuid(), 'SW-B', 'new' || g, '2026-09', 1000 FROM generate_series(1, $1) g",
            &[&n],
        )
        .unwrap();
}

#[test]
fn an_estimate_uses_the_rate_of_a_run_recorded_on_this_server() {
    let db = fresh_db();
    db.make_legacy_baselined(200);
    let doc = plan_json(&db, &[]);
    assert!(estimate(&doc, 7).1.starts_with("calibration"), "{doc}");
    // V4 (step 5) takes its census during its build in the release: the longer of the two.
    assert!(
        estimate(&doc, 5)
            .1
            .ends_with("the census taken during the build: the longer of the two"),
        "{doc}"
    );
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // The member-month rebuild of step 7 ran once: make its run take 10 s exactly.
    let mut c = db.client();
    let row = c
        .query_one(
            "UPDATE pgmend.repair_runs SET as_of = finished_at - interval '10 seconds'
              WHERE repair = 'rebuild-member-monthly-usage' RETURNING run_id, changed",
            &[],
        )
        .unwrap();
    let (run_id, changed): (i64, i64) = (row.get(0), row.get(1));
    assert!(changed > 0);
    new_coupons(&db, 30);
    let doc = plan_json(&db, &[]);
    let changes = doc["steps"][9]["repair"]["changes"].as_i64().unwrap();
    assert_eq!(changes, 30, "{doc}");
    let (millis, from) = estimate(&doc, 10);
    assert!(
        from.starts_with(&format!("from run {run_id} on this server: ")),
        "{from}"
    );
    // 10 s for `changed` rows: `changes` rows take changes × 10,000 / changed ms, rounded up.
    let expected = (changes * 10_000 + changed - 1) / changed;
    assert!(
        (millis as i64 - expected).abs() <= 1,
        "{millis} ms, expected {expected} ms: {from}"
    );
    // The human plan shows it under the step.
    let r = db.run(&["plan"]);
    assert!(
        r.stdout.contains(&format!(
            "\n## step 10: repair rebuild-member-monthly-usage\n(estimated {}: from run {run_id} on this server: ",
            pgmend::human::millis(millis)
        )),
        "{}",
        r.stdout
    );
}

/// Applies the release up to the gate, then makes `new` counter rows drift.
fn to_the_gate(db: &TestDb, new: i32) {
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    new_coupons(db, new);
}

#[test]
fn compare_names_the_step_staging_did_not_exercise_and_the_steps_whose_counts_differ() {
    let dir = tempfile::tempdir().unwrap();
    // Staging: budgets ten times larger, so no campaign is over budget and V5's census of
    // issued_within_budget finds none.
    let staging = fresh_db();
    staging.make_legacy_data(150);
    staging
        .client()
        .execute("UPDATE campaigns SET budget_yen = budget_yen * 10", &[])
        .unwrap();
    assert_eq!(staging.run(&["migrate", "baseline", "--yes"]).code, 0);
    to_the_gate(&staging, 5);
    let file = dir.path().join("staging.json");
    let r = staging.run(&["plan", "--output", file.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.both());

    let production = fresh_db();
    production.make_legacy_baselined(200);
    to_the_gate(&production, 20);
    let doc = plan_json(&production, &["--compare", file.to_str().unwrap()]);
    assert_eq!(doc["not_exercised"], serde_json::json!([11]), "{doc}");
    let step11 = &doc["steps"][10];
    let why = step11["not_exercised"].as_str().unwrap();
    assert!(
        why.starts_with("census issued_within_budget: 0 there, "),
        "{why}"
    );
    // Step 9 moves 5,000 yen there and 20,000 here; step 10 rebuilds 5 keys there, 20 here.
    assert_eq!(
        doc["counts_differ"],
        serde_json::json!([9, 10, 11]),
        "{doc}"
    );
    assert_eq!(
        doc["steps"][9]["counts"][0],
        serde_json::json!({"what": "rows changed", "staging": 5, "here": 20})
    );
    assert!(doc["files_differ"].as_array().unwrap().is_empty(), "{doc}");

    let r = production.run(&["plan", "--compare", file.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout
            .contains("\nstep 4 (repair void-duplicate-coupons): done on both\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("not exercised by the rehearsal: 11\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("counts differ: 9, 10, 11\n"),
        "{}",
        r.stdout
    );
    let step11 = r
        .stdout
        .split("\nstep 11 (migration V5): estimated ")
        .nth(1)
        .unwrap();
    assert!(
        step11.contains(
            "\n   NOT EXERCISED by the rehearsal: census issued_within_budget: 0 there, 1 here\n"
        ),
        "{}",
        r.stdout
    );
    // As a change ticket: one table, step 11's note first.
    let r = production.run(&[
        "plan",
        "--compare",
        file.to_str().unwrap(),
        "--format",
        "markdown",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let md = read(&r.stdout);
    assert!(md.html.is_empty(), "{:?}", md.html);
    let table = &md.tables[0];
    assert_eq!(table.len(), 12, "{table:?}");
    assert_eq!(table[11][1], "migration V5");
    assert!(
        table[11][6].starts_with("NOT EXERCISED: census issued_within_budget: 0 there, 1 here"),
        "{:?}",
        table[11]
    );
}

#[test]
fn compare_refuses_a_file_that_is_not_a_plan_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_db();
    for (name, text, says) in [
        (
            "garbage.json",
            "{not json",
            "is not a plan file (pgmend plan --output): not JSON",
        ),
        (
            "other.json",
            "{\"steps\": []}",
            "is not a plan file (pgmend plan --output): it has no plan_sha256",
        ),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let r = db.run(&["plan", "--compare", file.to_str().unwrap()]);
        assert_eq!(r.code, 2, "{}", r.both());
        assert!(r.stderr.contains(says), "{}", r.stderr);
        assert!(r.stdout.is_empty(), "{}", r.stdout);
    }
}

/// How far the estimates are from the step times `apply` measures, on the demo's data
/// (`PGMEND_ESTIMATE_MEMBERS`, 30,000 by default): prints both per step, and fails when a
/// step that took 200 ms or more is off by more than a factor of two. Not run by default: it
/// times a whole release.
/// `PGMEND_ESTIMATE_MEMBERS=100000 cargo test --test plan_ticket -- --ignored --nocapture`
#[test]
#[ignore]
fn estimates_are_within_a_factor_of_two_of_the_measured_step_times() {
    let members: i32 = std::env::var("PGMEND_ESTIMATE_MEMBERS")
        .map(|m| m.parse().unwrap())
        .unwrap_or(30_000);
    let db = fresh_db();
    db.make_legacy_baselined(members);
    println!(
        "{members} members, {} coupons",
        db.scalar_i64("SELECT count(*) FROM issued_coupons")
    );
    let doc = plan_json(&db, &[]);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let mut off = Vec::new();
    for line in r.stderr.lines().filter(|l| l.starts_with("step ")) {
        let Some((step, took)) = line
            .strip_prefix("step ")
            .and_then(|l| l.split_once(" done in "))
        else {
            continue;
        };
        let step: usize = step.parse().unwrap();
        let took = millis(took);
        if doc["steps"][step - 1]["estimate"].is_null() {
            continue; // the gate
        }
        let (estimate, from) = estimate(&doc, step);
        let ratio = estimate as f64 / took.max(1) as f64;
        println!("step {step}: estimated {estimate} ms, took {took} ms, ratio {ratio:.2} ({from})");
        if took >= 200 && !(0.5..=2.0).contains(&ratio) {
            off.push(step);
        }
    }
    assert!(
        off.is_empty(),
        "off by more than a factor of two: steps {off:?}"
    );
}

/// Milliseconds from a duration as `human::duration` writes it (`850ms`, `1.5s`, `2m05s`).
fn millis(text: &str) -> u64 {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().unwrap();
    }
    let (minutes, rest) = text.split_once('m').unwrap_or(("0", text));
    let seconds: f64 = rest.trim_end_matches('s').parse().unwrap_or(0.0);
    minutes.parse::<u64>().unwrap() * 60_000 + (seconds * 1000.0) as u64
}
