//! What a denial answers, formatted once: the `RateLimit` item with no tokens left and the
//! JSON body of a 429, per policy name, for the usual retry and reset times. Pure
//! formatting; `http::headers` puts them in answers.

use bytes::Bytes;
use http::HeaderValue;

/// The most seconds kept formatted (a `Retry-After` value, a denial's `t` and body).
pub(crate) const FORMATTED_SECONDS: usize = 128;

/// What a denial by one policy answers for its usual retry and reset times, formatted once
/// per policy name for the life of the process: the `RateLimit` item with no tokens left
/// (`"name";r=0;t=T`) and the JSON body (`retry_after_seconds` S), for T and S below
/// [`FORMATTED_SECONDS`]. A denial is the answer an attack gets most: it then copies shared
/// bytes instead of formatting them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct DenialForms {
    ratelimit: Vec<HeaderValue>,
    bodies: Vec<Bytes>,
}

impl DenialForms {
    /// The forms of the policy `name` (`sf_name`: the name as a structured-field string).
    pub(crate) fn of(name: &'static str, sf_name: &'static str) -> &'static DenialForms {
        type Kept = std::collections::HashMap<&'static str, &'static DenialForms>;
        static KEPT: std::sync::OnceLock<std::sync::Mutex<Kept>> = std::sync::OnceLock::new();
        let mut kept = KEPT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.entry(name).or_insert_with(|| {
            let forms = DenialForms {
                // All or none: an item's place is its `t`.
                ratelimit: (0..FORMATTED_SECONDS as u64)
                    .map(|t| {
                        let item = [("r", 0), ("t", t)];
                        let value = crate::http::sf::item_list(std::iter::once((sf_name, item)))?;
                        HeaderValue::from_maybe_shared(leak(value.as_bytes())).ok()
                    })
                    .collect::<Option<Vec<_>>>()
                    .unwrap_or_default(),
                bodies: (0..FORMATTED_SECONDS as u64)
                    .map(|s| leak(&rate_limited_body(name, s)))
                    .collect(),
            };
            Box::leak(Box::new(forms))
        })
    }

    /// The `RateLimit` item of a denial with `t` seconds until the quota is whole.
    pub(crate) fn ratelimit(&self, t: u64) -> Option<HeaderValue> {
        self.ratelimit.get(usize::try_from(t).ok()?).cloned()
    }

    /// The JSON body of a denial that may retry in `seconds`.
    pub(crate) fn body(&self, seconds: u64) -> Option<Bytes> {
        self.bodies.get(usize::try_from(seconds).ok()?).cloned()
    }
}

/// `bytes`, kept for the life of the process.
fn leak(bytes: &[u8]) -> Bytes {
    Bytes::from_static(Box::leak(Box::from(bytes)))
}

/// `{"error":"rate_limited","policy":NAME,"retry_after_seconds":SECONDS}`.
pub(crate) fn rate_limited_body(name: &str, seconds: u64) -> Vec<u8> {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(seconds);
    const HEAD: &[u8] = br#"{"error":"rate_limited","policy":"#;
    const TAIL: &[u8] = br#","retry_after_seconds":"#;
    let mut out = Vec::with_capacity(HEAD.len() + name.len() + 2 + TAIL.len() + digits.len() + 1);
    out.extend_from_slice(HEAD);
    // A string's JSON text: writing into a vector cannot fail.
    let _ = serde_json::to_writer(&mut out, name);
    out.extend_from_slice(TAIL);
    out.extend_from_slice(digits.as_bytes());
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denials_forms_are_what_formatting_it_writes() {
        let forms = DenialForms::of("login \"x\"", "\"login \\\"x\\\"\"");
        assert!(std::ptr::eq(
            forms,
            DenialForms::of("login \"x\"", "\"login \\\"x\\\"\"")
        ));
        for s in [0, 1, 59, 127] {
            assert_eq!(forms.body(s).unwrap(), rate_limited_body("login \"x\"", s));
            let item = crate::http::sf::item_list(std::iter::once((
                "\"login \\\"x\\\"\"",
                [("r", 0), ("t", s)],
            )))
            .unwrap();
            assert_eq!(forms.ratelimit(s).unwrap(), item);
        }
        assert_eq!(forms.body(128), None);
        assert_eq!(forms.ratelimit(128), None);
        let body: serde_json::Value = serde_json::from_slice(&forms.body(12).unwrap()).unwrap();
        assert_eq!(body["policy"], "login \"x\"");
        assert_eq!(body["retry_after_seconds"], 12);
    }
}
