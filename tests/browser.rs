//! The report's page in a real browser: headless Chromium (the Debian package `chromium`,
//! which `.ci/run` installs, with `fonts-noto-cjk`) loads the page pgmend wrote, in English and
//! in Japanese, and a probe script added to a copy of it measures the layout: no horizontal
//! overflow at 1280 px, every chart label inside its chart, and, with the print stylesheet
//! applied at the width of an A4 page, no table wider than the page and no header broken inside
//! a word. The fonts Chromium used are read from the DevTools protocol
//! (`CSS.getPlatformFontsForNode`, over `--remote-debugging-pipe`, driven by a short python3
//! script): every Japanese character is drawn by a Japanese font, never as the missing-glyph
//! box; the same check run with the Japanese fonts hidden from fontconfig must fail, so it
//! can tell. The screenshots and the PDFs are kept in `target/browser/` as artifacts.

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
// Headers break only between words: each word (a run of non-spaces in English, each of WORDS
// in Japanese) lies on one line.
const WORDS = __WORDS__;
out.brokenHeaders = []; out.wrappedHeaders = 0;
const lineTops = (range) => new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
for (const th of document.querySelectorAll('th')) {
  const nodes = []; let text = '';
  const walk = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) { nodes.push([walk.currentNode, text.length]); text += walk.currentNode.textContent; }
  const at = (i) => { let k = nodes.length - 1; while (k > 0 && nodes[k][1] > i) k--; return [nodes[k][0], i - nodes[k][1]]; };
  const spans = [];
  if (WORDS.length) {
    for (const w of WORDS) { let i = -1; while ((i = text.indexOf(w, i + 1)) >= 0) spans.push([i, i + w.length]); }
  } else {
    for (const m of text.matchAll(/\S+/g)) spans.push([m.index, m.index + m[0].length]);
  }
  const whole = document.createRange(); whole.selectNodeContents(th);
  if (lineTops(whole).size > 1) out.wrappedHeaders++;
  for (const [from, to] of spans) {
    const range = document.createRange();
    range.setStart(...at(from)); range.setEnd(...at(to - 1)); range.setEnd(range.endContainer, range.endOffset + 1);
    if (lineTops(range).size > 1) out.brokenHeaders.push(text.slice(from, to) + ' in ' + text);
  }
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

/// Asks Chromium, over the DevTools protocol, which fonts drew each element's text: prints a
/// JSON list of `{"text", "fonts": [{"familyName", "glyphCount", ...}]}`. argv: chromium, a
/// profile directory, the page's URL.
const FONTS: &str = r#"
import json, os, subprocess, sys, time
chromium, profile, url = sys.argv[1:4]
to_r, to_w = os.pipe()
from_r, from_w = os.pipe()
def pipes():  # --remote-debugging-pipe reads fd 3 and writes fd 4
    a, b = os.dup(to_r), os.dup(from_w)
    os.dup2(a, 3)
    os.dup2(b, 4)
