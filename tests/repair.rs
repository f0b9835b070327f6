//! Repairs and the whole release against a real server: edge cases against an independent
//! expectation, dry runs that change nothing, exact counters under concurrent writers,
//! ranking at write time, undo, a second schema, kill -9 and resumption.

mod common;

#[path = "common/held.rs"]
mod held;
#[allow(dead_code)]
#[path = "../examples/kill_campaign.rs"]
mod kill_campaign;

use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const CONFIRM: [&str; 4] = ["apply", "--yes", "--confirm", "deploy-new-application"];

/// A database at V2 with the edge cases of the incident: exact ties on issued_at, groups
/// of three and four, two redeemed duplicates in one group, a campaign with no coupons, a
/// campaign that ends exactly on budget, coupons in two months, and counters that drifted
/// below and above the truth.
fn edge_cases() -> TestDb {
    let db = fresh_db();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    db.client()
        .batch_execute(
            "INSERT INTO campaigns VALUES ('C-OVER', 1000, 2000, 999), ('C-ON', 1000, 3000, 0),
                                         ('C-NONE', 500, 5000, 0), ('C-BIG', 1000, 100000, 5000);
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at) VALUES
               -- an exact tie on issued_at: the smaller coupon_id is kept
               ('00000000-0000-0000-0000-0000000000a2', 'C-OVER', 'a', '2026-09', 1000, '2026-09-20 10:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000a1', 'C-OVER', 'a', '2026-09', 1000, '2026-09-20 10:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000a3', 'C-OVER', 'a', '2026-09', 1000, '2026-09-20 10:01+09', NULL),
               -- four rows, two redeemed: the earlier redeemed one is kept, the other only marked
               ('00000000-0000-0000-0000-0000000000b1', 'C-OVER', 'b', '2026-09', 1000, '2026-09-20 09:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000b2', 'C-OVER', 'b', '2026-09', 1000, '2026-09-20 09:01+09', '2026-09-22 12:00+09'),
               ('00000000-0000-0000-0000-0000000000b3', 'C-OVER', 'b', '2026-09', 1000, '2026-09-20 09:02+09', '2026-09-23 12:00+09'),
               ('00000000-0000-0000-0000-0000000000b4', 'C-OVER', 'b', '2026-09', 1000, '2026-09-20 09:03+09', NULL),
               ('00000000-0000-0000-0000-0000000000c1', 'C-OVER', 'c', '2026-09', 1000, '2026-09-20 09:00+09', '2026-09-21 12:00+09'),
               -- exactly on budget once voided; the duplicate is in the next month
               ('00000000-0000-0000-0000-0000000000d1', 'C-ON', 'a', '2026-09', 1000, '2026-09-20 09:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000d2', 'C-ON', 'b', '2026-09', 1000, '2026-09-20 09:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000d3', 'C-ON', 'b', '2026-10', 1000, '2026-10-01 09:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000d4', 'C-ON', 'd', '2026-09', 1000, '2026-09-20 09:00+09', NULL),
               ('00000000-0000-0000-0000-0000000000e1', 'C-BIG', 'a', '2026-10', 1000, '2026-10-02 09:00+09', NULL);
             -- counters someone filled in by hand, wrong both ways
             INSERT INTO campaign_budgets VALUES ('C-OVER', 1000, 2000, 1000), ('C-BIG', 1000, 100000, 99000);
             INSERT INTO member_monthly_usage VALUES ('a', '2026-09', 9000), ('b', '2026-09', 0), ('zz', '2026-09', 700);",
        )
        .unwrap();
    db
}

/// The expected end state, computed from the release's rule (per campaign and member the
/// coupon kept is the earliest issued of the redeemed ones, or of all when none is redeemed; the
/// other unredeemed ones are voided), not from pgmend's SQL, before anything runs.
fn remember_expected(db: &TestDb) {
    db.client()
        .batch_execute(
            "CREATE TABLE expected_coupons AS
               SELECT coupon_id, rn > 1 AS dup, rn > 1 AND redeemed_at IS NULL AS voided
                 FROM (SELECT coupon_id, redeemed_at, row_number() OVER (PARTITION BY campaign_id, member_id
                               ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn FROM issued_coupons) x;",
        )
        .unwrap();
}

/// Every difference between the database and the expectation, as lines.
fn differences(db: &TestDb) -> Vec<String> {
    let mut c = db.client();
    let mut out: Vec<String> = c
        .query(
            "SELECT 'coupon ' || e.coupon_id || ': legacy_duplicate ' || i.legacy_duplicate || ', voided ' || (i.voided_at IS NOT NULL)
                    || ' (expected ' || e.dup || ', ' || e.voided || ')'
               FROM expected_coupons e JOIN issued_coupons i USING (coupon_id)
              WHERE i.legacy_duplicate <> e.dup OR (i.voided_at IS NOT NULL) <> e.voided",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    out.extend(
        c.query(
            "WITH truth AS (SELECT c.campaign_id, coalesce(sum(i.amount_yen) FILTER (WHERE NOT e.voided), 0) AS yen
                              FROM campaigns c LEFT JOIN issued_coupons i USING (campaign_id)
                              LEFT JOIN expected_coupons e USING (coupon_id) GROUP BY 1)
             SELECT 'campaign ' || t.campaign_id || ': ' || coalesce(b.issued_yen::text, 'no row') || ' (expected ' || t.yen || ')'
               FROM truth t LEFT JOIN campaign_budgets b USING (campaign_id) WHERE b.issued_yen IS DISTINCT FROM t.yen
             UNION ALL
             SELECT 'campaign_budgets ' || b.campaign_id || ': discount/budget not copied'
               FROM campaign_budgets b JOIN campaigns c USING (campaign_id)
              WHERE (b.discount_yen, b.budget_yen) <> (c.discount_yen, c.budget_yen) AND b.campaign_id NOT IN ('C-OVER', 'C-BIG')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0)),
    );
    out.extend(
        c.query(
            "WITH truth AS (SELECT i.member_id, i.month, sum(i.amount_yen) FILTER (WHERE NOT e.voided) AS yen
                              FROM issued_coupons i JOIN expected_coupons e USING (coupon_id) GROUP BY 1, 2)
             SELECT 'usage ' || coalesce(t.member_id, u.member_id) || '/' || coalesce(t.month, u.month) || ': '
                    || coalesce(u.used_yen, 0) || ' (expected ' || coalesce(t.yen, 0) || ')'
               FROM truth t FULL JOIN member_monthly_usage u USING (member_id, month)
              WHERE coalesce(u.used_yen, 0) <> coalesce(t.yen, 0)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0)),
    );
    out
}

/// A checksum of every table's content (pgmend's own included).
fn checksum_all(db: &TestDb) -> String {
    checksum_of(db, "'pg_catalog', 'information_schema'")
}

/// A checksum of the content of every table outside pgmend's own schema: what a run and
/// its undo leave as it was (their own records are in `pgmend`).
fn checksum_outside_pgmend(db: &TestDb) -> String {
    checksum_of(db, "'pg_catalog', 'information_schema', 'pgmend'")
}

