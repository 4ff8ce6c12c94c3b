//! Policy names as structured-field strings (RFC 8941), serialized once when a policy file is
//! loaded, and the `RateLimit` fields' items; a leaf that the rules and the response fields
//! both use.

use sfv::{ItemSerializer, StringRef};

/// Serialize a policy name as an sf-string, once (names are fixed when a file is loaded).
/// Characters outside printable ASCII become `?`.
pub(crate) fn sf_string(name: &str) -> String {
    let printable: String = name
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect();
    match StringRef::from_str(&printable) {
        Ok(string) => ItemSerializer::new().bare_item(string).finish(),
        Err(_) => "\"?\"".to_string(),
    }
}

/// sf-integers stop at 15 digits.
const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// Write a list of `sf_name;k1=v1;k2=v2` items (the names already serialized) as a field
/// value, in one allocation of the exact size (so the value keeps it as it is).
pub(crate) fn item_list<'a>(
    items: impl Iterator<Item = (&'a str, [(&'static str, u64); 2])> + Clone,
) -> Option<http::HeaderValue> {
    let mut digits = itoa::Buffer::new();
    let mut len = 0;
    for (i, (name, params)) in items.clone().enumerate() {
        len += name.len() + if i > 0 { 2 } else { 0 };
        for (key, value) in params {
            len += 2 + key.len() + digits.format(value.min(MAX_SF_INTEGER)).len();
        }
    }
    let mut out = Vec::with_capacity(len);
    for (name, params) in items {
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(name.as_bytes());
        for (key, value) in params {
            out.push(b';');
            out.extend_from_slice(key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(digits.format(value.min(MAX_SF_INTEGER)).as_bytes());
        }
    }
    // A vector whose length is its capacity becomes `Bytes` with no further allocation.
    (!out.is_empty())
        .then(|| http::HeaderValue::from_maybe_shared(bytes::Bytes::from(out)).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_listed_with_their_parameters() {
        let items = [
            ("\"a\"", [("q", 10), ("w", 1)]),
            ("\"b c\"", [("r", 0), ("t", u64::MAX)]),
        ];
        let value = item_list(items.iter().map(|(n, p)| (*n, *p))).unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            "\"a\";q=10;w=1, \"b c\";r=0;t=999999999999999"
        );
        assert!(item_list(std::iter::empty()).is_none());
    }
}
