//! What a policy counts by (`by = [...]`), what happens to a request that lacks it
//! (`on_missing`), and how client addresses are grouped into keys (`ipv4_prefix`,
//! `ipv6_prefix`).
//!
//! ```toml
//! [policies.login_per_address]
//! algorithm = "fixed-window"
//! limit = 20
//! window = "10m"
//! by = ["ip"]                       # one count per client address (its /64 for IPv6)
//!
//! [policies.search_for_everyone]
//! algorithm = "token-bucket"
//! rate = 1000
//! period = "1s"
//! burst = 1000
//! by = []                           # one count for every request it applies to
//!
//! [policies.per_account_per_route]
//! algorithm = "sliding-window"
//! limit = 100
//! window = "1m"
//! by = ["header:x-account", "route"]
//! on_missing = "skip"               # a request without the header is not counted here
//!
//! [policies.failed_logins_per_account]
//! algorithm = "fixed-window"
//! limit = 5
//! window = "15m"
//! by = ["json:/username"]           # the account the login body names (read first)
//! ```

use std::net::IpAddr;

use http::HeaderName;
use serde::Deserialize;

/// The most parts one `by` list may name.
pub const MAX_BY_PARTS: usize = 8;
/// The longest cookie or query parameter name a `by` part may name.
const MAX_PART_NAME_BYTES: usize = 128;

/// One part of a request that a policy's key is made of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// The client as the `[identity]` chain finds it (user, API key, device or address,
    /// the first present): never missing.
    Client,
    /// The client's address (the peer, or the forwarded address when the peer is a trusted
    /// proxy), grouped by `ipv4_prefix` and `ipv6_prefix`.
    Ip,
    /// The API key header (`[identity] api_key_header`).
    ApiKey,
    /// The user an earlier authentication layer put in the request
    /// ([`crate::http::AuthenticatedUser`]).
    User,
    /// The device id header (`[identity] device_header`).
    Device,
    /// A request header's value (`header:NAME`; the first, if repeated).
    Header(HeaderName),
    /// A cookie's value (`cookie:NAME`).
    Cookie(Box<str>),
    /// A query parameter's value as sent (`query:NAME`; the first, if repeated).
    Query(Box<str>),
    /// A claim of the request's verified JWT (`jwt:NAME`, see `[jwt]`): a string, number or
    /// boolean; missing when there is no token, it fails verification, or the claim is
    /// absent or another kind of value.
    Jwt(Box<str>),
    /// The route the request matched (`[[routes]] name`); missing when none matched.
    Route,
    /// The request method.
    Method,
    /// The host the request is for (`Host`, or the URI's authority).
    Host,
    /// A field of the request's JSON body, by JSON pointer (`json:/user/name`): a string,
    /// number or boolean; missing when the body is not JSON or the field is absent or
    /// another kind of value. The body is read first, up to the route's `max_body_bytes`.
    Json(Box<str>),
    /// A field of the request's form body (`form:username`,
    /// `application/x-www-form-urlencoded`), decoded; the first, if repeated. The body is
    /// read first, up to the route's `max_body_bytes`.
    Form(Box<str>),
}

impl KeyPart {
    /// Read one part as a policy file spells it.
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        let named = |kind: &str, name: &str| -> Result<Box<str>, String> {
            if name.is_empty() || name.len() > MAX_PART_NAME_BYTES {
                return Err(format!(
                    "`{kind}:` needs a name of 1 to {MAX_PART_NAME_BYTES} bytes"
                ));
            }
            if !name
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"\";,=&#%".contains(&b))
            {
                return Err(format!(
                    "`{kind}:{name}`: a {kind} name is visible ASCII without quotes, `;`, `,`, \
                     `=`, `&`, `#` or `%`"
                ));
            }
            Ok(name.into())
        };
        Ok(match text {
            "client" => KeyPart::Client,
            "ip" => KeyPart::Ip,
            "api_key" => KeyPart::ApiKey,
            "user" => KeyPart::User,
            "device" => KeyPart::Device,
            "route" => KeyPart::Route,
            "method" => KeyPart::Method,
            "host" => KeyPart::Host,
            _ => match text.split_once(':') {
                Some(("header", name)) => KeyPart::Header(
                    HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("`header:{name}`: not a header name"))?,
                ),
                Some(("cookie", name)) => KeyPart::Cookie(named("cookie", name)?),
                Some(("query", name)) => KeyPart::Query(named("query", name)?),
                Some(("jwt", name)) => KeyPart::Jwt(named("jwt", name)?),
                Some(("form", name)) => KeyPart::Form(named("form", name)?),
                Some(("json", pointer)) => {
                    if pointer.len() > MAX_PART_NAME_BYTES
                        || !pointer.starts_with('/')
                        || pointer.chars().any(char::is_control)
                    {
                        return Err(format!(
                            "`json:{pointer}`: a JSON pointer of at most \
                             {MAX_PART_NAME_BYTES} bytes starting with `/`, such as \
                             `json:/user/name`"
                        ));
                    }
                    KeyPart::Json(pointer.into())
                }
                _ => {
                    return Err(format!(
                        "`{text}` is not a part of a request a key can be made of: one of \
                         `client`, `ip`, `api_key`, `user`, `device`, `route`, `method`, \
                         `host`, `header:NAME`, `cookie:NAME`, `query:NAME`, `jwt:CLAIM`, \
                         `json:/POINTER`, `form:NAME`"
                    ));
                }
            },
        })
    }

    /// The part as the file spells it (for error messages, metrics and the config digest).
    pub fn name(&self) -> String {
        match self {
            KeyPart::Client => "client".into(),
            KeyPart::Ip => "ip".into(),
            KeyPart::ApiKey => "api_key".into(),
            KeyPart::User => "user".into(),
            KeyPart::Device => "device".into(),
            KeyPart::Header(name) => format!("header:{name}"),
            KeyPart::Cookie(name) => format!("cookie:{name}"),
            KeyPart::Query(name) => format!("query:{name}"),
            KeyPart::Jwt(name) => format!("jwt:{name}"),
            KeyPart::Route => "route".into(),
            KeyPart::Method => "method".into(),
            KeyPart::Host => "host".into(),
            KeyPart::Json(pointer) => format!("json:{pointer}"),
            KeyPart::Form(name) => format!("form:{name}"),
        }
    }

    /// Tell whether the part is read from the request's body.
    pub fn reads_body(&self) -> bool {
        matches!(self, KeyPart::Json(_) | KeyPart::Form(_))
    }
}

