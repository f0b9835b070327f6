//! Values the command line hands over, resolved and checked before any work starts.
//!
//! Values from the command line, checked before any work starts: `parse_duration` (the clap value
//! parser for `500ms`, `30s`, `2m`, `1h`, `0`), `format_duration` (the same notation back, for
//! messages), and `check_lock_options`, which refuses `--lock-timeout 0` and `--statement-timeout
//! 0`. This is where a fuller resolved configuration would go; today it is only these.

use std::time::Duration;

use anyhow::{bail, Result};

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

/// Checks the relations between safety options that clap cannot.
pub fn check_lock_options(lock_timeout: Duration, statement_timeout: Duration) -> Result<()> {
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
    fn shares_are_fractions_or_percentages_between_0_and_1() {
        assert_eq!(parse_share("5%"), Ok(0.05));
        assert_eq!(parse_share("0.25"), Ok(0.25));
        for bad in ["", "5", "-1%", "x%", "150%"] {
            assert!(parse_share(bad).is_err(), "{bad}");
        }
    }
}
