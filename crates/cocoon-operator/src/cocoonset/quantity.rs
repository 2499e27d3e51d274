//! Numeric reading of Kubernetes quantities, so drift checks compare `1Gi` and `1073741824`
//! (or the Go operator's canonical spelling) as the same amount.

/// The quantity in nano-units (`1` = 1_000_000_000), or `None` when it does not parse or
/// overflows. Exact for every value the API server accepts in practice.
pub fn nano_units(text: &str) -> Option<i128> {
    let s = text.trim();
    if s.is_empty() {
        return None;
    }
    let (sign, s) = match s.as_bytes()[0] {
        b'-' => (-1i128, &s[1..]),
        b'+' => (1, &s[1..]),
        _ => (1, s),
    };
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    if number.is_empty() || number == "." {
        return None;
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    // Digits as one integer plus how many of them sit after the point.
    let mut mantissa: i128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
    }
    let mut exp10: i32 = 9 - i32::try_from(frac_part.len()).ok()?;
    let mut binary: i128 = 1;
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
        "Ki" => binary = 1 << 10,
        "Mi" => binary = 1 << 20,
        "Gi" => binary = 1 << 30,
        "Ti" => binary = 1 << 40,
        "Pi" => binary = 1 << 50,
        "Ei" => binary = 1 << 60,
        other => {
            let rest = other.strip_prefix(['e', 'E'])?;
            exp10 += rest.parse::<i32>().ok()?;
        }
    }
    let mut value = mantissa.checked_mul(binary)?;
    if exp10 >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exp10).ok()?)?)?;
    } else {
        // Below a nano-unit: the API server rounds up, and so do we.
        let div = 10i128.checked_pow(u32::try_from(-exp10).ok()?)?;
        value = (value + div - 1) / div;
    }
    Some(sign * value)
}

/// Equality of two quantity strings by amount; unparsable strings compare textually.
pub fn same_amount(a: &str, b: &str) -> bool {
    match (nano_units(a), nano_units(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.trim() == b.trim(),
    }
}

/// Whether the quantity is set to a non-zero amount.
pub fn is_non_zero(text: &str) -> bool {
    match nano_units(text) {
        Some(v) => v != 0,
        None => !text.trim().is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_amounts_in_every_spelling() {
        for (a, b, equal) in [
            ("1Gi", "1073741824", true),
            ("100Gi", "107374182400", true),
            ("500m", "0.5", true),
            ("1", "1000m", true),
            ("1k", "1000", true),
            ("1e3", "1k", true),
            ("2Gi", "2G", false),
            ("1", "2", false),
            ("128Mi", "134217728", true),
        ] {
            assert_eq!(same_amount(a, b), equal, "{a} vs {b}");
        }
        assert_eq!(nano_units("abc"), None);
        assert_eq!(nano_units(""), None);
        assert!(is_non_zero("1Gi"));
        assert!(!is_non_zero("0"));
        assert!(!is_non_zero("0Gi"));
    }
}