/// A checksum of every table's content and of the catalog's relations and columns, the
/// schemas in `left_out` (a list of SQL literals) left out.
fn checksum_of(db: &TestDb, left_out: &str) -> String {
    let mut c = db.client();
    let tables: Vec<String> = c
        .query(
            &format!(
                "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables
                  WHERE schemaname NOT IN ({left_out}) ORDER BY 1"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut sums = Vec::new();
    for t in &tables {
        let s: String = c
            .query_one(&format!("SELECT '{t}:' || coalesce(md5(string_agg(x::text, ',' ORDER BY x::text)), '-') FROM {t} x"), &[])
            .unwrap()
            .get(0);
        sums.push(s);
    }
    let schema: String = c
        .query_one(
            // Ordered by the text itself: `ORDER BY 1` in an aggregate orders by the constant 1,
            // so the order (and the digest) followed the plan, which can change when pgmend's
            // schema adds rows to the catalog (seen on PostgreSQL 14).
            &format!("SELECT md5(string_agg(line, ',' ORDER BY line)) FROM (
                SELECT format('%s.%s.%s %s %s', n.nspname, c.relname, a.attname, a.atttypid, c.relkind) AS line
                  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                 WHERE n.nspname NOT IN ({left_out}, 'pg_toast')) s"),
            &[],
        )
        .unwrap()
        .get(0);
    format!("{} schema:{schema}", sums.join(" "))
}

#[test]
fn the_release_ends_in_the_expected_state_on_the_edge_cases() {
    let db = edge_cases();
    remember_expected(&db);
    let before = checksum_all(&db);
    for args in [
        vec!["plan"],
        vec!["plan", "--format", "json"],
        vec!["repair", "plan", "void-duplicate-coupons", "--all"],
        vec![
            "repair",
            "plan",
            "rebuild-member-monthly-usage",
            "--format",
            "json",
        ],
    ] {
        let r = db.run(&args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.both());
    }
    assert_eq!(checksum_all(&db), before, "a dry run changed something");
    let r = db.run(&[
        "repair",
        "plan",
        "void-duplicate-coupons",
        "--format",
        "json",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["changes"], 6, "{}", r.stdout); // a2 a3 b1 b3 b4 d3
    assert_eq!(doc["voided_or_created"], 5, "{}", r.stdout);

    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout
            .contains("pgmend apply --yes --confirm deploy-new-application"),
        "{}",
        r.stdout
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM refinery_schema_history"),
        4,
        "stops before V5"
    );
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(differences(&db), Vec::<String>::new());
    assert_eq!(db.history().len(), 5);
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates WHERE gate = 'deploy-new-application'"),
        1
    );

    // Run twice, changes nothing the second time.
    let before = checksum_all(&db);
    for name in [
        "void-duplicate-coupons",
        "rebuild-campaign-budgets",
        "rebuild-member-monthly-usage",
    ] {
        let r = db.run(&["repair", "apply", name, "--yes", "--format", "json"]);
        assert_eq!(r.code, 0, "{}", r.both());
        let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(doc["run"]["changed"], 0, "{name}: {}", r.stdout);
    }
    let after = checksum_all(&db);
    let strip_pgmend = |s: &str| {
        s.split(' ')
            .filter(|p| !p.starts_with("pgmend."))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(strip_pgmend(&after), strip_pgmend(&before));
}

/// The ledger as a sorted list of records (repair, table, key, action, before, after with a
/// void's time reduced to whether it is set, reason): a multiset, whatever order wrote them.
fn ledger_records(db: &TestDb) -> Vec<String> {
    db.client()
        .query(
            "SELECT concat_ws(' ', r.repair, l.target_table, l.row_key::text, l.action, l.before::text,
                              (l.after - 'voided_at')::text, (l.after ->> 'voided_at') IS NULL, l.reason)
               FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id) ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn with_four_workers_the_edge_cases_end_as_expected_and_as_one_worker_ends_them() {
    let db = edge_cases();
    remember_expected(&db);
    let one = copy_of(&db);
    for (target, jobs) in [(&db, "4"), (&one, "1")] {
        for args in [&["apply", "--yes"][..], &CONFIRM[..]] {
            let mut args = args.to_vec();
            args.extend(["--jobs", jobs, "--batch-target", "5ms"]);
            let r = target.run(&args);
            assert_eq!(r.code, 0, "--jobs {jobs}: {}", r.both());
        }
        assert_eq!(differences(target), Vec::<String>::new(), "--jobs {jobs}");
    }
    // The four workers' runs went through slices; one worker's did not.
    assert!(db.scalar_i64("SELECT count(*) FROM pgmend.run_slices") > 0);
    assert_eq!(one.scalar_i64("SELECT count(*) FROM pgmend.run_slices"), 0);
    let records = ledger_records(&db);
    assert!(records.len() >= 6, "{records:#?}");
    assert_eq!(records, ledger_records(&one));
}

#[test]
fn the_ledger_answers_which_coupons_were_voided_and_why() {
    let db = edge_cases();
    assert_eq!(
        db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"])
            .code,
        0
    );
    let r = db.run(&["repair", "log", "1", "--format", "csv"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let mut reader = csv::Reader::from_reader(r.stdout.as_bytes());
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 6);
    let a2 = rows
        .iter()
        .find(|r| r[2].contains("0000000000a2"))
        .expect("a2 was changed");
    assert!(
        a2[6].contains("00000000-0000-0000-0000-0000000000a1 is kept"),
        "{a2:?}"
    );
    let r = db.run(&["repair", "log", "1", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc.as_array().unwrap().len(), 6);
    let r = db.run(&["repair", "status", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc[0]["targets"], 3);
    assert_eq!(doc[0]["changed"], 6);
    assert_eq!(doc[0]["state"], "finished");
}

#[test]
fn compact_ledger_records_read_as_the_full_records_of_the_changes_made() {
    // The void and the counters' first pass write compact records (schema version 6); the
    // view must give each one exactly as a full record of that change reads: computed here
    // from the rows before and after the release, not from pgmend's SQL.
    let db = edge_cases();
    let mut c = db.client();
    c.batch_execute(
        "CREATE SCHEMA test_before;
         CREATE TABLE test_before.coupons AS SELECT * FROM issued_coupons;
         CREATE TABLE test_before.budgets AS SELECT * FROM campaign_budgets;
         CREATE TABLE test_before.usage AS SELECT * FROM member_monthly_usage;",
    )
    .unwrap();
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_compact") > 0,
        "the batches wrote compact records"
    );
    // pgmend's sessions render times in the database's default time zone; so must this one.
    c.batch_execute("SELECT set_config('TimeZone', (SELECT reset_val FROM pg_settings WHERE name = 'TimeZone'), false)")
        .unwrap();
    let mut rows = |sql: &str| -> Vec<String> {
        let mut v: Vec<String> = c
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        v.sort();
        v
    };
    let ledger = rows(
        "SELECT concat_ws(' | ', target_table, row_key::text, action, coalesce(before::text, '-'), after::text, reason)
           FROM pgmend.ledger_records",
    );
    let expected = rows(
        "WITH ranked AS (
           SELECT b.*, row_number() OVER w AS rn, first_value(b.coupon_id) OVER w AS kept
             FROM test_before.coupons b
           WINDOW w AS (PARTITION BY campaign_id, member_id ORDER BY redeemed_at IS NULL, issued_at, coupon_id))
         SELECT concat_ws(' | ', 'issued_coupons', jsonb_build_object('coupon_id', r.coupon_id)::text, 'update',
                          jsonb_build_object('legacy_duplicate', false, 'voided_at', r.voided_at, 'redeemed_at', r.redeemed_at)::text,
                          jsonb_build_object('legacy_duplicate', true, 'voided_at', c.voided_at, 'redeemed_at', c.redeemed_at)::text,
                          format('rank %s in its group; coupon_id %s is kept', r.rn, r.kept))
           FROM ranked r JOIN issued_coupons c USING (coupon_id) WHERE r.rn > 1
         UNION ALL
         SELECT concat_ws(' | ', 'campaign_budgets', jsonb_build_object('campaign_id', n.campaign_id)::text,
                          CASE WHEN o.campaign_id IS NULL THEN 'insert' ELSE 'update' END,
                          CASE WHEN o.campaign_id IS NULL THEN '-' ELSE jsonb_build_object('issued_yen', o.issued_yen)::text END,
                          CASE WHEN o.campaign_id IS NULL THEN to_jsonb(n) ELSE jsonb_build_object('issued_yen', n.issued_yen) END::text,
                          CASE WHEN o.campaign_id IS NULL THEN 'the key had no counter row; created with the sum of its source rows'
                               ELSE format('counter was %s; the source sums to %s', o.issued_yen, n.issued_yen) END)
           FROM campaign_budgets n LEFT JOIN test_before.budgets o USING (campaign_id)
          WHERE o.issued_yen IS DISTINCT FROM n.issued_yen
         UNION ALL
         SELECT concat_ws(' | ', 'member_monthly_usage', jsonb_build_object('member_id', n.member_id, 'month', n.month)::text,
                          CASE WHEN o.member_id IS NULL THEN 'insert' ELSE 'update' END,
                          CASE WHEN o.member_id IS NULL THEN '-' ELSE jsonb_build_object('used_yen', o.used_yen)::text END,
                          CASE WHEN o.member_id IS NULL THEN to_jsonb(n) ELSE jsonb_build_object('used_yen', n.used_yen) END::text,
                          CASE WHEN o.member_id IS NULL THEN 'the key had no counter row; created with the sum of its source rows'
                               ELSE format('counter was %s; the source sums to %s', o.used_yen, n.used_yen) END)
           FROM member_monthly_usage n LEFT JOIN test_before.usage o USING (member_id, month)
          WHERE o.used_yen IS DISTINCT FROM n.used_yen",
    );
    assert!(expected.len() >= 10, "{expected:#?}");
    assert_eq!(ledger, expected);
}

#[test]
fn a_run_whose_first_records_an_earlier_pgmend_wrote_in_full_is_logged_and_undone_whole() {
    // A run started by a pgmend before schema version 6 and finished by this one has its first
    // records in repair_ledger (full) and the rest in ledger_compact: `repair log` and undo must
    // read both, in ledger_id order. Simulated by moving the first half of a run's compact
    // records into repair_ledger as the view renders them.
    let db = edge_cases();
    let coupons = |db: &TestDb| {
        db.scalar_i64("SELECT hashtext(string_agg(x::text, ',' ORDER BY coupon_id))::bigint FROM issued_coupons x")
    };
    let original = coupons(&db);
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let log_before = db.run(&["--format", "csv", "repair", "log", "1"]);
    assert_eq!(log_before.code, 0, "{}", log_before.both());
    let mut c = db.client();
    let copied = c
        .execute(
            "INSERT INTO pgmend.repair_ledger (ledger_id, run_id, target_table, row_key, action, before, after, reason, at)
             SELECT ledger_id, run_id, target_table, row_key, action, before, after, reason, at
               FROM pgmend.ledger_records WHERE run_id = 1
              ORDER BY ledger_id LIMIT (SELECT count(*) / 2 FROM pgmend.ledger_compact WHERE run_id = 1)",
            &[],
        )
        .unwrap();
    assert!(copied >= 2, "{copied} records copied");
    let deleted = c
        .execute(
            "DELETE FROM pgmend.ledger_compact c USING pgmend.repair_ledger f
              WHERE c.run_id = 1 AND f.run_id = 1 AND f.ledger_id = c.ledger_id",
            &[],
        )
        .unwrap();
    assert_eq!(deleted, copied);
    assert!(db.scalar_i64("SELECT count(*) FROM pgmend.ledger_compact WHERE run_id = 1") >= 2);
    let log_after = db.run(&["--format", "csv", "repair", "log", "1"]);
    assert_eq!(log_after.code, 0, "{}", log_after.both());
    assert_eq!(
        log_after.stdout, log_before.stdout,
        "the same log, record for record"
    );

    let r = db.run(&["repair", "undo", "1", "--yes", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["restored"], 6);
    assert_eq!(coupons(&db), original, "every coupon is back as it was");
}

#[test]
fn a_coupon_redeemed_after_planning_is_the_one_kept() {
    let db = edge_cases();
    let r = db.run(&["repair", "plan", "void-duplicate-coupons", "--all"]);
    assert!(
        r.stdout
            .contains("coupon_id = 00000000-0000-0000-0000-0000000000d3"),
        "planned to void d3: {}",
        r.stdout
    );
    // Between the plan and the batch, the member redeems the later twin.
    db.client().batch_execute("UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id = '00000000-0000-0000-0000-0000000000d3'").unwrap();
    assert_eq!(
        db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"])
            .code,
        0
    );
    let state = |id: &str| -> (bool, bool) {
        let row = db
            .client()
            .query_one("SELECT legacy_duplicate, voided_at IS NOT NULL FROM issued_coupons WHERE coupon_id = $1::text::uuid", &[&id])
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        state("00000000-0000-0000-0000-0000000000d3"),
        (false, false),
        "the redeemed one is kept"
    );
    assert_eq!(
        state("00000000-0000-0000-0000-0000000000d2"),
        (true, true),
        "its unredeemed twin is voided"
    );
}

#[test]
fn a_coupon_redeemed_while_its_batch_waits_for_the_lock_is_the_one_kept() {
    let db = edge_cases();
    // The member redeems the later twin, and the application touches the earlier one, in a
    // transaction that commits while the batch waits for their locks: the batch must rank
    // the redeemed version it then locks, not the unredeemed one of its snapshot, and void
    // the earlier twin's new version (which its snapshot does not see).
    let (r, took, _) = common::run_while_held(
        &db,
        "UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id = '00000000-0000-0000-0000-0000000000d3';
         UPDATE issued_coupons SET amount_yen = amount_yen WHERE coupon_id = '00000000-0000-0000-0000-0000000000d2'",
        std::time::Duration::from_millis(1500),
        "SELECT 1",
        &[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--lock-timeout",
            "30s",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        took >= std::time::Duration::from_millis(1000),
        "the batch waited for the redemption to commit: {took:?}"
    );
    let state = |id: &str| -> (bool, bool, bool) {
        let row = db
            .client()
            .query_one("SELECT legacy_duplicate, voided_at IS NOT NULL, redeemed_at IS NOT NULL FROM issued_coupons WHERE coupon_id = $1::text::uuid", &[&id])
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        state("00000000-0000-0000-0000-0000000000d3"),
        (false, false, true),
        "the coupon redeemed during the wait is kept"
    );
    assert_eq!(
        state("00000000-0000-0000-0000-0000000000d2"),
        (true, true, false),
        "its unredeemed twin is voided"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.ledger_records
              WHERE row_key->>'coupon_id' = '00000000-0000-0000-0000-0000000000d2'
                AND reason LIKE '%00000000-0000-0000-0000-0000000000d3 is kept'"
        ),
        1,
        "the ledger names the redeemed coupon as the one kept"
    );
}

#[test]
fn undo_restores_exactly_what_a_run_changed_and_refuses_what_it_cannot() {
    let db = edge_cases();
    let before = checksum_outside_pgmend(&db);
    let coupons = |db: &TestDb| {
        db.scalar_i64("SELECT hashtext(string_agg(x::text, ',' ORDER BY coupon_id))::bigint FROM issued_coupons x")
    };
    let original = coupons(&db);
    assert_eq!(
        db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"])
            .code,
        0
    );
    assert_ne!(coupons(&db), original);
    let r = db.run(&["repair", "undo", "1", "--yes", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(coupons(&db), original, "every coupon is back as it was");
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["restored"], 6);
    assert_eq!(
        checksum_outside_pgmend(&db),
        before,
        "the run and its undo leave every table outside pgmend's records as it was"
    );
    assert_eq!(
        db.run(&["repair", "undo", "1", "--yes"]).code,
        1,
        "already undone"
    );

    // A voided coupon redeemed afterwards (the old cart ignores voided_at) cannot be undone.
    assert_eq!(
        db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"])
            .code,
        0
    );
    db.client().batch_execute("UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id = '00000000-0000-0000-0000-0000000000a3'").unwrap();
    let after = coupons(&db);
    let r = db.run(&["repair", "undo", "3", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("0000000000a3") && r.stderr.contains("changed since the run"),
        "{}",
        r.stderr
    );
    assert_eq!(coupons(&db), after, "a refused undo changes nothing");

    // Once the unique index exists, restoring a second live coupon per member is refused.
    db.client().batch_execute("UPDATE issued_coupons SET redeemed_at = NULL WHERE coupon_id = '00000000-0000-0000-0000-0000000000a3'").unwrap();
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "4"]).code,
        0
    );
    let r = db.run(&["repair", "undo", "3", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stderr.contains("unique index rejects"), "{}", r.stderr);
}

#[test]
fn undo_after_the_unique_index_refuses_exactly_the_rows_that_would_make_a_group_two_live_rows() {
    // After the whole release, undoing the void would give most groups a second live coupon;
    // the refusal must name exactly those rows, counted group by group: the group's live rows
    // now plus the rows the undo would make live again. Expected figures come from the coupons,
    // not from the ledger.
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let mut c = db.client();
    // One group with two marked rows and one with one loses its live row (marked by hand):
    // the first still conflicts (two rows made live), the second no longer does.
    c.batch_execute(
        "CREATE TABLE by_hand AS SELECT coupon_id FROM issued_coupons WHERE false;
         WITH marked AS (
         UPDATE issued_coupons SET legacy_duplicate = true
          WHERE NOT legacy_duplicate AND (campaign_id, member_id) IN (
                (SELECT campaign_id, member_id FROM issued_coupons GROUP BY 1, 2
                  HAVING count(*) FILTER (WHERE legacy_duplicate) = 2 ORDER BY 1, 2 LIMIT 1)
                UNION ALL
                (SELECT campaign_id, member_id FROM issued_coupons GROUP BY 1, 2
                  HAVING count(*) FILTER (WHERE legacy_duplicate) = 1 ORDER BY 1, 2 LIMIT 1))
          RETURNING coupon_id)
         INSERT INTO by_hand SELECT coupon_id FROM marked;",
    )
    .unwrap();
    assert_eq!(db.scalar_i64("SELECT count(*) FROM by_hand"), 2);
    // Rows the undo would make live: the marked ones the run marked (not those marked by hand).
    let expected = db.scalar_i64(
        "SELECT coalesce(sum(restored), 0)::int8 FROM (
           SELECT count(*) FILTER (WHERE legacy_duplicate AND coupon_id NOT IN (SELECT coupon_id FROM by_hand)) AS restored,
                  count(*) FILTER (WHERE NOT legacy_duplicate) AS live
             FROM issued_coupons GROUP BY campaign_id, member_id) g
          WHERE live + restored > 1",
    );
    let records = db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records WHERE run_id = 1");
    assert!(records > 1000, "{records} records");
    assert!(
        expected > 0 && expected < records,
        "{expected} of {records}"
    );
    let coupons = |db: &TestDb| {
        db.scalar_i64("SELECT hashtext(string_agg(x::text, ',' ORDER BY coupon_id))::bigint FROM issued_coupons x")
    };
    let before = coupons(&db);
    let r = db.run(&["repair", "undo", "1", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    let counted: i64 = r
        .stderr
        .split(" rows cannot be restored")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .map(|n| n.replace(',', ""))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {}", r.stderr));
    assert_eq!(counted, expected, "{}", r.stderr);
    assert!(r.stderr.contains("unique index rejects"), "{}", r.stderr);
    assert_eq!(coupons(&db), before, "a refused undo changes nothing");
}

#[test]
fn an_undo_stopped_part_way_resumes_where_it_stopped() {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    let coupons = |db: &TestDb| {
        db.scalar_i64("SELECT hashtext(string_agg(x::text, ',' ORDER BY coupon_id))::bigint FROM issued_coupons x")
    };
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "2"]).code,
        0
    );
    let original = coupons(&db);
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let run_id = db.scalar_i64("SELECT max(run_id) FROM pgmend.repair_runs");
    let changed = db.scalar_i64(&format!(
        "SELECT count(*) FROM pgmend.ledger_records WHERE run_id = {run_id}"
    ));
    assert!(
        changed > 1000,
        "more than one undo batch (1,000 records): {changed}"
    );

    // The application holds a coupon of the undo's second batch: the undo restores the
    // first batch, then runs out of its lock budget and stops (exit 1).
    let mut app = db.client();
    let mut tx = app.transaction().unwrap();
    tx.batch_execute(&format!(
        "SELECT 1 FROM issued_coupons WHERE coupon_id = (SELECT (row_key->>'coupon_id')::uuid FROM pgmend.ledger_records
           WHERE run_id = {run_id} ORDER BY ledger_id OFFSET 1000 LIMIT 1) FOR UPDATE"
    ))
    .unwrap();
    let id = run_id.to_string();
    let r = db.run(&["repair", "undo", &id, "--yes", "--lock-retry-for", "2s"]);
    assert_eq!(r.code, 1, "{}", r.both());
    tx.rollback().unwrap();
    let undo_run = db.scalar_i64(&format!(
        "SELECT run_id FROM pgmend.repair_runs WHERE undoes_run = {run_id} AND state = 'running'"
    ));
    let restored_first = db.scalar_i64(&format!(
        "SELECT count(*) FROM pgmend.ledger_records WHERE run_id = {undo_run}"
    ));
    assert_eq!(
        restored_first, 1000,
        "the first batch committed, the second did not"
    );

    let r = db.run(&["repair", "undo", &id, "--yes", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stderr.contains("resuming undo run"), "{}", r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["undo_run"], undo_run);
    assert_eq!(
        doc["restored"].as_i64(),
        Some(changed),
        "counted across both attempts"
    );
    assert_eq!(coupons(&db), original, "every coupon is back as it was");
    // One restore record per changed row, none twice.
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(DISTINCT row_key) FROM pgmend.ledger_records WHERE run_id = {undo_run}"
        )),
        changed
    );
    assert_eq!(
        db.run(&["repair", "undo", &id, "--yes"]).code,
        1,
        "already undone"
    );
}

