//! The report as one self-contained page (no script, no external file), built with `maud`,
//! which escapes every value by default.
//!
//! Laid out for reading at any width and for printing on A4: tables scroll inside their own
//! box on screen and wrap on paper, each section starts a printed page, and the charts are
//! SVG scaled to the page. The campaign chart labels each bar with its figure (placed beside
//! the bar, or inside its end when beside would leave the chart) over a value axis; the
//! histogram's buckets follow the coupon amounts, so each bar holds overruns the coupons can
//! make. The member table streams (the page lists the first rows, `--members`); the histogram
//! counts every row, so it comes last.
//!
//! `Html` writes the page in pieces so the member table streams: the facts, totals, campaign chart
//! and tables at `begin`, then member rows (the first `--members`; later rows are counted for the
//! histogram, not listed), then the histogram, whose `Buckets` follow `Header::coupon_step_yen`
//! (the gcd of the campaigns' discounts); inline CSS with a print stylesheet for A4.

use std::io::{self, Write};

use maud::{html, Markup, PreEscaped, DOCTYPE};
use unicode_width::UnicodeWidthStr;

use super::render::{facts, titled, totals_lines, Shown, LOST_UPDATES_TITLE, MEMBER_FIELDS};
use super::{Header, Lang, MemberRow, Render, CAMPAIGN_NUMBERS, LOST_UPDATE_NUMBERS};
use crate::human::int;

