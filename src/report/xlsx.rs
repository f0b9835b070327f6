//! The report as an Excel workbook (`rust_xlsxwriter`), for accounting as it is.
//!
//! Sheets: `summary` (as of, state, database, cap, every total, where the lost updates come
//! from), `campaigns` (with a chart of budget against issued), `member-months over cap` and
//! `redeemed duplicates` (the legacy duplicates already redeemed: the money lost). Amounts are
//! numbers with a yen format, ids are strings (Excel never evaluates a string cell), header
//! rows are frozen and filtered. The two long sheets are in constant-memory mode: each row goes
//! to a temporary file as it arrives, so memory stays flat whatever the row count; a sheet that
//! would pass Excel's 1,048,576 rows continues on another (`... (2)`), and the summary says so.
//! The zip is written into the output only at the end.
//!
//! `Xlsx` writes the summary and the campaigns (with the chart) at `begin`, the members and the
//! redeemed duplicates (streamed by `report::generate` only because `wants_redeemed_duplicates` is
//! true here) into constant-memory sheets, and the zip into the output at `end`.

use std::io::{self, Write};

use rust_xlsxwriter::{
    Chart, ChartType, ColNum, Format, FormatBorder, RowNum, Workbook, XlsxError,
};

use super::{legacy_counter::Source, DuplicateRow, Header, Lang, MemberRow};
use crate::human::int;

/// Excel's rows per sheet, the header included.
pub const EXCEL_ROWS: u32 = 1_048_576;

