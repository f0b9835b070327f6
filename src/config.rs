//! Values the command line hands over, resolved and checked before any work starts.
//!
//! Values from the command line, checked before any work starts: `parse_duration` (the clap value
//! parser for `500ms`, `30s`, `2m`, `1h`, `0`), `format_duration` (the same notation back, for
//! messages), the health signals' thresholds (`parse_duration_threshold`, `parse_count_threshold`,
//! `parse_ratio_threshold`,
//! `parse_autovacuum_pause`: a value or `off`), and `check_lock_options`, which refuses `--lock-timeout 0`, `--statement-timeout
//! 0` and `--validate-timeout 0`. This is where a fuller resolved configuration would go; today it is only these.

use std::time::Duration;

use anyhow::{bail, Result};

/// How many batch workers a run in ranges takes (`--jobs`): `auto`, the default, lets the
/// controller choose and change it ([`crate::repair::controller`]); a number keeps it fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jobs {
    Auto,
    Fixed(u16),
}

impl std::fmt::Display for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Jobs::Auto => f.write_str("auto"),
            Jobs::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Parses `--jobs`: `auto` or a whole number from 1 to 64. Used as a clap value parser.
pub fn parse_jobs(text: &str) -> Result<Jobs, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("auto") {
        return Ok(Jobs::Auto);
    }
    match text.parse::<u16>() {
        Ok(n @ 1..=64) => Ok(Jobs::Fixed(n)),
        _ => Err(format!(
            "{text:?} is not a number of workers: write auto (pgmend chooses, the default) or a number from 1 to 64"
        )),
    }
}

/// Parses `500ms`, `30s`, `2m`, `1h` (and `0`), and the compound forms pgmend writes for
/// longer durations (`12m30s`, `1h05m`). Used as a clap value parser.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("an empty duration; write it like 500ms, 30s, 2m or 1h".into());
    }
    let mut rest = text;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("{text:?} has no unit; write it like 500ms, 30s, 2m or 1h"))?;
        let (number, after) = rest.split_at(split);
        let n: u64 = number.parse().map_err(|_| {
            format!(
                "{text:?} does not start with a whole number; write it like 500ms, 30s, 2m or 1h"
            )
        })?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let millis = match unit {
            "ms" => Some(n),
            "s" => n.checked_mul(1_000),
            "m" | "min" => n.checked_mul(60_000),
            "h" => n.checked_mul(3_600_000),
            "d" => n.checked_mul(86_400_000),
            _ => {
                return Err(format!(
                    "{text:?} has an unknown unit {unit:?}; use ms, s, m, h or d"
                ))
            }
        };
        total = millis
            .and_then(|m| total.checked_add(m))
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = next;
    }
    Ok(Duration::from_millis(total))
}

/// A health signal's threshold from the command line (`repair::health`): `off` (or `0`)
/// switches the signal off; otherwise the value past which batches pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold<T> {
    Off,
    At(T),
}

impl<T> Threshold<T> {
    /// The value, or None when the signal is off.
    pub fn value(self) -> Option<T> {
        match self {
            Threshold::Off => None,
            Threshold::At(v) => Some(v),
        }
    }
}

fn is_off(text: &str) -> bool {
    let t = text.trim();
    t == "0" || t.eq_ignore_ascii_case("off")
}

/// Parses a duration threshold (`--max-replica-lag`, `--max-lock-wait`): a duration as
/// [`parse_duration`] takes it, or `0`/`off` for no threshold. Used as a clap value parser.
pub fn parse_duration_threshold(text: &str) -> Result<Threshold<Duration>, String> {
    if is_off(text) {
        return Ok(Threshold::Off);
    }
    match parse_duration(text)? {
        d if d.is_zero() => Ok(Threshold::Off),
        d => Ok(Threshold::At(d)),
    }
}

/// Parses a count threshold (`--max-archive-backlog`, `--max-requested-checkpoints`): a whole
/// number from 1 to 1,000,000, or `0`/`off` for no threshold. Used as a clap value parser.
pub fn parse_count_threshold(text: &str) -> Result<Threshold<i64>, String> {
    if is_off(text) {
        return Ok(Threshold::Off);
    }
    match text.trim().parse::<i64>() {
        Ok(n @ 1..=1_000_000) => Ok(Threshold::At(n)),
        _ => Err(format!(
            "{text:?} is not a count: write a whole number from 1 to 1000000, or off"
        )),
    }
}

