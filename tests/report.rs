//! `pgmend report overruns`: every figure equals an independent SQL computation, in every
//! format; exact past 32 bits; read-only; atomic `--output`; stable renderings.

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::Value;

/// Per campaign, computed with correlated subqueries (not the report's GROUP BY with
/// FILTERs): budget, issued, coupons, voided, voided_yen, redeemed duplicates (count, yen),
/// voided then redeemed (count, yen).
fn expected_campaigns(db: &TestDb, released: bool) -> BTreeMap<String, [i64; 10]> {
    let budget = if released {
        "(SELECT budget_yen FROM campaign_budgets b WHERE b.campaign_id = c.campaign_id)"
    } else {
        "c.budget_yen"
    };
    let (voided, duplicate) = if released {
        ("i.voided_at IS NOT NULL", "i.legacy_duplicate")
    } else {
        // Before the release: nothing is voided; a duplicate is any coupon that loses the
        // release's ranking within its (campaign, member).
        (
            "false",
            "EXISTS (SELECT 1 FROM issued_coupons o WHERE o.campaign_id = i.campaign_id AND o.member_id = i.member_id
                       AND (o.redeemed_at IS NULL, o.issued_at, o.coupon_id) < (i.redeemed_at IS NULL, i.issued_at, i.coupon_id))",
        )
    };
    let sql = format!(
        "SELECT c.campaign_id, {budget}::int8,
                (SELECT coalesce(sum(amount_yen::numeric), 0) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND NOT ({voided}))::int8,
                (SELECT count(*) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND NOT ({voided})),
                (SELECT count(*) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND {voided}),
                (SELECT coalesce(sum(amount_yen::numeric), 0) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND {voided})::int8,
                (SELECT count(*) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND {duplicate} AND NOT ({voided}) AND i.redeemed_at IS NOT NULL),
                (SELECT coalesce(sum(amount_yen::numeric), 0) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND {duplicate} AND NOT ({voided}) AND i.redeemed_at IS NOT NULL)::int8,
                (SELECT count(*) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND {voided} AND i.redeemed_at IS NOT NULL),
                (SELECT coalesce(sum(amount_yen::numeric), 0) FROM issued_coupons i WHERE i.campaign_id = c.campaign_id AND {voided} AND i.redeemed_at IS NOT NULL)::int8
           FROM campaigns c"
    );
    db.client()
        .query(sql.as_str(), &[])
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get(0),
                [
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    r.get(4),
                    r.get(5),
                    r.get(6),
                    r.get(7),
                    r.get(8),
                    r.get(9),
                    0,
                ],
            )
        })
        .collect()
}

/// (member, month) → used yen, for member-months past `cap`.
fn expected_members(db: &TestDb, cap: i64, released: bool) -> BTreeMap<(String, String), i64> {
    let live = if released {
        "voided_at IS NULL"
    } else {
        "true"
    };
    db.client()
        .query(
            &format!(
                "SELECT member_id, month, sum(amount_yen::numeric)::int8 FROM issued_coupons
                  WHERE {live} GROUP BY member_id, month HAVING sum(amount_yen::numeric) > $1::int8"
            ),
            &[&cap],
        )
        .unwrap()
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

const CAMPAIGN_NUMBERS: [&str; 9] = [
    "budget_yen",
    "issued_yen",
    "coupons",
    "voided_coupons",
    "voided_yen",
    "redeemed_legacy_duplicates",
    "redeemed_legacy_duplicates_yen",
    "voided_then_redeemed",
    "voided_then_redeemed_yen",
];

const LOST_UPDATE_NUMBERS: [&str; 3] = [
    "legacy_counter_yen",
    "old_system_issued_yen",
    "lost_update_yen",
];

/// Checks the JSON document against the independent figures; returns it.
fn check_json(
    db: &TestDb,
    args: &[&str],
    campaigns: &BTreeMap<String, [i64; 10]>,
    members: &BTreeMap<(String, String), i64>,
    cap: i64,
) -> Value {
    let mut all = vec!["report", "overruns", "--format", "json"];
    all.extend_from_slice(args);
    let r = db.run(&all);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: Value = serde_json::from_str(&r.stdout).expect("the report is one JSON document");
    assert_eq!(
        doc.as_object().unwrap().keys().collect::<Vec<_>>(),
        [
            "as_of",
            "campaigns",
            "database",
            "legacy_counter",
            "members_over_monthly_cap",
            "monthly_cap_yen",
            "state",
            "totals"
        ]
    );
    assert_eq!(doc["monthly_cap_yen"], cap);
    assert_eq!(doc["database"]["dbname"], db.name.as_str());
    assert_eq!(doc["database"]["port"], db.params.port);
    let as_of = doc["as_of"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(as_of).is_ok() && as_of.ends_with("+09:00"),
        "{as_of}"
    );

    let got = doc["campaigns"].as_array().unwrap();
    assert_eq!(got.len(), campaigns.len());
    let (mut overrun_total, mut voided_total, mut rld_total) = (0i64, 0i64, 0i64);
    for c in got {
        let id = c["campaign_id"].as_str().unwrap();
        let want = &campaigns[id];
        for (i, field) in CAMPAIGN_NUMBERS.iter().enumerate() {
            assert_eq!(c[field].as_i64(), Some(want[i]), "{id} {field}: {c}");
        }
        let overrun = (want[1] - want[0]).max(0);
        assert_eq!(c["overrun_yen"].as_i64(), Some(overrun), "{id} overrun");
        overrun_total += overrun;
        voided_total += want[4];
        rld_total += want[6];
    }

    let got: BTreeMap<(String, String), i64> = doc["members_over_monthly_cap"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["cap_yen"], cap);
            assert_eq!(
                m["overrun_yen"].as_i64().unwrap(),
                m["used_yen"].as_i64().unwrap() - cap
            );
            (
                (
                    m["member_id"].as_str().unwrap().to_string(),
                    m["month"].as_str().unwrap().to_string(),
                ),
                m["used_yen"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(&got, members);
    let member_overrun: i64 = members.values().map(|u| u - cap).sum();

    let t = &doc["totals"];
    assert_eq!(t["campaign_overrun_yen"].as_i64(), Some(overrun_total));
    assert_eq!(t["member_overrun_yen"].as_i64(), Some(member_overrun));
    assert_eq!(t["voided_yen"].as_i64(), Some(voided_total));
    assert_eq!(
        t["redeemed_legacy_duplicates_yen"].as_i64(),
        Some(rld_total)
    );
    doc
}

/// The CSV sections, written by one `--output NAME.csv` (one snapshot), parsed back with the
/// `csv` crate: section name → (header, records).
fn csv_sections(
    db: &TestDb,
    extra: &[&str],
) -> BTreeMap<String, (Vec<String>, Vec<csv::StringRecord>)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.csv");
    let mut args = vec!["report", "overruns", "--output", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let r = db.run(&args);
    assert_eq!(r.code, 0, "{}", r.both());
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["r-campaigns.csv", "r-members.csv", "r-summary.csv"],
        "one file per section, nothing else"
    );
    let mut out = BTreeMap::new();
    for section in ["summary", "campaigns", "members"] {
        let bytes = std::fs::read(dir.path().join(format!("r-{section}.csv"))).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.ends_with("\r\n"), "RFC 4180 lines end in CRLF");
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        let records: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
        for rec in &records {
            assert_eq!(
                rec.len(),
                header.len(),
                "{section}: every record has every column"
            );
        }
        out.insert(section.to_string(), (header, records));
    }
    out
}

/// A text cell as the CSV writes it: OWASP's leading `'` before a formula character.
fn neutralised(text: &str) -> String {
    match text.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{text}"),
        _ => text.to_string(),
    }
}

