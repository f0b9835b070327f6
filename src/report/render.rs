//! The report's renderings. Each one is told the header (everything but the member rows),
//! then each member row as it arrives from the server, then the end; none of them holds the
//! member rows, so a report of any size is written in constant memory.
//!
//! The `Render` trait (`begin(header)`, `member(row)`, `end(header)`) and two implementations:
//! `Text` (psql-style and Markdown, padded by display width with `unicode-width`; Markdown escapes
//! markup and HTML from the data; past its member limit it says `wants_more_members` false) and
//! `Json` (written piece by piece in the contract's key order). The others: `csv_sections::Csv`,
//! `html::Html`, `xlsx::Xlsx`.

use std::io::{self, Write};

use unicode_width::UnicodeWidthStr;

use crate::human::int;

use super::{DuplicateRow, Header, Lang, MemberRow, Totals, CAMPAIGN_NUMBERS, LOST_UPDATE_NUMBERS};

pub trait Render {
    fn begin(&mut self, header: &Header) -> io::Result<()>;
    fn member(&mut self, row: &MemberRow) -> io::Result<()>;
    /// Whether the rendering lists the redeemed legacy duplicates one by one (the workbook
    /// does); they are then streamed after the members, before `end`.
    fn wants_redeemed_duplicates(&self) -> bool {
        false
    }
    fn redeemed_duplicate(&mut self, _row: &DuplicateRow) -> io::Result<()> {
        Ok(())
    }
    /// False once the rendering has shown all the member rows it will show: the report
    /// stops fetching them.
    fn wants_more_members(&self) -> bool {
        true
    }
    fn end(&mut self, header: &Header) -> io::Result<()>;
}

/// `first` and then `rest`: a table's column names.
pub(super) fn titled(first: &'static str, rest: &[&'static str]) -> Vec<&'static str> {
    std::iter::once(first).chain(rest.iter().copied()).collect()
}

pub(super) const MEMBER_FIELDS: [&str; 5] =
    ["member_id", "month", "used_yen", "cap_yen", "overrun_yen"];

/// The facts above the tables, as (label, value), in `lang`.
pub(super) fn facts(lang: Lang, h: &Header) -> [(&'static str, String); 4] {
    [
        (
            lang.tr("As of"),
            format!("{} {}", h.as_of, lang.tr("(Asia/Tokyo)")),
        ),
        (lang.tr("Database"), h.database.label()),
        (lang.tr("State"), lang.tr(h.state.explain()).to_string()),
        (
            lang.tr("Monthly cap"),
            format!(
                "{} {}",
                int(h.monthly_cap_yen),
                lang.tr("yen per member and month")
            ),
        ),
    ]
}

/// The totals as (label for people, amount in yen with separators), in `lang`.
pub(super) fn totals_lines(lang: Lang, t: &Totals) -> [(&'static str, String); 6] {
    let lines = [
        ("Campaign overruns (yen)", int(t.campaign_overrun_yen)),
        (
            "Member overruns past the monthly cap (yen)",
            int(t.member_overrun_yen),
        ),
        ("Voided by the repair (yen)", int(t.voided_yen)),
        (
            "Redeemed legacy duplicates: money lost (yen)",
            int(t.redeemed_legacy_duplicates_yen),
        ),
        (
            "Voided, then redeemed anyway by the old cart (yen)",
            int(t.voided_then_redeemed_yen),
        ),
        (
            "Lost updates: issued by the old system, missing from its counter (yen)",
            t.lost_update_yen
                .map(int)
                .unwrap_or_else(|| lang.tr("not recorded").into()),
        ),
    ];
    lines.map(|(label, v)| (lang.tr(label), v))
}

// ---------------------------------------------------------------------------------------
// Text tables: the terminal (psql style) and Markdown.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextStyle {
    Table,
    Markdown,
}

struct Column {
    title: &'static str,
    width: usize,
    right: bool,
}

/// The columns `titles` names, headed in words on the terminal (`Budget (yen)`) and by the
/// JSON's field names in Markdown (`budget_yen`), translated to `lang`.
fn columns(
    lang: Lang,
    style: TextStyle,
    titles: &[&'static str],
    right_from: usize,
) -> Vec<Column> {
    titles
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let title = match style {
                TextStyle::Table => lang.words(t),
                TextStyle::Markdown => lang.tr(t),
            };
            Column {
                title,
                width: title.width(),
                right: i >= right_from,
            }
        })
        .collect()
}

