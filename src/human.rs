//! How numbers, amounts, counts, rates, durations and times read in every human-facing line
//! pgmend writes (terminal text, progress, prompts, Markdown and HTML). JSON, CSV and the
//! workbook carry plain values and never pass through here; `docs/formatting.md` lists which
//! time zone each output uses.

use std::time::Duration;

/// `1234567` → `1,234,567`: every count and amount a person reads is grouped by thousands.
pub fn int(n: impl Into<i128>) -> String {
    let n = n.into();
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// An amount of yen in a sentence: `1,234 yen`. Tables say "yen" in their header and use
/// [`int`] in the cells.
pub fn yen(amount: i64) -> String {
    format!("{} yen", int(amount))
}

/// A count with its noun: `1 row`, `0 rows`, `12,345 rows`. `noun` is the singular; nouns
/// whose plural is not `+s` name it after a `|`: `"batch|batches"`, `"key|keys"`.
pub fn count(n: impl Into<i128>, noun: &str) -> String {
    let n = n.into();
    let (one, many) = match noun.split_once('|') {
        Some((one, many)) => (one, many.to_string()),
        None => (noun, format!("{noun}s")),
    };
    format!("{} {}", int(n), if n == 1 { one } else { &many })
}

/// A rate per second, whole numbers from 10 up (`29,429/s`), one decimal below (`2.5/s`).
pub fn rate(per_second: f64) -> String {
    if !per_second.is_finite() || per_second < 0.0 {
        "-/s".into()
    } else if per_second >= 10.0 {
        format!("{}/s", int(per_second.round() as i64))
    } else {
        format!("{per_second:.1}/s")
    }
}

/// A share as a whole percentage, rounded down so that 99.9 % of the work is not "100%".
pub fn percent(part: i64, whole: i64) -> String {
    if whole <= 0 {
        return "100%".into();
    }
    format!(
        "{}%",
        (i128::from(part) * 100 / i128::from(whole)).clamp(0, 100)
    )
}

/// A duration the way the command line takes one: `0s`, `850ms`, `30s`, `1.5s`, `2m`,
/// `1h`; longer ones in whole units (`12m30s`, `1h05m`), so a value read off a progress line
/// can be passed back to a flag.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        if ms.is_multiple_of(1_000) {
            format!("{}s", ms / 1_000)
        } else {
            format!("{:.1}s", d.as_secs_f64())
        }
    } else {
        let s = d.as_secs();
        match (s / 3_600, s % 3_600 / 60, s % 60) {
            (0, m, 0) => format!("{m}m"),
            (0, m, s) => format!("{m}m{s:02}s"),
            (h, 0, _) => format!("{h}h"),
            (h, m, _) => format!("{h}h{m:02}m"),
        }
    }
}

/// A size on disk: `512 B`, `8.0 kB`, `1.2 MB`, `3.4 GB` (powers of 1024, as PostgreSQL's
/// `pg_size_pretty` counts them).
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Milliseconds from a batch timer, as [`duration`] writes them.
pub fn millis(ms: u64) -> String {
    duration(Duration::from_millis(ms))
}

/// The widest a human table may be, in columns: a wider one's widest cells wrap at word
/// boundaries instead of padding every row past a terminal's width.
pub const TABLE_WIDTH: usize = 120;

/// `rows` as a psql-style table no wider than [`TABLE_WIDTH`].
pub fn table<R: tabled::Tabled>(rows: impl IntoIterator<Item = R>) -> tabled::Table {
    use tabled::settings::{peaker::PriorityMax, Style, Width};
    let mut table = tabled::Table::new(rows);
    table.with(Style::psql()).with(
        Width::wrap(TABLE_WIDTH)
            .keep_words(true)
            .priority(PriorityMax::right()),
    );
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_on_disk() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(8192), "8.0 kB");
        assert_eq!(bytes(3 * 1024 * 1024 + 200 * 1024), "3.2 MB");
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(int(0), "0");
        assert_eq!(int(999), "999");
        assert_eq!(int(1000), "1,000");
        assert_eq!(int(-1_234_567), "-1,234,567");
        assert_eq!(int(i64::MIN), "-9,223,372,036,854,775,808");
        assert_eq!(int(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(yen(15_535_000), "15,535,000 yen");
    }

    #[test]
    fn counts_agree_with_their_number() {
        assert_eq!(count(1, "row"), "1 row");
        assert_eq!(count(0, "row"), "0 rows");
        assert_eq!(count(2_500, "statement"), "2,500 statements");
        assert_eq!(count(1, "batch|batches"), "1 batch");
        assert_eq!(count(3, "batch|batches"), "3 batches");
        assert_eq!(count(-1, "key"), "-1 keys");
    }

    #[test]
    fn rates_have_no_false_precision() {
        assert_eq!(rate(29_428.722_1), "29,429/s");
        assert_eq!(rate(10.0), "10/s");
        assert_eq!(rate(2.54), "2.5/s");
        assert_eq!(rate(f64::NAN), "-/s");
        assert_eq!(rate(f64::INFINITY), "-/s");
    }

    #[test]
    fn percentages_round_down() {
        assert_eq!(percent(999, 1000), "99%");
        assert_eq!(percent(1000, 1000), "100%");
        assert_eq!(percent(0, 0), "100%");
        assert_eq!(percent(1, 3), "33%");
    }

    #[test]
    fn durations_read_like_the_flags() {
        let ms = Duration::from_millis;
        assert_eq!(duration(ms(0)), "0s");
        assert_eq!(duration(ms(850)), "850ms");
        assert_eq!(duration(ms(30_000)), "30s");
        assert_eq!(duration(ms(1_500)), "1.5s");
        assert_eq!(duration(ms(120_000)), "2m");
        assert_eq!(duration(ms(750_000)), "12m30s");
        assert_eq!(duration(ms(3_600_000)), "1h");
        assert_eq!(duration(ms(3_900_000)), "1h05m");
        // What a progress line shows, a flag takes back.
        for text in ["850ms", "30s", "2m", "12m30s", "1h", "1h05m"] {
            let d = crate::config::parse_duration(text).unwrap();
            assert_eq!(duration(d), text);
        }
    }
}
