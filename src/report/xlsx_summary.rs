//! The workbook's first sheet, for a reader who files it: one row per figure, as label, value
//! and a one-line explanation, in the report's language; and the page setup every sheet
//! shares (A4, fit to one page wide, the header row on every page, a footer with the report's
//! as-of time and the page number).
//!
//! Rows: as of (a date cell, Asia/Tokyo), state, database, where the lost updates come from,
//! the monthly cap, every total in the JSON's order (`Totals::fields`), then the lost-update
//! totals. `SUMMARY_TOTALS` names each total in words; its keys are the JSON's, and a unit test
//! checks they are the same set and in the same order.

use rust_xlsxwriter::{ExcelDateTime, Format, RowNum, Worksheet, XlsxError};
use unicode_width::UnicodeWidthStr;

use super::{legacy_counter::Source, Header, Lang};

/// A total's JSON key, its label and its explanation (English; Japanese in `lang.rs`).
pub(super) const SUMMARY_TOTALS: [(&str, &str, &str); 16] = [
    (
        "campaign_overrun_yen",
        "Campaign overruns (yen)",
        "Issued past each campaign's budget, over the campaigns that passed it.",
    ),
    (
        "member_overrun_yen",
        "Member overruns past the monthly cap (yen)",
        "Coupons past the monthly cap, over the member-months that passed it.",
    ),
    (
        "voided_yen",
        "Voided by the repair (yen)",
        "Duplicate coupons the repair voided: taken back before use.",
    ),
    (
        "redeemed_legacy_duplicates_yen",
        "Redeemed legacy duplicates: money lost (yen)",
        "Duplicates already redeemed, so kept as history: money lost.",
    ),
    (
        "voided_then_redeemed_yen",
        "Voided, then redeemed anyway by the old cart (yen)",
        "Voided coupons the old cart redeemed anyway; part of the voided amount.",
    ),
    (
        "budget_yen",
        "Budgets, all campaigns (yen)",
        "The campaigns' budgets added up.",
    ),
    (
        "issued_yen",
        "Issued, all campaigns (yen)",
        "Coupons that are not voided, added up.",
    ),
    (
        "coupons",
        "Coupons not voided",
        "How many coupons stand, all campaigns.",
    ),
    (
        "voided_coupons",
        "Voided coupons",
        "How many coupons the repair voided.",
    ),
    (
        "redeemed_legacy_duplicates",
        "Redeemed duplicates (coupons)",
        "How many duplicates were already redeemed.",
    ),
    (
        "voided_then_redeemed",
        "Voided, then redeemed (coupons)",
        "How many voided coupons were redeemed anyway.",
    ),
    (
        "members_over_monthly_cap",
        "Member-months over the cap",
        "Members and months whose coupons pass the monthly cap.",
    ),
    (
        "member_used_yen",
        "Used in those member-months (yen)",
        "All the coupons of the member-months over the cap.",
    ),
    (
        "legacy_counter_yen",
        "Legacy counter (yen)",
        "What the old system's counter said it had issued.",
    ),
    (
        "old_system_issued_yen",
        "Issued by the old system (yen)",
        "What the old system really issued, voided coupons included.",
    ),
    (
        "lost_update_yen",
        "Lost updates (yen)",
        "Issued, yet missing from the counter: updates lost to double taps.",
    ),
];

/// The date cells' format (the header names the zone).
pub(super) const DATE_FORMAT: &str = "yyyy-mm-dd hh:mm:ss";

/// `YYYY-MM-DD HH:MM:SS` (or ISO 8601 with `T` and an offset, which is dropped: the report's
/// times are all Asia/Tokyo) as an Excel date.
pub(super) fn tokyo_datetime(text: &str) -> Option<ExcelDateTime> {
    let local = text.get(..19)?;
    ExcelDateTime::parse_from_str(local).ok()
}

/// The formats the summary writes its values with.
pub(super) struct Formats<'a> {
    pub header: &'a Format,
    pub yen: &'a Format,
    pub count: &'a Format,
    pub date: &'a Format,
    pub note: &'a Format,
}

