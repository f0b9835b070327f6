//! Values the command line hands over, resolved and checked before any work starts.
//!
//! Values from the command line, checked before any work starts: `parse_duration` (the clap value
//! parser for `500ms`, `30s`, `2m`, `1h`, `0`), `format_duration` (the same notation back, for
//! messages), and `check_lock_options`, which refuses `--lock-timeout 0` and `--statement-timeout
//! 0`. This is where a fuller resolved configuration would go; today it is only these.

use std::time::Duration;

use anyhow::{bail, Result};

/// Parses `500ms`, `30s`, `2m`, `1h` (and `0`). Used as a clap value parser.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; write it like 500ms, 30s, 2m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| {
        format!("{text:?} does not start with a whole number; write it like 500ms, 30s, 2m or 1h")
    })?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" | "min" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}; use ms, s, m or h"
            ))
        }
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Writes a duration the way the command line takes it: `500ms`, `30s`, `2m`, `1h`,
/// or a decimal for what falls between (`1.5s`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms < 1_000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

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
    }

    #[test]
    fn bad_durations_say_how_to_write_them() {
        for bad in [
            "",
            "5",
            "ms",
            "5 s",
            "1.5s",
            "3d",
            "-1s",
            "99999999999999999999h",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(parse_duration("10").unwrap_err().contains("500ms"));
    }
}
