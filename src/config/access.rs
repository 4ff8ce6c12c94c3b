//! `[access]`: client addresses never limited (`exempt`) and addresses refused before any
//! counting (`deny`).
//!
//! ```toml
//! [access]
//! exempt = ["10.20.0.0/16"]        # the monitoring network: never limited, counted
//! exempt_api_keys = ["api_key:9f2c41d07ab3e6f1"]   # by hash (`ratemesh hash-key`)
//! exempt_subjects = ["svc-monitoring"]             # a verified JWT's `sub` (`[jwt]`)
//! deny = ["203.0.113.0/24"]        # answered 403, before any counting
//! ```
//!
//! An address in both lists is denied. The address is the client's, as `[identity]` finds
//! it (the forwarded address when the peer is a trusted proxy).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use super::source::{ConfigError, Source};

/// The most ranges one list may hold.
pub const MAX_ACCESS_RANGES: usize = 10_000;

/// Addresses exempt from every limit, and addresses refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessLists {
    /// Never limited (counted in `ratemesh_requests_exempt_total`).
    pub exempt: Vec<IpNet>,
    /// Answered `403 Forbidden` before any counting.
    pub deny: Vec<IpNet>,
    /// API keys never limited, by the digest of their `api_key:` hash.
    pub exempt_api_keys: Vec<u64>,
    /// Subjects (`sub`) of verified JWTs never limited.
    pub exempt_subjects: Vec<String>,
}

/// What the lists say of a client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Limited as usual.
    Limited,
    /// Never limited.
    Exempt,
    /// Refused.
    Denied,
}

impl AccessLists {
    /// Tell whether the lists are empty (no request needs its address looked up).
    pub fn is_empty(&self) -> bool {
        self.exempt.is_empty() && self.deny.is_empty()
    }

    /// Tell whether the lists name clients beyond addresses (API keys, JWT subjects).
    pub fn names_clients(&self) -> bool {
        !self.exempt_api_keys.is_empty() || !self.exempt_subjects.is_empty()
    }

    /// What the lists say of `ip` (an IPv4-mapped IPv6 address is its IPv4 address).
    pub fn of(&self, ip: IpAddr) -> Access {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if self.deny.iter().any(|net| net.contains(&ip)) {
            Access::Denied
        } else if self.exempt.iter().any(|net| net.contains(&ip)) {
            Access::Exempt
        } else {
            Access::Limited
        }
    }
}

/// `[access]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccess {
    #[serde(default)]
    exempt: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    exempt_api_keys: Vec<String>,
    #[serde(default)]
    exempt_subjects: Vec<String>,
}

pub(super) fn build_access(
    source: &Source<'_>,
    spanned: &Spanned<RawAccess>,
) -> Result<AccessLists, ConfigError> {
    let raw = spanned.get_ref();
    let list = |key: &str, texts: &[String]| -> Result<Vec<IpNet>, ConfigError> {
        let fail = |reason: String| {
            source.error(
                source.line_of_key(spanned.span(), key),
                format!("access.{key}"),
                reason,
            )
        };
        if texts.len() > MAX_ACCESS_RANGES {
            return Err(fail(format!(
                "at most {MAX_ACCESS_RANGES} ranges, got {}",
                texts.len()
            )));
        }
        texts
            .iter()
            .map(|text| {
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| fail(format!("`{text}` is not an IP address or CIDR range")))
            })
            .collect()
    };
    let fail = |key: &str, reason: String| {
        source.error(
            source.line_of_key(spanned.span(), key),
            format!("access.{key}"),
            reason,
        )
    };
    let mut exempt_api_keys = Vec::new();
    for text in &raw.exempt_api_keys {
        let digest = text
            .strip_prefix("api_key:")
            .filter(|hex| {
                hex.len() == 16
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .ok_or_else(|| {
                fail(
                    "exempt_api_keys",
                    format!(
                        "`{text}`: an API key is listed by its hash, never in clear (`ratemesh \
                         hash-key` prints `api_key:` and 16 hex digits)"
                    ),
                )
            })?;
        exempt_api_keys.push(digest);
    }
    if raw.exempt_api_keys.len() > MAX_ACCESS_RANGES
        || raw.exempt_subjects.len() > MAX_ACCESS_RANGES
    {
        return Err(fail(
            "exempt_api_keys",
            format!("at most {MAX_ACCESS_RANGES} entries per list"),
        ));
    }
    if raw.exempt_subjects.iter().any(String::is_empty) {
        return Err(fail("exempt_subjects", "an empty subject".into()));
    }
    Ok(AccessLists {
        exempt: list("exempt", &raw.exempt)?,
        deny: list("deny", &raw.deny)?,
        exempt_api_keys,
        exempt_subjects: raw.exempt_subjects.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_in_both_lists_is_denied() {
        let lists = AccessLists {
            exempt: vec!["10.0.0.0/8".parse().unwrap()],
            deny: vec!["10.9.0.0/16".parse().unwrap()],
            ..AccessLists::default()
        };
        assert_eq!(lists.of("10.1.2.3".parse().unwrap()), Access::Exempt);
        assert_eq!(lists.of("10.9.2.3".parse().unwrap()), Access::Denied);
        assert_eq!(lists.of("::ffff:10.9.2.3".parse().unwrap()), Access::Denied);
        assert_eq!(lists.of("192.0.2.1".parse().unwrap()), Access::Limited);
    }
}