const MEMBERS: &str = "member-months over cap";
const DUPLICATES: &str = "redeemed duplicates";

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
    members: Stream,
    duplicates: Stream,
    summary_row: RowNum,
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
            members: Stream {
                title: MEMBERS,
                columns: &MEMBER_COLUMNS,
                sheets: Vec::new(),
                row: 0,
            },
            duplicates: Stream {
                title: DUPLICATES,
                columns: &DUPLICATE_COLUMNS,
                sheets: Vec::new(),
                row: 0,
            },
            summary_row: 0,
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
        let (yen_format, count_format, header) =
            (self.yen.clone(), self.count.clone(), self.header.clone());
        let sheet = self.book.add_worksheet();
        sheet.set_name("summary")?;
        sheet.write_string_with_format(0, 0, self.lang.tr("key"), &header)?;
        sheet.write_string_with_format(0, 1, self.lang.tr("value"), &header)?;
        sheet.set_freeze_panes(1, 0)?;
        sheet.set_column_width(0, 34)?;
        sheet.set_column_width(1, 40)?;
        let mut row = 1;
        let source = match &h.legacy_counter {
            Source::Live => "live".to_string(),
            Source::DeployGate { recorded_at } => format!("deploy_gate {recorded_at}"),
            Source::NotRecorded => "not_recorded".to_string(),
        };
        for (key, value) in [
            ("as_of", h.as_of.clone()),
            ("state", h.state.as_str().to_string()),
            ("database", h.database.label()),
            ("legacy_counter_source", source),
        ] {
            sheet.write_string(row, 0, key)?;
            sheet.write_string(row, 1, value)?;
            row += 1;
        }
        let numbers = std::iter::once(("monthly_cap_yen", Some(h.monthly_cap_yen)))
            .chain(h.totals.fields().into_iter().map(|(k, v)| (k, Some(v))))
            .chain(h.totals.lost_updates());
        for (key, value) in numbers {
            sheet.write_string(row, 0, key)?;
            if let Some(v) = value {
                let format = if key.ends_with("_yen") {
                    &yen_format
                } else {
                    &count_format
                };
                sheet.write_number_with_format(row, 1, v as f64, format)?;
            }
            row += 1;
        }
        self.summary_row = row;
        Ok(())
    }

    fn campaigns(&mut self, h: &Header) -> Result<(), XlsxError> {
        let columns: Vec<&str> = std::iter::once("campaign_id")
            .chain(super::CAMPAIGN_NUMBERS)
            .chain(super::LOST_UPDATE_NUMBERS)
            .collect();
        let formats: Vec<Format> = columns.iter().map(|c| self.amount(c).clone()).collect();
        let (header, lang) = (self.header.clone(), self.lang);
        let sheet = self.book.add_worksheet();
        sheet.set_name("campaigns")?;
        for (i, c) in columns.iter().enumerate() {
            sheet.write_string_with_format(0, i as ColNum, lang.tr(c), &header)?;
        }
        sheet.set_freeze_panes(1, 0)?;
        sheet.set_row_height(0, 45)?;
        let widest = h
            .campaigns
            .iter()
            .map(|c| c.campaign_id.chars().count())
            .max()
            .unwrap_or(0);
        sheet.set_column_width(0, (widest.clamp(11, 40) + 2) as f64)?;
        for i in 1..columns.len() {
            sheet.set_column_width(i as ColNum, 16)?;
        }
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
            let mut chart = Chart::new(ChartType::Column);
            chart
                .title()
                .set_name(lang.tr("Budget against issued, per campaign (yen)"));
            for col in [1, 2] {
                chart
                    .add_series()
                    .set_name(("campaigns", 0, col))
                    .set_categories(("campaigns", 1, 0, last, 0))
                    .set_values(("campaigns", 1, col, last, col));
            }
            chart.y_axis().set_num_format("¥#,##0");
            chart
                .set_width((240 + 90 * h.campaigns.len() as u32).min(1400))
                .set_height(360);
            sheet.insert_chart(last + 3, 0, &chart)?;
        }
        Ok(())
    }

    /// Opens the next sheet of `stream`, with its header.
    fn open(&mut self, which: fn(&mut Self) -> &mut Stream) -> Result<(), XlsxError> {
        let stream = which(self);
        let n = stream.sheets.len() + 1;
        let (title, columns) = (stream.title, stream.columns);
        let name = if n == 1 {
            title.to_string()
        } else {
            format!("{title} ({n})")
        };
        let (header, lang) = (self.header.clone(), self.lang);
        let sheet = self.book.add_worksheet_with_constant_memory()?;
        sheet.set_name(name)?;
        for (i, c) in columns.iter().enumerate() {
            sheet.write_string_with_format(0, i as ColNum, lang.tr(c), &header)?;
            sheet.set_column_width(i as ColNum, if i == 0 { 38 } else { 16 })?;
        }
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
            let note = format!(
                "{title}: {} sheets; Excel holds at most {} rows per sheet",
                sheets.len(),
                int(self.rows_per_sheet as i64)
            );
            let row = self.summary_row;
            self.summary_row += 1;
            let sheet = self.book.worksheet_from_index(0)?;
            sheet.write_string(row, 0, "split")?;
            sheet.write_string(row, 1, note)?;
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
        sheet.write_string(row, 5, &d.issued_at)?;
        sheet.write_string(row, 6, &d.redeemed_at)?;
        Ok(())
    }
}

impl<W: Write + Send> super::Render for Xlsx<W> {
    fn begin(&mut self, h: &Header) -> io::Result<()> {
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
    use crate::report::{Database, MemberWidths, Render, State, Totals};

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
                "summary",
                "campaigns",
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
            assert_eq!(rows[0][0], Data::String("member_id".into()));
            assert_eq!(rows.len(), if n < 2 { 4 } else { 2 }, "{name}");
            for r in &rows[1..] {
                ids.push(r[0].to_string());
                assert!(matches!(r[2], Data::Float(_)), "{:?}", r[2]);
            }
        }
        assert_eq!(ids, ["m0", "m1", "m2", "m3", "m4", "m5", "m6"]);
        let summary = read.worksheet_range("summary").unwrap();
        let split: Vec<String> = summary
            .rows()
            .filter(|r| r[0] == Data::String("split".into()))
            .map(|r| r[1].to_string())
            .collect();
        assert_eq!(
            split,
            [format!(
                "{MEMBERS}: 3 sheets; Excel holds at most 4 rows per sheet"
            )]
        );
    }
}
