//! Reviewed plans (issue 18): what `pgmend plan` predicts equals what `pgmend apply` then
//! writes, counted in the tables afterwards.

mod common;

use common::fresh_db;
use serde_json::Value;

/// The plan's JSON document on `db`.
fn plan_json(db: &common::TestDb) -> Value {
    let r = db.run(&["plan", "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.both());
    serde_json::from_str(&r.stdout).unwrap()
}

fn step(doc: &Value, n: usize) -> &Value {
    &doc["steps"][n - 1]
}

#[test]
fn on_a_quiet_database_apply_writes_what_the_plan_predicts() {
    let db = fresh_db();
    db.make_legacy_baselined(300);
    let doc = plan_json(&db);
    let void = &step(&doc, 4)["repair"];
    let budgets = &step(&doc, 6)["repair"];
    let usage = &step(&doc, 7)["repair"];
    assert!(void["changes"].as_i64().unwrap() > 0, "{void}");

    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());

    // The void: rows marked, rows voided.
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE legacy_duplicate"),
        void["changes"].as_i64().unwrap()
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL"),
        void["voided_or_created"].as_i64().unwrap()
    );
    // Every campaign's new counter: created (there was no campaign_budgets) with the value the
    // plan gave it, which is the sum after the void.
    let mut c = db.client();
    let rows = c
        .query(
            "SELECT campaign_id, issued_yen::bigint FROM campaign_budgets",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len() as i64, budgets["changes"].as_i64().unwrap());
    for row in rows {
        let (id, yen): (String, i64) = (row.get(0), row.get(1));
        assert_eq!(budgets["amounts"][&id].as_i64(), Some(yen), "campaign {id}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM member_monthly_usage"),
        usage["changes"].as_i64().unwrap()
    );
    assert_eq!(
        db.scalar_i64("SELECT coalesce(sum(used_yen), 0)::bigint FROM member_monthly_usage"),
        usage["amounts"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_i64().unwrap())
            .sum::<i64>()
    );
    // The passes after the gate: nothing left on a quiet database, in the plan and in apply.
    for n in [9, 10] {
        assert_eq!(step(&doc, n)["repair"]["changes"], 0, "step {n}");
        assert!(step(&doc, n)["predicted_on"]
            .as_str()
            .unwrap()
            .contains("not predicted"));
    }
    let r = db.run(&[
        "apply",
        "--yes",
        "--confirm",
        "deploy-new-application",
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let walk: Value = serde_json::from_str(&r.stdout).unwrap();
    for s in walk["steps"].as_array().unwrap() {
        if s["step"] == 9 || s["step"] == 10 {
            assert_eq!(s["run"]["run"]["changed"], 0, "{s}");
        }
    }
}