/// Writes the summary into `sheet`; returns the next free row.
pub(super) fn write(
    sheet: &mut Worksheet,
    lang: Lang,
    h: &Header,
    f: &Formats,
) -> Result<RowNum, XlsxError> {
    for (col, title) in ["Figure", "Value", "What it means"].iter().enumerate() {
        sheet.write_string_with_format(0, col as u16, lang.tr(title), f.header)?;
    }
    sheet.set_freeze_panes(1, 0)?;
    for (col, width) in WIDTHS.iter().enumerate() {
        sheet.set_column_width(col as u16, *width as f64)?;
    }

    let as_of = lang.tr("As of (Asia/Tokyo)");
    sheet.write_string(1, 0, as_of)?;
    match tokyo_datetime(&h.as_of) {
        Some(d) => sheet.write_datetime_with_format(1, 1, d, f.date)?,
        None => sheet.write_string(1, 1, &h.as_of)?,
    };
    let snapshot = "Every figure is from one read-only snapshot of the database at this time.";
    sheet.write_string_with_format(1, 2, lang.tr(snapshot), f.note)?;
    fit_height(sheet, 1, &["", lang.tr(snapshot)])?;

    let source = match &h.legacy_counter {
        Source::Live => lang.tr("live"),
        Source::DeployGate { .. } => lang.tr("recorded at the deploy gate"),
        Source::NotRecorded => lang.tr("not recorded"),
    };
    let texts = [
        (
            "State",
            lang.tr(h.state.as_str()).to_string(),
            lang.tr(h.state.explain()).to_string(),
        ),
        (
            "Database",
            h.database.label(),
            lang.tr("Where the figures were read: host, port and database name.")
                .to_string(),
        ),
        (
            "Lost updates: source",
            source.to_string(),
            h.legacy_counter.explain(lang),
        ),
    ];
    let mut row = 2;
    for (label, value, note) in texts {
        sheet.write_string(row, 0, lang.tr(label))?;
        sheet.write_string_with_format(row, 1, &value, f.note)?;
        sheet.write_string_with_format(row, 2, &note, f.note)?;
        fit_height(sheet, row, &[&value, &note])?;
        row += 1;
    }

    sheet.write_string(row, 0, lang.tr("Monthly cap (yen)"))?;
    sheet.write_number_with_format(row, 1, h.monthly_cap_yen as f64, f.yen)?;
    let cap = "The most a member may receive in coupons in one month.";
    sheet.write_string_with_format(row, 2, lang.tr(cap), f.note)?;
    fit_height(sheet, row, &["", lang.tr(cap)])?;
    row += 1;

    let values = h
        .totals
        .fields()
        .into_iter()
        .map(|(k, v)| (k, Some(v)))
        .chain(h.totals.lost_updates());
    for ((key, value), (_, label, note)) in values.zip(SUMMARY_TOTALS) {
        sheet.write_string(row, 0, lang.tr(label))?;
        if let Some(v) = value {
            let format = if key.ends_with("_yen") {
                f.yen
            } else {
                f.count
            };
            sheet.write_number_with_format(row, 1, v as f64, format)?;
        }
        sheet.write_string_with_format(row, 2, lang.tr(note), f.note)?;
        fit_height(sheet, row, &["", lang.tr(note)])?;
        row += 1;
    }
    Ok(row)
}

/// The summary's column widths, in characters: label, value, explanation.
const WIDTHS: [usize; 3] = [44, 40, 72];

/// Makes `row` tall enough for its wrapped value and explanation (`texts`): neither Excel nor
/// LibreOffice grows a row for wrapped text written by a program, and the lines would overlap.
fn fit_height(sheet: &mut Worksheet, row: RowNum, texts: &[&str; 2]) -> Result<(), XlsxError> {
    let lines = texts
        .iter()
        .zip(&WIDTHS[1..])
        .map(|(text, width)| text.width().div_ceil(width - 2).max(1))
        .max()
        .unwrap_or(1);
    if lines > 1 {
        sheet.set_row_height(row, 15.0 * lines as f64 + 2.0)?;
    }
    Ok(())
}

/// How a sheet prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Print {
    /// Landscape, on one page: the summary.
    OnePage,
    /// Landscape, one page wide and as long as it takes.
    Wide,
    /// Portrait, one page wide and as long as it takes.
    Narrow,
}

/// A4, fit to one page wide (and to one page for `Print::OnePage`), the header row repeated
/// on each page, gridlines, and a footer: the as-of time, the sheet's name and the page.
pub(super) fn page_setup(
    sheet: &mut Worksheet,
    lang: Lang,
    h: &Header,
    print: Print,
) -> Result<(), XlsxError> {
    const A4: u8 = 9;
    sheet.set_paper_size(A4);
    if print != Print::Narrow {
        sheet.set_landscape();
    }
    sheet.set_print_fit_to_pages(1, u16::from(print == Print::OnePage));
    sheet.set_repeat_rows(0, 0)?;
    sheet.set_print_gridlines(true);
    // `&` starts a code in a footer (`&P` the page, `&N` the pages, `&A` the sheet's name).
    let as_of = h
        .as_of
        .get(..19)
        .unwrap_or(&h.as_of)
        .replace(['T', '&'], " ");
    let footer = match lang {
        Lang::En => format!("&LAs of {as_of} (Asia/Tokyo)&C&A&RPage &P of &N"),
        Lang::Ja => format!("&L基準日時 {as_of}（日本時間）&C&A&R&P / &N ページ"),
    };
    sheet.set_footer(footer);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Totals;

    #[test]
    fn every_total_has_a_label_in_the_json_order() {
        let t = Totals::default();
        let keys: Vec<&str> = t
            .fields()
            .iter()
            .map(|(k, _)| *k)
            .chain(t.lost_updates().iter().map(|(k, _)| *k))
            .collect();
        let labelled: Vec<&str> = SUMMARY_TOTALS.iter().map(|(k, _, _)| *k).collect();
        assert_eq!(keys, labelled);
        for (_, label, note) in SUMMARY_TOTALS {
            assert_ne!(Lang::Ja.tr(label), label, "Japanese for {label}");
            assert_ne!(Lang::Ja.tr(note), note, "Japanese for {note}");
        }
    }

    #[test]
    fn dates_are_read_in_tokyo_time() {
        // Excel counts days from 1899-12-30: 2026-10-01 is day 46,296.
        let d = tokyo_datetime("2026-10-01T09:30:00+09:00").unwrap();
        assert!((d.to_excel() - (46_296.0 + 9.5 / 24.0)).abs() < 1e-9);
        assert!(tokyo_datetime("soon").is_none());
    }
}
