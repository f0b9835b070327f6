//! The report as CSV: one section per file, so that summing a column never double counts.
//!
//! RFC 4180 (CRLF, a header row). Three sections: `summary` (where and when the figures come
//! from, and every total, one per row), `campaigns` and `members` (the member-months over the
//! cap). Totals live in the summary only. The campaign and member rows end with `as_of`, `state`
//! and `database`, so a sheet carries its own provenance.
//!
//! Safe to open in a spreadsheet: every text cell that starts with `=`, `+`, `-`, `@`, a tab or a
//! carriage return gets a leading `'` (OWASP's advice on CSV injection), and text cells are
//! quoted, so a separator or a quote in an id cannot start a new cell. Amounts are written as
//! plain integers and never neutralised: a negative difference stays a number.
//!
//! `Csv` writes each section it is given into its own writer (`commands/report.rs` gives it one
//! temporary file per section, or stdout for `--section`); `neutralise` is the formula guard.

use std::io::{self, Write};

use super::{Header, Lang, LegacyCounterSource, MemberRow, CAMPAIGN_NUMBERS, LOST_UPDATE_NUMBERS};

/// A CSV section, as `--section` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Summary,
    Campaigns,
    Members,
}

impl Section {
    pub const ALL: [Section; 3] = [Section::Summary, Section::Campaigns, Section::Members];

    pub fn name(self) -> &'static str {
        match self {
            Section::Summary => "summary",
            Section::Campaigns => "campaigns",
            Section::Members => "members",
        }
    }
}

/// A text cell made safe for a spreadsheet: a leading `'` where the cell would start with a
/// character a spreadsheet takes as the start of a formula.
pub fn neutralise(text: &str) -> std::borrow::Cow<'_, str> {
    match text.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{text}").into(),
        _ => text.into(),
    }
}

/// One cell: text (neutralised and quoted), an amount (a bare integer) or nothing.
enum Cell<'a> {
    Text(&'a str),
    Number(i64),
    Empty,
}

impl Cell<'_> {
    fn amount(v: Option<i64>) -> Self {
        v.map(Cell::Number).unwrap_or(Cell::Empty)
    }
}

const PROVENANCE: [&str; 3] = ["as_of", "state", "database"];

struct Sheet<W: Write> {
    out: W,
}

impl<W: Write> Sheet<W> {
    fn new(mut out: W, excel: bool) -> io::Result<Self> {
        if excel {
            out.write_all("\u{feff}".as_bytes())?;
        }
        Ok(Sheet { out })
    }

    /// Writes one record. The csv crate's quoting decides by content, which would leave a
    /// text cell that looks like a number unquoted; quoting is done here by kind instead.
    fn record(&mut self, cells: &[Cell<'_>]) -> io::Result<()> {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            match cell {
                Cell::Number(n) => line.push_str(&n.to_string()),
                Cell::Empty => {}
                Cell::Text(t) => {
                    line.push('"');
                    line.push_str(&neutralise(t).replace('"', "\"\""));
                    line.push('"');
                }
            }
        }
        line.push_str("\r\n");
        self.out.write_all(line.as_bytes())
    }

    fn header(&mut self, lang: Lang, names: &[&'static str]) -> io::Result<()> {
        let cells: Vec<Cell> = names.iter().map(|n| Cell::Text(lang.tr(n))).collect();
        self.record(&cells)
    }
}

/// Writes the sections it was given, each into its own writer, from the one snapshot.
pub struct Csv<W: Write> {
    summary: Option<Sheet<W>>,
    campaigns: Option<Sheet<W>>,
    members: Option<Sheet<W>>,
    provenance: [String; 3],
    lang: Lang,
}

impl<W: Write> Csv<W> {
    /// `excel` starts each file with a UTF-8 byte order mark, which Excel needs to read
    /// UTF-8 (in Japan it otherwise assumes Shift_JIS).
    /// `lang` is the language of the header rows; cells are the same in every language.
    pub fn new(sections: Vec<(Section, W)>, excel: bool, lang: Lang) -> io::Result<Self> {
        let mut csv = Csv {
            summary: None,
            campaigns: None,
            members: None,
            provenance: Default::default(),
            lang,
        };
        for (section, out) in sections {
            let sheet = Some(Sheet::new(out, excel)?);
            match section {
                Section::Summary => csv.summary = sheet,
                Section::Campaigns => csv.campaigns = sheet,
                Section::Members => csv.members = sheet,
            }
        }
        Ok(csv)
    }
}

