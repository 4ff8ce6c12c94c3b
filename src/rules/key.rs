//! A policy's key from what it counts by (`by`): each part read from the request, hashed
//! with the environment under the rules' secret. The one model of "what a policy counts
//! by" on the gateway, forward-auth and proxy paths; a policy without `by` keeps the key
//! of the identity chain (see [`super::Rules`]).

use std::net::IpAddr;

use super::compile::intern;
use super::request::RequestFacts;
use crate::config::{AddressPrefixes, CountBy, IdentityConfig, KeyPart, OnMissing};
use crate::ids::{KeyHasher, KeyPrefix};

/// A policy's `by`, compiled: the parts, and the environment and the word `by` hashed.
pub(super) struct KeyModel {
    prefix: KeyPrefix,
    parts: Vec<KeyPart>,
    /// Each part's name as the file spells it (for the answer to a request that lacks it).
    names: Vec<&'static str>,
    pub(super) on_missing: OnMissing,
}

impl KeyModel {
    pub(super) fn new(hasher: &KeyHasher, env: &str, by: &CountBy, on_missing: OnMissing) -> Self {
        KeyModel {
            prefix: hasher.key_prefix(&[env.as_bytes(), b"by"]),
            names: by.parts.iter().map(|p| intern(&p.name())).collect(),
            parts: by.parts.clone(),
            on_missing,
        }
    }

