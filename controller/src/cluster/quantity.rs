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
    let (mantissa, decimals) = parse_decimal(input, number)?;
    let scale = Scale::of_suffix(input, suffix)?;
    let value = scale.to_milli(input, mantissa, decimals)?;
    let value = if negative { -value } else { value };
    i64::try_from(value).map_err(|_| err(input, "too large"))
}

/// The digits of `number` (`12.5`) as an integer mantissa (125) and the count of decimals (1).
fn parse_decimal(input: &str, number: &str) -> Result<(i128, i32), QuantityError> {
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
    let mut mantissa: i128 = 0;
    for c in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(c - b'0')))
            .ok_or_else(|| err(input, "too large"))?;
    }
    Ok((mantissa, frac_part.len() as i32))
}

/// A suffix's factor: 10^exp10 * 2^exp2.
struct Scale {
    exp10: i32,
    exp2: i32,
}

impl Scale {
    /// The factor of a decimal SI (`m`, `k`, `G`), binary (`Ki`, `Gi`) or exponent (`e3`)
    /// suffix.
    fn of_suffix(input: &str, suffix: &str) -> Result<Scale, QuantityError> {
        let (exp10, exp2) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            other if other.starts_with(['e', 'E']) => {
                let e: i32 = other[1..].parse().map_err(|_| err(input, "bad exponent"))?;
                if !(-30..=30).contains(&e) {
                    return Err(err(input, "exponent out of range"));
                }
                (e, 0)
            }
            _ => return Err(err(input, "unknown suffix")),
        };
        Ok(Scale { exp10, exp2 })
    }

    /// `mantissa` / 10^`decimals` scaled by this factor, in milli-units rounded up.
    fn to_milli(&self, input: &str, mantissa: i128, decimals: i32) -> Result<i128, QuantityError> {
        let too_large = || err(input, "too large");
        let exp10 = self.exp10 - decimals + 3; // to milli
        let mut value = mantissa;
        for _ in 0..self.exp2 {
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
        Ok(value)
    }
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