#[test]
fn the_counter_rebuild_is_exact_where_the_naive_update_loses_a_write() {
    // The interleaving is forced: an application transaction has counted a new coupon and
    // holds the counter row; the rebuild starts; then the application commits.
    for naive in [true, false] {
        let db = edge_cases();
        assert_eq!(db.run(&["apply", "--yes"]).code, 0);
        // The counter has drifted, so the rebuild has something to write.
        db.client().batch_execute("UPDATE campaign_budgets SET issued_yen = issued_yen + 500 WHERE campaign_id = 'C-BIG'").unwrap();
        let mut app = db.client();
        let mut tx = app.transaction().unwrap();
        tx.batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'C-BIG', 'new', '2026-10', 1000);
             UPDATE campaign_budgets SET issued_yen = issued_yen + 1000 WHERE campaign_id = 'C-BIG';",
        )
        .unwrap();
        let rebuild = if naive {
            let mut c = db.client();
            thread::spawn(move || {
                c.batch_execute(
                    "SET application_name = 'naive';
                     UPDATE campaign_budgets SET issued_yen = (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons
                                                                 WHERE campaign_id = 'C-BIG' AND voided_at IS NULL)
                      WHERE campaign_id = 'C-BIG'",
                )
                .unwrap();
                0
            })
        } else {
            let mut cmd = db.pgmend();
            cmd.args(["repair", "apply", "rebuild-campaign-budgets", "--yes"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            thread::spawn(move || cmd.status().unwrap().code().unwrap())
        };
        let who = if naive { "naive" } else { "pgmend" };
        let started = Instant::now();
        let mut watch = db.client();
        while !watch
            .query_one("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock')", &[&who])
            .unwrap()
            .get::<_, bool>(0)
        {
            assert!(started.elapsed() < Duration::from_secs(30), "{who} never waited for the counter row");
            thread::sleep(Duration::from_millis(20));
        }
        tx.commit().unwrap();
        assert_eq!(rebuild.join().unwrap(), 0);
        let (counter, truth) = {
            let row = db
                .client()
                .query_one(
                    "SELECT (SELECT issued_yen FROM campaign_budgets WHERE campaign_id = 'C-BIG')::bigint,
                            (SELECT sum(amount_yen) FROM issued_coupons WHERE campaign_id = 'C-BIG' AND voided_at IS NULL)::bigint",
                    &[],
                )
                .unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        };
        if naive {
            assert_eq!(
                counter,
                truth - 1000,
                "the naive form writes the sum it saw before it waited"
            );
        } else {
            assert_eq!(counter, truth, "lock first, then sum: exact");
        }
    }
}

