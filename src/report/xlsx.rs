//! The report as an Excel workbook (`rust_xlsxwriter`), for an accountant to read, print and
//! file.
//!
//! Sheets, named in the report's language: the summary (`xlsx_summary`: label, value and a
//! one-line explanation for every figure), the campaigns (with a chart of budget against issued,
//! the issued bar red where over budget, as on the page), the member-months over the cap and the
//! redeemed duplicates (the legacy duplicates already redeemed: the money lost). Headers are
//! words, in the report's language; amounts are numbers with a yen format, ids are strings
//! (Excel never evaluates a string cell), times are date cells whose header names the zone
//! (Asia/Tokyo); header rows are frozen and filtered. Every sheet prints on A4, one page wide
//! (the summary on one page), its header row on every page, with a footer of the as-of time,
//! the sheet's name and the page number. The two long sheets are in constant-memory mode: each
//! row goes to a temporary file as it arrives, so memory stays flat whatever the row count; a
//! sheet that would pass Excel's 1,048,576 rows continues on another (`... (2)`), and the summary
//! says so. The zip is written into the output only at the end.
//!
//! `Xlsx` writes the summary and the campaigns (with the chart) at `begin`, the members and the
//! redeemed duplicates (streamed by `report::generate` only because `wants_redeemed_duplicates` is
//! true here) into constant-memory sheets, and the zip into the output at `end`.

use std::io::{self, Write};

use rust_xlsxwriter::{
    Chart, ChartFormat, ChartLegendPosition, ChartPoint, ChartSolidFill, ChartType, ColNum, Format,
    FormatAlign, FormatBorder, RowNum, Workbook, Worksheet, XlsxError,
};

use unicode_width::UnicodeWidthStr;

use super::xlsx_summary::{self, page_setup, tokyo_datetime, Print, DATE_FORMAT};
use super::{DuplicateRow, Header, Lang, MemberRow};
use crate::human::int;

/// Excel's rows per sheet, the header included.
pub const EXCEL_ROWS: u32 = 1_048_576;

/// The sheets' names, in English (Japanese in `lang.rs`).
const SUMMARY: &str = "Summary";
const CAMPAIGNS: &str = "Campaigns";
const MEMBERS: &str = "Member-months over cap";
const DUPLICATES: &str = "Redeemed duplicates";

/// The page's colours (`html.rs`): budget, issued, issued over budget.
const BUDGET_COLOUR: &str = "#9AA5B1";
const ISSUED_COLOUR: &str = "#2F6FB0";
const OVER_COLOUR: &str = "#C0392B";

const MEMBER_COLUMNS: [&str; 5] = ["member_id", "month", "used_yen", "cap_yen", "overrun_yen"];
const DUPLICATE_COLUMNS: [&str; 7] = [
    "coupon_id",
    "campaign_id",
    "member_id",
    "month",
    "amount_yen",
    "issued_at",
    "redeemed_at",
];

fn xlsx(e: XlsxError) -> io::Error {
    io::Error::other(format!("writing the workbook: {e}"))
}

/// A long sheet written row by row, continued on a new sheet at the row limit.
struct Stream {
    title: &'static str,
    columns: &'static [&'static str],
    print: Print,
    /// Worksheet indexes, in order.
    sheets: Vec<usize>,
    /// The next row of the last sheet.
    row: RowNum,
}

pub struct Xlsx<W: Write + Send> {
    out: Option<W>,
    lang: Lang,
    book: Workbook,
    rows_per_sheet: RowNum,
    header: Format,
    yen: Format,
    count: Format,
    date: Format,
    note: Format,
    members: Stream,
    duplicates: Stream,
    summary_row: RowNum,
    /// The header, for the page setup of the sheets opened as the rows stream.
    header_seen: Option<Header>,
}

impl<W: Write + Send> Xlsx<W> {
    /// `lang` is the language of the headers and the chart; cells are the same in every
    /// language.
    pub fn new(out: W, lang: Lang) -> Self {
        Self::with_rows_per_sheet(out, lang, EXCEL_ROWS)
    }

