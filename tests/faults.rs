//! Faults and concurrency against a real server: a bounded kill campaign (the long one is
//! `examples/kill_campaign.rs`), the server restarted (fast and immediate) in the middle of a
//! batch, the tool's backend terminated, its statement cancelled (in a batch and in a
//! concurrent index build), two releases at once, a release while an undo runs, and the
//! finance report while the repairs run. Every end state is compared with an uninterrupted
//! run on a `TEMPLATE` copy of the same data.

mod common;

#[path = "common/held.rs"]
mod held;
#[allow(dead_code)]
#[path = "../examples/kill_campaign.rs"]
mod kill_campaign;

use std::thread;
use std::time::{Duration, Instant};

use common::*;
use held::*;
use kill_campaign::{end_state, EndState, CONFIRM};

// ---------------------------------------------------------------------------------------
// 1. The kill campaign, bounded.

#[test]
fn killed_at_random_moments_the_release_ends_as_an_uninterrupted_run_would() {
    let seed = kill_campaign::seed_from_env().unwrap();
    eprintln!("kill campaign seed {seed}; replay with PGMEND_KILL_SEED={seed}");
    let options = kill_campaign::CampaignOptions {
        exe: exe(),
        iterations: 6,
        members: 500,
        seed,
        batch_target: "20ms".into(),
        jobs: 1,
        max_time: None,
        prefix: format!("kc{}", std::process::id()),
    };
    let conn = |db: &str| conninfo_for(db);
    let tally = kill_campaign::campaign(&options, &conn, &mut |l| eprintln!("{l}"))
        .unwrap_or_else(|e| panic!("{e:#}\n(seed {seed}; replay with PGMEND_KILL_SEED={seed})"));
    eprintln!("{}", tally.summary());
    assert_eq!(tally.iterations, 6);
    // Every iteration aims its first kill inside the reference's run time, but a run that is
    // faster than the reference this time can finish first (seen on PostgreSQL 14: 3 kills in
    // 4 iterations); half of them landing is the floor.
    assert!(
        tally.kills >= 3,
        "only {} kills landed (seed {seed}; replay with PGMEND_KILL_SEED={seed})",
        tally.kills
    );
}

// ---------------------------------------------------------------------------------------
// 2. Server faults in the middle of a batch.

/// pgmend's message for a lost or broken session says what happened, where (the step and
/// the batch), and shows no password. (What to do: `a_lost_session_says_to_rerun_the_release`.)
fn assert_explains(stderr: &str, happened: &[&str], password: &str) {
    let lower = stderr.to_lowercase();
    assert!(
        happened.iter().any(|h| lower.contains(&h.to_lowercase())),
        "stderr says what happened ({happened:?}):\n{stderr}"
    );
    assert!(stderr.contains("pgmend: error: "), "{stderr}");
    assert!(!stderr.contains(password), "the password leaked:\n{stderr}");
}

fn server_restart_in_the_middle_of_a_batch(mode: &str) {
    let (pg, expected) = durable_server_with_faulty_copy();
    let conninfo = pg.conninfo("faulty");

    let (child, holder, _pid, run_id, checkpoint) = hold_in_the_middle_of_a_batch(&conninfo);
    pg_ctl(&pg, &["restart", "-m", mode, "-w", "-t", "60"]);
    drop(holder);
    let r = finish(child, Duration::from_secs(60), "apply");
    eprintln!("after pg_ctl restart -m {mode}:\n{}", r.stderr);
    assert_eq!(r.code, 2, "{}", r.both());
    assert_explains(
        &r.stderr,
        &[
            "terminating connection",
            "connection closed",
            "server closed the connection",
            "connection reset",
            "unexpected EOF",
            "shutdown",
        ],
        &pg.password,
    );
    assert_whole_batches(&conninfo, run_id, checkpoint, false);
    rerun_resumes(&conninfo, &expected, &pg.password);
}

#[test]
fn a_fast_server_restart_in_the_middle_of_a_batch_exits_2_and_the_rerun_resumes() {
    server_restart_in_the_middle_of_a_batch("fast");
}

#[test]
fn an_immediate_server_restart_in_the_middle_of_a_batch_exits_2_and_the_rerun_resumes() {
    server_restart_in_the_middle_of_a_batch("immediate");
}