#[test]
fn counters_stay_exact_while_the_new_application_issues_coupons() {
    let db = edge_cases();
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    // The corrected issuance of seed 000: one transaction, the member-month row first, the
    // coupon by upsert against the partial unique index, the budget row last.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = in_step_writers(&db, &stop);
    thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        for name in ["rebuild-campaign-budgets", "rebuild-member-monthly-usage"] {
            let r = db.run(&["repair", "apply", name, "--yes", "--batch-target", "5ms"]);
            assert_eq!(r.code, 0, "{}", r.both());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let issued: i32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(issued > 20, "the writers ran ({issued})");
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM campaign_budgets b WHERE issued_yen <> (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                WHERE i.campaign_id = b.campaign_id AND voided_at IS NULL)"
        ),
        0
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM member_monthly_usage u WHERE used_yen <> (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                WHERE i.member_id = u.member_id AND i.month = u.month AND voided_at IS NULL)"
        ),
        0
    );
}

/// The new application, stepping while `repair apply` runs after the gate: four writers,
/// each coupon with its counters in one transaction (seed 000's corrected issuance).
fn in_step_writers(
    db: &TestDb,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<thread::JoinHandle<i32>> {
    (0..4)
        .map(|w| {
            let mut c = db.client();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    let member = format!("w{w}-{n}");
                    let mut tx = c.transaction().unwrap();
                    tx.execute("INSERT INTO member_monthly_usage VALUES ($1, '2026-10', 0) ON CONFLICT DO NOTHING", &[&member]).unwrap();
                    tx.execute("SELECT 1 FROM member_monthly_usage WHERE member_id = $1 AND month = '2026-10' FOR UPDATE", &[&member]).unwrap();
                    let inserted = tx
                        .execute(
                            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
                             VALUES (gen_random_uuid(), 'C-BIG', $1, '2026-10', 1000)
                             ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate DO NOTHING",
                            &[&member],
                        )
                        .unwrap();
                    if inserted == 1 {
                        tx.execute("UPDATE member_monthly_usage SET used_yen = used_yen + 1000 WHERE member_id = $1 AND month = '2026-10'", &[&member]).unwrap();
                        tx.execute("UPDATE campaign_budgets SET issued_yen = issued_yen + 1000 WHERE campaign_id = 'C-BIG'", &[]).unwrap();
                    }
                    tx.commit().unwrap();
                }
                n
            })
        })
        .collect()
}

fn counters_wrong(db: &TestDb) -> (i64, i64) {
    (
        db.scalar_i64(
            "SELECT count(*) FROM campaign_budgets b WHERE issued_yen <> (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                WHERE i.campaign_id = b.campaign_id AND voided_at IS NULL)",
        ),
        db.scalar_i64(
            "SELECT count(*) FROM member_monthly_usage u WHERE used_yen <> (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                WHERE i.member_id = u.member_id AND i.month = u.month AND voided_at IS NULL)",
        ),
    )
}