/// Parses the CSV sections back and checks they say what the JSON says, that no section
/// holds a total, and that summing a column gives the summary's total.
fn check_csv_matches_json(db: &TestDb, doc: &Value) {
    let sections = csv_sections(db, &[]);
    let t = &doc["totals"];

    let (header, summary) = &sections["summary"];
    assert_eq!(header, &["key", "value"]);
    let summary: BTreeMap<&str, &str> = summary
        .iter()
        .map(|r| (r.get(0).unwrap(), r.get(1).unwrap()))
        .collect();
    assert_eq!(summary["state"], doc["state"].as_str().unwrap());
    assert_eq!(
        summary["monthly_cap_yen"],
        doc["monthly_cap_yen"].to_string()
    );
    for (key, value) in t.as_object().unwrap() {
        let want = if value.is_null() {
            String::new()
        } else {
            value.to_string()
        };
        assert_eq!(summary[key.as_str()], want, "summary {key}");
    }
    assert_eq!(
        summary["legacy_counter_source"],
        doc["legacy_counter"]["source"].as_str().unwrap()
    );

    let (header, campaigns) = &sections["campaigns"];
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let json_campaigns = doc["campaigns"].as_array().unwrap();
    assert_eq!(
        campaigns.len(),
        json_campaigns.len(),
        "campaign rows only, no total row"
    );
    for (rec, c) in campaigns.iter().zip(json_campaigns) {
        assert_eq!(
            &rec[col("campaign_id")],
            neutralised(c["campaign_id"].as_str().unwrap())
        );
        for field in CAMPAIGN_NUMBERS.iter().chain(&["overrun_yen"]) {
            assert_eq!(
                rec[col(field)].parse::<i64>().ok(),
                c[field].as_i64(),
                "{field}"
            );
        }
        // Two runs, two snapshots: as_of may tick over a second between them.
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
        let gap = at(&rec[col("as_of")]) - at(doc["as_of"].as_str().unwrap());
        assert!(
            (0..=60).contains(&gap.num_seconds()),
            "as_of {} then {}",
            doc["as_of"],
            &rec[col("as_of")]
        );
        assert_eq!(&rec[col("state")], doc["state"].as_str().unwrap());
        assert_eq!(
            &rec[col("as_of")],
            summary["as_of"],
            "the same snapshot as the summary"
        );
    }
    for (rec, c) in campaigns.iter().zip(json_campaigns) {
        for field in LOST_UPDATE_NUMBERS {
            assert_eq!(
                rec[col(field)].parse::<i64>().ok(),
                c[field].as_i64(),
                "{field}"
            );
        }
    }
    // Summing a column gives its total: the total is not in the column.
    for field in CAMPAIGN_NUMBERS
        .iter()
        .chain(&["overrun_yen"])
        .chain(&LOST_UPDATE_NUMBERS)
    {
        let sum: i64 = campaigns
            .iter()
            .map(|r| r[col(field)].parse::<i64>().unwrap_or(0))
            .sum();
        let key = if *field == "overrun_yen" {
            "campaign_overrun_yen"
        } else {
            field
        };
        assert_eq!(Some(sum), t[key].as_i64(), "sum of campaigns.{field}");
    }

    let (header, members) = &sections["members"];
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let json_members = doc["members_over_monthly_cap"].as_array().unwrap();
    assert_eq!(members.len(), json_members.len());
    assert_eq!(
        Some(members.len() as i64),
        t["members_over_monthly_cap"].as_i64()
    );
    for (rec, m) in members.iter().zip(json_members) {
        assert_eq!(
            &rec[col("member_id")],
            neutralised(m["member_id"].as_str().unwrap())
        );
        assert_eq!(
            &rec[col("month")],
            neutralised(m["month"].as_str().unwrap())
        );
        for field in ["used_yen", "cap_yen", "overrun_yen"] {
            assert_eq!(
                rec[col(field)].parse::<i64>().ok(),
                m[field].as_i64(),
                "{field}"
            );
        }
    }
    for (field, key) in [
        ("overrun_yen", "member_overrun_yen"),
        ("used_yen", "member_used_yen"),
    ] {
        let sum: i64 = members
            .iter()
            .map(|r| r[col(field)].parse::<i64>().unwrap())
            .sum();
        assert_eq!(Some(sum), t[key].as_i64(), "sum of members.{field}");
    }
}

/// The campaign rows of a text table (psql or Markdown style), as id → numbers.
fn text_campaigns(text: &str) -> BTreeMap<String, Vec<i64>> {
    let mut out = BTreeMap::new();
    let mut in_campaigns = false;
    for line in text.lines() {
        if line.starts_with("Campaigns") || line.starts_with("## Campaigns") {
            in_campaigns = true;
            continue;
        }
        if line.starts_with("Members") || line.starts_with("## Members") {
            break;
        }
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim())
            .collect();
        // Markdown: one table of 11 cells; the terminal: the first of two tables, 7 cells,
        // headed in words (issue 38: no table wider than about 120 columns).
        if !in_campaigns
            || (cells.len() != 11 && cells.len() != 7)
            || cells[0] == "campaign_id"
            || cells[0] == "Campaign"
            || cells[1].starts_with('-')
        {
            continue;
        }
        out.insert(
            cells[0].to_string(),
            cells[1..]
                .iter()
                .map(|c| c.replace(',', "").parse().unwrap())
                .collect(),
        );
    }
    out
}

