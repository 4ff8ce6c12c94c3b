//! Policy names as structured-field strings (RFC 8941), serialized once when a policy file is
//! loaded; a leaf that the rules and the response fields both use.

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