fn backend_signalled_in_the_middle_of_a_batch(function: &str, happened: &[&str]) {
    let source = fresh_db();
    source.make_legacy_baselined(2000);
    let expected = reference(&source);
    let db = copy_of(&source);
    let (child, holder, pid, run_id, checkpoint) = hold_in_the_middle_of_a_batch(&db.conninfo());
    let signalled: bool = db
        .client()
        .query_one(&format!("SELECT {function}($1)"), &[&pid])
        .unwrap()
        .get(0);
    assert!(signalled);
    let r = finish(child, Duration::from_secs(60), "apply");
    drop(holder);
    eprintln!("after {function}:\n{}", r.stderr);
    assert_eq!(r.code, 2, "{}", r.both());
    assert_explains(&r.stderr, happened, &db.password());
    assert_whole_batches(&db.conninfo(), run_id, checkpoint, true);
    rerun_resumes(&db.conninfo(), &expected, &db.password());
}

#[test]
fn a_terminated_backend_in_the_middle_of_a_batch_exits_2_and_the_rerun_resumes() {
    backend_signalled_in_the_middle_of_a_batch(
        "pg_terminate_backend",
        &[
            "terminating connection due to administrator command",
            "57P01",
            "connection closed",
        ],
    );
}

#[test]
fn a_cancelled_batch_statement_exits_2_and_the_rerun_resumes() {
    backend_signalled_in_the_middle_of_a_batch(
        "pg_cancel_backend",
        &["canceling statement due to user request", "57014"],
    );
}

/// When the session is lost or a statement is cancelled in the middle of the release, pgmend
/// exits 2 saying what failed, that what it committed is kept, and the command that
/// continues (found by the kill campaign's author: it used to say only what failed).
#[test]
fn a_lost_session_says_to_rerun_the_release() {
    let db = fresh_db();
    db.make_legacy_baselined(2000);
    let (child, holder, pid, _, _) = hold_in_the_middle_of_a_batch(&db.conninfo());
    db.client()
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    let r = finish(child, Duration::from_secs(60), "apply");
    drop(holder);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("pgmend apply --yes"),
        "stderr says what to do (rerun the release to resume):\n{}",
        r.stderr
    );
}

/// A person cancels (or terminates) the concurrent build of V3 while it waits for an old
/// snapshot: pgmend exits 2 naming it, leaves no INVALID index, and the rerun completes.
fn concurrent_build_signalled(function: &str, happened: &[&str]) {
    let source = fresh_db();
    source.make_legacy_baselined(500);
    let expected = reference(&source);
    let db = copy_of(&source);
    let (child, mut reader, pid) = hold_the_concurrent_build(&db, &CONFIRM);
    let mut watch = db.client();
    watch
        .query_one(&format!("SELECT {function}($1)"), &[&pid])
        .unwrap();
    // Give pgmend its chance to drop the INVALID index while the reader is still there,
    // then let the reader go (a DROP INDEX CONCURRENTLY waits for it too).
    thread::sleep(Duration::from_millis(1500));
    reader.batch_execute("COMMIT").unwrap();
    let r = finish(child, Duration::from_secs(120), "apply");
    eprintln!("after {function} on the build:\n{}", r.stderr);
    assert_eq!(r.code, 2, "{}", r.both());
    assert_explains(&r.stderr, happened, &db.password());
    assert_eq!(
        db.invalid_indexes(),
        0,
        "pgmend dropped the index its cancelled build left INVALID"
    );
    let r = db.run(&CONFIRM);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
}

#[test]
fn a_cancelled_concurrent_build_exits_2_without_an_invalid_index_and_the_rerun_completes() {
    concurrent_build_signalled(
        "pg_cancel_backend",
        &["canceling statement due to user request", "57014"],
    );
}

#[test]
fn a_terminated_concurrent_build_exits_2_without_an_invalid_index_and_the_rerun_completes() {
    concurrent_build_signalled(
        "pg_terminate_backend",
        &[
            "terminating connection due to administrator command",
            "57P01",
            "connection closed",
        ],
    );
}

// ---------------------------------------------------------------------------------------
// 3. Concurrency.

