//! A route's cost taken from the request (`cost_from`): a header that a trusted proxy set, or
//! a query parameter, read as a number and mapped through a linear formula or a table, never
//! above `max_cost`; or a GraphQL query's computed cost ([`super::GraphQlPricing`]), where a
//! query above `max_cost` is refused.
//!
//! ```toml
//! [[routes]]
//! name = "search"
//! path = "/search"
//! cost = 1                           # when the request gives no usable number
//! cost_from = "query:page_size"      # or "header:x-cost" (believed from trusted proxies)
//! cost_per_unit = 0.1                # page_size 50 costs 5 (rounded up)
//! max_cost = 20                      # never more
//! ```

use http::HeaderName;

use super::key::KeyPart;

/// The longest number a cost source is read from, in bytes.
const MAX_NUMBER_BYTES: usize = 20;

/// Where a route's cost comes from, and how its number becomes a cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostFrom {
    /// The part of the request that gives the number.
    pub source: CostSource,
    /// How the number becomes a cost.
    pub map: CostMap,
    /// The most one request costs (a larger figure is capped).
    pub max_cost: u64,
}

/// The part of a request a cost is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSource {
    /// A header's first value (`header:NAME`), believed only from `[identity]
    /// trusted_proxies`.
    Header(HeaderName),
    /// A query parameter's first value (`query:NAME`).
    Query(Box<str>),
    /// The computed cost of a GraphQL query (`graphql`), priced as the route says.
    GraphQl(Box<super::GraphQlPricing>),
}

/// How the number read becomes a cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostMap {
    /// The number is the cost.
    Value,
    /// `ceil(number × cost_per_unit)`, the factor kept in millionths (`cost_per_unit = 0.1`
    /// is 100,000).
    Linear(u64),
    /// `(up_to, cost)` in increasing `up_to` (`cost_table`): the cost of the first row whose
    /// `up_to` is at least the number; above the last row, `max_cost`.
    Table(Vec<(u64, u64)>),
}

impl CostSource {
    /// Read `header:NAME` or `query:NAME`.
    pub fn parse(text: &str) -> Result<CostSource, String> {
        match KeyPart::parse(text)? {
            KeyPart::Header(name) => Ok(CostSource::Header(name)),
            KeyPart::Query(name) => Ok(CostSource::Query(name)),
            _ => Err(format!(
                "`{text}`: a cost comes from `header:NAME` (set by a trusted proxy) or \
                 `query:NAME`"
            )),
        }
    }
}

impl CostFrom {
    /// The cost for `value` (the source's bytes): `None` when it is not a whole number (the
    /// route's constant cost then applies); otherwise at least 1 and at most `max_cost`.
    pub fn cost(&self, value: &[u8]) -> Option<u64> {
        let value = value.trim_ascii();
        if value.is_empty() || value.len() > MAX_NUMBER_BYTES {
            return None;
        }
        let number: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
        let cost = match &self.map {
            CostMap::Value => number,
            CostMap::Linear(millionths) => {
                let cost = (u128::from(number) * u128::from(*millionths)).div_ceil(1_000_000);
                u64::try_from(cost).unwrap_or(u64::MAX)
            }
            CostMap::Table(rows) => rows
                .iter()
                .find(|&&(up_to, _)| number <= up_to)
                .map_or(self.max_cost, |&(_, cost)| cost),
        };
        Some(cost.clamp(1, self.max_cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(map: CostMap, max_cost: u64) -> CostFrom {
        CostFrom {
            source: CostSource::Query("n".into()),
            map,
            max_cost,
        }
    }

    #[test]
    fn numbers_map_to_costs_within_one_and_the_cap() {
        let value = from(CostMap::Value, 50);
        assert_eq!(value.cost(b"7"), Some(7));
        assert_eq!(value.cost(b" 7 "), Some(7));
        assert_eq!(value.cost(b"0"), Some(1));
        assert_eq!(value.cost(b"1000"), Some(50));
        assert_eq!(value.cost(b"99999999999999999999999"), None);
        for bad in [&b""[..], b"-3", b"1.5", b"7x", b"\xff"] {
            assert_eq!(value.cost(bad), None, "{bad:?}");
        }
        let linear = from(CostMap::Linear(100_000), 20);
        assert_eq!(linear.cost(b"50"), Some(5));
        assert_eq!(linear.cost(b"51"), Some(6));
        assert_eq!(linear.cost(b"1"), Some(1));
        assert_eq!(linear.cost(b"18446744073709551615"), Some(20));
        let table = from(CostMap::Table(vec![(10, 1), (50, 3), (100, 5)]), 8);
        assert_eq!(table.cost(b"10"), Some(1));
        assert_eq!(table.cost(b"11"), Some(3));
        assert_eq!(table.cost(b"100"), Some(5));
        assert_eq!(table.cost(b"101"), Some(8));
    }

    #[test]
    fn a_cost_comes_from_a_header_or_a_query_parameter_only() {
        assert!(matches!(
            CostSource::parse("header:X-Cost"),
            Ok(CostSource::Header(_))
        ));
        assert!(matches!(
            CostSource::parse("query:page_size"),
            Ok(CostSource::Query(_))
        ));
        assert!(CostSource::parse("ip").is_err());
        assert!(CostSource::parse("cookie:c").is_err());
        assert!(CostSource::parse("query:").is_err());
    }
}