fn summary(sheet: &mut Sheet<impl Write>, lang: Lang, h: &Header) -> io::Result<()> {
    sheet.header(lang, &["key", "value"])?;
    let texts = [
        ("as_of", h.as_of.clone()),
        ("state", h.state.as_str().to_string()),
        ("database", h.database.label()),
    ];
    for (key, value) in &texts {
        sheet.record(&[Cell::Text(key), Cell::Text(value)])?;
    }
    sheet.record(&[
        Cell::Text("monthly_cap_yen"),
        Cell::Number(h.monthly_cap_yen),
    ])?;
    for (key, value) in h.totals.fields() {
        sheet.record(&[Cell::Text(key), Cell::Number(value)])?;
    }
    let (source, recorded_at) = match &h.legacy_counter {
        LegacyCounterSource::Live => ("live", ""),
        LegacyCounterSource::DeployGate { recorded_at } => ("deploy_gate", recorded_at.as_str()),
        LegacyCounterSource::NotRecorded => ("not_recorded", ""),
    };
    sheet.record(&[Cell::Text("legacy_counter_source"), Cell::Text(source)])?;
    sheet.record(&[
        Cell::Text("legacy_counter_recorded_at"),
        Cell::Text(recorded_at),
    ])?;
    for (key, value) in h.totals.lost_updates() {
        sheet.record(&[Cell::Text(key), Cell::amount(value)])?;
    }
    sheet.out.flush()
}

impl<W: Write> super::Render for Csv<W> {
    fn begin(&mut self, h: &Header) -> io::Result<()> {
        self.provenance = [
            h.as_of.clone(),
            h.state.as_str().to_string(),
            h.database.label(),
        ];
        if let Some(sheet) = &mut self.summary {
            summary(sheet, self.lang, h)?;
        }
        if let Some(sheet) = &mut self.campaigns {
            let names: Vec<&str> = std::iter::once("campaign_id")
                .chain(CAMPAIGN_NUMBERS)
                .chain(LOST_UPDATE_NUMBERS)
                .chain(PROVENANCE)
                .collect();
            sheet.header(self.lang, &names)?;
            for c in &h.campaigns {
                let mut cells = vec![Cell::Text(&c.campaign_id)];
                cells.extend(c.numbers().into_iter().map(Cell::Number));
                cells.extend(c.lost_updates().into_iter().map(Cell::amount));
                cells.extend(self.provenance.iter().map(|p| Cell::Text(p)));
                sheet.record(&cells)?;
            }
            sheet.out.flush()?;
        }
        if let Some(sheet) = &mut self.members {
            let names: Vec<&str> = ["member_id", "month", "used_yen", "cap_yen", "overrun_yen"]
                .into_iter()
                .chain(PROVENANCE)
                .collect();
            sheet.header(self.lang, &names)?;
        }
        Ok(())
    }

    fn member(&mut self, m: &MemberRow) -> io::Result<()> {
        let Some(sheet) = &mut self.members else {
            return Ok(());
        };
        let [as_of, state, database] = &self.provenance;
        sheet.record(&[
            Cell::Text(&m.member_id),
            Cell::Text(&m.month),
            Cell::Number(m.used_yen),
            Cell::Number(m.cap_yen),
            Cell::Number(m.overrun_yen),
            Cell::Text(as_of),
            Cell::Text(state),
            Cell::Text(database),
        ])
    }

    fn end(&mut self, _h: &Header) -> io::Result<()> {
        if let Some(sheet) = &mut self.members {
            sheet.out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::neutralise;

    #[test]
    fn cells_that_a_spreadsheet_would_evaluate_are_neutralised() {
        for (text, safe) in [
            ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"),
            ("+1+1", "'+1+1"),
            ("-1+1", "'-1+1"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tx", "'\tx"),
            ("\rx", "'\rx"),
            ("SW-A", "SW-A"),
            ("秋-セール", "秋-セール"),
            ("", ""),
            ("a=b", "a=b"),
        ] {
            assert_eq!(neutralise(text), safe, "{text:?}");
        }
    }
}
