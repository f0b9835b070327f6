//! The report's page in a real browser: headless Chromium (the Debian package `chromium`,
//! which `.ci/run` installs) loads the page pgmend wrote, and a probe script added to a copy
//! of it measures the layout: no horizontal overflow at 1280 px, every chart label inside its
//! chart, and, with the print stylesheet applied at the width of an A4 page, no table wider
//! than the page. The screenshot and the PDF are kept in `target/browser/` as artifacts.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Collects what the test asserts on, into `<pre id="probe">` (read back with --dump-dom).
/// With `#print` in the URL it first applies the page's `@media print` rules on screen.
const PROBE: &str = r#"<script>
if (location.hash === '#print') {
  const sheet = document.styleSheets[0];
  const rules = [];
  for (const r of sheet.cssRules) {
    if (r instanceof CSSMediaRule && r.media.mediaText.includes('print')) {
      for (const inner of r.cssRules) if (inner instanceof CSSStyleRule) rules.push(inner.cssText);
    }
  }
  for (const text of rules) sheet.insertRule(text, sheet.cssRules.length);
}
const out = { scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
              labels: 0, outside: [], wideTables: [] };
for (const svg of document.querySelectorAll('svg.chart')) {
  const box = svg.getBoundingClientRect();
  for (const t of svg.querySelectorAll('text')) {
    const r = t.getBoundingClientRect();
    out.labels++;
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) {
      out.outside.push(t.textContent + ' ' + JSON.stringify([r.left, r.right, r.top, r.bottom]) + ' in ' + JSON.stringify([box.left, box.right, box.top, box.bottom]));
    }
  }
}
for (const table of document.querySelectorAll('table')) {
  const r = table.getBoundingClientRect();
  if (r.right > document.documentElement.clientWidth + 0.5) out.wideTables.push(table.parentElement.parentElement.className + ' ' + r.right);
}
const pre = document.createElement('pre');
pre.id = 'probe';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"#;

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("which").arg(name).output() {
            if out.status.success() {
                return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            }
        }
    }
    panic!("no chromium on PATH: install the Debian package chromium (.ci/run does)");
}

/// Runs headless Chromium on `url` with `args`; returns stdout.
fn browse(profile: &Path, url: &str, args: &[&str]) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("running chromium");
    assert!(
        out.status.success(),
        "chromium {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn probe(profile: &Path, page: &Path, width: u32, hash: &str) -> serde_json::Value {
    let url = format!("file://{}{hash}", page.display());
    let dom = browse(
        profile,
        &url,
        &[&format!("--window-size={width},1000"), "--dump-dom"],
    );
    let json = dom
        .split("<pre id=\"probe\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("no probe in the page:\n{dom}"))
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap()
}

#[test]
fn the_page_fits_1280_px_its_chart_labels_lie_inside_and_it_prints_on_a4() {
    let db = fresh_db();
    db.make_legacy_baselined(1500);
    let r = db.run(&["apply", "--yes", "--confirm", "deploy-new-application"]);
    assert_eq!(r.code, 0, "{}", r.both());
    // A long Japanese campaign name with a budget far below its issue, and a tiny campaign.
    db.client()
        .batch_execute(
            "INSERT INTO campaigns VALUES ('秋のシルバーウィーク特別セール・会員限定クーポン第二弾', 1000, 50000, 0), ('T', 1000, 1000, 0);
             INSERT INTO campaign_budgets VALUES ('秋のシルバーウィーク特別セール・会員限定クーポン第二弾', 1000, 50000, 0), ('T', 1000, 1000, 0);",
        )
        .unwrap();

    let dir = repo().join("target/browser");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("overruns.html");
    let _ = std::fs::remove_file(&page);
    let r = db.run(&["report", "overruns", "--output", page.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.both());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("<script"), "the page itself has no script");
    let probed = dir.join("overruns-probe.html");
    std::fs::write(&probed, html.replace("</body>", &format!("{PROBE}</body>"))).unwrap();
    let profile = tempfile::tempdir().unwrap();

    let screen = probe(profile.path(), &probed, 1280, "");
    assert_eq!(screen["innerWidth"], 1280, "{screen}");
    assert!(
        screen["scrollWidth"].as_i64().unwrap() <= 1280,
        "horizontal overflow at 1280 px: {screen}"
    );
    assert!(screen["labels"].as_i64().unwrap() > 20, "{screen}");
    assert_eq!(
        screen["outside"],
        serde_json::json!([]),
        "labels outside their chart"
    );

    // The print stylesheet at an A4 page's width (210 mm less 2 × 12 mm margins, at 96 dpi).
    let a4 = probe(profile.path(), &probed, 703, "#print");
    assert_eq!(
        a4["wideTables"],
        serde_json::json!([]),
        "tables cut on A4: {a4}"
    );
    assert!(a4["scrollWidth"].as_i64().unwrap() <= 703, "{a4}");
    assert_eq!(
        a4["outside"],
        serde_json::json!([]),
        "labels outside their chart on A4"
    );

    // The artifacts: what a person sees, and what the accountant files.
    let url = format!("file://{}", page.display());
    let shot = dir.join("overruns.png");
    let pdf = dir.join("overruns.pdf");
    let _ = std::fs::remove_file(&shot);
    let _ = std::fs::remove_file(&pdf);
    browse(
        profile.path(),
        &url,
        &[
            "--window-size=1280,2400",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    browse(
        profile.path(),
        &url,
        &[
            "--no-pdf-header-footer",
            &format!("--print-to-pdf={}", pdf.display()),
        ],
    );
    assert!(std::fs::read(&shot).unwrap().starts_with(b"\x89PNG"));
    let pdf = std::fs::read(&pdf).unwrap();
    assert!(pdf.starts_with(b"%PDF"));
    let pages = regex::bytes::Regex::new(r"/Type\s*/Page[^s]")
        .unwrap()
        .find_iter(&pdf)
        .count();
    assert!(pages >= 5, "a page per section at least: {pages} pages");
}
