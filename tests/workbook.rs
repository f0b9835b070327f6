//! The report's workbook printed by a real office suite: LibreOffice (the Debian package
//! `libreoffice-calc-nogui`, which `.ci/run` installs) converts it to PDF headless, and poppler's
//! `pdftotext` (`poppler-utils`) reads each page back. Every page's footer names its sheet, so
//! the test knows which sheet each page belongs to: the summary prints on one page, and every
//! page of every sheet holds the sheet's first and last column headers (no sheet is wider than
//! a page). The PDFs are kept in `target/workbook/` as artifacts.
//!
//! The conversion takes seconds, so the version matrix skips it (`slow_tests_skipped`): what is
//! tested is the workbook, not the server.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;

/// Runs `program` with `args`; panics with its output when it fails.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (.ci/run installs it)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The workbook printed to PDF by LibreOffice, as the text of each page.
fn print(book: &Path, dir: &Path) -> Vec<String> {
    let profile = tempfile::tempdir().unwrap();
    run(
        "soffice",
        &[
            &format!("-env:UserInstallation=file://{}", profile.path().display()),
            "--headless",
            "--convert-to",
            "pdf",
            "--outdir",
            dir.to_str().unwrap(),
            book.to_str().unwrap(),
        ],
    );
    let pdf = book.with_extension("pdf");
    let info = run("pdfinfo", &[pdf.to_str().unwrap()]);
    assert!(info.contains("(A4)"), "A4 pages: {info}");
    let text = run("pdftotext", &["-layout", pdf.to_str().unwrap(), "-"]);
    let mut pages: Vec<String> = text.split('\u{c}').map(String::from).collect();
    if pages.last().is_some_and(|p| p.trim().is_empty()) {
        pages.pop();
    }
    pages
}

/// Sheet name → the text of its pages, from the name each page's footer carries.
fn pages_by_sheet(pages: &[String], sheets: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut by_sheet: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, page) in pages.iter().enumerate() {
        let footer = page
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or_default();
        let sheet = sheets
            .iter()
            .find(|s| footer.contains(**s))
            .unwrap_or_else(|| panic!("page {} names no sheet in its footer: {footer:?}", n + 1));
        by_sheet
            .entry(sheet.to_string())
            .or_default()
            .push(page.clone());
    }
    by_sheet
}

struct Expect {
    lang: &'static str,
    /// Sheet name, its first header, its last header (a word of it that stays on one line).
    sheets: [(&'static str, &'static str, &'static str); 4],
    /// The summary's first and last labels.
    summary_labels: [&'static str; 2],
}

const EN: Expect = Expect {
    lang: "en",
    sheets: [
        ("Summary", "Figure", "What it means"),
        ("Campaigns", "Campaign", "Lost updates"),
        ("Member-months over cap", "Member", "Over (yen)"),
        ("Redeemed duplicates", "Coupon", "Redeemed at"),
    ],
    summary_labels: ["As of (Asia/Tokyo)", "Lost updates (yen)"],
};

const JA: Expect = Expect {
    lang: "ja",
    sheets: [
        ("概要", "項目", "説明"),
        ("キャンペーン", "キャンペーン", "消失した"),
        ("月間上限を超えた会員・月", "会員ID", "超過額"),
        ("利用済みの重複クーポン", "クーポンID", "利用日時"),
    ],
    summary_labels: ["基準日時（日本時間）", "消失した更新（円）"],
};

fn check(db: &TestDb, dir: &Path, expect: &Expect) -> usize {
    let book = dir.join(format!("overruns-{}.xlsx", expect.lang));
    let _ = std::fs::remove_file(&book);
    let r = db.run(&[
        "report",
        "overruns",
        "--output",
        book.to_str().unwrap(),
        "--lang",
        expect.lang,
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let pages = print(&book, dir);
    let names: Vec<&str> = expect.sheets.iter().map(|(name, _, _)| *name).collect();
    let by_sheet = pages_by_sheet(&pages, &names);
    for (name, first, last) in expect.sheets {
        let printed = by_sheet
            .get(name)
            .unwrap_or_else(|| panic!("{}: no page of {name}", expect.lang));
        for (n, page) in printed.iter().enumerate() {
            assert!(
                page.contains(first) && page.contains(last),
                "{}: page {} of {name} lacks its first or last column ({first}, {last}): the sheet is wider than the page\n{page}",
                expect.lang,
                n + 1
            );
        }
    }
    let summary = &by_sheet[expect.sheets[0].0];
    assert_eq!(summary.len(), 1, "{}: the summary on one page", expect.lang);
    for label in expect.summary_labels {
        assert!(
            summary[0].contains(label),
            "{}: {label}\n{}",
            expect.lang,
            summary[0]
        );
    }
    pages.len()
}

#[test]
fn libreoffice_prints_each_sheet_one_page_wide_and_the_summary_on_one_page() {
    if slow_tests_skipped("libreoffice_prints_each_sheet_one_page_wide_and_the_summary_on_one_page")
    {
        return;
    }
    let db = fresh_db();
    db.make_legacy_baselined(300);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    let dir = repo().join("target/workbook");
    std::fs::create_dir_all(&dir).unwrap();
    let en = check(&db, &dir, &EN);
    let ja = check(&db, &dir, &JA);
    // Summary, campaigns, a few pages of members, the duplicates: not the 15 pages the
    // workbook printed on before it had a page setup.
    assert!(en <= 8 && ja <= 8, "{en} and {ja} pages");
}