#[test]
fn after_the_gate_the_drift_correction_is_exact_while_the_new_application_writes() {
    let db = edge_cases();
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    // Drift from before the deploy (the old cart's lost updates), then the new application.
    db.client()
        .batch_execute(
            "UPDATE campaign_budgets SET budget_yen = 100000000, issued_yen = issued_yen + 3000 WHERE campaign_id = 'C-BIG';
             UPDATE member_monthly_usage SET used_yen = used_yen + 1000;",
        )
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = in_step_writers(&db, &stop);
    thread::sleep(Duration::from_millis(200));
    for _ in 0..2 {
        for name in ["rebuild-campaign-budgets", "rebuild-member-monthly-usage"] {
            let r = db.run(&["repair", "apply", name, "--yes", "--batch-target", "5ms"]);
            assert_eq!(r.code, 0, "{}", r.both());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let issued: i32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(issued > 20, "the writers ran ({issued})");
    assert_eq!(counters_wrong(&db), (0, 0));
    // One ledger record per row a run changed, and each says what it was and became.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT run_id, row_key FROM pgmend.ledger_records GROUP BY 1, 2 HAVING count(*) > 1) d"
        ),
        0
    );
    assert_eq!(db.run(&["verify"]).code, 0);
}

/// A writer out of step: every change pgmend makes to a campaign's counter is followed by
/// a coupon the counter never hears of, as the old issuing code would add one.
fn out_of_step_writer(db: &TestDb) {
    db.client()
        .batch_execute(
            "CREATE FUNCTION old_cart() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
               VALUES (gen_random_uuid(), NEW.campaign_id, gen_random_uuid()::text, '2026-10', 1000);
               RETURN NULL;
             END $$;
             CREATE TRIGGER old_cart AFTER UPDATE ON campaign_budgets FOR EACH ROW
               WHEN (pg_trigger_depth() = 0 AND current_setting('application_name') = 'pgmend')
               EXECUTE FUNCTION old_cart();
             UPDATE campaign_budgets SET issued_yen = issued_yen + 700 WHERE campaign_id = 'C-BIG';",
        )
        .unwrap();
}

#[test]
fn after_the_gate_an_out_of_step_writer_ends_the_counter_pass_with_exit_1_naming_the_keys() {
    let db = edge_cases();
    assert_eq!(db.run(&CONFIRM).code, 0);
    out_of_step_writer(&db);
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("still differ from their source") && r.stderr.contains("C-BIG"),
        "{}",
        r.stderr
    );
    assert!(!r.stdout.contains("note:"), "{}", r.stdout);
    // It corrected them twice more before it gave up, and kept one record per row.
    assert!(
        r.stderr
            .contains("correcting 1 of them again (pass 2 of 2)")
            && r.stderr
                .contains("correcting 1 of them again (pass 3 of 2)"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT run_id, row_key FROM pgmend.ledger_records GROUP BY 1, 2 HAVING count(*) > 1) d"
        ),
        0
    );
    // The release's migration after the gate refuses too: undo V5 in the history and rerun.
    db.client()
        .batch_execute(
            "DROP TRIGGER old_cart ON campaign_budgets;
             UPDATE campaign_budgets SET issued_yen = issued_yen + 500 WHERE campaign_id = 'C-BIG';
             ALTER TABLE campaign_budgets DROP CONSTRAINT issued_within_budget;
             DELETE FROM refinery_schema_history WHERE version = 5;",
        )
        .unwrap();
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("counters differ from their source before a migration after the deploy gate")
            && r.stderr
                .contains("campaign_budgets (rebuild-campaign-budgets), for example C-BIG")
            && r.stderr
                .contains("member_monthly_usage (rebuild-member-monthly-usage), for example"),
        "{}",
        r.stderr
    );
    assert!(
        db.history().iter().all(|(v, _)| *v != 5),
        "V5 was not applied"
    );
}

/// Inside the release, the counter step after the gate that a writer keeps out of step stops
/// the release itself (step 9, exit 1 with its run's message), before step 10 starts. Without
/// that stop the walk went on, and only V5's comparison stopped it, a step later and with
/// another message: a release whose V5 was done, or with the steps in another order, would have
/// ended complete (issue 41).
#[test]
fn after_the_gate_an_out_of_step_writer_stops_the_release_at_its_counter_step_before_the_next_starts(
) {
    let db = edge_cases();
    assert_eq!(db.run(&["apply", "--yes"]).code, 0, "stops at the gate");
    out_of_step_writer(&db);
    let runs_of = |repair: &str| {
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pgmend.repair_runs WHERE repair = '{repair}'"
        ))
    };
    let member_runs = runs_of("rebuild-member-monthly-usage");
    let budget_runs = runs_of("rebuild-campaign-budgets");
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 1, "{}", r.both());
    // The server's record: the gate is confirmed, step 9 ran and is not recorded as done,
    // and nothing of step 10 or 11 ran.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates WHERE gate = 'deploy-new-application'"),
        1
    );
    assert_eq!(
        runs_of("rebuild-campaign-budgets"),
        budget_runs + 1,
        "step 9 ran once"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.release_steps WHERE step >= 9"),
        0,
        "no step from 9 on is recorded as done:\n{}",
        r.stderr
    );
    assert_eq!(
        runs_of("rebuild-member-monthly-usage"),
        member_runs,
        "step 10 did not start:\n{}",
        r.stderr
    );
    assert!(
        db.history().iter().all(|(v, _)| *v != 5),
        "V5 was not applied"
    );
    // The message is step 9's own: its run, its repair and the key.
    assert!(
        r.stderr.contains("== step 9: repair rebuild-campaign-budgets")
            && r.stderr.contains(
                "of rebuild-campaign-budgets finished, but 1 counter still differ from their source"
            )
            && r.stderr.contains("C-BIG")
            && !r.stderr.contains("== step 10")
            && !r
                .stderr
                .contains("counters differ from their source before a migration"),
        "{}",
        r.stderr
    );
}