fn check_text_matches_json(db: &TestDb, doc: &Value) {
    for format in ["table", "markdown"] {
        let r = db.run(&["report", "overruns", "--format", format]);
        assert_eq!(r.code, 0, "{}", r.both());
        let rows = text_campaigns(&r.stdout);
        let json = doc["campaigns"].as_array().unwrap();
        assert_eq!(rows.len(), json.len(), "{format}:\n{}", r.stdout);
        for c in json {
            let got = &rows[c["campaign_id"].as_str().unwrap()];
            assert_eq!(got[0], c["budget_yen"].as_i64().unwrap(), "{format}");
            assert_eq!(got[1], c["issued_yen"].as_i64().unwrap(), "{format}");
            assert_eq!(got[2], c["overrun_yen"].as_i64().unwrap(), "{format}");
        }
        let members = doc["members_over_monthly_cap"].as_array().unwrap().len();
        assert!(
            r.stdout.contains(&format!(
                "Members over the monthly cap ({})",
                group(members as i64)
            )),
            "{format}"
        );
    }
    let r = db.run(&["report", "overruns", "--format", "html"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let pairs = r.stdout.matches("<g class=\"pair\"").count();
    assert_eq!(pairs, doc["campaigns"].as_array().unwrap().len());
    for c in doc["campaigns"].as_array().unwrap() {
        let id = c["campaign_id"].as_str().unwrap();
        assert!(r.stdout.contains(&format!("data-campaign=\"{id}\"")));
    }
    assert!(!r.stdout.contains("<script"), "self-contained, no scripts");
    assert!(
        !r.stdout.contains("src=\"http"),
        "self-contained, no external files"
    );
}

fn group(n: i64) -> String {
    pgmend::human::int(n)
}

#[test]
fn every_figure_equals_independent_sql_in_every_format_after_the_release() {
    let db = fresh_db();
    db.make_legacy_baselined(600);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // The old cart redeems two voided coupons anyway; a campaign with no coupon at all.
    db.client()
        .batch_execute(
            "UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id IN
               (SELECT coupon_id FROM issued_coupons WHERE voided_at IS NOT NULL ORDER BY coupon_id LIMIT 2);
             INSERT INTO campaigns VALUES ('SW-EMPTY', 1000, 5000, 0);
             INSERT INTO campaign_budgets VALUES ('SW-EMPTY', 1000, 5000, 0);",
        )
        .unwrap();
    let campaigns = expected_campaigns(&db, true);
    assert!(
        campaigns.values().any(|c| c[1] > c[0]),
        "the data has an over-budget campaign"
    );
    assert!(campaigns.values().map(|c| c[7]).sum::<i64>() == 2);
    for cap in [2000, 1000] {
        let members = expected_members(&db, cap, true);
        assert!(!members.is_empty());
        let cap_arg = cap.to_string();
        let doc = check_json(
            &db,
            &["--monthly-cap-yen", &cap_arg],
            &campaigns,
            &members,
            cap,
        );
        assert_eq!(doc["state"], "released");
        if cap == 2000 {
            check_csv_matches_json(&db, &doc);
            check_text_matches_json(&db, &doc);
        }
    }
}

#[test]
fn before_the_release_it_reports_the_legacy_state_and_predicts_the_lost_duplicates() {
    let db = fresh_db();
    db.make_legacy_baselined(600);
    let legacy = expected_campaigns(&db, false);
    let members = expected_members(&db, 2000, false);
    let before = check_json(&db, &[], &legacy, &members, 2000);
    assert_eq!(before["state"], "legacy");
    assert_eq!(before["totals"]["voided_yen"], 0);
    let r = db.run(&["report", "overruns"]);
    assert!(r.stdout.contains("State:       legacy"), "{}", r.stdout);

    // Up to the gate: started, not finished.
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    let r = db.run(&["report", "overruns", "--format", "json"]);
    let partial: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(partial["state"], "partial");

    assert_eq!(
        db.run(&["apply", "--yes", "--confirm", "deploy-new-application"])
            .code,
        0
    );
    let after = check_json(
        &db,
        &[],
        &expected_campaigns(&db, true),
        &expected_members(&db, 2000, true),
        2000,
    );
    assert_eq!(after["state"], "released");
    // The duplicates the legacy report counted by the ranking rule are the ones the release
    // kept as redeemed history: the same money, before and after.
    for (b, a) in before["campaigns"]
        .as_array()
        .unwrap()
        .iter()
        .zip(after["campaigns"].as_array().unwrap())
    {
        assert_eq!(b["campaign_id"], a["campaign_id"]);
        assert_eq!(
            b["redeemed_legacy_duplicates"],
            a["redeemed_legacy_duplicates"]
        );
        assert_eq!(
            b["redeemed_legacy_duplicates_yen"],
            a["redeemed_legacy_duplicates_yen"]
        );
        assert_eq!(
            b["issued_yen"].as_i64().unwrap() - a["voided_yen"].as_i64().unwrap(),
            a["issued_yen"].as_i64().unwrap(),
            "what the release voided comes off the issued total"
        );
    }
}

#[test]
fn sums_past_two_to_the_31_are_exact() {
    let db = fresh_db();
    let mut c = db.legacy_schema();
    // Three coupons of 2,000,000,000 yen: 6,000,000,000 in one campaign, 4,000,000,000 for
    // one member in one month; each alone fits in an integer, no sum does.
    c.batch_execute(
        "INSERT INTO campaigns VALUES ('BIG', 2000000000, 2000000000, 0), ('BIG2', 2000000000, 2000000000, 0);
         INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES
           ('00000000-0000-0000-0000-000000000001', 'BIG', 'm1', '2026-09', 2000000000),
           ('00000000-0000-0000-0000-000000000002', 'BIG', 'm2', '2026-09', 2000000000),
           ('00000000-0000-0000-0000-000000000003', 'BIG', 'm3', '2026-09', 2000000000),
           ('00000000-0000-0000-0000-000000000004', 'BIG2', 'm1', '2026-09', 2000000000);",
    )
    .unwrap();
    let doc = check_json(
        &db,
        &[],
        &expected_campaigns(&db, false),
        &expected_members(&db, 2000, false),
        2000,
    );
    let big = &doc["campaigns"][0];
    assert_eq!(big["issued_yen"].as_i64(), Some(6_000_000_000));
    assert_eq!(big["overrun_yen"].as_i64(), Some(4_000_000_000));
    assert_eq!(
        doc["members_over_monthly_cap"][0]["used_yen"].as_i64(),
        Some(4_000_000_000)
    );
    assert_eq!(
        doc["totals"]["member_overrun_yen"].as_i64(),
        Some(4_000_000_000 - 2000 + 2_000_000_000 - 2000 + 2_000_000_000 - 2000)
    );
    let r = db.run(&["report", "overruns"]);
    assert!(r.stdout.contains("6,000,000,000"), "{}", r.stdout);
    check_csv_matches_json(&db, &doc);
}

#[test]
fn runs_where_transactions_default_to_read_only_and_gives_the_same_bytes_twice() {
    let db = fresh_db();
    db.make_legacy_baselined(300);
    assert_eq!(
        db.run(&["apply", "--yes", "--confirm", "deploy-new-application"])
            .code,
        0
    );
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .unwrap();
    let as_of = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+09:00").unwrap();
    for format in ["table", "json", "csv", "markdown", "html"] {
        let args = [
            "report",
            "overruns",
            "--format",
            format,
            "--section",
            "members",
        ];
        let args = if format == "csv" {
            &args[..]
        } else {
            &args[..4]
        };
        let first = db.run(args);
        assert_eq!(first.code, 0, "{format}: {}", first.both());
        let second = db.run(args);
        assert_eq!(
            as_of.replace_all(&first.stdout, "AS_OF"),
            as_of.replace_all(&second.stdout, "AS_OF"),
            "{format}"
        );
    }
    // The server itself refuses writes on this connection: the report never needed one.
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.both());
}

#[test]
fn output_is_written_atomically_and_never_replaced_without_force() {
    let db = fresh_db();
    db.make_legacy_baselined(200);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overruns.csv");
    let file = path.to_str().unwrap();

    let r = db.run(&[
        "report",
        "overruns",
        "--format",
        "csv",
        "--section",
        "campaigns",
        "--excel",
        "--output",
        file,
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout.is_empty(),
        "the report went to the file, not stdout"
    );
    assert!(r.stderr.contains("wrote"), "{}", r.stderr);
    // Created like any new file (0666 less the umask), not tempfile's private 0600.
    use std::os::unix::fs::PermissionsExt;
    let plain = dir.path().join("plain");
    std::fs::File::create(&plain).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), mode(&plain));
    std::fs::remove_file(&plain).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes.starts_with("\u{feff}\"campaign_id\",".as_bytes()),
        "Excel's BOM, then the header"
    );

    std::fs::write(&path, "keep me").unwrap();
    let r = db.run(&[
        "report",
        "overruns",
        "--section",
        "campaigns",
        "--output",
        file,
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--force"), "{}", r.stderr);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");

    let r = db.run(&[
        "report",
        "overruns",
        "--output",
        file,
        "--force",
        "--section",
        "summary",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("\"key\","), "replaced, as CSV: {text}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["overruns.csv"], "no temporary file is left behind");

    let missing = dir.path().join("no/such/dir/r.csv");
    let r = db.run(&["report", "overruns", "--output", missing.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("does not exist"), "{}", r.stderr);
    let r = db.run(&["report", "overruns", "--format", "json", "--excel"]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("--excel only applies to --format csv"),
        "{}",
        r.stderr
    );
    let r = db.run(&["verify", "--format", "html"]);
    assert_eq!(r.code, 2);
}

/// Without --format, `--output` takes the format from its extension (a text table in a .csv
/// file was the old behaviour); a --format that contradicts it is refused before anything is
/// written.
#[test]
fn the_output_format_comes_from_the_file_name_unless_they_disagree() {
    let db = fresh_db();
    db.make_legacy_baselined(100);
    let dir = tempfile::tempdir().unwrap();
    let out = |name: &str, extra: &[&str]| {
        let path = dir.path().join(name);
        let mut args = vec!["report", "overruns", "--output", path.to_str().unwrap()];
        args.extend(extra);
        let r = db.run(&args);
        (r, std::fs::read_to_string(&path).unwrap_or_default())
    };
    let table = db.run(&["report", "overruns"]).stdout;
    let json = db.run(&["report", "overruns", "--format", "json"]).stdout;
    for (name, extra, expect) in [
        (
            "r.csv",
            &["--section", "campaigns"][..],
            db.run(&[
                "report",
                "overruns",
                "--format",
                "csv",
                "--section",
                "campaigns",
            ])
            .stdout,
        ),
        (
            "r.CSV",
            &["--excel", "--section", "members"][..],
            db.run(&[
                "report",
                "overruns",
                "--format",
                "csv",
                "--excel",
                "--section",
                "members",
            ])
            .stdout,
        ),
        ("r.json", &[][..], json.clone()),
        (
            "r.md",
            &[][..],
            db.run(&["report", "overruns", "--format", "markdown"])
                .stdout,
        ),
        (
            "r.html",
            &[][..],
            db.run(&["report", "overruns", "--format", "html"]).stdout,
        ),
        ("r.txt", &[][..], table.clone()),
        ("report", &[][..], table.clone()),
        // An explicit format that agrees, and one the extension does not name.
        ("s.json", &["--format", "json"][..], json.clone()),
        ("s.txt", &["--format", "json"][..], json.clone()),
    ] {
        let (r, written) = out(name, extra);
        assert_eq!(r.code, 0, "{name}: {}", r.both());
        // The same renderer as stdout. Each run is its own snapshot, stamped with its own
        // moment: compare with the digits masked.
        let strip = |t: &str| {
            t.chars()
                .map(|c| if c.is_ascii_digit() { '0' } else { c })
                .collect::<String>()
        };
        assert_eq!(strip(&written), strip(&expect), "{name}");
    }
    for (name, given) in [
        ("m.csv", "json"),
        ("m.json", "human"),
        ("m.html", "markdown"),
    ] {
        let (r, written) = out(name, &["--format", given]);
        assert_eq!(r.code, 2, "{name} --format {given}: {}", r.both());
        assert!(
            r.stderr
                .contains(&format!("but --format {given} was given")),
            "{}",
            r.stderr
        );
        assert!(written.is_empty() && !dir.path().join(name).exists());
    }
}

/// A small hand-made database whose renderings are pinned by snapshots: a Japanese
/// campaign id (double-width), a pipe in an id, a campaign without coupons, an over-budget
/// campaign, a redeemed duplicate and a voided coupon redeemed anyway.
fn snapshot_db() -> TestDb {
    let db = fresh_db();
    let mut c = db.legacy_schema();
    c.batch_execute(
        "INSERT INTO campaigns VALUES ('SW-A', 1000, 3000, 0), ('秋-セール', 1500, 100000, 0),
                                      ('A|B', 1000, 1000, 0), ('EMPTY', 1000, 5000, 0);
         INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at)
         SELECT ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, v.c, v.m, v.mon, v.amt,
                timestamptz '2026-09-20 10:00+09' + g * interval '1 minute',
                CASE WHEN v.red THEN timestamptz '2026-09-25 10:00+09' END
           FROM (VALUES (1, 'SW-A', 'm01', '2026-09', 1000, false),
                        (2, 'SW-A', 'm01', '2026-09', 1000, true),
                        (3, 'SW-A', 'm01', '2026-09', 1000, false),
                        (4, 'SW-A', 'm02', '2026-09', 1000, false),
                        (5, 'SW-A', 'm03', '2026-10', 1000, false),
                        (6, '秋-セール', 'm01', '2026-09', 1500, false),
                        (7, '秋-セール', 'm02', '2026-09', 1500, true),
                        (8, '秋-セール', 'm02', '2026-09', 1500, true),
                        (9, 'A|B', 'm04', '2026-10', 1000, false),
                        (10, 'A|B', 'm04', '2026-10', 1000, false),
                        (11, 'SW-A', 'm04', '2026-10', 1000, false))
                AS v(g, c, m, mon, amt, red);",
    )
    .unwrap();
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // The old cart redeems a voided coupon anyway.
    c.batch_execute(
        "UPDATE issued_coupons SET redeemed_at = timestamptz '2026-09-30 12:00+09'
          WHERE coupon_id = '00000000-0000-0000-0000-000000000003'",
    )
    .unwrap();
    db
}

#[test]
fn renderings_are_stable() {
    let db = snapshot_db();
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+09:00", "[as_of]");
    settings.add_filter(
        r"host=\S+ port=\d+ dbname=[\w\\]+",
        "host=[host] port=[port] dbname=[db]",
    );
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for format in ["table", "markdown"] {
            let r = db.run(&["report", "overruns", "--format", format]);
            assert_eq!(r.code, 0, "{}", r.both());
            insta::assert_snapshot!(format!("report_{format}"), r.stdout);
        }
        for section in ["summary", "campaigns", "members"] {
            let r = db.run(&[
                "report",
                "overruns",
                "--format",
                "csv",
                "--section",
                section,
            ]);
            assert_eq!(r.code, 0, "{}", r.both());
            insta::assert_snapshot!(format!("report_csv_{section}"), r.stdout);
        }
    });
}

