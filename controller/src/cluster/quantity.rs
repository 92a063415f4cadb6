//! Kubernetes resource quantities (`500m`, `1.5Gi`, `2e3`) parsed exactly into integers:
//! milli-units for cpu and extended resources, whole units (bytes, pods) for the rest.

use thiserror::Error;

/// A quantity string that is not a valid Kubernetes quantity.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("`{input}` is not a Kubernetes quantity ({why})")]
pub struct QuantityError {
    pub input: String,
    pub why: &'static str,
}

fn err(input: &str, why: &'static str) -> QuantityError {
    QuantityError {
        input: input.to_string(),
        why,
    }
}

/// Parses a quantity into thousandths of its unit, rounding up (as the scheduler does):
/// `"500m"` → 500, `"2"` → 2000, `"1Ki"` → 1_024_000.
pub fn parse_milli(input: &str) -> Result<i64, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(err(input, "empty"));
    }
    let (negative, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    if number.is_empty() || number == "." {
        return Err(err(input, "no number"));
    }
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => {
            if f.contains('.') {
                return Err(err(input, "two decimal points"));
            }
            (i, f)
        }
        None => (number, ""),
    };
    // mantissa * 10^exp10 * 2^exp2
    let mut mantissa: i128 = 0;
    for c in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(c - b'0')))
            .ok_or_else(|| err(input, "too large"))?;
    }
    let mut exp10: i32 = -(frac_part.len() as i32);
    let mut exp2: i32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp2 += 10,
        "Mi" => exp2 += 20,
        "Gi" => exp2 += 30,
        "Ti" => exp2 += 40,
        "Pi" => exp2 += 50,
        "Ei" => exp2 += 60,
        other if other.starts_with(['e', 'E']) => {
            let e: i32 = other[1..].parse().map_err(|_| err(input, "bad exponent"))?;
            if !(-30..=30).contains(&e) {
                return Err(err(input, "exponent out of range"));
            }
            exp10 += e;
        }
        _ => return Err(err(input, "unknown suffix")),
    }
    exp10 += 3; // to milli
    let too_large = || err(input, "too large");
    let mut value = mantissa;
    for _ in 0..exp2 {
        value = value.checked_mul(2).ok_or_else(too_large)?;
    }
    if exp10 >= 0 {
        for _ in 0..exp10 {
            value = value.checked_mul(10).ok_or_else(too_large)?;
        }
    } else {
        let mut div: i128 = 1;
        for _ in 0..(-exp10) {
            div = div.checked_mul(10).ok_or_else(too_large)?;
        }
        value = (value + div - 1) / div; // round up
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).map_err(|_| too_large())
}

/// Parses a quantity into whole units, rounding up: `"1Gi"` → 1_073_741_824, `"100m"` → 1.
pub fn parse_units(input: &str) -> Result<i64, QuantityError> {
    let milli = parse_milli(input)?;
    Ok(milli.div_euclid(1000) + i64::from(milli.rem_euclid(1000) != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_binary_and_exponent_forms() {
        assert_eq!(parse_milli("500m").unwrap(), 500);
        assert_eq!(parse_milli("2").unwrap(), 2000);
        assert_eq!(parse_milli("0.25").unwrap(), 250);
        assert_eq!(parse_milli("1.5k").unwrap(), 1_500_000);
        assert_eq!(parse_units("1Ki").unwrap(), 1024);
        assert_eq!(parse_units("16Gi").unwrap(), 16 * 1024 * 1024 * 1024);
        assert_eq!(parse_units("128M").unwrap(), 128_000_000);
        assert_eq!(parse_units("2e3").unwrap(), 2000);
        assert_eq!(parse_milli("1n").unwrap(), 1, "sub-milli rounds up");
        assert_eq!(parse_units("100m").unwrap(), 1, "fractional units round up");
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "abc",
            "1.2.3",
            "5Xi",
            "1e99",
            "-",
            "99999999999999999999999Ei",
        ] {
            assert!(parse_milli(bad).is_err(), "{bad}");
        }
    }
}
