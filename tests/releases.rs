//! A release is the user's project: found with `--release DIR` (or `PGMEND_RELEASE`) or in the
//! current directory, refused when there is none; `--migrations-dir` and `--repairs-dir`
//! override its parts; several releases run on one database one after another, each under its
//! name, and another is refused while one is unfinished.

mod common;

use std::path::Path;

use common::*;

/// A directory with no release.toml, for the runs that must find none.
fn elsewhere() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn in_dir(db: &TestDb, dir: &Path, args: &[&str]) -> Run {
    run(db.pgmend().args(args).current_dir(dir), &db.password())
}

fn data(name: &str) -> String {
    repo()
        .join("tests/data/releases")
        .join(name)
        .display()
        .to_string()
}

/// The coupon release, from the repository root, through its deploy gate to the end.
fn coupon_release_complete(db: &TestDb) {
    db.make_legacy_data(200);
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
}

fn releases(db: &TestDb) -> Vec<(String, bool)> {
    db.client()
        .query(
            "SELECT release, finished_at IS NOT NULL FROM pgmend.releases ORDER BY started_at",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn a_release_written_by_init_to_a_temporary_directory_runs_end_to_end_from_anywhere() {
    let db = fresh_db();
    db.make_legacy_data(200);
    let work = elsewhere();
    let release = work.path().join("my-release");
    let r = in_dir(&db, work.path(), &["init", release.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(release.join("release.toml").is_file());
    assert_eq!(
        std::fs::read_dir(release.join("migrations"))
            .unwrap()
            .count(),
        5
    );
    // A second init into the same directory overwrites nothing.
    let again = in_dir(&db, work.path(), &["init", release.to_str().unwrap()]);
    assert_eq!(again.code, 2, "{}", again.both());
    assert!(again.stderr.contains("would overwrite"), "{}", again.stderr);

    let dir = release.to_str().unwrap();
    let other = elsewhere();
    for args in [
        vec!["migrate", "baseline", "--yes", "--release", dir],
        vec!["apply", "--yes", "--release", dir],
    ] {
        let r = in_dir(&db, other.path(), &args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.both());
    }
    // Through PGMEND_RELEASE this time.
    let r = run(
        db.pgmend()
            .args(["apply", "--yes", "--confirm", "deploy-new-application"])
            .env("PGMEND_RELEASE", dir)
            .current_dir(other.path()),
        &db.password(),
    );
    assert_eq!(r.code, 0, "{}", r.both());
    let v = in_dir(&db, other.path(), &["verify", "--release", dir]);
    assert_eq!(v.code, 0, "{}", v.both());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM refinery_schema_history"),
        5
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.release_steps WHERE release = 'coupon-incident'"
        ),
        5
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates WHERE release = 'coupon-incident' AND gate = 'deploy-new-application'"),
        1
    );
    assert_eq!(releases(&db), [("coupon-incident".to_string(), true)]);
}

#[test]
fn with_no_release_found_every_command_that_needs_one_exits_2_and_changes_nothing() {
    let db = fresh_db();
    db.make_legacy_data(50);
    let before = snapshot(&db);
    let empty = elsewhere();
    for args in [
        vec!["apply", "--yes"],
        vec!["plan"],
        vec!["migrate", "apply", "--yes"],
        vec!["migrate", "baseline", "--yes"],
        vec!["repair", "apply", "void-duplicate-coupons", "--yes"],
    ] {
        let r = in_dir(&db, empty.path(), &args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("no release found"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(r.stderr.contains("pgmend init DIR"), "{}", r.stderr);
    }
    // A --release that holds no release.toml is refused too, naming it.
    let r = in_dir(
        &db,
        empty.path(),
        &[
            "apply",
            "--yes",
            "--release",
            empty.path().to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("holds no release.toml"), "{}", r.stderr);
    assert_eq!(snapshot(&db), before);
}

/// The origin of each migration `migrate status` lists, by version.
fn origins(r: &Run) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.both()));
    v["migrations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["origin"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn release_options_take_precedence_over_the_variable_and_the_current_directory_and_dirs_over_the_release(
) {
    let db = fresh_db();
    db.make_legacy_data(20);
    let work = elsewhere();
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    for dir in [&a, &b] {
        assert_eq!(
            in_dir(&db, work.path(), &["init", dir.to_str().unwrap()]).code,
            0
        );
    }
    let status = |dir: &Path, env: Option<&Path>, extra: &[&str]| {
        let mut c = db.pgmend();
        c.args(["migrate", "status", "--format", "json"])
            .args(extra)
            .current_dir(dir);
        if let Some(e) = env {
            c.env("PGMEND_RELEASE", e);
        }
        run(&mut c, &db.password())
    };
    let all_under = |r: &Run, dir: &Path| {
        let o = origins(r);
        assert_eq!(o.len(), 5, "{}", r.both());
        assert!(
            o.iter().all(|p| p.starts_with(&dir.display().to_string())),
            "{o:?} not under {}",
            dir.display()
        );
    };
    // The current directory, when it holds a release.toml.
    all_under(&status(&a, None, &[]), &a);
    // PGMEND_RELEASE over the current directory.
    all_under(&status(&a, Some(&b), &[]), &b);
    // --release over PGMEND_RELEASE.
    all_under(
        &status(&a, Some(&b), &["--release", a.to_str().unwrap()]),
        &a,
    );
    // --migrations-dir over the release's migrations/.
    let r = status(
        &a,
        None,
        &["--migrations-dir", b.join("migrations").to_str().unwrap()],
    );
    all_under(&r, &b.join("migrations"));
    // --migrations-dir works with no release at all.
    all_under(
        &status(
            work.path(),
            None,
            &["--migrations-dir", a.join("migrations").to_str().unwrap()],
        ),
        &a.join("migrations"),
    );
    // --repairs-dir over the release's repairs/: a repair only the other directory has.
    std::fs::rename(
        b.join("repairs/void-duplicate-coupons.toml"),
        b.join("repairs/void-twice.toml"),
    )
    .unwrap();
    let list = |extra: &[&str]| {
        let r = run(
            db.pgmend()
                .args(["repair", "list"])
                .args(extra)
                .current_dir(&a),
            &db.password(),
        );
        assert_eq!(r.code, 0, "{}", r.both());
        r.stdout
    };
    assert!(!list(&[]).contains("void-twice"));
    assert!(list(&["--repairs-dir", b.join("repairs").to_str().unwrap()]).contains("void-twice"));
    assert!(list(&["--release", b.to_str().unwrap()]).contains("void-twice"));
}

#[test]
fn a_second_release_runs_after_the_first_under_its_own_name_and_a_third_waits_until_it_is_finished()
{
    let db = fresh_db();
    db.make_legacy_data(200);
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    // The coupon release stops at its deploy gate: unfinished.
    assert_eq!(db.run(&["apply", "--yes"]).code, 0);
    let notes = data("campaign-notes");
    let third = data("third");
    let before = snapshot(&db);
    let r = db.run(&["apply", "--yes", "--release", &notes]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("release coupon-incident is unfinished")
            && r.stderr.contains("gate deploy-new-application"),
        "{}",
        r.stderr
    );
    assert_eq!(snapshot(&db), before, "a refused release changes nothing");
    // plan shows the same refusal as a blocker (exit 2).
    let p = db.run(&["plan", "--release", &notes]);
    assert_eq!(p.code, 2, "{}", p.both());
    assert!(
        p.stdout.contains("release coupon-incident is unfinished"),
        "{}",
        p.stdout
    );

    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // The second release: V6, its own repair step, its gate.
    let r = db.run(&["apply", "--yes", "--release", &notes]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("tell-accounting"), "{}", r.stdout);
    assert_eq!(
        db.scalar_i64("SELECT max(version)::int8 FROM refinery_schema_history"),
        6
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.release_steps WHERE release = 'campaign-notes' AND step = 2 AND what = 'repair recount-campaign-budgets'"),
        1
    );
    // The coupon release's records are its own still.
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM pgmend.release_steps WHERE release = 'coupon-incident'"
        ),
        5
    );
    assert_eq!(
        releases(&db),
        [
            ("coupon-incident".to_string(), true),
            ("campaign-notes".to_string(), false)
        ]
    );
    // verify and repair status follow the chosen release.
    let names = |args: &[&str]| -> Vec<String> {
        let r = db.run(&[args, &["--format", "json"]].concat());
        let v: serde_json::Value =
            serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.both()));
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    let of_notes = names(&["verify", "--release", &notes]);
    assert!(
        of_notes.contains(&"no_empty_note".to_string()),
        "{of_notes:?}"
    );
    assert!(
        of_notes.contains(&"repair_recount-campaign-budgets".to_string()),
        "{of_notes:?}"
    );
    assert!(
        !of_notes.iter().any(|n| n.contains("coupon")),
        "{of_notes:?}"
    );
    let of_coupons = names(&["verify"]);
    assert!(
        of_coupons.contains(&"one_live_coupon_per_member".to_string()),
        "{of_coupons:?}"
    );
    assert!(
        !of_coupons.contains(&"no_empty_note".to_string()),
        "{of_coupons:?}"
    );
    let v = db.run(&["verify", "--release", &notes]);
    assert_eq!(v.code, 0, "{}", v.both());
    // A counter changed by hand and an empty note: the second release's checks fail, each
    // naming what breaks it.
    db.client()
        .batch_execute(
            "UPDATE campaign_budgets SET issued_yen = issued_yen - 1
              WHERE campaign_id = (SELECT min(campaign_id) FROM campaign_budgets
                                    WHERE issued_yen BETWEEN 1 AND budget_yen);
             INSERT INTO campaign_notes VALUES ((SELECT min(campaign_id) FROM campaigns), '');",
        )
        .unwrap();
    let r = db.run(&["verify", "--release", &notes, "--format", "json"]);
    assert_eq!(r.code, 1, "{}", r.both());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let failed: Vec<(String, i64)> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["violations"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            ("no_empty_note".to_string(), 1),
            ("repair_recount-campaign-budgets".to_string(), 1)
        ]
    );
    db.client()
        .batch_execute(
            "UPDATE campaign_budgets b SET issued_yen = s.yen
               FROM (SELECT campaign_id, sum(amount_yen) AS yen FROM issued_coupons
                      WHERE voided_at IS NULL GROUP BY 1) s
              WHERE s.campaign_id = b.campaign_id AND b.issued_yen <> s.yen;
             DELETE FROM campaign_notes;",
        )
        .unwrap();
    let s = db.run(&["repair", "status", "--release", &notes]);
    assert_eq!(s.code, 0, "{}", s.both());
    assert!(
        s.stdout.contains("coupon-incident: complete (11 steps)")
            && s.stdout.contains(
                "campaign-notes: step 3 of 4 pending (gate tell-accounting) (the chosen release)"
            ),
        "{}",
        s.stdout
    );
    // The finance report is the coupon release's: refused under another.
    let r = db.run(&["report", "overruns", "--release", &notes]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("belongs to the coupon release"),
        "{}",
        r.stderr
    );

    // A third release is refused while the second waits at its gate; nothing changes.
    let before = snapshot(&db);
    let r = db.run(&["apply", "--yes", "--release", &third]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("release campaign-notes is unfinished")
            && r.stderr.contains("step 3 (gate tell-accounting)"),
        "{}",
        r.stderr
    );
    assert_eq!(snapshot(&db), before);
    // The coupon release, run again, is complete and stays so.
    let r = db.run(&["apply", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(r.stdout.contains("Nothing to apply"), "{}", r.stdout);

    let r = db.run(&[
        "apply",
        "--yes",
        "--release",
        &notes,
        "--confirm",
        "tell-accounting",
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pgmend.gates WHERE release = 'campaign-notes' AND gate = 'tell-accounting'"),
        1
    );
    let r = db.run(&["apply", "--yes", "--release", &third]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert_eq!(
        db.scalar_i64("SELECT max(version)::int8 FROM refinery_schema_history"),
        8
    );
    assert_eq!(releases(&db).iter().filter(|(_, done)| *done).count(), 3);
}

#[test]
fn a_release_whose_migration_versions_another_release_has_is_refused_before_any_change() {
    let db = fresh_db();
    coupon_release_complete(&db);
    let work = elsewhere();
    let clash = work.path().join("clash");
    std::fs::create_dir_all(clash.join("migrations")).unwrap();
    std::fs::write(
        clash.join("release.toml"),
        "name = \"clash\"\n[[step]]\nmigrate = 5\n",
    )
    .unwrap();
    std::fs::write(
        clash.join("migrations/V5__something_else.sql"),
        "CREATE TABLE something_else (id int);\n",
    )
    .unwrap();
    let before = snapshot(&db);
    let r = db.run(&["apply", "--yes", "--release", clash.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("one history per database") && r.stderr.contains("after V5"),
        "{}",
        r.stderr
    );
    assert_eq!(snapshot(&db), before);
}

#[test]
fn a_coupon_release_known_only_by_its_migrations_holds_back_another_release_in_every_command_that_writes(
) {
    let db = fresh_db();
    db.make_legacy_data(50);
    assert_eq!(db.run(&["migrate", "baseline", "--yes"]).code, 0);
    // Its first migrations applied alone: no step record, no gate, no pgmend schema.
    let r = db.run(&["migrate", "apply", "--yes", "--target", "3"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let third = data("third");
    let notes = data("campaign-notes");
    let before = snapshot(&db);
    for args in [
        vec!["apply", "--yes", "--release", &third],
        vec!["migrate", "apply", "--yes", "--release", &third],
        vec![
            "repair",
            "apply",
            "recount-campaign-budgets",
            "--yes",
            "--release",
            &notes,
        ],
    ] {
        let r = db.run(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.both());
        assert!(
            r.stderr.contains("release coupon-incident is unfinished")
                && r.stderr.contains("step 4 (repair void-duplicate-coupons)")
                && r.stderr.contains("pgmend init DIR"),
            "{args:?}: {}",
            r.stderr
        );
    }
    assert_eq!(snapshot(&db), before);
    // migrate status from the third release shows the coupon release's versions as another
    // release's, not as missing files.
    let s = db.run(&["migrate", "status", "--release", &third]);
    assert!(
        s.stdout.contains("applied (another release)"),
        "{}",
        s.both()
    );
    assert!(!s.stdout.contains("missing from disk"), "{}", s.stdout);
}