/// Two `pgmend apply` started together on a copy of legacy data, with `--runner-wait
/// runner_wait`; the reference end state, the copy and both runs.
fn two_releases_at_once(runner_wait: &str) -> (EndState, TestDb, Run, Run) {
    let source = fresh_db();
    source.make_legacy_baselined(1000);
    let expected = reference(&source);
    let db = copy_of(&source);
    let args = confirm_with(&["--batch-target", "20ms", "--runner-wait", runner_wait]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = spawn(&exe(), &db.conninfo(), &args);
    let b = spawn(&exe(), &db.conninfo(), &args);
    let (a, b) = (
        finish(a, Duration::from_secs(120), "first apply"),
        finish(b, Duration::from_secs(120), "second apply"),
    );
    (expected, db, a, b)
}

#[test]
fn two_releases_at_once_one_is_refused_naming_the_holder() {
    let (expected, db, a, b) = two_releases_at_once("0s");
    let mut codes = [a.code, b.code];
    codes.sort_unstable();
    assert_eq!(codes, [0, 1], "\n{}\n---\n{}", a.both(), b.both());
    let refused = if a.code == 1 { &a } else { &b };
    assert!(
        refused
            .stderr
            .contains("another pgmend is working on this database (backend pid ")
            && refused.stderr.contains("application_name \"pgmend\"")
            && refused.stderr.contains("nothing was changed"),
        "{}",
        refused.stderr
    );
    assert!(!refused.stderr.contains("== step"), "{}", refused.stderr);
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
}

#[test]
fn two_releases_at_once_with_runner_wait_both_succeed_and_nothing_is_done_twice() {
    let (expected, db, a, b) = two_releases_at_once("1m");
    assert_eq!(
        (a.code, b.code),
        (0, 0),
        "\n{}\n---\n{}",
        a.both(),
        b.both()
    );
    let waited = [&a, &b]
        .into_iter()
        .filter(|r| r.stderr.contains("waiting up to 1m for another pgmend"))
        .count();
    assert_eq!(waited, 1, "one waited:\n{}\n---\n{}", a.stderr, b.stderr);
    // The one that waited found every step done.
    let second = if a.stderr.contains("waiting up to") {
        &a
    } else {
        &b
    };
    assert!(!second.stderr.contains("== step"), "{}", second.stderr);
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
}

#[test]
fn a_release_started_while_an_undo_runs_waits_for_it_and_ends_correct() {
    let source = fresh_db();
    source.make_legacy_baselined(1000);
    let expected = reference(&source);
    let db = copy_of(&source);
    assert_eq!(
        db.run(&["migrate", "apply", "--yes", "--target", "3"]).code,
        0
    );
    let r = db.run(&["repair", "apply", "void-duplicate-coupons", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // Keep the undo busy: a session holds one of the voided coupons for a while.
    let mut holder = db.client();
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM issued_coupons WHERE coupon_id =
               (SELECT coupon_id FROM issued_coupons WHERE voided_at IS NOT NULL ORDER BY coupon_id DESC LIMIT 1) FOR SHARE",
        )
        .unwrap();
    let undo = spawn(
        &exe(),
        &db.conninfo(),
        &["repair", "undo", "1", "--yes", "--lock-timeout", "60s"],
    );
    waiting_for_a_lock(&db, "the undo waiting on the held coupon", "%");
    let refused = db.run(&CONFIRM);
    assert_eq!(refused.code, 1, "{}", refused.both());
    assert!(
        refused
            .stderr
            .contains("another pgmend is working on this database (backend pid "),
        "{}",
        refused.stderr
    );
    let waiting = spawn(
        &exe(),
        &db.conninfo(),
        &confirm_with(&["--runner-wait", "2m"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    thread::sleep(Duration::from_millis(1000));
    holder.batch_execute("COMMIT").unwrap();
    let undo = finish(undo, Duration::from_secs(120), "undo");
    assert_eq!(undo.code, 0, "{}", undo.both());
    let apply = finish(waiting, Duration::from_secs(120), "apply");
    assert_eq!(apply.code, 0, "{}", apply.both());
    assert!(
        apply.stderr.contains("waiting up to 2m for another pgmend"),
        "{}",
        apply.stderr
    );
    let got = end_state(&exe(), &db.conninfo()).unwrap();
    assert_eq!(
        got.undo_runs,
        ["run 1 of void-duplicate-coupons undone by run 2"]
    );
    assert_same(&expected, &got);
}

/// Checks one report document against itself: totals are the sums of the rows, overruns
/// follow from the figures, and each campaign's coupons plus voided coupons are all of its
/// coupons (`all`, counted before: nothing adds coupons here).
fn assert_consistent(doc: &serde_json::Value, all: &std::collections::BTreeMap<String, i64>) {
    let n = |v: &serde_json::Value, k: &str| v[k].as_i64().unwrap_or_else(|| panic!("{k} in {v}"));
    let campaigns = doc["campaigns"].as_array().unwrap();
    let members = doc["members_over_monthly_cap"].as_array().unwrap();
    let totals = &doc["totals"];
    let sum = |rows: &[serde_json::Value], k: &str| rows.iter().map(|r| n(r, k)).sum::<i64>();
    for (total, row) in [
        ("campaign_overrun_yen", "overrun_yen"),
        ("voided_yen", "voided_yen"),
        (
            "redeemed_legacy_duplicates_yen",
            "redeemed_legacy_duplicates_yen",
        ),
        ("voided_then_redeemed_yen", "voided_then_redeemed_yen"),
        ("budget_yen", "budget_yen"),
        ("issued_yen", "issued_yen"),
        ("coupons", "coupons"),
        ("voided_coupons", "voided_coupons"),
        ("redeemed_legacy_duplicates", "redeemed_legacy_duplicates"),
        ("voided_then_redeemed", "voided_then_redeemed"),
    ] {
        assert_eq!(
            n(totals, total),
            sum(campaigns, row),
            "totals.{total}: {doc}"
        );
    }
    assert_eq!(n(totals, "member_overrun_yen"), sum(members, "overrun_yen"));
    assert_eq!(n(totals, "member_used_yen"), sum(members, "used_yen"));
    assert_eq!(n(totals, "members_over_monthly_cap"), members.len() as i64);
    for c in campaigns {
        let id = c["campaign_id"].as_str().unwrap();
        assert_eq!(
            n(c, "coupons") + n(c, "voided_coupons"),
            all[id],
            "campaign {id}: coupons + voided_coupons is every coupon of the campaign: {c}"
        );
        assert_eq!(
            n(c, "overrun_yen"),
            (n(c, "issued_yen") - n(c, "budget_yen")).max(0),
            "{c}"
        );
        // The demo's coupons are all 1,000 yen.
        assert_eq!(n(c, "issued_yen"), 1000 * n(c, "coupons"), "{c}");
        assert_eq!(n(c, "voided_yen"), 1000 * n(c, "voided_coupons"), "{c}");
    }
    for m in members {
        assert!(n(m, "used_yen") > n(m, "cap_yen"), "{m}");
        assert_eq!(
            n(m, "overrun_yen"),
            n(m, "used_yen") - n(m, "cap_yen"),
            "{m}"
        );
    }
}

#[test]
fn reports_taken_while_the_repairs_run_are_consistent_and_nothing_deadlocks() {
    let source = fresh_db();
    source.make_legacy_baselined(2000);
    let expected = reference(&source);
    let db = copy_of(&source);
    let all: std::collections::BTreeMap<String, i64> = db
        .client()
        .query(
            "SELECT campaign_id, count(*) FROM issued_coupons GROUP BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut apply = spawn(
        &exe(),
        &db.conninfo(),
        &confirm_with(&["--batch-target", "5ms"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let started = Instant::now();
    let mut states = Vec::new();
    let mut reports = 0;
    loop {
        let done = apply.try_wait().unwrap().is_some();
        let r = finish(
            spawn(
                &exe(),
                &db.conninfo(),
                &["report", "overruns", "--format", "json"],
            ),
            Duration::from_secs(60),
            "report overruns",
        );
        assert_eq!(r.code, 0, "{}", r.both());
        let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        assert_consistent(&doc, &all);
        let state = doc["state"].as_str().unwrap().to_string();
        if states.last() != Some(&state) {
            states.push(state);
        }
        reports += 1;
        if done {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the release did not finish while reports ran (deadlock?)"
        );
    }
    let apply = finish(apply, Duration::from_secs(1), "apply");
    assert_eq!(apply.code, 0, "{}", apply.both());
    eprintln!("{reports} reports while the release ran; states seen: {states:?}");
    assert!(
        reports >= 3,
        "only {reports} reports ran during the release"
    );
    assert_eq!(states.last().map(String::as_str), Some("released"));
    // The release moves forward only: legacy, partial, released, in that order.
    let order = ["legacy", "partial", "released"];
    let ranks: Vec<usize> = states
        .iter()
        .map(|s| order.iter().position(|o| o == s).unwrap())
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{states:?}");
    assert_same(&expected, &end_state(&exe(), &db.conninfo()).unwrap());
}