/// The same with V5 applied early (`migrate apply`): no migration after the counter steps is
/// left to compare the counters, so only the counter step's own stop keeps the release from
/// ending complete with a counter a writer keeps moving.
#[test]
fn with_v5_already_applied_an_out_of_step_writer_after_the_gate_still_ends_the_release_with_exit_1()
{
    let db = edge_cases();
    assert_eq!(db.run(&["apply", "--yes"]).code, 0, "stops at the gate");
    let r = db.run(&["migrate", "apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(db.history().iter().any(|(v, _)| *v == 5));
    out_of_step_writer(&db);
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 1, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.release_steps WHERE step >= 9"),
        0,
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(
            "of rebuild-campaign-budgets finished, but 1 counter still differ from their source"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn before_the_gate_an_out_of_step_writer_is_expected_drift_and_a_note() {
    let db = edge_cases();
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    out_of_step_writer(&db);
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout
            .contains("the rebuild after the deploy gate catches them"),
        "{}",
        r.stdout
    );
}

#[test]
fn inside_apply_a_run_whose_question_the_next_step_asks_is_not_counted_twice() {
    // The void right before V4's census, and the counters' first passes (corrected again
    // after the gate), end without their own count: `left_over` is null. The runs after the
    // gate are counted, as their count decides the step.
    let db = edge_cases();
    let r = db.run(&[
        "apply",
        "--yes",
        "--confirm",
        "deploy-new-application",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let left_over: Vec<(String, serde_json::Value)> = out["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.get("run").is_some())
        .map(|s| {
            (
                s["label"].as_str().unwrap().to_string(),
                s["run"]["left_over"].clone(),
            )
        })
        .collect();
    let expected: Vec<(String, serde_json::Value)> = [
        ("repair void-duplicate-coupons", serde_json::Value::Null),
        ("repair rebuild-campaign-budgets", serde_json::Value::Null),
        (
            "repair rebuild-member-monthly-usage",
            serde_json::Value::Null,
        ),
        ("repair rebuild-campaign-budgets", 0.into()),
        ("repair rebuild-member-monthly-usage", 0.into()),
    ]
    .into_iter()
    .map(|(l, v)| (l.to_string(), v))
    .collect();
    assert_eq!(left_over, expected);
    assert_eq!(db.run(&["verify"]).code, 0);
}

/// Member-months whose counter (a missing row counts as 0) differs from their coupons.
const MEMBER_MONTHS_OFF: &str = "SELECT count(*) FROM member_monthly_usage u
   FULL JOIN (SELECT member_id, month, sum(amount_yen) AS yen FROM issued_coupons
               WHERE voided_at IS NULL GROUP BY 1, 2) s USING (member_id, month)
  WHERE coalesce(u.used_yen, 0) <> coalesce(s.yen, 0)";

#[test]
fn before_v5_a_counter_that_drifted_after_its_rebuild_is_caught_though_the_last_one_is_not_read_again(
) {
    // After the gate, the member-months' rebuild (step 10) corrects a row, and a writer out of
    // step changes a campaign's counter as it does. Step 10 ended with the member-months equal
    // to their source, so V5's comparison does not read them again; it must still read the
    // campaigns, which step 9 left exact before the writer moved them.
    let db = edge_cases();
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    db.client()
        .batch_execute(
            "UPDATE member_monthly_usage SET used_yen = used_yen + 1
              WHERE (member_id, month) = (SELECT member_id, month FROM member_monthly_usage ORDER BY 1, 2 LIMIT 1);
             CREATE FUNCTION out_of_step() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               UPDATE campaign_budgets SET issued_yen = issued_yen + 300 WHERE campaign_id = 'C-BIG';
               RETURN NULL;
             END $$;
             CREATE TRIGGER out_of_step AFTER UPDATE ON member_monthly_usage FOR EACH ROW
               WHEN (pg_trigger_depth() = 0 AND current_setting('application_name') = 'pgmend')
               EXECUTE FUNCTION out_of_step();",
        )
        .unwrap();
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("counters differ from their source before a migration after the deploy gate")
            && r.stderr
                .contains("campaign_budgets (rebuild-campaign-budgets), for example C-BIG")
            && !r
                .stderr
                .contains("member_monthly_usage (rebuild-member-monthly-usage)"),
        "{}",
        r.stderr
    );
    assert!(
        db.history().iter().all(|(v, _)| *v != 5),
        "V5 was not applied"
    );
    assert_eq!(
        db.scalar_i64(MEMBER_MONTHS_OFF),
        0,
        "the member-months the check did not read again are equal to their source"
    );
}

/// Runs `repair apply REPAIR` (a counter's first pass) while another session holds `created`
/// (the new application creating a counter row with a new coupon) for 1.5 s; expects exit 0
/// after the batch waited for that session.
fn first_pass_while_the_application_creates(db: &TestDb, created: &str, repair: &str) {
    let (r, took, _) = common::run_while_held(
        db,
        created,
        std::time::Duration::from_millis(1500),
        "SELECT 1",
        &["repair", "apply", repair, "--yes", "--lock-timeout", "30s"],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        took >= std::time::Duration::from_millis(1000),
        "the batch waited for the other session's row: {took:?}"
    );
}

#[test]
fn a_counter_row_created_while_the_first_pass_waits_is_merged_not_an_error() {
    // The first pass inserts the keys its snapshot saw without a counter row plainly. The new
    // application, deployed early, creates member d's row for 2026-09 with a new coupon in
    // one transaction that commits while the batch waits for that key: the plain insert
    // fails on the unique key, and the batch runs again, merging into the row.
    let db = edge_cases();
    first_pass_while_the_application_creates(
        &db,
        "INSERT INTO member_monthly_usage VALUES ('d', '2026-09', 1000);
         INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
         VALUES ('00000000-0000-0000-0000-0000000000f7', 'C-BIG', 'd', '2026-09', 1000, '2026-09-21 09:00+09')",
        "rebuild-member-monthly-usage",
    );
    assert_eq!(
        db.scalar_i64("SELECT used_yen::bigint FROM member_monthly_usage WHERE (member_id, month) = ('d', '2026-09')"),
        2000,
        "coupon d4 and the new one"
    );
    assert_eq!(
        db.scalar_i64(MEMBER_MONTHS_OFF),
        0,
        "every member-month equals its coupons"
    );
}

#[test]
fn a_counter_row_created_after_the_staged_sums_were_read_is_merged_not_an_error() {
    // The campaign budgets' one batch over every key reads its sums apart first, into a
    // temporary table (`db::staged`: a parallel plan), then inserts the keys without a row
    // plainly. The new application creates C-ON's row with a new coupon in one transaction
    // that commits while that insert waits for the key: the plain insert fails on the unique
    // key, and the batch runs again from its savepoint with the sums already read, adding them
    // to the application's row.
    let db = edge_cases();
    db.client()
        .batch_execute(
            "CREATE SCHEMA probe;
             CREATE TABLE probe.staged (n int);
             CREATE FUNCTION probe.seen() RETURNS event_trigger LANGUAGE plpgsql
               AS $$ BEGIN INSERT INTO probe.staged VALUES (1); END $$;
             CREATE EVENT TRIGGER probe_staged ON ddl_command_end WHEN TAG IN ('CREATE TABLE AS')
               EXECUTE FUNCTION probe.seen();",
        )
        .unwrap();
    first_pass_while_the_application_creates(
        &db,
        "INSERT INTO campaign_budgets VALUES ('C-ON', 1000, 3000, 1000);
         INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
         VALUES ('00000000-0000-0000-0000-0000000000f8', 'C-ON', 'e', '2026-09', 1000, '2026-09-21 09:00+09')",
        "rebuild-campaign-budgets",
    );
    assert!(
        db.scalar_i64("SELECT count(*) FROM probe.staged") >= 1,
        "the sums were read apart"
    );
    assert_eq!(
        db.scalar_i64("SELECT issued_yen::bigint FROM campaign_budgets WHERE campaign_id = 'C-ON'"),
        5000,
        "C-ON's four coupons and the new one"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM campaigns c LEFT JOIN campaign_budgets b USING (campaign_id)
              WHERE b.issued_yen IS DISTINCT FROM (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                                                   WHERE i.campaign_id = c.campaign_id AND i.voided_at IS NULL)"
        ),
        0,
        "every campaign's budget equals its coupons"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.ledger_records
              WHERE row_key ->> 'campaign_id' = 'C-ON' AND action = 'update'
                AND reason LIKE 'the key had no counter row when its drift was read%' AND after ->> 'issued_yen' = '5000'"
        ),
        1,
        "the merge is recorded as an addition to the application's row"
    );
}

#[test]
fn over_budget_and_out_of_range_counters_are_skipped_reported_and_exit_1() {
    // Before the gate a counter run walks ranges of keys, each batch one statement on the
    // server (`batch_range`); after it, the keys that differ, with the drift read first.
    // Both must skip and report the same keys.
    for gate in [false, true] {
        let db = edge_cases();
        let release: &[&str] = if gate { &CONFIRM } else { &["apply", "--yes"] };
        assert_eq!(db.run(release).code, 0);
        if !gate {
            // V5 adds the budget check after the gate; before it, the same check by hand.
            db.client()
                .batch_execute(
                    "ALTER TABLE campaign_budgets ADD CONSTRAINT issued_within_budget
                       CHECK (issued_yen BETWEEN 0 AND budget_yen) NOT VALID",
                )
                .unwrap();
        }
        skipped_and_reported(&db);
    }
}

fn skipped_and_reported(db: &TestDb) {
    // The old cart issued one more coupon on the campaign that sat exactly on budget.
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'C-ON', 'late', '2026-10', 1000);
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'C-BIG', 'late', '2026-10', 1000);",
        )
        .unwrap();
    let r = db.run(&["repair", "apply", "rebuild-campaign-budgets", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("C-ON") && r.stderr.contains("issued_within_budget"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT issued_yen::bigint FROM campaign_budgets WHERE campaign_id = 'C-ON'"),
        3000
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT issued_yen::bigint FROM campaign_budgets WHERE campaign_id = 'C-BIG'"
        ),
        2000,
        "the others are written"
    );

    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES
               (gen_random_uuid(), 'C-NONE', 'whale', '2026-11', 2000000000), (gen_random_uuid(), 'C-BIG', 'whale', '2026-11', 2000000000);",
        )
        .unwrap();
    let r = db.run(&["repair", "apply", "rebuild-member-monthly-usage", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr
            .contains("4000000000 does not fit member_monthly_usage.used_yen"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM member_monthly_usage WHERE member_id = 'whale'"),
        1,
        "created at 0"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT used_yen::bigint FROM member_monthly_usage WHERE member_id = 'whale'"
        ),
        0
    );
}

#[test]
fn a_repair_for_another_schema_needs_only_a_definition_file() {
    let db = fresh_db();
    db.client()
        .batch_execute(
            "CREATE TABLE point_grants (grant_id bigint PRIMARY KEY, member_id integer NOT NULL, reason text NOT NULL,
                                        points integer NOT NULL, granted_at timestamptz NOT NULL, revoked_at timestamptz,
                                        superseded boolean NOT NULL DEFAULT false, spent_at timestamptz);
             CREATE TABLE member_points (member_id integer PRIMARY KEY, points integer NOT NULL DEFAULT 0);
             INSERT INTO point_grants VALUES (1, 7, 'signup', 100, '2026-01-01', NULL, false, NULL),
                                             (2, 7, 'signup', 100, '2026-01-02', NULL, false, NULL),
                                             (3, 7, 'review', 50, '2026-01-03', NULL, false, NULL),
                                             (4, 8, 'signup', 100, '2026-01-01', NULL, false, '2026-02-01'),
                                             (5, 8, 'signup', 100, '2026-01-01', NULL, false, NULL);
             INSERT INTO member_points VALUES (7, 999), (9, 10);",
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("revoke-duplicate-grants.toml"),
        "kind = \"void_duplicates\"\ndescription = \"one signup bonus per member\"\ntable = \"point_grants\"\nrow_key = \"grant_id\"\n\
         group_by = [\"member_id\", \"reason\"]\nrank_by = [{ column = \"spent_at\", order = \"not_null_first\" }, { column = \"granted_at\" }, { column = \"grant_id\" }]\n\
         mark = \"superseded\"\nvoid = \"revoked_at\"\nkeep_when_not_null = \"spent_at\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("rebuild-member-points.toml"),
        "kind = \"rebuild_counter\"\ndescription = \"points per member\"\ncounter_table = \"member_points\"\nkey = [\"member_id\"]\n\
         counter = \"points\"\nsource_table = \"point_grants\"\naggregate = \"sum\"\nvalue = \"points\"\nsource_filter_null = \"revoked_at\"\n\
         keys_from = \"source\"\nwhen_no_source = \"zero\"\n",
    )
    .unwrap();
    let d = dir_arg(dir.path());
    for name in ["revoke-duplicate-grants", "rebuild-member-points"] {
        let r = db.run(&["repair", "apply", name, "--yes", "--repairs-dir", &d]);
        assert_eq!(r.code, 0, "{}", r.both());
    }
    let revoked: Vec<i64> = db
        .client()
        .query(
            "SELECT grant_id FROM point_grants WHERE revoked_at IS NOT NULL ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        revoked,
        [2, 5],
        "the later signup of 7 and the unspent one of 8"
    );
    let points: Vec<(i32, i32)> = db
        .client()
        .query(
            "SELECT member_id, points FROM member_points ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(points, [(7, 150), (8, 100), (9, 0)]);
}

#[test]
fn killed_at_random_the_release_resumes_to_the_same_state_and_ledger() {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    remember_expected(&db);
    let seed = kill_campaign::seed_from_env().unwrap();
    eprintln!("kill seed {seed}; replay with PGMEND_KILL_SEED={seed}");
    let mut rng = kill_campaign::Rng::new(seed);
    // Eight kills at random moments, then a run left to finish: on a loaded machine a run may
    // never get through in the random window, and the point is the resume. The window is
    // short: a killed pgmend's lease ends with its process, so the next run starts at once
    // (it used to wait about a second for the killed session's lock), and with up to 430 ms a
    // run could finish the release after two kills.
    let kill_campaign::Killed { kills, completed } = kill_campaign::kill_then_finish(
        || {
            let mut c = db.pgmend();
            c.args([
                "apply",
                "--yes",
                "--confirm",
                "deploy-new-application",
                "--batch-target",
                "2ms",
                "--runner-wait",
                "30s",
            ]);
            c
        },
        &mut rng,
        60,
        8,
        (30, 230),
    )
    .unwrap_or_else(|e| panic!("seed {seed}: {e:#}"));
    assert!(
        kills >= 3,
        "the run was interrupted only {kills} times (seed {seed}; replay with PGMEND_KILL_SEED={seed})"
    );
    assert!(completed, "no run finished");
    assert_eq!(differences(&db), Vec::<String>::new());
    assert_eq!(db.history().len(), 5);
    assert_eq!(db.invalid_indexes(), 0);
    // One ledger record per changed coupon, across however many runs it took.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id) WHERE r.repair = 'void-duplicate-coupons'"
        ),
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate")
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) - count(DISTINCT row_key) FROM pgmend.ledger_records l JOIN pgmend.repair_runs r USING (run_id) WHERE r.repair = 'void-duplicate-coupons'"
        ),
        0
    );
    eprintln!("killed {kills} times");
}