/// What a policy counts by: its key is made of these parts of the request, in order. No
/// parts: one count for every request the policy applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CountBy {
    /// The parts, in the order the file lists them.
    pub parts: Vec<KeyPart>,
}

impl CountBy {
    /// Read a `by` list: at most [`MAX_BY_PARTS`] parts, each at most once.
    pub fn parse(list: &[String]) -> Result<CountBy, String> {
        if list.len() > MAX_BY_PARTS {
            return Err(format!("at most {MAX_BY_PARTS} parts, got {}", list.len()));
        }
        let mut parts: Vec<KeyPart> = Vec::with_capacity(list.len());
        for text in list {
            let part = KeyPart::parse(text)?;
            if parts.contains(&part) {
                return Err(format!("`{text}` is listed twice"));
            }
            parts.push(part);
        }
        Ok(CountBy { parts })
    }
}

/// What happens to a request that lacks a part its policy counts by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Answer `400 Bad Request`, with a JSON body that names the part.
    #[default]
    Refuse,
    /// Leave the policy out for this request (counted).
    Skip,
}

/// How client addresses are grouped into keys: the first `v4` bits of an IPv4 address, the
/// first `v6` bits of an IPv6 one (a client cannot leave its limit by moving inside its
/// /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressPrefixes {
    /// Bits of an IPv4 address kept (1 to 32; default 32).
    pub v4: u8,
    /// Bits of an IPv6 address kept (1 to 128; default 64).
    pub v6: u8,
}

impl Default for AddressPrefixes {
    fn default() -> Self {
        AddressPrefixes { v4: 32, v6: 64 }
    }
}

impl AddressPrefixes {
    /// The address with the bits beyond its prefix cleared (an IPv4-mapped IPv6 address
    /// counts as its IPv4 address), and the prefix length kept.
    pub fn group(&self, ip: IpAddr) -> (IpAddr, u8) {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(v4) => {
                let bits =
                    u32::from(v4) & (u32::MAX.checked_shl(32 - u32::from(self.v4)).unwrap_or(0));
                (IpAddr::V4(bits.into()), self.v4)
            }
            IpAddr::V6(v6) => {
                let bits =
                    u128::from(v6) & (u128::MAX.checked_shl(128 - u32::from(self.v6)).unwrap_or(0));
                (IpAddr::V6(bits.into()), self.v6)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_and_refuse_what_is_not_a_part() {
        let by = CountBy::parse(&["ip".into(), "header:X-Account".into(), "route".into()]).unwrap();
        assert_eq!(
            by.parts,
            [
                KeyPart::Ip,
                KeyPart::Header(HeaderName::from_static("x-account")),
                KeyPart::Route
            ]
        );
        assert!(CountBy::parse(&[]).unwrap().parts.is_empty());
        assert!(
            CountBy::parse(&["ip".into(), "ip".into()])
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            CountBy::parse(&["address".into()])
                .unwrap_err()
                .contains("not a part")
        );
        assert!(KeyPart::parse("header:bad header").is_err());
        assert!(KeyPart::parse("cookie:").is_err());
        assert!(KeyPart::parse("query:a=b").is_err());
        assert_eq!(
            KeyPart::parse("json:/user/name").unwrap(),
            KeyPart::Json("/user/name".into())
        );
        assert_eq!(
            KeyPart::parse("form:username").unwrap(),
            KeyPart::Form("username".into())
        );
        assert!(KeyPart::parse("json:user").is_err());
        assert!(KeyPart::parse("json:/a\u{7}").is_err());
        assert!(KeyPart::parse(&format!("json:/{}", "a".repeat(200))).is_err());
        assert!(KeyPart::parse("form:").is_err());
        let many: Vec<String> = (0..10_000).map(|i| format!("header:x-{i}")).collect();
        assert!(CountBy::parse(&many).unwrap_err().contains("at most 8"));
    }

    #[test]
    fn addresses_group_by_their_prefix() {
        let prefixes = AddressPrefixes::default();
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(prefixes.group(a), prefixes.group(b));
        assert_ne!(prefixes.group(a), prefixes.group(c));
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(prefixes.group(v4), (v4, 32));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(prefixes.group(mapped), (v4, 32));
        let wide = AddressPrefixes { v4: 24, v6: 48 };
        assert_eq!(wide.group(v4), ("192.0.2.0".parse::<IpAddr>().unwrap(), 24));
        let all = AddressPrefixes { v4: 1, v6: 1 };
        assert_eq!(
            all.group("200.1.1.1".parse().unwrap()).0,
            "128.0.0.0".parse::<IpAddr>().unwrap()
        );
    }
}