    /// Tell whether some part is a JWT claim.
    pub(super) fn uses_claims(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, KeyPart::Jwt(_)))
    }

    /// Tell whether some part is the client's address.
    pub(super) fn uses_address(&self) -> bool {
        self.parts.contains(&KeyPart::Ip)
    }

    /// Tell whether some part is a field of the request's body.
    pub(super) fn uses_body(&self) -> bool {
        self.parts.iter().any(KeyPart::reads_body)
    }

    /// Tell whether some part is a field of a JSON body.
    pub(super) fn uses_json(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, KeyPart::Json(_)))
    }

    /// The key of the request `facts` (whose route, if it matched one, is `route`), or the
    /// name of the first part it lacks.
    pub(super) fn key(
        &self,
        facts: &RequestFacts<'_>,
        route: Option<&'static str>,
        identity: &IdentityConfig,
    ) -> Result<u64, &'static str> {
        // Each part as (its kind, its bytes): the kind keeps `header:a` = "x" apart from
        // `cookie:a` = "x". An address is its prefix's bytes and length.
        let mut key = self.prefix.start();
        self.visit(facts, route, identity, |part, _, value| {
            match part {
                KeyPart::Client => key.part(facts.identity.source.name().as_bytes()),
                KeyPart::Ip => key.part(b"ip"),
                KeyPart::ApiKey => key.part(b"api_key"),
                KeyPart::Device => key.part(b"device"),
                KeyPart::User => key.part(b"user"),
                KeyPart::Header(name) => {
                    key.part(b"header");
                    key.part(name.as_str().as_bytes());
                }
                KeyPart::Cookie(name) => {
                    key.part(b"cookie");
                    key.part(name.as_bytes());
                }
                KeyPart::Query(param) => {
                    key.part(b"query");
                    key.part(param.as_bytes());
                }
                KeyPart::Jwt(claim) => {
                    key.part(b"jwt");
                    key.part(claim.as_bytes());
                }
                KeyPart::Route => key.part(b"route"),
                KeyPart::Method => key.part(b"method"),
                KeyPart::Host => key.part(b"host"),
                KeyPart::Json(pointer) => {
                    key.part(b"json");
                    key.part(pointer.as_bytes());
                }
                KeyPart::Form(field) => {
                    key.part(b"form");
                    key.part(field.as_bytes());
                }
            }
            key.part(value);
        })?;
        Ok(key.finish())
    }

    /// Each part of the request `facts` with its name and value, in order (an address as its
    /// prefix's bytes and length), or the name of the first part it lacks.
    pub(super) fn visit(
        &self,
        facts: &RequestFacts<'_>,
        route: Option<&'static str>,
        identity: &IdentityConfig,
        mut each: impl FnMut(&KeyPart, &'static str, &[u8]),
    ) -> Result<(), &'static str> {
        let mut buffer = [0u8; 17];
        let address = match facts.request.client_ip {
            Some(ip) if self.parts.contains(&KeyPart::Ip) => {
                let len = write_address(&mut buffer, ip, identity.prefixes);
                Some(&buffer[..len])
            }
            _ => None,
        };
        // The claims' values, in the order of the `jwt:` parts.
        let claims: smallvec::SmallVec<[Option<std::borrow::Cow<'_, [u8]>>; 2]> = self
            .parts
            .iter()
            .filter_map(|part| match part {
                KeyPart::Jwt(name) => Some(
                    facts
                        .request
                        .claims
                        .and_then(|claims| super::jwt::claim_value(claims, name)),
                ),
                _ => None,
            })
            .collect();
        let mut claims = claims.iter();
        // The body's fields, in the order of the `json:` and `form:` parts (a body not parsed
        // yet is parsed here, once).
        let parsed;
        let json = match (facts.request.json, facts.request.body) {
            (Some(json), _) => Some(json),
            (None, Some(body)) if self.uses_json() => {
                parsed = serde_json::from_slice::<serde_json::Value>(body).ok();
                parsed.as_ref()
            }
            _ => None,
        };
        let fields: smallvec::SmallVec<[Option<std::borrow::Cow<'_, [u8]>>; 2]> = self
            .parts
            .iter()
            .filter_map(|part| match part {
                KeyPart::Json(pointer) => {
                    Some(json.and_then(|json| json_value(json.pointer(pointer)?)))
                }
                KeyPart::Form(name) => Some(facts.request.body.and_then(|body| form(body, name))),
                _ => None,
            })
            .collect();
        let mut fields = fields.iter();
        for (part, name) in self.parts.iter().zip(&self.names) {
            let missing = || *name;
            let value: &[u8] = match part {
                KeyPart::Client => facts.identity.value.as_bytes(),
                KeyPart::Ip => address.ok_or_else(missing)?,
                KeyPart::ApiKey => header(facts, &identity.api_key_header).ok_or_else(missing)?,
                KeyPart::Device => header(facts, &identity.device_header).ok_or_else(missing)?,
                KeyPart::User => facts.request.user.ok_or_else(missing)?.as_bytes(),
                KeyPart::Header(header_name) => header(facts, header_name).ok_or_else(missing)?,
                KeyPart::Cookie(cookie_name) => cookie(facts, cookie_name).ok_or_else(missing)?,
                KeyPart::Query(param) => facts.request.query_param(param).ok_or_else(missing)?,
                KeyPart::Jwt(_) => claims
                    .next()
                    .and_then(|c| c.as_deref())
                    .ok_or_else(missing)?,
                KeyPart::Route => route.ok_or_else(missing)?.as_bytes(),
                KeyPart::Method => facts.method.as_str().as_bytes(),
                KeyPart::Host => facts.request.host.ok_or_else(missing)?.as_bytes(),
                KeyPart::Json(_) | KeyPart::Form(_) => fields
                    .next()
                    .and_then(|f| f.as_deref())
                    .ok_or_else(missing)?,
            };
            each(part, name, value);
        }
        Ok(())
    }
}

/// The text of a client's address in a key of the identity chain: the address itself when
/// its prefix keeps every bit (an IPv4 address by default), else `address/prefix`.
pub(crate) fn address_text(ip: IpAddr, prefixes: AddressPrefixes) -> String {
    let (grouped, len) = prefixes.group(ip);
    let full = if grouped.is_ipv4() { 32 } else { 128 };
    if len == full {
        grouped.to_string()
    } else {
        format!("{grouped}/{len}")
    }
}

/// Write the address's prefix (its bytes, then its length) into `out`; return the length
/// written.
fn write_address(out: &mut [u8; 17], ip: IpAddr, prefixes: AddressPrefixes) -> usize {
    match prefixes.group(ip) {
        (IpAddr::V4(v4), len) => {
            out[..4].copy_from_slice(&v4.octets());
            out[4] = len;
            5
        }
        (IpAddr::V6(v6), len) => {
            out[..16].copy_from_slice(&v6.octets());
            out[16] = len;
            17
        }
    }
}

/// A header's first value, trimmed; an empty one is missing.
fn header<'a>(facts: &RequestFacts<'a>, name: &http::HeaderName) -> Option<&'a [u8]> {
    let value = facts.request.headers?.get(name)?.as_bytes().trim_ascii();
    (!value.is_empty()).then_some(value)
}

/// A cookie's value (the first of that name, over every `Cookie` header).
fn cookie<'a>(facts: &RequestFacts<'a>, name: &str) -> Option<&'a [u8]> {
    facts
        .request
        .headers?
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|&b| b == b'=')?;
            (&pair[..at] == name.as_bytes()).then(|| pair[at + 1..].trim_ascii())
        })
        .filter(|value| !value.is_empty())
}

/// A JSON value's bytes in a key: a string's text, a number's or a boolean's JSON; `None`
/// for anything else (and for an empty string).
fn json_value(value: &serde_json::Value) -> Option<std::borrow::Cow<'_, [u8]>> {
    match value {
        serde_json::Value::String(text) if !text.is_empty() => Some(text.as_bytes().into()),
        value @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => {
            Some(value.to_string().into_bytes().into())
        }
        _ => None,
    }
}