#[test]
fn an_unfinished_run_under_another_definition_is_refused_and_can_be_abandoned() {
    let db = edge_cases();
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("repairs")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let d = dir_arg(dir.path());
    // An unfinished run, as a crash leaves it.
    assert_eq!(
        db.run(&[
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--repairs-dir",
            &d
        ])
        .code,
        0
    );
    db.client().batch_execute("UPDATE pgmend.repair_runs SET state = 'running', checkpoint = 1, finished_at = NULL WHERE run_id = 1").unwrap();
    let file = dir.path().join("void-duplicate-coupons.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("description = \"", "description = \"edited: "),
    )
    .unwrap();
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--repairs-dir",
        &d,
    ]);
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stderr.contains("run 1 of void-duplicate-coupons")
            && r.stderr.contains("pgmend repair abandon 1 --yes"),
        "{}",
        r.stderr
    );
    assert_eq!(db.run(&["repair", "abandon", "1", "--yes"]).code, 0);
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--repairs-dir",
        &d,
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
}

#[test]
fn rollback_restores_the_legacy_counters_from_the_coupons() {
    let db = edge_cases();
    assert_eq!(db.run(&CONFIRM).code, 0);
    // The old code runs again after the rollback and counts a coupon in campaigns only.
    let r = db.run(&[
        "repair",
        "apply",
        "restore-legacy-campaign-counters",
        "--yes",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen) VALUES (gen_random_uuid(), 'C-BIG', 'old', '2026-10', 1000);
             UPDATE campaigns SET issued_yen = issued_yen + 1000 WHERE campaign_id = 'C-BIG';",
        )
        .unwrap();
    let r = db.run(&[
        "repair",
        "apply",
        "restore-legacy-campaign-counters",
        "--yes",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM campaigns c WHERE issued_yen <> (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons i
                WHERE i.campaign_id = c.campaign_id AND voided_at IS NULL)"
        ),
        0,
        "every legacy counter equals its coupons, the old code's late coupon included"
    );
}

/// The edge cases with the void repair done and V3 applied, recorded as release steps 1 to 4:
/// the next step of `apply` is V4, the unique index.
fn released_up_to_the_void_step() -> TestDb {
    let db = edge_cases();
    assert_eq!(
        db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"])
            .code,
        0
    );
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    db.client()
        .batch_execute("INSERT INTO pgmend.release_steps (release, step, what, run_id) VALUES ('coupon-incident', 4, 'repair void-duplicate-coupons', 1)")
        .unwrap();
    db
}

#[test]
fn late_duplicates_before_the_unique_index_get_another_void_pass() {
    let db = released_up_to_the_void_step();
    // The old application then double-tapped again.
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
             VALUES ('00000000-0000-0000-0000-0000000000f1', 'C-BIG', 'a', '2026-10', 1000, '2026-10-03 09:00+09');",
        )
        .unwrap();
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains("running void-duplicate-coupons again"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE coupon_id = '00000000-0000-0000-0000-0000000000f1' AND legacy_duplicate AND voided_at IS NOT NULL"),
        1
    );
    assert!(db.exists("one_coupon_per_member"));
    assert_eq!(db.invalid_indexes(), 0);
}

#[test]
fn duplicates_that_keep_arriving_are_marked_by_the_guard_until_the_index_is_valid() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let db = fresh_db();
    db.voided_before_the_release_reaches_v4(2000);
    // The old application keeps double-tapping: a copy of a random live coupon, one after
    // the other, from before V4's census until after the index exists (which then refuses
    // them). The first is in before the release starts, so the census finds a duplicate.
    const DOUBLE_TAP: &str =
        "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
        SELECT gen_random_uuid(), campaign_id, member_id, month, amount_yen FROM issued_coupons
         WHERE NOT legacy_duplicate OFFSET floor(random() * 1000) LIMIT 1";
    db.client().batch_execute(DOUBLE_TAP).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let (stop, mut c) = (stop.clone(), db.client());
        thread::spawn(move || {
            let (mut inserted, mut refused) = (0, 0);
            while !stop.load(Ordering::SeqCst) {
                match c.batch_execute(DOUBLE_TAP) {
                    Ok(()) => inserted += 1,
                    Err(e) => {
                        assert_eq!(
                            e.code(),
                            Some(&postgres::error::SqlState::UNIQUE_VIOLATION),
                            "{e}"
                        );
                        refused += 1;
                    }
                }
                thread::sleep(Duration::from_millis(1));
            }
            (inserted, refused)
        })
    };
    let r = db.run(&["apply", "--yes"]);
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    let (inserted, refused) = stream.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr
            .contains("installed a guard trigger on issued_coupons")
            && r.stderr.contains("dropped the guard trigger"),
        "{}",
        r.stderr
    );
    assert!(inserted > 0 && refused > 0, "{inserted} {refused}");
    assert!(db.exists("one_coupon_per_member"));
    assert_eq!(db.invalid_indexes(), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgmend guard%'"),
        0,
        "the guard is gone once the index is valid"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                    GROUP BY campaign_id, member_id HAVING count(*) > 1) d"
        ),
        0
    );
    // The guard marked some double taps as they arrived, each with its ledger record; every
    // marked coupon, whoever marked it, has exactly one.
    let guarded = db.scalar_i64(
        "SELECT count(*) FROM pgmend.ledger_records l JOIN issued_coupons c ON c.coupon_id = (l.row_key->>'coupon_id')::uuid
          WHERE l.reason LIKE '%(pgmend guard)' AND c.legacy_duplicate AND c.voided_at IS NOT NULL
            AND (l.after->>'voided_at')::timestamptz = c.voided_at",
    );
    assert!(guarded > 0, "{}", r.stderr);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM issued_coupons c WHERE legacy_duplicate AND (
               SELECT count(*) FROM pgmend.ledger_records l
                WHERE l.target_table = 'issued_coupons' AND l.row_key = jsonb_build_object('coupon_id', c.coupon_id)) <> 1"
        ),
        0
    );
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(db.run(&["verify"]).code, 0);
}

