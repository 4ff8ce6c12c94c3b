//! How a client's tier is chosen: `tier_from` (the sources, in order) and `tenants` (clients
//! named in the file; API keys only by their hash).
//!
//! ```toml
//! tier_from = ["jwt:plan", "tenants", "header:x-plan"]   # default: ["tenants"]
//! default_tier = "free"
//!
//! [tenants]
//! "user:alice" = "pro"
//! "api_key:9f2c41d07ab3e6f1" = "enterprise"   # `ratemesh hash-key` prints it
//! ```

use http::HeaderName;

/// One place a client's tier may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierSource {
    /// `tenants`: the client as the identity chain finds it, an API key by its hash.
    Tenants,
    /// A claim of the request's verified JWT that names a tier (`jwt:plan`).
    Jwt(String),
    /// A header that names a tier, believed only from `[identity] trusted_proxies`
    /// (`header:x-plan`: a gateway in front that authenticated the client).
    Header(HeaderName),
}

impl TierSource {
    /// Read one source as the file spells it.
    pub fn parse(text: &str) -> Result<TierSource, String> {
        match text.split_once(':') {
            None if text == "tenants" => Ok(TierSource::Tenants),
            Some(("jwt", claim)) if !claim.is_empty() && claim.len() <= 128 => {
                Ok(TierSource::Jwt(claim.to_string()))
            }
            Some(("header", name)) => HeaderName::from_bytes(name.as_bytes())
                .map(TierSource::Header)
                .map_err(|_| format!("`{text}`: not a header name")),
            _ => Err(format!(
                "`{text}` is not a source of tiers: `tenants`, `jwt:CLAIM` or `header:NAME`"
            )),
        }
    }
}

/// Check a `tenants` entry's name: `kind:value`, an API key only as its 16-hex-digit hash.
pub(super) fn check_tenant(name: &str) -> Result<(), String> {
    let Some((kind, value)) = name.split_once(':') else {
        return Err(format!(
            "`{name}`: name a client as `user:NAME`, `device:ID`, `ip:ADDRESS` or \
             `api_key:HASH`"
        ));
    };
    match kind {
        "user" | "device" | "ip" if !value.is_empty() => Ok(()),
        "api_key"
            if value.len() == 16
                && value
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) =>
        {
            Ok(())
        }
        "api_key" => Err(format!(
            "`{name}`: an API key is listed by its hash, never in clear: `ratemesh hash-key \
             --config FILE` reads the key on standard input and prints `api_key:` and 16 hex \
             digits"
        )),
        _ => Err(format!(
            "`{name}`: name a client as `user:NAME`, `device:ID`, `ip:ADDRESS` or \
             `api_key:HASH`"
        )),
    }
}