proc = subprocess.Popen([chromium, '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
                         '--disable-background-networking', '--disable-component-update',
                         '--remote-debugging-pipe', '--user-data-dir=' + profile,
                         '--window-size=1280,1000', 'about:blank'],
                        preexec_fn=pipes, close_fds=False,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.close(to_r)
os.close(from_w)
buf, last = b'', 0
def call(method, params=None, session=None):
    global buf, last
    last += 1
    msg = {'id': last, 'method': method, 'params': params or {}}
    if session:
        msg['sessionId'] = session
    os.write(to_w, json.dumps(msg).encode() + b'\0')
    while True:
        while b'\0' not in buf:
            chunk = os.read(from_r, 1 << 16)
            if not chunk:
                sys.exit('chromium closed the DevTools pipe')
            buf += chunk
        line, buf = buf.split(b'\0', 1)
        reply = json.loads(line)
        if reply.get('id') == last:
            if 'error' in reply:
                sys.exit(method + ': ' + json.dumps(reply['error']))
            return reply['result']
def evaluate(expression, session, promise=False):
    r = call('Runtime.evaluate', {'expression': expression, 'returnByValue': True,
                                  'awaitPromise': promise}, session)
    return r['result'].get('value')
target = call('Target.createTarget', {'url': url})['targetId']
s = call('Target.attachToTarget', {'targetId': target, 'flatten': True})['sessionId']
for _ in range(200):
    if evaluate('location.href + " " + document.readyState', s) == url + ' complete':
        break
    time.sleep(0.05)
evaluate('document.fonts.ready.then(() => 1)', s, promise=True)
call('DOM.enable', {}, s)
call('CSS.enable', {}, s)
root = call('DOM.getDocument', {'depth': -1}, s)['root']['nodeId']
selector = 'h1, h2, dt, dd, th, td, p, svg text'
nodes = call('DOM.querySelectorAll', {'nodeId': root, 'selector': selector}, s)['nodeIds']
texts = json.loads(evaluate('JSON.stringify([...document.querySelectorAll(%s)].map(e => e.textContent))'
                            % json.dumps(selector), s))
out = [{'text': t, 'fonts': call('CSS.getPlatformFontsForNode', {'nodeId': n}, s)['fonts']}
       for n, t in zip(nodes, texts)]
print(json.dumps(out))
try:
    call('Browser.close')
except SystemExit:
    pass
proc.wait(timeout=20)
"#;

/// Japanese characters: kana, CJK ideographs, full-width forms.
fn japanese(c: char) -> bool {
    matches!(c, '\u{3000}'..='\u{30ff}' | '\u{4e00}'..='\u{9fff}' | '\u{ff00}'..='\u{ffef}')
}

/// The elements whose Japanese characters Chromium did not draw with a Japanese font (so
/// drew as boxes): (text, fonts used). `fontconfig`: a FONTCONFIG_FILE to run under.
fn not_drawn_in_japanese(page: &Path, fontconfig: Option<&Path>) -> Vec<String> {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("python3");
    cmd.args(["-c", FONTS])
        .arg(chromium())
        .arg(profile.path())
        .arg(format!("file://{}", page.display()));
    if let Some(config) = fontconfig {
        cmd.env("FONTCONFIG_FILE", config);
    }
    let out = cmd.output().expect("running python3");
    assert!(
        out.status.success(),
        "the DevTools probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nodes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut missing = Vec::new();
    let mut japanese_nodes = 0;
    for node in &nodes {
        let text = node["text"].as_str().unwrap();
        let wanted = text.chars().filter(|c| japanese(*c)).count() as u64;
        if wanted == 0 {
            continue;
        }
        japanese_nodes += 1;
        let fonts = node["fonts"].as_array().unwrap();
        let drawn: u64 = fonts
            .iter()
            .filter(|f| {
                let family = f["familyName"].as_str().unwrap_or_default();
                ["CJK", "Noto Sans JP", "Hiragino", "Yu Gothic", "Meiryo"]
                    .iter()
                    .any(|name| family.contains(name))
            })
            .map(|f| f["glyphCount"].as_u64().unwrap_or(0))
            .sum();
        if drawn < wanted {
            missing.push(format!("{text:?} drawn with {fonts:?}"));
        }
    }
    assert!(
        japanese_nodes > 0,
        "no Japanese text on {} ({} elements; fontconfig {fontconfig:?})",
        page.display(),
        nodes.len()
    );
    missing
}

/// A fontconfig that knows only the Latin fonts: what a machine without a Japanese font sees.
fn latin_fonts_only(dir: &Path) -> PathBuf {
    let config = dir.join("fonts.conf");
    std::fs::write(
        &config,
        format!(
            r#"<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>/usr/share/fonts/truetype/dejavu</dir><dir>/usr/share/fonts/truetype/liberation</dir><cachedir>{}</cachedir></fontconfig>"#,
            dir.join("cache").display()
        ),
    )
    .unwrap();
    config
}

/// Words a Japanese header must never be broken inside.
const JAPANESE_WORDS: &[&str] = &[
    "キャンペーン",
    "クーポン数",
    "クーポン額",
    "無効化した",
    "無効化後に",
    "利用済みの",
    "利用された",
    "旧カウンターの",
    "旧システムの",
    "発行額",
    "超過額",
    "利用額",
    "月間上限",
    "消失した",
    "（円）",
];

fn check_page(db: &TestDb, lang: &str) {
    let dir = repo().join("target/browser");
    std::fs::create_dir_all(&dir).unwrap();
    let stem = if lang == "en" {
        "overruns".to_string()
    } else {
        format!("overruns-{lang}")
    };
    let page = dir.join(format!("{stem}.html"));
    let _ = std::fs::remove_file(&page);
    let r = db.run(&[
        "report",
        "overruns",
        "--output",
        page.to_str().unwrap(),
        "--lang",
        lang,
    ]);
    assert_eq!(r.code, 0, "{}", r.both());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("<script"), "the page itself has no script");
    let words = if lang == "ja" {
        serde_json::to_string(JAPANESE_WORDS).unwrap()
    } else {
        "[]".to_string()
    };
    let probed = dir.join(format!("{stem}-probe.html"));
    let probe_script = PROBE.replace("__WORDS__", &words);
    std::fs::write(
        &probed,
        html.replace("</body>", &format!("{probe_script}</body>")),
    )
    .unwrap();
    let profile = tempfile::tempdir().unwrap();

    let screen = probe(profile.path(), &probed, 1280, "");
    assert_eq!(screen["innerWidth"], 1280, "{screen}");
    assert!(
        screen["scrollWidth"].as_i64().unwrap() <= 1280,
        "{lang}: horizontal overflow at 1280 px: {screen}"
    );
    assert!(screen["labels"].as_i64().unwrap() > 20, "{screen}");
    assert_eq!(
        screen["outside"],
        serde_json::json!([]),
        "{lang}: labels outside their chart"
    );

    // The print stylesheet at an A4 page's width (210 mm less 2 × 12 mm margins, at 96 dpi).
    let a4 = probe(profile.path(), &probed, 703, "#print");
    assert_eq!(
        a4["wideTables"],
        serde_json::json!([]),
        "{lang}: tables cut on A4: {a4}"
    );
    assert!(a4["scrollWidth"].as_i64().unwrap() <= 703, "{a4}");
    assert_eq!(
        a4["outside"],
        serde_json::json!([]),
        "{lang}: labels outside their chart on A4"
    );
    assert!(
        a4["wrappedHeaders"].as_i64().unwrap() > 0,
        "{lang}: some headers wrap on A4, so the next check means something: {a4}"
    );
    assert_eq!(
        a4["brokenHeaders"],
        serde_json::json!([]),
        "{lang}: headers broken inside a word on A4"
    );

    // Every Japanese character drawn by a Japanese font; and without one the check would see
    // the boxes.
    assert_eq!(
        not_drawn_in_japanese(&page, None),
        Vec::<String>::new(),
        "{lang}: Japanese drawn as missing-glyph boxes"
    );
    let fonts = tempfile::tempdir().unwrap();
    assert!(
        !not_drawn_in_japanese(&page, Some(&latin_fonts_only(fonts.path()))).is_empty(),
        "{lang}: without a Japanese font the check must find boxes"
    );

    // The artifacts: what a person sees, and what the accountant files.
    let url = format!("file://{}", page.display());
    let shot = dir.join(format!("{stem}.png"));
    let pdf = dir.join(format!("{stem}.pdf"));
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
    assert!(
        pages >= 5,
        "{lang}: a page per section at least: {pages} pages"
    );
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
    check_page(&db, "en");
    check_page(&db, "ja");
}