#[test]
fn a_build_that_waits_too_long_stops_without_another_void_pass() {
    let db = released_up_to_the_void_step();
    let runs = db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs");
    // A writer's open transaction: CREATE INDEX CONCURRENTLY waits for it, past
    // --build-wait. That is no duplicate the void repair could clear.
    let mut other = db.client();
    let mut tx = other.transaction().unwrap();
    tx.batch_execute("LOCK TABLE issued_coupons IN ROW EXCLUSIVE MODE")
        .unwrap();
    let r = db.run(&["apply", "--yes", "--build-wait", "2s"]);
    tx.rollback().unwrap();
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(r.stderr.contains("--build-wait"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("running void-duplicate-coupons again"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs"),
        runs
    );
    // The cancelled build's INVALID index could not be dropped while the writer held on;
    // the rerun drops it and builds the index.
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(db.exists("one_coupon_per_member"));
    assert_eq!(db.invalid_indexes(), 0);
}

#[test]
fn ctrl_c_finishes_the_batch_stops_cleanly_and_the_rerun_resumes() {
    let db = fresh_db();
    db.make_legacy_baselined(4000);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    let stderr = interrupted_void_run(&db);
    assert!(
        stderr.contains("Resume it with: pgmend repair apply void-duplicate-coupons --yes"),
        "{stderr}"
    );
    let mut watch = db.client();
    let (state, checkpoint, targets): (String, i64, i64) = {
        let r = watch
            .query_one(
                "SELECT state, checkpoint, targets FROM pgmend.repair_runs WHERE run_id = 1",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(state, "running");
    assert!(
        checkpoint < targets,
        "stopped before the end ({checkpoint}/{targets})"
    );
    // Every committed batch is whole: the ledger holds exactly the rows changed so far.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.ledger_records WHERE run_id = 1"),
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate")
    );
    let r = db.run(&[
        "repair",
        "apply",
        "void-duplicate-coupons",
        "--yes",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["resumed"], true);
    assert_eq!(doc["run"]["processed"], doc["run"]["targets"]);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate GROUP BY campaign_id, member_id HAVING count(*) > 1) g"), 0);
}

#[test]
fn a_counter_table_without_a_unique_key_is_refused_before_any_change() {
    let db = fresh_db();
    db.client()
        .batch_execute(
            "CREATE TABLE grants (member_id integer NOT NULL, points integer NOT NULL);
             CREATE TABLE totals (member_id integer NOT NULL, points integer NOT NULL DEFAULT 0);
             INSERT INTO grants VALUES (7, 100), (7, 50);
             INSERT INTO totals VALUES (7, 1);",
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rebuild-totals.toml"),
        "kind = \"rebuild_counter\"\ndescription = \"points per member\"\ncounter_table = \"totals\"\nkey = [\"member_id\"]\n\
         counter = \"points\"\nsource_table = \"grants\"\naggregate = \"sum\"\nvalue = \"points\"\n\
         keys_from = \"source\"\nwhen_no_source = \"zero\"\n",
    )
    .unwrap();
    let d = dir_arg(dir.path());
    let r = db.run(&[
        "repair",
        "apply",
        "rebuild-totals",
        "--yes",
        "--repairs-dir",
        &d,
    ]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("counter_table totals has no unique index or primary key on exactly its key (member_id)"),
        "{}",
        r.stderr
    );
    assert!(!db.exists("pgmend.repair_runs"));
    assert_eq!(db.scalar_i64("SELECT points::bigint FROM totals"), 1);
}

/// Starts `repair apply void-duplicate-coupons` with tiny batches on `db` and stops it with
/// Ctrl-C once a batch has committed: the run is left `running` part of the way through.
/// Returns its stderr.
fn interrupted_void_run(db: &TestDb) -> String {
    let child = db
        .pgmend()
        .args([
            "repair",
            "apply",
            "void-duplicate-coupons",
            "--yes",
            "--batch-target",
            "1ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut watch = db.client();
    while !watch
        .query_one("SELECT coalesce((SELECT checkpoint > 0 FROM pgmend.repair_runs WHERE run_id = 1), false)", &[])
        .map(|r| r.get::<_, bool>(0))
        .unwrap_or(false)
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no batch committed"
        );
        thread::sleep(Duration::from_millis(10));
    }
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.repair_runs WHERE run_id = 1 AND state = 'running' AND checkpoint < targets"),
        1,
        "the run stopped part of the way"
    );
    stderr
}

/// Groups of (campaign, member) with more than one unmarked coupon.
const LIVE_DUPLICATES: &str =
    "SELECT count(*) FROM (SELECT 1 FROM issued_coupons WHERE NOT legacy_duplicate
                                 GROUP BY campaign_id, member_id HAVING count(*) > 1) d";

#[test]
fn a_void_run_in_ranges_voids_the_duplicates_that_arrive_ahead_of_its_checkpoint() {
    // A run walks the groups in ranges of member_id (V3's index), so a duplicate that the old
    // application adds to a group the run has not reached yet, or a new member's double tap,
    // is voided by the run itself; a run that froze its groups up front left them to the next
    // census.
    let db = fresh_db();
    db.make_legacy_baselined(4000);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    interrupted_void_run(&db);
    db.client()
        .batch_execute(
            "INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
             SELECT gen_random_uuid(), campaign_id, member_id, month, amount_yen, issued_at + interval '1 second'
               FROM issued_coupons WHERE member_id = (SELECT max(member_id) FROM issued_coupons) AND NOT legacy_duplicate;
             INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
             VALUES (gen_random_uuid(), 'SW-B', 'zz-new-member', '2026-09', 1000, now()),
                    (gen_random_uuid(), 'SW-B', 'zz-new-member', '2026-09', 1000, now() + interval '1 second')",
        )
        .unwrap();
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("resuming run 1"), "{}", r.stderr);
    assert_eq!(
        db.scalar_i64(LIVE_DUPLICATES),
        0,
        "no group holds two live coupons"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.ledger_records l JOIN issued_coupons i ON i.coupon_id = (l.row_key->>'coupon_id')::uuid
              WHERE l.run_id = 1 AND i.member_id = 'zz-new-member' AND i.legacy_duplicate"
        ),
        1,
        "the run's ledger records the new member's second coupon, which it voided"
    );
    let mut c = db.client();
    held::assert_checkpoint_in_step(&mut c, 1);
}

#[test]
fn walking_the_groups_in_ranges_ends_as_freezing_them_does() {
    // Without an index on the group columns (before V3), a void run freezes every group with
    // duplicates; with it, the run walks ranges of member_id. Same data, same end state.
    let end_state = |with_index: bool| -> (String, bool) {
        let db = fresh_db();
        db.make_legacy_baselined(3000);
        let target = if with_index { "3" } else { "2" };
        assert_eq!(
            db.run(&["migrate", "apply", "--yes", "--target", target])
                .code,
            0
        );
        let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        assert_eq!(db.scalar_i64(LIVE_DUPLICATES), 0);
        let mut c = db.client();
        held::assert_checkpoint_in_step(&mut c, 1);
        let row = c
            .query_one(
                "SELECT md5(string_agg(campaign_id || member_id || issued_at::text || legacy_duplicate::text || (voided_at IS NULL)::text,
                                       ',' ORDER BY campaign_id, member_id, issued_at)),
                        (SELECT target_ranges FROM pgmend.repair_runs WHERE run_id = 1)
                   FROM issued_coupons",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let (frozen, frozen_ranges) = end_state(false);
    let (walked, walked_ranges) = end_state(true);
    assert!(!frozen_ranges && walked_ranges, "one run of each kind");
    assert_eq!(frozen, walked);
}

#[test]
fn a_run_in_ranges_whose_index_is_gone_is_refused_and_changes_nothing() {
    let db = fresh_db();
    db.make_legacy_baselined(3000);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    interrupted_void_run(&db);
    db.client()
        .batch_execute("DROP INDEX issued_coupons_by_member")
        .unwrap();
    let before = db.scalar_i64(
        "SELECT count(*) FILTER (WHERE legacy_duplicate) * 1000000 + (SELECT checkpoint FROM pgmend.repair_runs WHERE run_id = 1) FROM issued_coupons",
    );
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_ne!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("no valid index on those columns exists now")
            && r.stderr.contains("pgmend repair abandon 1 --yes"),
        "{}",
        r.stderr
    );
    let after = db.scalar_i64(
        "SELECT count(*) FILTER (WHERE legacy_duplicate) * 1000000 + (SELECT checkpoint FROM pgmend.repair_runs WHERE run_id = 1) FROM issued_coupons",
    );
    assert_eq!(before, after, "nothing changed");
}