/// Parses a slowdown threshold (`--max-cpu-slowdown`): a ratio above 1 and at most 100, with at
/// most two decimals, kept in hundredths (`1.5` is 150), or `0`/`off` for no threshold. Used as
/// a clap value parser.
pub fn parse_ratio_threshold(text: &str) -> Result<Threshold<u32>, String> {
    if is_off(text) {
        return Ok(Threshold::Off);
    }
    let t = text.trim().trim_end_matches(['x', 'X']);
    let two_decimals = t.split_once('.').is_none_or(|(_, d)| d.len() <= 2);
    match t.parse::<f64>() {
        Ok(r) if two_decimals && r > 1.0 && r <= 100.0 => Ok(Threshold::At((r * 100.0).round() as u32)),
        _ => Err(format!(
            "{text:?} is not a slowdown: write a ratio above 1 such as 1.5 (at most 100, two decimals), or off"
        )),
    }
}

/// Which autovacuum on a repaired table pauses the batches (`--autovacuum-pause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutovacuumPause {
    /// Only one that prevents wraparound (the default).
    Wraparound,
    /// Any autovacuum.
    Any,
}

/// Parses `--autovacuum-pause`: `wraparound`, `any` or `off`. Used as a clap value parser.
pub fn parse_autovacuum_pause(text: &str) -> Result<Threshold<AutovacuumPause>, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "wraparound" => Ok(Threshold::At(AutovacuumPause::Wraparound)),
        "any" => Ok(Threshold::At(AutovacuumPause::Any)),
        "off" | "0" => Ok(Threshold::Off),
        _ => Err(format!(
            "{text:?} is not an autovacuum choice: write wraparound (the default), any or off"
        )),
    }
}

/// A share: `0.05` or `5%`, from 0 to 1.
pub fn parse_share(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let share = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("{text:?} is not a share; write it like 0.05 or 5%"))?;
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("{text:?} is not between 0 and 1 (0% and 100%)"));
    }
    Ok(share)
}

/// Writes a duration the way the command line takes it (see [`crate::human::duration`]).
pub fn format_duration(d: Duration) -> String {
    crate::human::duration(d)
}

/// How long the server keeps the runner lock's lease of a pgmend it no longer hears from
/// (`idle_session_timeout` on the lease session, `db::runner_lock`).
pub const LEASE: Duration = Duration::from_secs(60);

/// How long a transaction of pgmend idles at most on the server between two of its statements
/// (`idle_in_transaction_session_timeout` in every write transaction): pgmend's own work between
/// two statements takes milliseconds, so a transaction idle for this long belongs to a pgmend
/// that is gone or cut off, and the server ends it and releases its locks.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(30);

/// `--validate-timeout`'s default: a `VALIDATE CONSTRAINT` scans the whole table, which can
/// take many minutes on a big one (at 100 MiB/s, an hour reads some 350 GiB), and holds only
/// SHARE UPDATE EXCLUSIVE meanwhile: the application reads and writes, so a generous bound
/// costs it nothing. Other DDL, VACUUM and autovacuum on the table wait, and for that the
/// scan still ends within the hour.
pub const DEFAULT_VALIDATE_TIMEOUT: &str = "1h";

