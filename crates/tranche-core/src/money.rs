//! Amounts of US dollars kept exactly: whole nanodollars (10^-9 USD), so that budgets compare
//! and add without rounding drift; shown and given as dollars.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nanodollars in a dollar.
const NANOS: f64 = 1e9;

/// An amount of US dollars, to the nanodollar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(u64);

impl Usd {
    pub const ZERO: Self = Self(0);

    /// Dollars, refused when negative, not finite or beyond reason (a billion dollars).
    pub fn from_dollars(dollars: f64) -> Result<Self, String> {
        if !dollars.is_finite() || !(0.0..=1e9).contains(&dollars) {
            return Err(format!("{dollars} is not an amount of dollars (0 to 1,000,000,000)"));
        }
        Ok(Self((dollars * NANOS).round() as u64))
    }

    /// Dollars rounded up to the nanodollar: a cost never comes out smaller than it is.
    pub fn ceil(dollars: f64) -> Self {
        if dollars.is_nan() || dollars <= 0.0 {
            Self(0)
        } else {
            Self((dollars * NANOS).ceil() as u64)
        }
    }

    pub fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    pub fn nanos(self) -> u64 {
        self.0
    }

    pub fn dollars(self) -> f64 {
        self.0 as f64 / NANOS
    }

    pub fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${:.4}", self.dollars())
    }
}

impl std::str::FromStr for Usd {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim().trim_start_matches('$');
        let dollars: f64 =
            text.parse().map_err(|_| format!("`{s}` is not an amount of dollars (e.g. 12.50)"))?;
        Self::from_dollars(dollars)
    }
}

/// Stored and shown as a number of dollars.
impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let dollars = f64::deserialize(deserializer)?;
        Self::from_dollars(dollars).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_round_trip_and_bad_amounts_are_refused() {
        let budget: Usd = "12.50".parse().unwrap();
        assert_eq!(budget.nanos(), 12_500_000_000);
        assert_eq!("$0.000000001".parse::<Usd>().unwrap().nanos(), 1);
        assert_eq!(serde_json::to_string(&budget).unwrap(), "12.5");
        assert_eq!(serde_json::from_str::<Usd>("12.5").unwrap(), budget);
        for bad in ["-1", "NaN", "inf", "ten", ""] {
            assert!(bad.parse::<Usd>().is_err(), "{bad}");
        }
        assert_eq!(Usd::ceil(1e-10).nanos(), 1, "a cost is rounded up");
        assert_eq!(Usd::ceil(-3.0), Usd::ZERO);
        assert_eq!(budget.to_string(), "$12.5000");
    }
}