/// Ids a hostile or careless source could put in the data: formulas, quotes and separators,
/// HTML, Japanese, control characters and a 10 kB string.
fn hostile_ids() -> Vec<String> {
    vec![
        "=HYPERLINK(\"http://evil.example/\",\"click\")".into(),
        "+1+1".into(),
        "-2+3".into(),
        "@SUM(A1:A9)".into(),
        "\t=1+1".into(),
        "\r=1+1".into(),
        "a,b;c\"d'e".into(),
        "<script>alert(1)</script>".into(),
        "<img src=x onerror=alert(1)>".into(),
        "秋-セール|割引".into(),
        "line\nbreak".into(),
        "0012".into(),
        "x".repeat(10_000),
    ]
}

/// A hand-made database whose campaign and member ids are all hostile: one campaign per id,
/// over budget, and one member-month per id over the cap (two coupons of 1,500 yen).
fn hostile_db() -> TestDb {
    let db = fresh_db();
    let mut c = db.legacy_schema();
    for (i, id) in hostile_ids().iter().enumerate() {
        c.execute("INSERT INTO campaigns VALUES ($1, 1500, 2000, 0)", &[id])
            .unwrap();
        for k in 0..2 {
            c.execute(
                "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
                 VALUES (gen_random_uuid(), $1, $1, '2026-09', 1500)",
                &[id],
            )
            .unwrap_or_else(|e| panic!("coupon {i}/{k}: {e}"));
        }
    }
    db
}