    /// `rows_per_sheet` is Excel's limit; tests make it small to see the split.
    pub fn with_rows_per_sheet(out: W, lang: Lang, rows_per_sheet: u32) -> Self {
        Xlsx {
            out: Some(out),
            lang,
            book: Workbook::new(),
            rows_per_sheet: rows_per_sheet.max(2),
            header: Format::new()
                .set_bold()
                .set_text_wrap()
                .set_border_bottom(FormatBorder::Thin),
            yen: Format::new().set_num_format("¥#,##0;-¥#,##0"),
            count: Format::new().set_num_format("#,##0"),
            date: Format::new()
                .set_num_format(DATE_FORMAT)
                .set_align(FormatAlign::Left),
            note: Format::new().set_text_wrap(),
            members: Stream {
                title: MEMBERS,
                columns: &MEMBER_COLUMNS,
                print: Print::Narrow,
                sheets: Vec::new(),
                row: 0,
            },
            duplicates: Stream {
                title: DUPLICATES,
                columns: &DUPLICATE_COLUMNS,
                print: Print::Wide,
                sheets: Vec::new(),
                row: 0,
            },
            summary_row: 0,
            header_seen: None,
        }
    }

    fn amount(&self, column: &str) -> &Format {
        if column.ends_with("_yen") {
            &self.yen
        } else {
            &self.count
        }
    }

    fn summary(&mut self, h: &Header) -> Result<(), XlsxError> {
        let lang = self.lang;
        let formats = xlsx_summary::Formats {
            header: &self.header,
            yen: &self.yen,
            count: &self.count,
            date: &self.date,
            note: &self.note,
        };
        let sheet = self.book.add_worksheet();
        sheet.set_name(lang.tr(SUMMARY))?;
        self.summary_row = xlsx_summary::write(sheet, lang, h, &formats)?;
        page_setup(sheet, lang, h, Print::OnePage)
    }

    fn campaigns(&mut self, h: &Header) -> Result<(), XlsxError> {
        let columns: Vec<&str> = std::iter::once("campaign_id")
            .chain(super::CAMPAIGN_NUMBERS)
            .chain(super::LOST_UPDATE_NUMBERS)
            .collect();
        let formats: Vec<Format> = columns.iter().map(|c| self.amount(c).clone()).collect();
        let (header, lang) = (self.header.clone(), self.lang);
        let name = lang.tr(CAMPAIGNS);
        let sheet = self.book.add_worksheet();
        sheet.set_name(name)?;
        page_setup(sheet, lang, h, Print::Wide)?;
        // The chart sits in the printed range: gridlines would print under it.
        sheet.set_print_gridlines(false);
        let widest = h
            .campaigns
            .iter()
            .map(|c| c.campaign_id.width())
            .max()
            .unwrap_or(0);
        let widths: Vec<usize> = std::iter::once(widest.clamp(12, 40) + 2)
            .chain(std::iter::repeat_n(16, columns.len() - 1))
            .collect();
        header_row(sheet, lang, &columns, &widths, &header)?;
        sheet.set_freeze_panes(1, 0)?;
        for (r, c) in h.campaigns.iter().enumerate() {
            let row = r as RowNum + 1;
            sheet.write_string(row, 0, &c.campaign_id)?;
            let values = c
                .numbers()
                .into_iter()
                .map(Some)
                .chain(c.lost_updates())
                .enumerate();
            for (i, v) in values {
                if let Some(v) = v {
                    sheet.write_number_with_format(
                        row,
                        i as ColNum + 1,
                        v as f64,
                        &formats[i + 1],
                    )?;
                }
            }
        }
        let last = h.campaigns.len() as RowNum;
        sheet.autofilter(0, 0, last, columns.len() as ColNum - 1)?;
        if !h.campaigns.is_empty() {
            sheet.insert_chart(last + 3, 0, &chart(h, lang, name))?;
        }
        Ok(())
    }