/// A form field's value, decoded (the first of that name); an empty one is missing.
fn form<'a>(body: &'a [u8], name: &str) -> Option<std::borrow::Cow<'a, [u8]>> {
    let value =
        form_urlencoded::parse(body).find_map(|(key, value)| (key == name).then_some(value))?;
    (!value.is_empty()).then(|| match value {
        std::borrow::Cow::Borrowed(text) => std::borrow::Cow::Borrowed(text.as_bytes()),
        std::borrow::Cow::Owned(text) => std::borrow::Cow::Owned(text.into_bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IdentitySource;
    use crate::rules::request::{Identity, RequestParts};

    fn model(parts: &[&str]) -> KeyModel {
        let by = CountBy::parse(&parts.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        KeyModel::new(&KeyHasher::from_secret("s"), "test", &by, OnMissing::Refuse)
    }

    #[test]
    fn body_fields_key_by_value_whatever_the_body_s_spelling() {
        let identity = Identity::new(IdentitySource::Ip, "192.0.2.1");
        let config = IdentityConfig::default();
        let key = |model: &KeyModel, body: &'static [u8], parsed: bool| {
            let json: Option<&'static serde_json::Value> = parsed
                .then(|| serde_json::from_slice(body).ok())
                .flatten()
                .map(|v| &*Box::leak(Box::new(v)));
            model.key(
                &RequestFacts {
                    identity: &identity,
                    tier: None,
                    method: &http::Method::POST,
                    path: "/login",
                    request: RequestParts {
                        body: Some(body),
                        json,
                        ..RequestParts::default()
                    },
                },
                None,
                &config,
            )
        };
        let json = model(&["json:/user"]);
        let a = key(&json, br#"{"user":"alice","x":1}"#, false);
        assert!(a.is_ok());
        assert_eq!(a, key(&json, br#"{ "x" : 2, "user" : "alice" }"#, true));
        assert_ne!(a, key(&json, br#"{"user":"bob"}"#, false));
        assert_eq!(key(&json, b"user=alice", false), Err("json:/user"));
        let form = model(&["form:user"]);
        let f = key(&form, b"user=alice", false);
        assert_eq!(f, key(&form, b"x=1&user=%61lice", false));
        assert_ne!(f, a, "a form's field and a JSON one make two keys");
        assert_eq!(key(&form, b"user=", false), Err("form:user"));
    }

    #[test]
    fn keys_follow_the_parts_and_name_the_one_missing() {
        let identity = Identity::new(IdentitySource::ApiKey, "k1");
        let mut headers = http::HeaderMap::new();
        headers.insert("x-account", "alice".parse().unwrap());
        headers.append(http::header::COOKIE, "a=1; sid=s9".parse().unwrap());
        let config = IdentityConfig::default();
        let facts =
            |headers: &'static http::HeaderMap, ip: &str, query: &'static str| RequestFacts {
                identity: Box::leak(Box::new(identity.clone())),
                tier: None,
                method: &http::Method::GET,
                path: "/login",
                request: RequestParts {
                    headers: Some(headers),
                    client_ip: ip.parse().ok(),
                    user: None,
                    query: Some(query),
                    host: Some("api.example.com"),
                    claims: None,
                    from_trusted_proxy: false,
                    body: None,
                    json: None,
                },
            };
        let headers: &'static http::HeaderMap = Box::leak(Box::new(headers));
        let by_ip = model(&["ip"]);
        let a = by_ip.key(&facts(headers, "2001:db8::1", ""), None, &config);
        let b = by_ip.key(&facts(headers, "2001:db8::2:1", ""), None, &config);
        let c = by_ip.key(&facts(headers, "2001:db8:0:1::1", ""), None, &config);
        assert_eq!(a, b, "one /64");
        assert_ne!(a, c);
        let account = model(&["header:x-account", "route"]);
        assert_eq!(
            account.key(&facts(headers, "", ""), None, &config),
            Err("route")
        );
        let with_route = account.key(&facts(headers, "", ""), Some("login"), &config);
        assert!(with_route.is_ok());
        let cookie = model(&["cookie:sid"]);
        let query = model(&["query:user"]);
        assert!(cookie.key(&facts(headers, "", ""), None, &config).is_ok());
        assert_eq!(
            query.key(&facts(headers, "", "a=1"), None, &config),
            Err("query:user")
        );
        let one = query.key(&facts(headers, "", "a=1&user=bob"), None, &config);
        let two = query.key(&facts(headers, "", "user=bob&user=eve"), None, &config);
        assert_eq!(one, two, "the first value");
        // The same bytes under two kinds of part make two keys.
        let mut h2 = http::HeaderMap::new();
        h2.insert("user", "bob".parse().unwrap());
        let h2: &'static http::HeaderMap = Box::leak(Box::new(h2));
        let by_header = model(&["header:user"]).key(&facts(h2, "", ""), None, &config);
        let by_query = model(&["query:user"]).key(&facts(h2, "", "user=bob"), None, &config);
        assert_ne!(by_header, by_query);
        // Everyone: one key.
        let all = model(&[]);
        assert_eq!(
            all.key(&facts(headers, "192.0.2.1", ""), None, &config),
            all.key(&facts(h2, "198.51.100.1", "x=1"), Some("r"), &config)
        );
    }
}