#[test]
fn hostile_ids_are_neutralised_in_csv_and_escaped_in_markdown_and_every_figure_holds() {
    let db = hostile_db();
    let doc = check_json(
        &db,
        &[],
        &expected_campaigns(&db, false),
        &expected_members(&db, 2000, false),
        2000,
    );
    check_csv_matches_json(&db, &doc);
    // The workbook writes ids as strings, which Excel never evaluates: exactly as they are.
    let book = check_workbook_matches_json(&db, &doc);
    let ids: std::collections::BTreeSet<String> = book["Campaigns"][1..]
        .iter()
        .map(|r| string(&r[0]))
        .collect();
    assert_eq!(ids, hostile_ids().into_iter().collect());

    // No text cell of any section starts a formula; every id is there, only neutralised.
    let sections = csv_sections(&db, &[]);
    let numeric = |name: &str| {
        name.ends_with("_yen")
            || name.ends_with("coupons")
            || name.ends_with("duplicates")
            || name == "voided_then_redeemed"
    };
    for (section, (header, records)) in &sections {
        for rec in records {
            for (name, cell) in header.iter().zip(rec.iter()) {
                if numeric(name)
                    || (section == "summary" && name == "value" && cell.parse::<i64>().is_ok())
                {
                    assert!(
                        cell.parse::<i64>().is_ok(),
                        "{section}.{name} is a number: {cell:?}"
                    );
                } else {
                    assert!(
                        !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                        "{section}.{name} starts a formula: {cell:?}"
                    );
                }
            }
        }
    }
    let (header, campaigns) = &sections["campaigns"];
    let id_col = header.iter().position(|h| h == "campaign_id").unwrap();
    let ids: std::collections::BTreeSet<String> =
        campaigns.iter().map(|r| r[id_col].to_string()).collect();
    let want: std::collections::BTreeSet<String> =
        hostile_ids().iter().map(|id| neutralised(id)).collect();
    assert_eq!(ids, want);

    // The page escapes every id (maud): no tag from the data, the ids there as text.
    let r = db.run(&["report", "overruns", "--format", "html"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        !r.stdout.contains("<script") && !r.stdout.contains("<img"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(r
        .stdout
        .contains("=HYPERLINK(&quot;http://evil.example/&quot;,&quot;click&quot;)"));

    // The Markdown, rendered by a CommonMark renderer, holds no tag from the data; the ids
    // are there as text.
    let r = db.run(&["report", "overruns", "--format", "markdown"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let mut html = String::new();
    pulldown_cmark::html::push_html(
        &mut html,
        pulldown_cmark::Parser::new_ext(&r.stdout, pulldown_cmark::Options::ENABLE_TABLES),
    );
    for tag in ["<script", "<img"] {
        assert!(
            !html.contains(tag),
            "{tag} from the data reached the HTML:\n{html}"
        );
    }
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    // Every campaign is one table row of 11 cells whose first cell is its id (control
    // characters shown as spaces): no separator or markup in an id broke a row or a cell.
    let campaigns = markdown_tables(&r.stdout)
        .into_iter()
        .find(|t| t[0][0] == "campaign_id")
        .expect("the campaigns table");
    let ids: std::collections::BTreeSet<String> = campaigns[1..]
        .iter()
        .map(|row| {
            assert_eq!(row.len(), 11, "{row:?}");
            row[0].clone()
        })
        .collect();
    let want: std::collections::BTreeSet<String> = hostile_ids()
        .iter()
        .map(|id| id.replace(|c: char| c.is_control(), " ").trim().to_string())
        .collect();
    assert_eq!(ids, want);
}

/// The tables of a Markdown document as a CommonMark (GFM tables) renderer reads them:
/// table → rows (the header first) → the text of each cell.
fn markdown_tables(markdown: &str) -> Vec<Vec<Vec<String>>> {
    use pulldown_cmark::{Event, Tag, TagEnd};
    let mut tables: Vec<Vec<Vec<String>>> = Vec::new();
    let mut in_cell = false;
    for event in pulldown_cmark::Parser::new_ext(markdown, pulldown_cmark::Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Table(_)) => tables.push(Vec::new()),
            Event::Start(Tag::TableHead | Tag::TableRow) => {
                tables.last_mut().unwrap().push(Vec::new())
            }
            Event::Start(Tag::TableCell) => {
                in_cell = true;
                tables
                    .last_mut()
                    .unwrap()
                    .last_mut()
                    .unwrap()
                    .push(String::new())
            }
            Event::End(TagEnd::TableCell) => in_cell = false,
            Event::Text(t) | Event::Code(t) | Event::Html(t) | Event::InlineHtml(t) if in_cell => {
                let row = tables.last_mut().unwrap().last_mut().unwrap();
                row.last_mut().unwrap().push_str(&t);
            }
            _ => {}
        }
    }
    tables
}

#[test]
fn a_csv_holds_one_section_and_the_other_formats_refuse_section() {
    let db = fresh_db();
    db.make_legacy_baselined(50);
    let r = db.run(&["report", "overruns", "--format", "csv"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--section"), "{}", r.stderr);
    let r = db.run(&[
        "report",
        "overruns",
        "--format",
        "json",
        "--section",
        "members",
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("--section only applies to --format csv"),
        "{}",
        r.stderr
    );
    for (section, first) in [
        ("summary", "\"key\",\"value\""),
        ("campaigns", "\"campaign_id\","),
        ("members", "\"member_id\","),
    ] {
        let r = db.run(&[
            "report",
            "overruns",
            "--format",
            "csv",
            "--section",
            section,
        ]);
        assert_eq!(r.code, 0, "{}", r.both());
        assert!(r.stdout.starts_with(first), "{section}: {}", r.stdout);
    }
}

/// Per campaign, computed apart from the report: the legacy counter `campaigns.issued_yen` and
/// every coupon of the campaign (voided ones included: the old system counted them).
fn expected_lost_updates(db: &TestDb) -> BTreeMap<String, (i64, i64)> {
    db.client()
        .query(
            "SELECT c.campaign_id, c.issued_yen::int8,
                    (SELECT coalesce(sum(amount_yen::numeric), 0) FROM issued_coupons i
                      WHERE i.campaign_id = c.campaign_id)::int8
               FROM campaigns c",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect()
}

/// Checks the report's lost-update figures, in JSON, CSV and the table, against `want`.
fn check_lost_updates(db: &TestDb, want: &BTreeMap<String, (i64, i64)>, source: &str) -> Value {
    let r = db.run(&["report", "overruns", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        doc["legacy_counter"]["source"], source,
        "{}",
        doc["legacy_counter"]
    );
    let (mut counter, mut issued) = (0, 0);
    for c in doc["campaigns"].as_array().unwrap() {
        let id = c["campaign_id"].as_str().unwrap();
        let (want_counter, want_issued) = want[id];
        assert_eq!(c["legacy_counter_yen"].as_i64(), Some(want_counter), "{id}");
        assert_eq!(
            c["old_system_issued_yen"].as_i64(),
            Some(want_issued),
            "{id}"
        );
        assert_eq!(
            c["lost_update_yen"].as_i64(),
            Some(want_issued - want_counter),
            "{id}"
        );
        counter += want_counter;
        issued += want_issued;
    }
    assert_eq!(doc["campaigns"].as_array().unwrap().len(), want.len());
    let t = &doc["totals"];
    assert_eq!(t["legacy_counter_yen"].as_i64(), Some(counter));
    assert_eq!(t["old_system_issued_yen"].as_i64(), Some(issued));
    assert_eq!(t["lost_update_yen"].as_i64(), Some(issued - counter));
    check_csv_matches_json(db, &doc);
    for format in ["table", "markdown", "html"] {
        let r = db.run(&["report", "overruns", "--format", format]);
        assert!(
            r.stdout.contains("Lost updates: the legacy counter"),
            "{format}"
        );
        assert!(
            r.stdout.contains(&group(issued - counter)),
            "{format}: the total lost updates"
        );
    }
    doc
}

#[test]
fn the_lost_updates_equal_independent_sql_before_the_gate_after_it_and_after_the_rollback_repair() {
    let db = fresh_db();
    db.make_legacy_baselined(600);
    let before = expected_lost_updates(&db);
    assert!(
        before.values().all(|(counter, issued)| counter < issued),
        "the demo's counter lost updates: {before:?}"
    );
    check_lost_updates(&db, &before, "live");

    // Up to the gate: duplicates voided (still counted: the old system issued them); the old
    // code issues one more coupon and its counter update is lost.
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             VALUES (gen_random_uuid(), 'SW-B', 'm-late', '2026-09', 1000)",
        )
        .unwrap();
    assert!(db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL") > 0);
    let at_gate = expected_lost_updates(&db);
    assert_ne!(at_gate, before);
    check_lost_updates(&db, &at_gate, "live");

    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // After the deploy the new application issues coupons; the legacy counter does not move.
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
             VALUES (gen_random_uuid(), 'SW-C', 'm-new-app', '2026-09', 1000)",
        )
        .unwrap();
    let doc = check_lost_updates(&db, &at_gate, "deploy_gate");
    let recorded_at = doc["legacy_counter"]["recorded_at"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(recorded_at).is_ok()
            && recorded_at.ends_with("+09:00"),
        "{recorded_at}"
    );

    // Rolling back: the repair overwrites the legacy counter with the truth; the figure at the
    // deploy stays what it was.
    let r = db.run(&[
        "repair",
        "apply",
        "restore-legacy-campaign-counters",
        "--yes",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let overwritten = expected_lost_updates(&db);
    assert!(
        at_gate
            .iter()
            .all(|(id, (counter, _))| overwritten[id].0 != *counter),
        "the repair rewrote every counter: {overwritten:?}"
    );
    check_lost_updates(&db, &at_gate, "deploy_gate");
    // Passing the gate again (a rerun) keeps the first record.
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    check_lost_updates(&db, &at_gate, "deploy_gate");
}

#[test]
fn the_lost_updates_on_a_hand_made_database() {
    let db = fresh_db();
    let mut c = db.legacy_schema();
    // LU-A: four coupons, counter 2,000 (two updates lost); LU-B: a counter above the coupons
    // (a negative difference stays a number); LU-C: no coupon.
    c.batch_execute(
        "INSERT INTO campaigns VALUES ('LU-A', 1000, 10000, 2000), ('LU-B', 500, 10000, 2500), ('LU-C', 100, 100, 0);
         INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
         SELECT gen_random_uuid(), 'LU-A', 'm' || (g % 3), '2026-09', 1000 FROM generate_series(1, 4) g
         UNION ALL SELECT gen_random_uuid(), 'LU-B', 'm9', '2026-09', 500 FROM generate_series(1, 3);",
    )
    .unwrap();
    let want = expected_lost_updates(&db);
    assert_eq!(want["LU-A"], (2000, 4000));
    assert_eq!(want["LU-B"], (2500, 1500));
    let doc = check_lost_updates(&db, &want, "live");
    assert_eq!(doc["campaigns"][1]["lost_update_yen"].as_i64(), Some(-1000));
    let r = db.run(&[
        "report",
        "overruns",
        "--format",
        "csv",
        "--section",
        "campaigns",
    ]);
    assert!(
        r.stdout.contains(",2500,1500,-1000,"),
        "a negative difference is a bare number: {}",
        r.stdout
    );
}

/// The workbook's sheets in each language, in order.
const SHEETS_EN: [&str; 4] = [
    "Summary",
    "Campaigns",
    "Member-months over cap",
    "Redeemed duplicates",
];
const SHEETS_JA: [&str; 4] = [
    "概要",
    "キャンペーン",
    "月間上限を超えた会員・月",
    "利用済みの重複クーポン",
];

/// The summary's labels in English for the JSON's totals, in the JSON's order.
const SUMMARY_LABELS: [(&str, &str); 16] = [
    ("Campaign overruns (yen)", "campaign_overrun_yen"),
    (
        "Member overruns past the monthly cap (yen)",
        "member_overrun_yen",
    ),
    ("Voided by the repair (yen)", "voided_yen"),
    (
        "Redeemed legacy duplicates: money lost (yen)",
        "redeemed_legacy_duplicates_yen",
    ),
    (
        "Voided, then redeemed anyway by the old cart (yen)",
        "voided_then_redeemed_yen",
    ),
    ("Budgets, all campaigns (yen)", "budget_yen"),
    ("Issued, all campaigns (yen)", "issued_yen"),
    ("Coupons not voided", "coupons"),
    ("Voided coupons", "voided_coupons"),
    (
        "Redeemed duplicates (coupons)",
        "redeemed_legacy_duplicates",
    ),
    ("Voided, then redeemed (coupons)", "voided_then_redeemed"),
    ("Member-months over the cap", "members_over_monthly_cap"),
    ("Used in those member-months (yen)", "member_used_yen"),
    ("Legacy counter (yen)", "legacy_counter_yen"),
    ("Issued by the old system (yen)", "old_system_issued_yen"),
    ("Lost updates (yen)", "lost_update_yen"),
];

/// The workbook, read back by calamine: sheet name → rows of cells; its sheets are `names`.
fn workbook_named(
    path: &std::path::Path,
    names: [&str; 4],
) -> BTreeMap<String, Vec<Vec<calamine::Data>>> {
    use calamine::Reader;
    let mut book: calamine::Xlsx<_> = calamine::open_workbook(path).unwrap();
    let sheets = book.sheet_names();
    assert_eq!(sheets, names, "the sheets, in order");
    let book: BTreeMap<String, Vec<Vec<calamine::Data>>> = sheets
        .iter()
        .map(|n| {
            let range = book.worksheet_range(n).unwrap();
            (n.clone(), range.rows().map(|r| r.to_vec()).collect())
        })
        .collect();
    check_words_not_names(&book, names[0]);
    book
}

/// The English workbook.
fn workbook(path: &std::path::Path) -> BTreeMap<String, Vec<Vec<calamine::Data>>> {
    workbook_named(path, SHEETS_EN)
}

/// Every header and every label of the summary is words, not a field name: no `snake_case`,
/// no JSON key.
fn check_words_not_names(book: &BTreeMap<String, Vec<Vec<calamine::Data>>>, summary: &str) {
    let snake = regex::Regex::new(r"[a-z0-9]_[a-z0-9]").unwrap();
    let keys = SUMMARY_LABELS.map(|(_, key)| key);
    let mut texts: Vec<String> = book
        .values()
        .flat_map(|rows| rows[0].iter().map(string))
        .collect();
    texts.extend(book[summary][1..].iter().map(|r| string(&r[0])));
    for text in &texts {
        assert!(!snake.is_match(text), "a field name, not words: {text:?}");
        assert!(
            !keys.contains(&text.as_str()) && text != "state",
            "{text:?}"
        );
    }
    assert_eq!(book[summary][0].len(), 3, "label, value and what it means");
    for row in &book[summary][1..] {
        assert!(
            !string(&row[2]).is_empty(),
            "an explanation for {:?}",
            row[0]
        );
    }
}

/// A cell that must be a number (not text that looks like one), as an integer.
fn number(cell: &calamine::Data) -> i64 {
    match cell {
        calamine::Data::Float(f) if f.fract() == 0.0 => *f as i64,
        calamine::Data::Int(i) => *i,
        other => panic!("not a number: {other:?}"),
    }
}

fn string(cell: &calamine::Data) -> String {
    match cell {
        calamine::Data::String(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// A cell that must be a date (not text that looks like one), as Excel's serial day number.
fn date(cell: &calamine::Data) -> f64 {
    match cell {
        calamine::Data::DateTime(d) => d.as_f64(),
        other => panic!("not a date: {other:?}"),
    }
}

/// Excel's serial day number of a time in Asia/Tokyo, given as seconds since 1970 on the
/// Tokyo wall clock: days since 1899-12-30.
fn excel_day(tokyo_epoch_seconds: f64) -> f64 {
    tokyo_epoch_seconds.floor() / 86_400.0 + 25_569.0
}

/// What calamine does not read: every sheet keeps its header row in view (a frozen pane below
/// row 1), the three data sheets have filters on their header, amounts carry the yen format,
/// and every sheet prints one page wide on A4 (the summary on one page) with its header row
/// on each page and a footer with the page number.
fn check_workbook_layout(path: &std::path::Path) {
    use std::io::Read;
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut part = |name: &str| {
        let mut text = String::new();
        zip.by_name(name)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    let workbook = part("xl/workbook.xml");
    let sheets = workbook.matches("<sheet ").count();
    assert!(
        sheets >= 4,
        "summary, campaigns, members, duplicates: {workbook}"
    );
    assert_eq!(
        workbook.matches(r#"name="_xlnm.Print_Titles""#).count(),
        sheets,
        "the header row repeats on every printed page of every sheet: {workbook}"
    );
    let mut filtered = 0;
    let page_setup = regex::Regex::new(r"<pageSetup [^>]*/>").unwrap();
    for n in 1..=sheets {
        let xml = part(&format!("xl/worksheets/sheet{n}.xml"));
        assert!(
            xml.contains(r#"ySplit="1""#) && xml.contains(r#"state="frozen""#),
            "sheet {n} freezes its header row"
        );
        filtered += usize::from(xml.contains("<autoFilter "));
        assert!(
            xml.contains(r#"<pageSetUpPr fitToPage="1"/>"#),
            "sheet {n} fits to page"
        );
        let setup = page_setup
            .find(&xml)
            .unwrap_or_else(|| panic!("sheet {n} has no page setup"))
            .as_str()
            .to_string();
        assert!(setup.contains(r#"paperSize="9""#), "A4: {setup}");
        // One page wide: fitToWidth is 1 where absent (its default).
        assert!(
            !setup.contains("fitToWidth=") || setup.contains(r#"fitToWidth="1""#),
            "{setup}"
        );
        if n == 1 {
            assert!(
                !setup.contains("fitToHeight="),
                "the summary on one page: {setup}"
            );
        } else {
            assert!(setup.contains(r#"fitToHeight="0""#), "{setup}");
        }
        if n != 3 {
            assert!(
                setup.contains(r#"orientation="landscape""#),
                "sheet {n} is wide: {setup}"
            );
        }
        assert!(
            xml.contains("<oddFooter>") && xml.contains("&amp;P"),
            "sheet {n}'s footer"
        );
    }
    assert!(filtered >= 3, "{filtered} sheets have filters");
    assert!(part("xl/styles.xml").contains("¥#,##0"), "the yen format");
}

fn check_workbook_matches_json(
    db: &TestDb,
    doc: &Value,
) -> BTreeMap<String, Vec<Vec<calamine::Data>>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overruns.xlsx");
    let r = db.run(&["report", "overruns", "--output", path.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.both());
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes.windows(20).any(|w| w == b"xl/charts/chart1.xml"),
        "the workbook has a chart"
    );
    let book = workbook(&path);
    check_workbook_layout(&path);

    let summary: BTreeMap<String, calamine::Data> = book["Summary"][1..]
        .iter()
        .map(|r| (string(&r[0]), r[1].clone()))
        .collect();
    let state = doc["state"].as_str().unwrap();
    assert_eq!(string(&summary["State"]), state);
    assert_eq!(
        number(&summary["Monthly cap (yen)"]),
        doc["monthly_cap_yen"].as_i64().unwrap()
    );
    // The as-of time: a date cell, the JSON's time on the Tokyo wall clock.
    let as_of = doc["as_of"].as_str().unwrap();
    assert!(as_of.ends_with("+09:00"), "{as_of}");
    let wall: f64 = db
        .client()
        .query_one(
            "SELECT extract(epoch FROM (left($1, 19)::timestamp))::float8",
            &[&as_of],
        )
        .unwrap()
        .get(0);
    let got = date(&summary["As of (Asia/Tokyo)"]);
    // The JSON came from another run a moment before: seconds apart at most.
    let want = excel_day(wall);
    assert!(
        (got - want).abs() * 86_400.0 < 10.0,
        "{got}, not {want}, for {as_of}"
    );
    for (label, key) in SUMMARY_LABELS {
        match doc["totals"][key].as_i64() {
            Some(v) => assert_eq!(number(&summary[label]), v, "summary {label}"),
            None => assert_eq!(summary[label], calamine::Data::Empty, "summary {label}"),
        }
    }

    let rows = &book["Campaigns"];
    let fields = [
        "budget_yen",
        "issued_yen",
        "overrun_yen",
        "coupons",
        "voided_coupons",
        "voided_yen",
        "redeemed_legacy_duplicates",
        "redeemed_legacy_duplicates_yen",
        "voided_then_redeemed",
        "voided_then_redeemed_yen",
        "legacy_counter_yen",
        "old_system_issued_yen",
        "lost_update_yen",
    ];
    let header: Vec<String> = rows[0].iter().map(string).collect();
    assert_eq!(
        header[..4],
        ["Campaign", "Budget (yen)", "Issued (yen)", "Over (yen)"]
    );
    assert_eq!(header.len(), fields.len() + 1);
    let json = doc["campaigns"].as_array().unwrap();
    assert_eq!(rows.len() - 1, json.len());
    for (row, c) in rows[1..].iter().zip(json) {
        assert_eq!(
            string(&row[0]),
            c["campaign_id"].as_str().unwrap(),
            "ids are strings, as they are"
        );
        for (i, field) in fields.iter().enumerate() {
            match c[field].as_i64() {
                Some(v) => assert_eq!(number(&row[i + 1]), v, "{field}"),
                None => assert_eq!(row[i + 1], calamine::Data::Empty, "{field}"),
            }
        }
    }

    let rows = &book["Member-months over cap"];
    let json = doc["members_over_monthly_cap"].as_array().unwrap();
    assert_eq!(rows.len() - 1, json.len());
    for (row, m) in rows[1..].iter().zip(json) {
        assert_eq!(string(&row[0]), m["member_id"].as_str().unwrap());
        assert_eq!(string(&row[1]), m["month"].as_str().unwrap());
        for (i, field) in ["used_yen", "cap_yen", "overrun_yen"].iter().enumerate() {
            assert_eq!(number(&row[i + 2]), m[field].as_i64().unwrap(), "{field}");
        }
    }

    let rows = &book["Redeemed duplicates"];
    assert_eq!(
        rows[0].iter().map(string).collect::<Vec<_>>()[5..],
        ["Issued at (Asia/Tokyo)", "Redeemed at (Asia/Tokyo)"],
        "the times' headers name their zone"
    );
    let t = &doc["totals"];
    assert_eq!(
        rows.len() as i64 - 1,
        t["redeemed_legacy_duplicates"].as_i64().unwrap()
    );
    let sum: i64 = rows[1..].iter().map(|r| number(&r[4])).sum();
    assert_eq!(sum, t["redeemed_legacy_duplicates_yen"].as_i64().unwrap());
    // The times are date cells holding the coupon's time on the Tokyo wall clock.
    let times: BTreeMap<String, (f64, f64)> = db
        .client()
        .query(
            "SELECT coupon_id::text,
                    extract(epoch FROM (issued_at AT TIME ZONE 'Asia/Tokyo'))::float8,
                    extract(epoch FROM (redeemed_at AT TIME ZONE 'Asia/Tokyo'))::float8
               FROM issued_coupons WHERE redeemed_at IS NOT NULL",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (excel_day(r.get(1)), excel_day(r.get(2)))))
        .collect();
    for row in &rows[1..] {
        let (issued, redeemed) = times[&string(&row[0])];
        assert!((date(&row[5]) - issued).abs() < 1e-6, "{row:?}");
        assert!((date(&row[6]) - redeemed).abs() < 1e-6, "{row:?}");
    }
    book
}

#[test]
fn the_workbook_read_back_by_calamine_equals_the_json_and_lists_the_money_lost() {
    let db = fresh_db();
    db.make_legacy_baselined(600);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc = check_json(
        &db,
        &[],
        &expected_campaigns(&db, true),
        &expected_members(&db, 2000, true),
        2000,
    );
    let book = check_workbook_matches_json(&db, &doc);
    // The redeemed duplicates are exactly the coupons the release kept as redeemed history.
    let mut want: Vec<String> = db
        .client()
        .query(
            "SELECT coupon_id::text FROM issued_coupons
              WHERE legacy_duplicate AND voided_at IS NULL AND redeemed_at IS NOT NULL",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    want.sort();
    let mut got: Vec<String> = book["Redeemed duplicates"][1..]
        .iter()
        .map(|r| string(&r[0]))
        .collect();
    got.sort();
    assert!(!want.is_empty());
    assert_eq!(got, want);

    // Before the release the duplicates are predicted with the release's ranking.
    let legacy = fresh_db();
    legacy.make_legacy_baselined(300);
    let doc = check_json(
        &legacy,
        &[],
        &expected_campaigns(&legacy, false),
        &expected_members(&legacy, 2000, false),
        2000,
    );
    check_workbook_matches_json(&legacy, &doc);

    let r = db.run(&["report", "overruns", "--format", "xlsx"]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("--output FILE.xlsx"), "{}", r.stderr);
    assert!(r.stdout.is_empty());
}

#[test]
fn lang_ja_translates_every_human_rendering_and_leaves_ids_json_and_figures_alone() {
    let db = snapshot_db();
    let as_of = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+09:00").unwrap();
    let run = |args: &[&str]| {
        let r = db.run(args);
        assert_eq!(r.code, 0, "{}", r.both());
        as_of.replace_all(&r.stdout, "AS_OF").into_owned()
    };
    // JSON never changes with --lang.
    assert_eq!(
        run(&["report", "overruns", "--format", "json", "--lang", "ja"]),
        run(&["report", "overruns", "--format", "json"])
    );
    let figure = regex::Regex::new(r"[0-9][0-9,]*|SW-A|秋-セール|EMPTY|m0[0-9]").unwrap();
    for format in ["table", "markdown", "html"] {
        let en = run(&["report", "overruns", "--format", format]);
        // A page's header wraps only between its words, at a <wbr>.
        let ja =
            run(&["report", "overruns", "--format", format, "--lang", "ja"]).replace("<wbr>", "");
        for word in [
            "クーポン超過レポート",
            "キャンペーンID",
            "予算（円）",
            "合計",
            "月間上限を超えた会員",
            "消失した更新",
        ] {
            assert!(ja.contains(word), "{format} lacks {word}:\n{ja}");
        }
        for english in [
            "Coupon overrun report",
            "budget_yen",
            "Totals",
            "Members over the monthly cap",
        ] {
            assert!(
                !ja.contains(english),
                "{format} still says {english}:\n{ja}"
            );
        }
        // Ids and figures are the same as in English.
        let figures = |t: &str| -> Vec<String> {
            figure
                .find_iter(t)
                .map(|m| m.as_str().to_string())
                .filter(|m| m != "2" && m != "000")
                .collect()
        };
        if format != "html" {
            assert_eq!(figures(&ja), figures(&en), "{format}");
        }
    }
    let html = run(&["report", "overruns", "--format", "html", "--lang", "ja"]);
    assert!(html.contains("<html lang=\"ja\">"));
    assert!(html.contains("リリース済み："), "the state in Japanese");
    for english in ["released", "(Asia/Tokyo)", "budget ", "issued "] {
        assert!(!html.contains(english), "the page still says {english}");
    }
    assert!(html.contains("リリース済み："), "the state in Japanese");
    for english in ["released", "(Asia/Tokyo)", "budget ", "issued "] {
        assert!(!html.contains(english), "the page still says {english}");
    }
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(
        r"host=\S+ port=\d+ dbname=[\w\\]+",
        "host=[host] port=[port] dbname=[db]",
    );
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        insta::assert_snapshot!(
            "report_table_ja",
            run(&["report", "overruns", "--lang", "ja"])
        );
    });

    // CSV: the headers change, not a cell.
    for section in ["summary", "campaigns", "members"] {
        let en = run(&[
            "report",
            "overruns",
            "--format",
            "csv",
            "--section",
            section,
        ]);
        let ja = run(&[
            "report",
            "overruns",
            "--format",
            "csv",
            "--section",
            section,
            "--lang",
            "ja",
        ]);
        let (en_head, en_rows) = en.split_once("\r\n").unwrap();
        let (ja_head, ja_rows) = ja.split_once("\r\n").unwrap();
        assert_eq!(ja_rows, en_rows, "{section}");
        assert_ne!(ja_head, en_head, "{section}");
        let header: Vec<String> = csv::Reader::from_reader(ja.as_bytes())
            .headers()
            .unwrap()
            .iter()
            .map(String::from)
            .collect();
        assert!(
            header[0] == "キャンペーンID" || header[0] == "会員ID" || header[0] == "項目",
            "{header:?}"
        );
    }

    // The workbook: Japanese sheet names, headers and summary, the same numbers as numbers, the
    // same dates as dates, the same page setup.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ja.xlsx");
    let r = db.run(&[
        "report",
        "overruns",
        "--output",
        path.to_str().unwrap(),
        "--lang",
        "ja",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let book = workbook_named(&path, SHEETS_JA);
    check_workbook_layout(&path);
    // A Japanese header is written on lines that break between its words, never inside one.
    let header = |sheet: &str, col: usize| string(&book[sheet][0][col]).replace('\n', "");
    let words = [
        "キャンペーン",
        "クーポン",
        "無効化",
        "利用済み",
        "利用された",
        "カウンター",
        "システム",
        "発行額",
        "日時",
    ];
    for rows in book.values() {
        for cell in &rows[0] {
            let text = string(cell);
            for word in words {
                assert!(
                    !text.replace('\n', "").contains(word) || text.contains(word),
                    "{word} broken in {text:?}"
                );
            }
        }
    }
    assert!(
        book["キャンペーン"][0]
            .iter()
            .any(|c| string(c).contains('\n')),
        "the long headers are on more than one line"
    );
    assert_eq!(header("キャンペーン", 0), "キャンペーンID");
    assert_eq!(header("キャンペーン", 1), "予算（円）");
    assert_eq!(header("月間上限を超えた会員・月", 0), "会員ID");
    assert_eq!(
        [
            header("利用済みの重複クーポン", 5),
            header("利用済みの重複クーポン", 6)
        ],
        ["発行日時（日本時間）", "利用日時（日本時間）"]
    );
    let summary = &book["概要"];
    assert_eq!(
        summary[0].iter().map(string).collect::<Vec<_>>(),
        ["項目", "値", "説明"]
    );
    assert_eq!(string(&summary[1][0]), "基準日時（日本時間）");
    assert!(
        matches!(summary[1][1], calamine::Data::DateTime(_)),
        "{:?}",
        summary[1][1]
    );
    assert_eq!(string(&summary[2][0]), "状態");
    assert!(
        ["修復前", "リリース途中", "リリース済み"].contains(&string(&summary[2][1]).as_str()),
        "the state in Japanese: {:?}",
        summary[2][1]
    );
    for row in &summary[1..] {
        let label = string(&row[0]);
        assert!(!label.is_ascii(), "a label in Japanese: {label}");
    }
    let doc: Value =
        serde_json::from_str(&run(&["report", "overruns", "--format", "json"])).unwrap();
    for (row, c) in book["キャンペーン"][1..]
        .iter()
        .zip(doc["campaigns"].as_array().unwrap())
    {
        assert_eq!(string(&row[0]), c["campaign_id"].as_str().unwrap());
        assert_eq!(number(&row[1]), c["budget_yen"].as_i64().unwrap());
    }
}

#[test]
fn the_page_lists_the_first_members_and_points_at_the_full_list() {
    let db = fresh_db();
    db.make_legacy_baselined(1000);
    let over = expected_members(&db, 2000, false).len();
    assert!(over > 200, "{over}");
    let rows = |html: &str| html.matches("<tr><td class=\"id\">m0").count();
    let r = db.run(&["report", "overruns", "--format", "html"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(rows(&r.stdout), 200);
    // Told in a reader's words: the page's reader has the report's files, not the command line.
    assert!(r.stdout.contains(&format!(
        "The first 200 of {} member-months over the cap are listed here",
        group(over as i64)
    )));
    assert!(r.stdout.contains("workbook (.xlsx)"), "where the rest are");
    assert!(!r.stdout.contains("--members") && !r.stdout.contains("--output"));
    // The histogram still counts every member-month.
    let counted: usize = regex::Regex::new(r"<title>([\d,]+) member-months? over by")
        .unwrap()
        .captures_iter(&r.stdout)
        .map(|c| c[1].replace(',', "").parse::<usize>().unwrap())
        .sum();
    assert_eq!(counted, over);
    let r = db.run(&["report", "overruns", "--format", "html", "--members", "all"]);
    assert_eq!(rows(&r.stdout), over);
    assert!(!r.stdout.contains("are listed here"));
}