    /// Opens the next sheet of `stream`, with its header and page setup.
    fn open(&mut self, which: fn(&mut Self) -> &mut Stream) -> Result<(), XlsxError> {
        let stream = which(self);
        let n = stream.sheets.len() + 1;
        let (title, columns, print) = (stream.title, stream.columns, stream.print);
        let (header, lang) = (self.header.clone(), self.lang);
        let title = lang.tr(title);
        let name = if n == 1 {
            title.to_string()
        } else {
            format!("{title} ({n})")
        };
        let h = self.header_seen.clone().expect("begin comes first");
        let sheet = self.book.add_worksheet_with_constant_memory()?;
        sheet.set_name(name)?;
        page_setup(sheet, lang, &h, print)?;
        let widths: Vec<usize> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| match *c {
                "coupon_id" => 38,
                "issued_at" | "redeemed_at" => 21,
                _ if i == 0 => 24,
                _ => 16,
            })
            .collect();
        header_row(sheet, lang, columns, &widths, &header)?;
        sheet.set_freeze_panes(1, 0)?;
        let index = self.book.worksheets().len() - 1;
        let stream = which(self);
        stream.sheets.push(index);
        stream.row = 1;
        Ok(())
    }

    /// The worksheet and row for `stream`'s next row: a new sheet when the stream starts or
    /// the last sheet is full.
    fn next_row(
        &mut self,
        which: fn(&mut Self) -> &mut Stream,
    ) -> Result<(usize, RowNum), XlsxError> {
        let limit = self.rows_per_sheet;
        let stream = which(self);
        if stream.sheets.is_empty() || stream.row >= limit {
            self.open(which)?;
        }
        let stream = which(self);
        let row = stream.row;
        stream.row += 1;
        Ok((*stream.sheets.last().expect("a sheet"), row))
    }

    /// Filters on each sheet of a stream, and the split said on the summary.
    fn close(&mut self, which: fn(&mut Self) -> &mut Stream) -> Result<(), XlsxError> {
        if which(self).sheets.is_empty() {
            // No row: the sheet still exists, with its header, so the workbook's shape is fixed.
            self.open(which)?;
        }
        let (sheets, next_row, columns, title) = {
            let s = which(self);
            (s.sheets.clone(), s.row, s.columns.len(), s.title)
        };
        for (i, index) in sheets.iter().enumerate() {
            let rows = if i + 1 == sheets.len() {
                next_row
            } else {
                self.rows_per_sheet
            };
            let sheet = self.book.worksheet_from_index(*index)?;
            sheet.autofilter(0, 0, rows - 1, columns as ColNum - 1)?;
        }
        if sheets.len() > 1 {
            let (lang, limit) = (self.lang, int(self.rows_per_sheet as i64));
            let title = lang.tr(title);
            let note = match lang {
                Lang::En => format!(
                    "{title}: {} sheets; Excel holds at most {limit} rows per sheet",
                    sheets.len()
                ),
                Lang::Ja => format!(
                    "{title}：{} シート（Excel の 1 シートは {limit} 行まで）",
                    sheets.len()
                ),
            };
            let row = self.summary_row;
            self.summary_row += 1;
            let note_format = self.note.clone();
            let sheet = self.book.worksheet_from_index(0)?;
            sheet.write_string(row, 0, lang.tr("Continued on more sheets"))?;
            sheet.write_number(row, 1, sheets.len() as f64)?;
            sheet.write_string_with_format(row, 2, note, &note_format)?;
        }
        Ok(())
    }

    fn write_member(&mut self, m: &MemberRow) -> Result<(), XlsxError> {
        let (index, row) = self.next_row(|x| &mut x.members)?;
        let sheet = self.book.worksheet_from_index(index)?;
        sheet.write_string(row, 0, &m.member_id)?;
        sheet.write_string(row, 1, &m.month)?;
        sheet.write_number_with_format(row, 2, m.used_yen as f64, &self.yen)?;
        sheet.write_number_with_format(row, 3, m.cap_yen as f64, &self.yen)?;
        sheet.write_number_with_format(row, 4, m.overrun_yen as f64, &self.yen)?;
        Ok(())
    }

    fn write_duplicate(&mut self, d: &DuplicateRow) -> Result<(), XlsxError> {
        let (index, row) = self.next_row(|x| &mut x.duplicates)?;
        let sheet = self.book.worksheet_from_index(index)?;
        sheet.write_string(row, 0, &d.coupon_id)?;
        sheet.write_string(row, 1, &d.campaign_id)?;
        sheet.write_string(row, 2, &d.member_id)?;
        sheet.write_string(row, 3, &d.month)?;
        sheet.write_number_with_format(row, 4, d.amount_yen as f64, &self.yen)?;
        for (col, text) in [(5, &d.issued_at), (6, &d.redeemed_at)] {
            match tokyo_datetime(text) {
                Some(at) => sheet.write_datetime_with_format(row, col, at, &self.date)?,
                None => sheet.write_string(row, col, text)?,
            };
        }
        Ok(())
    }
}

/// A header's lines in a column `width` characters wide: its words (`Lang::words_of`) packed
/// greedily, so that a line breaks between words, never inside one (Excel and LibreOffice
/// would break a Japanese header anywhere, `クーポ/ン数`).
fn header_lines(lang: Lang, column: &'static str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in lang.words_of(column) {
        match lines.last_mut() {
            Some(line) if line.width() + word.trim_end().width() < width => line.push_str(word),
            _ => lines.push(word.to_string()),
        }
    }
    lines.iter().map(|l| l.trim_end().to_string()).collect()
}