pub struct Text<W: Write> {
    out: W,
    style: TextStyle,
    lang: Lang,
    members: Vec<Column>,
    shown: Shown,
}

/// How many member rows a rendering shows (`--members`), and has shown.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Shown {
    pub(super) limit: Option<u64>,
    pub(super) rows: u64,
}

impl Shown {
    /// Whether the next row is shown; counts it if so.
    pub(super) fn next(&mut self) -> bool {
        if self.limit.is_some_and(|l| self.rows >= l) {
            return false;
        }
        self.rows += 1;
        true
    }

    fn full(&self) -> bool {
        self.limit.is_some_and(|l| self.rows >= l)
    }

    /// The line that says how many rows were left out and how to get them, if any were.
    pub(super) fn left_out(&self, lang: Lang, total: i64) -> Option<String> {
        let more = total - self.rows as i64;
        (more > 0).then(|| match lang {
            Lang::En => format!(
                "... and {} more member-months over the cap, not shown. Every row: add --members all, or write a file: --output overruns.xlsx (or overruns.csv).",
                int(more)
            ),
            Lang::Ja => format!(
                "…ほかに {} 件の会員・月は表示していません。すべて表示するには --members all、ファイルに書くには --output overruns.xlsx（または overruns.csv）。",
                int(more)
            ),
        })
    }
}

impl<W: Write> Text<W> {
    pub fn new(out: W, style: TextStyle, lang: Lang) -> Self {
        Text {
            out,
            style,
            lang,
            members: Vec::new(),
            shown: Shown::default(),
        }
    }

    /// Shows the first `limit` member rows only (None: every row).
    pub fn with_member_limit(mut self, limit: Option<u64>) -> Self {
        self.shown.limit = limit;
        self
    }

    fn cell(&self, text: &str) -> String {
        match self.style {
            TextStyle::Table => text
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect(),
            TextStyle::Markdown => markdown_text(text),
        }
    }