/// Checks the relations between safety options that clap cannot.
pub fn check_lock_options(
    lock_timeout: Duration,
    statement_timeout: Duration,
    validate_timeout: Duration,
) -> Result<()> {
    if validate_timeout.is_zero() {
        bail!("--validate-timeout 0 would let a VALIDATE CONSTRAINT scan for ever; give a bound such as 1h");
    }
    if lock_timeout.is_zero() {
        bail!("--lock-timeout 0 would let a DDL statement wait forever and stall every query queued behind it; give a bound such as 500ms");
    }
    if statement_timeout.is_zero() {
        bail!("--statement-timeout 0 would let a statement run forever; give a bound such as 1m");
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn jobs_are_auto_or_a_number_from_1_to_64() {
        use super::{parse_jobs, Jobs};
        assert_eq!(parse_jobs("auto"), Ok(Jobs::Auto));
        assert_eq!(parse_jobs("AUTO"), Ok(Jobs::Auto));
        assert_eq!(parse_jobs("1"), Ok(Jobs::Fixed(1)));
        assert_eq!(parse_jobs("64"), Ok(Jobs::Fixed(64)));
        for bad in ["0", "65", "-1", "", "two", "2.5"] {
            assert!(parse_jobs(bad).unwrap_err().contains("auto"), "{bad}");
        }
        assert_eq!(Jobs::Auto.to_string(), "auto");
        assert_eq!(Jobs::Fixed(3).to_string(), "3");
    }

    use super::*;

    #[test]
    fn durations_round_trip() {
        for text in ["500ms", "30s", "2m", "1h", "0s"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        for text in ["12m30s", "1h05m", "1h"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    }

    #[test]
    fn bad_durations_say_how_to_write_them() {
        for bad in [
            "",
            "5",
            "ms",
            "5 s",
            "1.5s",
            "3w",
            "-1s",
            "99999999999999999999h",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(parse_duration("10").unwrap_err().contains("500ms"));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn zero_timeouts_are_refused_each_by_name() {
        let s = Duration::from_secs(1);
        assert!(check_lock_options(s, s, s).is_ok());
        let default = parse_duration(DEFAULT_VALIDATE_TIMEOUT).unwrap();
        assert_eq!(default, Duration::from_secs(3600));
        for (args, named) in [
            ((Duration::ZERO, s, s), "--lock-timeout"),
            ((s, Duration::ZERO, s), "--statement-timeout"),
            ((s, s, Duration::ZERO), "--validate-timeout"),
        ] {
            let e = check_lock_options(args.0, args.1, args.2).unwrap_err();
            assert!(e.to_string().starts_with(named), "{e}");
        }
    }

    #[test]
    fn health_thresholds_take_a_value_or_off() {
        assert_eq!(
            parse_duration_threshold("30s"),
            Ok(Threshold::At(Duration::from_secs(30)))
        );
        for off in ["0", "off", "OFF", "0s", " off "] {
            assert_eq!(parse_duration_threshold(off), Ok(Threshold::Off), "{off}");
            assert_eq!(
                parse_autovacuum_pause(off.trim_end_matches('s')),
                Ok(Threshold::Off)
            );
        }
        assert!(parse_duration_threshold("5").unwrap_err().contains("500ms"));
        assert_eq!(parse_count_threshold("42"), Ok(Threshold::At(42)));
        assert_eq!(parse_count_threshold("off"), Ok(Threshold::Off));
        assert_eq!(parse_count_threshold("0"), Ok(Threshold::Off));
        for bad in ["", "-1", "2.5", "many", "1000001"] {
            assert!(
                parse_count_threshold(bad).unwrap_err().contains("off"),
                "{bad}"
            );
        }
        assert_eq!(parse_ratio_threshold("1.5"), Ok(Threshold::At(150)));
        assert_eq!(parse_ratio_threshold("2x"), Ok(Threshold::At(200)));
        assert_eq!(parse_ratio_threshold("off"), Ok(Threshold::Off));
        for bad in ["", "1", "0.5", "1.555", "fast", "101"] {
            assert!(
                parse_ratio_threshold(bad).unwrap_err().contains("off"),
                "{bad}"
            );
        }
        assert_eq!(
            parse_autovacuum_pause("Wraparound"),
            Ok(Threshold::At(AutovacuumPause::Wraparound))
        );
        assert_eq!(
            parse_autovacuum_pause("any"),
            Ok(Threshold::At(AutovacuumPause::Any))
        );
        assert!(parse_autovacuum_pause("some")
            .unwrap_err()
            .contains("wraparound"));
        assert_eq!(Threshold::At(3).value(), Some(3));
        assert_eq!(Threshold::<i64>::Off.value(), None);
    }

    #[test]
    fn shares_are_fractions_or_percentages_between_0_and_1() {
        assert_eq!(parse_share("5%"), Ok(0.05));
        assert_eq!(parse_share("0.25"), Ok(0.25));
        for bad in ["", "5", "-1%", "x%", "150%"] {
            assert!(parse_share(bad).is_err(), "{bad}");
        }
    }
}