/// Row 0 of a table sheet: each column's header in words, in a column `widths` wide, and the
/// row as tall as the most lines. English is written as it reads (the spaces wrap it); Japanese
/// with a line break between the words that do not fit together.
fn header_row(
    sheet: &mut Worksheet,
    lang: Lang,
    columns: &[&'static str],
    widths: &[usize],
    format: &Format,
) -> Result<(), XlsxError> {
    let mut most = 1;
    for (i, (c, width)) in columns.iter().zip(widths).enumerate() {
        let lines = header_lines(lang, c, *width);
        most = most.max(lines.len());
        let text = match lang {
            Lang::En => lang.words(c).to_string(),
            Lang::Ja => lines.join("\n"),
        };
        sheet.write_string_with_format(0, i as ColNum, text, format)?;
        sheet.set_column_width(i as ColNum, *width as f64)?;
    }
    sheet.set_row_height(0, 15.0 * most as f64 + 3.0)?;
    Ok(())
}

/// Budget against issued per campaign, coloured as the page colours it: the issued bar red
/// where the campaign is over budget. `sheet` is the campaigns sheet's name.
fn chart(h: &Header, lang: Lang, sheet: &str) -> Chart {
    let fill = |colour: &str| {
        let mut format = ChartFormat::new();
        format.set_solid_fill(ChartSolidFill::new().set_color(colour));
        format
    };
    let last = h.campaigns.len() as RowNum;
    let mut chart = Chart::new(ChartType::Column);
    chart
        .title()
        .set_name(lang.tr("Budget against issued, per campaign (yen)"));
    chart
        .add_series()
        .set_name((sheet, 0, 1))
        .set_categories((sheet, 1, 0, last, 0))
        .set_values((sheet, 1, 1, last, 1))
        .set_format(&mut fill(BUDGET_COLOUR));
    let points: Vec<ChartPoint> = h
        .campaigns
        .iter()
        .map(|c| {
            let colour = if c.overrun_yen > 0 {
                OVER_COLOUR
            } else {
                ISSUED_COLOUR
            };
            ChartPoint::new().set_format(&mut fill(colour))
        })
        .collect();
    chart
        .add_series()
        .set_name((sheet, 0, 2))
        .set_categories((sheet, 1, 0, last, 0))
        .set_values((sheet, 1, 2, last, 2))
        .set_format(&mut fill(ISSUED_COLOUR))
        .set_points(&points);
    chart.legend().set_position(ChartLegendPosition::Bottom);
    chart.y_axis().set_num_format("¥#,##0");
    chart
        .set_width((240 + 90 * h.campaigns.len() as u32).clamp(640, 1400))
        .set_height(380);
    chart
}

impl<W: Write + Send> super::Render for Xlsx<W> {
    fn begin(&mut self, h: &Header) -> io::Result<()> {
        self.header_seen = Some(h.clone());
        self.summary(h).map_err(xlsx)?;
        self.campaigns(h).map_err(xlsx)
    }

    fn member(&mut self, m: &MemberRow) -> io::Result<()> {
        self.write_member(m).map_err(xlsx)
    }

    fn wants_redeemed_duplicates(&self) -> bool {
        true
    }

    fn redeemed_duplicate(&mut self, d: &DuplicateRow) -> io::Result<()> {
        self.write_duplicate(d).map_err(xlsx)
    }

    fn end(&mut self, _h: &Header) -> io::Result<()> {
        self.close(|x| &mut x.members).map_err(xlsx)?;
        self.close(|x| &mut x.duplicates).map_err(xlsx)?;
        let mut out = self.out.take().expect("the workbook is written once");
        self.book.save_to_writer(&mut out).map_err(xlsx)?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{legacy_counter::Source, Database, MemberWidths, Render, State, Totals};

    fn header() -> Header {
        Header {
            as_of: "2026-10-01T09:30:00+09:00".into(),
            monthly_cap_yen: 2000,
            database: Database {
                host: "h".into(),
                port: 5432,
                dbname: "d".into(),
            },
            state: State::Released,
            legacy_counter: Source::Live,
            campaigns: Vec::new(),
            totals: Totals::default(),
            member_widths: MemberWidths::default(),
            coupon_step_yen: 1,
        }
    }

    #[test]
    fn a_sheet_past_the_row_limit_continues_on_another_and_the_summary_says_so() {
        let mut bytes = Vec::new();
        let h = header();
        let mut book = Xlsx::with_rows_per_sheet(&mut bytes, Lang::En, 4);
        book.begin(&h).unwrap();
        for i in 0..7 {
            book.member(&MemberRow {
                member_id: format!("m{i}"),
                month: "2026-09".into(),
                used_yen: 3000 + i,
                cap_yen: 2000,
                overrun_yen: 1000 + i,
            })
            .unwrap();
        }
        book.end(&h).unwrap();

        use calamine::{Data, Reader};
        let mut read = calamine::Xlsx::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(
            read.sheet_names(),
            [
                SUMMARY,
                CAMPAIGNS,
                MEMBERS,
                &format!("{MEMBERS} (2)"),
                &format!("{MEMBERS} (3)"),
                DUPLICATES
            ]
        );
        // Three rows under the header per sheet: 3 + 3 + 1, in order, numbers as numbers.
        let mut ids = Vec::new();
        for (n, name) in [
            MEMBERS.to_string(),
            format!("{MEMBERS} (2)"),
            format!("{MEMBERS} (3)"),
        ]
        .iter()
        .enumerate()
        {
            let range = read.worksheet_range(name).unwrap();
            let rows: Vec<_> = range.rows().collect();
            assert_eq!(rows[0][0], Data::String("Member".into()));
            assert_eq!(rows.len(), if n < 2 { 4 } else { 2 }, "{name}");
            for r in &rows[1..] {
                ids.push(r[0].to_string());
                assert!(matches!(r[2], Data::Float(_)), "{:?}", r[2]);
            }
        }
        assert_eq!(ids, ["m0", "m1", "m2", "m3", "m4", "m5", "m6"]);
        let summary = read.worksheet_range(SUMMARY).unwrap();
        let split: Vec<String> = summary
            .rows()
            .filter(|r| r[0] == Data::String("Continued on more sheets".into()))
            .map(|r| r[2].to_string())
            .collect();
        assert_eq!(
            split,
            [format!(
                "{MEMBERS}: 3 sheets; Excel holds at most 4 rows per sheet"
            )]
        );
    }

    #[test]
    fn a_japanese_workbook_has_no_english_word_and_its_times_are_dates() {
        let mut bytes = Vec::new();
        let h = header();
        let mut book = Xlsx::with_rows_per_sheet(&mut bytes, Lang::Ja, 2);
        book.begin(&h).unwrap();
        for i in 0..2 {
            book.redeemed_duplicate(&DuplicateRow {
                coupon_id: format!("c{i}"),
                campaign_id: "SW-A".into(),
                member_id: "m1".into(),
                month: "2026-09".into(),
                amount_yen: 1000,
                issued_at: "2026-09-20 23:59:59".into(),
                redeemed_at: "2026-09-21 00:00:01".into(),
            })
            .unwrap();
        }
        book.end(&h).unwrap();

        use calamine::{Data, Reader};
        let mut read = calamine::Xlsx::new(std::io::Cursor::new(bytes)).unwrap();
        let english = regex::Regex::new(r"[A-Za-z]{3,}").unwrap();
        let mut texts = Vec::new();
        for name in read.sheet_names() {
            assert!(!english.is_match(&name), "{name}");
            let range = read.worksheet_range(&name).unwrap();
            let rows: Vec<_> = range.rows().collect();
            texts.extend(rows[0].iter().map(|c| c.to_string()));
            if name == Lang::Ja.tr(SUMMARY) {
                for r in &rows[1..] {
                    texts.push(r[0].to_string());
                    texts.push(r[2].to_string());
                }
                assert!(matches!(rows[1][1], Data::DateTime(_)), "{:?}", rows[1][1]);
            }
        }
        for text in &texts {
            // Names, not words.
            let words = text.replace("Excel", "").replace("pgmend", "");
            assert!(
                !english.is_match(&words),
                "English in the Japanese workbook: {text:?}"
            );
        }
        let duplicates = read.worksheet_range(Lang::Ja.tr(DUPLICATES)).unwrap();
        let row: Vec<_> = duplicates.rows().nth(1).unwrap().to_vec();
        // 2026-09-20 23:59:59 is day 46,285 and one second short of the next.
        let Data::DateTime(issued) = &row[5] else {
            panic!("not a date: {row:?}")
        };
        assert!(
            (issued.as_f64() - (46_286.0 - 1.0 / 86_400.0)).abs() < 1e-9,
            "{row:?}"
        );
        assert!(matches!(row[6], Data::DateTime(_)), "{row:?}");
    }
}