    fn row(&mut self, cols: &[Column], cells: &[String]) -> io::Result<()> {
        let mut line = String::new();
        if self.style == TextStyle::Markdown {
            line.push('|');
        }
        for (i, (col, cell)) in cols.iter().zip(cells).enumerate() {
            if i > 0 && self.style == TextStyle::Table {
                line.push('|');
            }
            let pad = col.width.saturating_sub(cell.width());
            line.push(' ');
            if col.right {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
            line.push(' ');
            if self.style == TextStyle::Markdown {
                line.push('|');
            }
        }
        writeln!(self.out, "{}", line.trim_end())
    }

    fn head(&mut self, cols: &[Column]) -> io::Result<()> {
        let titles: Vec<String> = cols.iter().map(|c| c.title.to_string()).collect();
        self.row(cols, &titles)?;
        let mut line = String::new();
        match self.style {
            TextStyle::Table => {
                for (i, c) in cols.iter().enumerate() {
                    if i > 0 {
                        line.push('+');
                    }
                    line.push_str(&"-".repeat(c.width + 2));
                }
            }
            TextStyle::Markdown => {
                line.push('|');
                for c in cols {
                    let dashes = "-".repeat(c.width + 1);
                    if c.right {
                        line.push_str(&format!("{dashes}:|"));
                    } else {
                        line.push_str(&format!(":{dashes}|"));
                    }
                }
            }
        }
        writeln!(self.out, "{line}")
    }

    fn heading(&mut self, text: &str) -> io::Result<()> {
        match self.style {
            TextStyle::Table => writeln!(self.out, "\n{text}"),
            TextStyle::Markdown => writeln!(self.out, "\n## {text}\n"),
        }
    }

    fn none(&mut self) -> io::Result<()> {
        writeln!(self.out, "{}", self.lang.tr("(none)"))
    }

    /// The legacy counter against what the old system issued, per campaign.
    fn lost_updates(&mut self, h: &Header) -> io::Result<()> {
        self.heading(self.lang.tr(LOST_UPDATES_TITLE))?;
        let source = self.cell(&h.legacy_counter.explain(self.lang));
        writeln!(self.out, "{}: {source}\n", self.lang.tr("Source"))?;
        let rows: Vec<Vec<String>> = h
            .campaigns
            .iter()
            .filter(|c| c.legacy_counter_yen.is_some())
            .map(|c| {
                std::iter::once(self.cell(&c.campaign_id))
                    .chain(
                        c.lost_updates()
                            .iter()
                            .map(|v| v.map(int).unwrap_or_default()),
                    )
                    .collect()
            })
            .collect();
        if rows.is_empty() {
            return self.none();
        }
        let mut cols = columns(
            self.lang,
            self.style,
            &titled("campaign_id", &LOST_UPDATE_NUMBERS),
            1,
        );
        widen(&mut cols, rows.iter().map(|c| c.as_slice()));
        self.head(&cols)?;
        for r in &rows {
            self.row(&cols, r)?;
        }
        Ok(())
    }
}

pub(super) const LOST_UPDATES_TITLE: &str =
    "Lost updates: the legacy counter (campaigns.issued_yen) against what the old system issued";

impl<W: Write> Render for Text<W> {
    fn begin(&mut self, h: &Header) -> io::Result<()> {
        let lang = self.lang;
        let title = lang.tr("Coupon overrun report");
        match self.style {
            TextStyle::Table => {
                writeln!(self.out, "{title}")?;
                for (k, v) in facts(lang, h) {
                    let key = format!("{k}:");
                    let pad = 12usize.saturating_sub(key.width());
                    writeln!(self.out, "{key}{} {}", " ".repeat(pad), self.cell(&v))?;
                }
            }
            TextStyle::Markdown => {
                writeln!(self.out, "# {title}\n")?;
                for (k, v) in facts(lang, h) {
                    writeln!(self.out, "- **{k}:** {}", self.cell(&v))?;
                }
            }
        }

        self.heading(lang.tr("Totals"))?;
        let lines = totals_lines(lang, &h.totals);
        let mut cols = columns(lang, self.style, &["figure", "yen"], 1);
        let cells: Vec<[String; 2]> = lines
            .iter()
            .map(|(label, v)| [label.to_string(), v.clone()])
            .collect();
        widen(&mut cols, cells.iter().map(|c| c.as_slice()));
        self.head(&cols)?;
        for c in &cells {
            self.row(&cols, c)?;
        }

        self.heading(&format!(
            "{} ({})",
            lang.tr("Campaigns"),
            int(h.campaigns.len() as i64)
        ))?;
        if h.campaigns.is_empty() {
            self.none()?;
        } else {
            // On the terminal, two tables of the same campaigns: all ten figures in one would
            // be about 250 columns wide. Markdown keeps one table.
            let all = CAMPAIGN_NUMBERS.len();
            let parts: Vec<std::ops::Range<usize>> = match self.style {
                TextStyle::Table => vec![0..6, 6..all],
                TextStyle::Markdown => std::iter::once(0..all).collect(),
            };
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    writeln!(self.out)?;
                }
                let mut cols = columns(
                    lang,
                    self.style,
                    &titled("campaign_id", &CAMPAIGN_NUMBERS[part.clone()]),
                    1,
                );
                let cells: Vec<Vec<String>> = h
                    .campaigns
                    .iter()
                    .map(|c| {
                        std::iter::once(self.cell(&c.campaign_id))
                            .chain(c.numbers()[part.clone()].iter().map(|v| int(*v)))
                            .collect()
                    })
                    .collect();
                widen(&mut cols, cells.iter().map(|c| c.as_slice()));
                self.head(&cols)?;
                for c in &cells {
                    self.row(&cols, c)?;
                }
            }
        }

        self.lost_updates(h)?;

