//! Byte sizes: parsing flag values such as `1GiB`, `512Mi`, `64MB`, `65536` or
//! `unlimited`, and printing sizes for people.
//!
//! Units follow Kubernetes quantities: a suffix with `i` is binary (KiB/Ki =
//! 1024), without it decimal (KB/K = 1000). Case of the letters is ignored.

use crate::facts::Limit;

/// Parses a byte count with an optional unit.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a size (use e.g. 1GiB, 512MiB, 65536)"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let unit_lower = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit_lower.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1000_u64.pow(2),
        "g" | "gb" => 1000_u64.pow(3),
        "t" | "tb" => 1000_u64.pow(4),
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)"
            ));
        }
    };
    n.checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a limit: a size, or `unlimited` (also `-1` and `infinity`, as ulimit tools write it).
pub fn parse_limit(text: &str) -> Result<Limit, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "unlimited" | "infinity" | "-1" => Ok(Limit::Unlimited),
        _ => parse_bytes(text).map(Limit::Bytes),
    }
}

/// Parses a duration: `500ms`, `5s`, `2m`, or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (use e.g. 500ms, 5s, 2m)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        other => {
            return Err(format!(
                "{text:?} has an unknown unit {other:?} (use ms, s or m)"
            ));
        }
    };
    // A value below a nanosecond rounds to a zero deadline, under which every vendor
    // call would count as hung.
    if !(1e-9..=3600.0).contains(&seconds) {
        return Err(format!("{text:?} must be more than 0 and at most an hour"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// A fraction in (0, 1]: `0.5`.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "{text:?} is not a fraction between 0 (excluded) and 1"
        )),
    }
}

/// Prints bytes in the largest binary unit that keeps at most one decimal: `64 MiB`, `1.5 GiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = n as f64;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else if (value - value.round()).abs() < 0.05 {
        format!("{} {}", value.round() as u64, UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

pub fn format_limit(l: Limit) -> String {
    match l {
        Limit::Unlimited => "unlimited".to_string(),
        Limit::Bytes(n) => format_bytes(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("1gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("64MB"), Ok(64_000_000));
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes(" 8 MiB "), Ok(8 << 20));
        assert!(parse_bytes("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("-5").is_err());
        assert!(
            parse_bytes("99999999999TiB")
                .unwrap_err()
                .contains("too large")
        );
        assert_eq!(parse_limit("unlimited"), Ok(Limit::Unlimited));
        assert_eq!(parse_limit("-1"), Ok(Limit::Unlimited));
        assert_eq!(parse_limit("64KiB"), Ok(Limit::Bytes(65536)));
    }

    #[test]
    fn durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(
            parse_duration("0.0000000001s").is_err(),
            "rounds to a zero deadline"
        );
        assert!(parse_duration("5h").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(64 << 20), "64 MiB");
        assert_eq!(format_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_limit(Limit::Unlimited), "unlimited");
    }
}