/// The fonts: the system's, then the common Japanese ones (Debian's `fonts-noto-cjk`, macOS's
/// Hiragino, Windows' Yu Gothic and Meiryo), so Japanese text never falls back to the
/// missing-glyph box where one of them is installed; a Japanese page puts them first, so its
/// Latin text, digits and kana come from one font.
const STYLE: &str = "
body{font:14px/1.45 system-ui,'Noto Sans CJK JP','Noto Sans JP','Hiragino Sans','Hiragino Kaku Gothic ProN','Yu Gothic',Meiryo,sans-serif;margin:0 auto;padding:24px;max-width:1100px;color:#222}
html:lang(ja) body,html:lang(ja) svg text{font-family:'Noto Sans CJK JP','Noto Sans JP','Hiragino Sans','Hiragino Kaku Gothic ProN','Yu Gothic',Meiryo,system-ui,sans-serif}
h1{font-size:1.6em;margin:0 0 .5em}h2{font-size:1.2em;margin:1.6em 0 .5em}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px}
dl.facts dt{font-weight:600}dl.facts dd{margin:0;overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse}
th{text-align:left;vertical-align:bottom;font-weight:600;border-bottom:2px solid #888;word-break:keep-all;overflow-wrap:normal}
td,th{padding:3px 8px;border-bottom:1px solid #ddd}
th.n,td.n{text-align:right;font-variant-numeric:tabular-nums}
td.n{white-space:nowrap}
td.id{max-width:24em;overflow-wrap:anywhere}
svg.chart{display:block;width:100%;height:auto;max-width:960px}
svg text{font-size:12px;fill:#222}
svg text.in{fill:#fff}
.grid{stroke:#e3e3e3}.axis{stroke:#777}
.budget{fill:#9aa5b1}.issued{fill:#2f6fb0}.over{fill:#c0392b}.bar{fill:#c0392b}
.legend svg{vertical-align:middle}
p.more{color:#555}
@media print{
@page{size:A4;margin:12mm}
body{padding:0;max-width:none;font-size:9pt}
section{break-before:page}
section.totals{break-before:auto}
.scroll{overflow:visible}
table{width:100%;font-size:7.5pt}
td,th{padding:1px 3px}
th{font-size:7pt}
td.n{white-space:normal}
thead{display:table-header-group}
tr,svg{break-inside:avoid}
}";

/// The chart's coordinate system (the SVG scales it to the page).
const WIDTH: f64 = 960.0;
const PLOT_LEFT: f64 = 200.0;
const PLOT_RIGHT: f64 = 900.0;
/// An upper bound of the width of one display column of 12 px text.
const CHAR_W: f64 = 7.5;

pub struct Html<W: Write> {
    out: W,
    lang: Lang,
    shown: Shown,
    buckets: Buckets,
}

impl<W: Write> Html<W> {
    pub fn new(out: W, lang: Lang) -> Self {
        Html {
            out,
            lang,
            shown: Shown::default(),
            buckets: Buckets::default(),
        }
    }

    /// Lists the first `limit` member rows only (None: every row); the histogram still counts
    /// every row.
    pub fn with_member_limit(mut self, limit: Option<u64>) -> Self {
        self.shown.limit = limit;
        self
    }

    fn write(&mut self, markup: Markup) -> io::Result<()> {
        self.out.write_all(markup.into_string().as_bytes())?;
        self.out.write_all(b"\n")
    }
}

/// The line under a member list cut short, for a reader of the page (who has the report's files,
/// not the command line): how many are listed, and where the rest are.
fn left_out(lang: Lang, listed: u64, total: i64) -> Option<String> {
    let more = total - listed as i64;
    let whole = lang.tr("The complete list is in the report's workbook (.xlsx) and CSV files.");
    (more > 0).then(|| match lang {
        Lang::En => format!(
            "The first {} of {} member-months over the cap are listed here; the distribution below counts them all. {whole}",
            int(listed as i64),
            int(total)
        ),
        Lang::Ja => format!(
            "月間上限を超えた会員・月 {} 件のうち、最初の {} 件を載せています。下の分布はすべてを数えています。{whole}",
            int(total),
            int(listed as i64)
        ),
    })
}

/// Histogram buckets that follow the coupon amounts: an overrun is `used - cap`, where `used`
/// is a sum of coupons, so the possible overruns are `first`, `first + step`, ...; each bucket
/// holds `per` consecutive ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Buckets {
    first: i64,
    step: i64,
    per: i64,
    counts: Vec<u64>,
}

impl Buckets {
    /// At most `most` buckets up to `max_overrun`, for coupons whose amounts are multiples of
    /// `step`.
    pub(super) fn new(step: i64, cap: i64, max_overrun: i64, most: i64) -> Buckets {
        let step = step.max(1);
        let rest = (-cap).rem_euclid(step);
        let first = if rest == 0 { step } else { rest };
        let values = ((max_overrun - first).max(0) / step) + 1;
        let per = (values + most - 1) / most;
        let n = (values + per - 1) / per;
        Buckets {
            first,
            step,
            per,
            counts: vec![0; n as usize],
        }
    }

    fn add(&mut self, overrun: i64) {
        let last = self.counts.len().saturating_sub(1);
        let i = (((overrun - self.first).max(0) / self.step / self.per) as usize).min(last);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
    }

    /// The smallest and largest possible overrun of bucket `i`.
    pub(super) fn range(&self, i: usize) -> (i64, i64) {
        let low = self.first + i as i64 * self.per * self.step;
        (low, low + (self.per - 1) * self.step)
    }
}

/// A round step (1, 2 or 5 times a power of ten) giving at most `most` ticks up to `max`.
fn tick_step(max: i64, most: i64) -> i64 {
    let raw = (max.max(1) + most - 1) / most;
    let mut power = 1i64;
    loop {
        for step in [1, 2, 5] {
            if step * power >= raw {
                return step * power;
            }
        }
        power *= 10;
    }
}

/// `text` cut to about `columns` display columns, for a chart's label column (the whole text
/// is in the bar's tooltip).
fn clip(text: &str, columns: usize) -> String {
    if text.width() <= columns {
        return text.to_string();
    }
    let mut out = String::new();
    for c in text.chars() {
        if (out.as_str().width() + 2) > columns {
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out.push('…');
    out
}

fn text_width(text: &str) -> f64 {
    text.width() as f64 * CHAR_W
}

/// One bar's value label: beside the bar when it fits in the plot, else inside its end.
fn label(x_end: f64, y: f64, text: &str) -> Markup {
    let w = text_width(text);
    if x_end + 6.0 + w <= PLOT_RIGHT + 50.0 {
        html! { text x=(format!("{:.1}", x_end + 6.0)) y=(format!("{y:.1}")) { (text) } }
    } else {
        html! { text.in x=(format!("{:.1}", x_end - 6.0)) y=(format!("{y:.1}")) text-anchor="end" { (text) } }
    }
}

fn campaign_chart(h: &Header, lang: Lang) -> Markup {
    let max = h
        .campaigns
        .iter()
        .map(|c| c.budget_yen.max(c.issued_yen))
        .max()
        .unwrap_or(0)
        .max(1);
    let tick = tick_step(max, 5);
    let top = tick * ((max + tick - 1) / tick);
    let scale = |v: i64| PLOT_LEFT + (PLOT_RIGHT - PLOT_LEFT) * v as f64 / top as f64;
    let group = 52.0;
    let plot_top = 10.0;
    let plot_bottom = plot_top + group * h.campaigns.len() as f64;
    let height = plot_bottom + 34.0;
    let (budget, issued) = (lang.tr("budget"), lang.tr("issued"));
    html! {
        svg.chart role="img" aria-label=(lang.tr("Budget versus issued, per campaign"))
            viewBox=(format!("0 0 {WIDTH} {height}")) {
            @for i in 0..=(top / tick) {
                @let x = scale(i * tick);
                line.grid x1=(format!("{x:.1}")) x2=(format!("{x:.1}")) y1=(plot_top) y2=(plot_bottom) {}
                text.tick x=(format!("{x:.1}")) y=(format!("{:.1}", plot_bottom + 18.0)) text-anchor="middle" { (int(i * tick)) }
            }
            line.axis x1=(PLOT_LEFT) x2=(PLOT_LEFT) y1=(plot_top) y2=(plot_bottom) {}
            line.axis x1=(PLOT_LEFT) x2=(PLOT_RIGHT) y1=(plot_bottom) y2=(plot_bottom) {}
            @for (i, c) in h.campaigns.iter().enumerate() {
                @let y = plot_top + group * i as f64 + 6.0;
                @let class = if c.overrun_yen > 0 { "over" } else { "issued" };
                g.pair data-campaign=(c.campaign_id) {
                    title { (format!("{}: {budget} {} / {issued} {} / {} {}", c.campaign_id, int(c.budget_yen), int(c.issued_yen), lang.tr("overrun_yen"), int(c.overrun_yen))) }
                    text x="4" y=(format!("{:.1}", y + 24.0)) { (clip(&c.campaign_id, 24)) }
                    rect.budget x=(PLOT_LEFT) y=(format!("{y:.1}")) width=(format!("{:.1}", scale(c.budget_yen) - PLOT_LEFT)) height="18" {}
                    (label(scale(c.budget_yen), y + 13.5, &format!("{budget} {}", int(c.budget_yen))))
                    rect class=(class) x=(PLOT_LEFT) y=(format!("{:.1}", y + 21.0)) width=(format!("{:.1}", scale(c.issued_yen) - PLOT_LEFT)) height="18" {}
                    (label(scale(c.issued_yen), y + 34.5, &format!("{issued} {}", int(c.issued_yen))))
                }
            }
        }
        p.legend {
            svg width="12" height="12" { rect.budget width="12" height="12" {} } " " (budget) " "
            svg width="12" height="12" { rect.issued width="12" height="12" {} } " " (issued) " "
            svg width="12" height="12" { rect.over width="12" height="12" {} } " " (lang.tr("issued, over budget"))
        }
    }
}

fn histogram(buckets: &Buckets, lang: Lang) -> Markup {
    let most = buckets.counts.iter().copied().max().unwrap_or(0).max(1) as i64;
    let tick = tick_step(most, 5);
    let top = tick * ((most + tick - 1) / tick);
    let (left, right, plot_top, plot_bottom) = (70.0, 940.0, 24.0, 224.0);
    let y = |v: i64| plot_bottom - (plot_bottom - plot_top) * v as f64 / top as f64;
    let col = (right - left) / buckets.counts.len().max(1) as f64;
    let range = |i: usize| {
        let (low, high) = buckets.range(i);
        if low == high {
            int(low)
        } else {
            format!("{}–{}", int(low), int(high))
        }
    };
    // Range labels are rotated when they would not fit under their bar.
    let widest = (0..buckets.counts.len())
        .map(|i| text_width(&range(i)))
        .fold(0.0, f64::max);
    let rotate = widest > col - 4.0;
    let height = plot_bottom + if rotate { widest + 30.0 } else { 40.0 };
    html! {
        svg.chart role="img" aria-label=(lang.tr("Distribution of member overruns past the monthly cap"))
            viewBox=(format!("0 0 {WIDTH} {height:.1}")) {
            @for i in 0..=(top / tick) {
                @let v = i * tick;
                line.grid x1=(left) x2=(right) y1=(format!("{:.1}", y(v))) y2=(format!("{:.1}", y(v))) {}
                text.tick x=(format!("{:.1}", left - 6.0)) y=(format!("{:.1}", y(v) + 4.0)) text-anchor="end" { (int(v)) }
            }
            line.axis x1=(left) x2=(left) y1=(plot_top) y2=(plot_bottom) {}
            line.axis x1=(left) x2=(right) y1=(plot_bottom) y2=(plot_bottom) {}
            @for (i, count) in buckets.counts.iter().enumerate() {
                @let x = left + col * i as f64;
                @let top_y = y(*count as i64);
                @let mid = x + col / 2.0;
                g.bucket {
                    title { (match lang {
                        Lang::En => format!("{} over by {} yen", crate::human::count(*count as i64, "member-month"), range(i)),
                        Lang::Ja => format!("超過額 {} 円の会員・月：{} 件", range(i), int(*count as i64)),
                    }) }
                    rect.bar x=(format!("{:.1}", x + 3.0)) y=(format!("{top_y:.1}")) width=(format!("{:.1}", col - 6.0)) height=(format!("{:.1}", plot_bottom - top_y)) {}
                    text.count x=(format!("{mid:.1}")) y=(format!("{:.1}", top_y - 5.0)) text-anchor="middle" { (int(*count as i64)) }
                    @if rotate {
                        text.range x=(format!("{mid:.1}")) y=(format!("{:.1}", plot_bottom + 14.0)) text-anchor="end"
                            transform=(format!("rotate(-45 {mid:.1} {:.1})", plot_bottom + 14.0)) { (range(i)) }
                    } @else {
                        text.range x=(format!("{mid:.1}")) y=(format!("{:.1}", plot_bottom + 18.0)) text-anchor="middle" { (range(i)) }
                    }
                }
            }
        }
        p { (lang.tr("Member-months per overrun range, in yen past the cap.")) }
    }
}

/// A header row in words; a header wraps only between its words (`<wbr>` between the words of a
/// Japanese header, whose `word-break:keep-all` forbids the breaks between its characters).
fn table_head(lang: Lang, columns: &[&'static str], right_from: usize) -> Markup {
    let words = |c: &'static str| {
        html! { @for (i, w) in lang.words_of(c).iter().enumerate() { @if i > 0 { wbr; } (w) } }
    };
    html! {
        thead { tr {
            @for (i, c) in columns.iter().enumerate() {
                @if i >= right_from { th.n { (words(c)) } } @else { th { (words(c)) } }
            }
        } }
    }
}

fn head(h: &Header, lang: Lang) -> Markup {
    let title = lang.tr("Coupon overrun report");
    html! {
        (DOCTYPE)
        html lang=(lang.code()) {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) ", " (h.as_of) }
            style { (PreEscaped(STYLE)) }
        }
        body {
        h1 { (title) }
        dl.facts { @for (k, v) in facts(lang, h) { dt { (k) } dd { (v) } } }
        section.totals {
            h2 { (lang.tr("Totals")) }
            div.scroll { table { tbody {
                @for (label, v) in totals_lines(lang, &h.totals) { tr { td { (label) } td.n { (v) } } }
            } } }
        }
        section.campaign-chart {
            h2 { (lang.tr("Budget versus issued, per campaign")) }
            (campaign_chart(h, lang))
        }
        section.campaigns {
            h2 { (lang.tr("Campaigns")) " (" (int(h.campaigns.len() as i64)) ")" }
            div.scroll { table {
                (table_head(lang, &titled("campaign_id", &CAMPAIGN_NUMBERS), 1))
                tbody { @for c in &h.campaigns { tr {
                    td.id { (c.campaign_id) }
                    @for v in c.numbers() { td.n { (int(v)) } }
                } } }
            } }
        }
        section.lost-updates {
            h2 { (lang.tr(LOST_UPDATES_TITLE)) }
            p { (lang.tr("Source")) ": " (h.legacy_counter.explain(lang)) }
            div.scroll { table {
                (table_head(lang, &titled("campaign_id", &LOST_UPDATE_NUMBERS), 1))
                tbody { @for c in h.campaigns.iter().filter(|c| c.legacy_counter_yen.is_some()) { tr {
                    td.id { (c.campaign_id) }
                    @for v in c.lost_updates() { td.n { (v.map(int).unwrap_or_default()) } }
                } } }
            } }
        }
        }
        }
    }
}

impl<W: Write> Render for Html<W> {
    fn begin(&mut self, h: &Header) -> io::Result<()> {
        if h.totals.members_over_monthly_cap > 0 {
            self.buckets = Buckets::new(
                h.coupon_step_yen,
                h.monthly_cap_yen,
                h.member_widths.max_used_yen - h.monthly_cap_yen,
                12,
            );
        }
        let mut page = head(h, self.lang).into_string();
        // The page is written in pieces so the member table streams: close nothing yet.
        for closing in ["</html>", "</body>"] {
            if let Some(cut) = page.rfind(closing) {
                page.truncate(cut);
            }
        }
        self.out.write_all(page.as_bytes())?;
        let lang = self.lang;
        self.write(html! {
            (PreEscaped("<section class=\"members\">"))
            h2 { (lang.tr("Members over the monthly cap")) " (" (int(h.totals.members_over_monthly_cap)) ")" }
            (PreEscaped("<div class=\"scroll\"><table>"))
            (table_head(lang, &MEMBER_FIELDS, 2))
            (PreEscaped("<tbody>"))
        })
    }

    fn member(&mut self, m: &MemberRow) -> io::Result<()> {
        if m.overrun_yen > 0 {
            self.buckets.add(m.overrun_yen);
        }
        if !self.shown.next() {
            return Ok(());
        }
        self.write(html! { tr {
            td.id { (m.member_id) } td { (m.month) }
            td.n { (int(m.used_yen)) } td.n { (int(m.cap_yen)) } td.n { (int(m.overrun_yen)) }
        } })
    }

    fn end(&mut self, h: &Header) -> io::Result<()> {
        let lang = self.lang;
        let more = left_out(lang, self.shown.rows, h.totals.members_over_monthly_cap);
        let buckets = std::mem::take(&mut self.buckets);
        self.write(html! {
            (PreEscaped("</tbody></table></div>"))
            @if let Some(line) = more { p.more { (line) } }
            (PreEscaped("</section>"))
            section.histogram {
                h2 { (lang.tr("Distribution of member overruns past the monthly cap")) }
                @if buckets.counts.is_empty() {
                    p { (lang.tr("No member is over the monthly cap.")) }
                } @else {
                    (histogram(&buckets, lang))
                }
            }
            (PreEscaped("</body></html>"))
        })?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::{tick_step, Buckets};

    #[test]
    fn buckets_follow_the_coupon_amounts() {
        // 1,000-yen coupons over a 2,000-yen cap: overruns are 1,000, 2,000, ...
        let b = Buckets::new(1000, 2000, 5000, 12);
        assert_eq!(b.counts.len(), 5);
        assert_eq!(b.range(0), (1000, 1000));
        assert_eq!(b.range(4), (5000, 5000));
        // 1,500-yen coupons over 2,000: 3,000 - 2,000 = 1,000, then every 1,500.
        let b = Buckets::new(1500, 2000, 1000 + 1500 * 30, 12);
        assert_eq!(b.range(0), (1000, 1000 + 1500 * 2));
        assert!(b.counts.len() <= 12);
        let mut b = Buckets::new(1000, 2000, 30_000, 12);
        assert_eq!(b.range(0), (1000, 3000));
        b.add(3000);
        b.add(4000);
        assert_eq!(b.counts[..2], [1, 1]);
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(20_000_000, 5), 5_000_000);
        assert_eq!(tick_step(7, 5), 2);
        assert_eq!(tick_step(1, 5), 1);
    }
}