        self.heading(&format!(
            "{} ({})",
            lang.tr("Members over the monthly cap"),
            int(h.totals.members_over_monthly_cap)
        ))?;
        let w = h.member_widths;
        let mut cols = columns(lang, self.style, &MEMBER_FIELDS, 2);
        let widest = [
            w.member_id,
            w.month,
            int(w.max_used_yen).len(),
            int(h.monthly_cap_yen).len(),
            int(w.max_used_yen - h.monthly_cap_yen).len(),
        ];
        for (c, n) in cols.iter_mut().zip(widest) {
            c.width = c.width.max(n);
        }
        if h.totals.members_over_monthly_cap == 0 {
            self.none()?;
        } else {
            self.head(&cols)?;
        }
        self.members = cols;
        Ok(())
    }

    fn member(&mut self, m: &MemberRow) -> io::Result<()> {
        if !self.shown.next() {
            return Ok(());
        }
        let cells = [
            self.cell(&m.member_id),
            self.cell(&m.month),
            int(m.used_yen),
            int(m.cap_yen),
            int(m.overrun_yen),
        ];
        let cols = std::mem::take(&mut self.members);
        let result = self.row(&cols, &cells);
        self.members = cols;
        result
    }

    fn wants_more_members(&self) -> bool {
        !self.shown.full()
    }

    fn end(&mut self, h: &Header) -> io::Result<()> {
        if let Some(line) = self
            .shown
            .left_out(self.lang, h.totals.members_over_monthly_cap)
        {
            match self.style {
                TextStyle::Table => writeln!(self.out, "{line}")?,
                TextStyle::Markdown => writeln!(self.out, "\n{}", markdown_text(&line))?,
            }
        }
        self.out.flush()
    }
}

/// Text from the data, safe in a Markdown table cell: HTML becomes entities (a renderer would
/// pass `<script>` through), the characters Markdown would read as formatting or as a cell
/// break are backslash-escaped, and control characters become spaces.
pub fn markdown_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\\' | '|' | '`' | '*' | '_' | '[' | ']' | '~' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn widen<'a>(cols: &mut [Column], rows: impl Iterator<Item = &'a [String]>) {
    for row in rows {
        for (c, cell) in cols.iter_mut().zip(row) {
            c.width = c.width.max(cell.width());
        }
    }
}

// ---------------------------------------------------------------------------------------
// JSON: written piece by piece so the member array streams; key order is the contract's.

pub struct Json<W: Write> {
    out: W,
    first_member: bool,
}

impl<W: Write> Json<W> {
    pub fn new(out: W) -> Self {
        Json {
            out,
            first_member: true,
        }
    }
}

fn to_json(value: &impl serde::Serialize) -> io::Result<String> {
    serde_json::to_string(value).map_err(io::Error::other)
}

impl<W: Write> Render for Json<W> {
    fn begin(&mut self, h: &Header) -> io::Result<()> {
        writeln!(self.out, "{{")?;
        writeln!(self.out, "  \"as_of\": {},", to_json(&h.as_of)?)?;
        writeln!(self.out, "  \"monthly_cap_yen\": {},", h.monthly_cap_yen)?;
        writeln!(self.out, "  \"database\": {},", to_json(&h.database)?)?;
        writeln!(self.out, "  \"state\": {},", to_json(&h.state)?)?;
        writeln!(
            self.out,
            "  \"legacy_counter\": {},",
            to_json(&h.legacy_counter)?
        )?;
        write!(self.out, "  \"campaigns\": [")?;
        for (i, c) in h.campaigns.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(self.out, "{sep}\n    {}", to_json(c)?)?;
        }
        let close = if h.campaigns.is_empty() { "" } else { "\n  " };
        write!(self.out, "{close}],\n  \"members_over_monthly_cap\": [")
    }

    fn member(&mut self, m: &MemberRow) -> io::Result<()> {
        let sep = if self.first_member { "" } else { "," };
        self.first_member = false;
        write!(self.out, "{sep}\n    {}", to_json(m)?)
    }

    fn end(&mut self, h: &Header) -> io::Result<()> {
        let close = if self.first_member { "" } else { "\n  " };
        writeln!(self.out, "{close}],")?;
        writeln!(self.out, "  \"totals\": {}", to_json(&h.totals)?)?;
        writeln!(self.out, "}}")?;
        self.out.flush()
    }
}
