//! Keys in clear for the admin API's `/v1/top` (`[admin] show_identities`): the parts a key
//! was made of, as this node saw them on a request, for the parts that are not secret.
//!
//! Shown: the address (by its prefix), the user, the device, JWT claims, the route, the
//! method, the host, and the request parts the operator names in `show_parts` (headers,
//! cookies, query parameters, body fields). Never shown: API keys, and any other part, which
//! reads `(secret)`. A key whose parts are all secret has no identity to show.
//!
//! Each policy keeps, per thread, a direct-mapped table of [`SLOTS`] recent keys with their
//! text (at most [`MAX_LABEL_BYTES`] bytes, in place: nothing is allocated per request). A
//! request whose key already holds its slot costs a lock of the thread's own table and a
//! comparison; a heavy key holds its slot, so the keys `/v1/top` lists are found.

use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

use super::Rules;
use super::request::RequestFacts;
use crate::config::IdentitySource;
use crate::config::KeyPart;

/// Keys remembered per policy and thread.
pub(crate) const SLOTS: usize = 256;

/// The longest text kept for a key (longer is cut, ending with `…`).
pub(crate) const MAX_LABEL_BYTES: usize = 120;

/// What a node shows of keys in clear: the request parts the operator marked as not secret,
/// beside the ones that never are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShowIdentities {
    /// Headers, cookies, query parameters and body fields shown in clear.
    pub(crate) parts: Vec<KeyPart>,
}

impl ShowIdentities {
    /// Tell whether `part`'s value may be shown.
    fn shows(&self, part: &KeyPart) -> bool {
        match part {
            KeyPart::Ip
            | KeyPart::Device
            | KeyPart::User
            | KeyPart::Jwt(_)
            | KeyPart::Route
            | KeyPart::Method
            | KeyPart::Host => true,
            KeyPart::ApiKey | KeyPart::Client => false,
            other => self.parts.contains(other),
        }
    }
}

/// A key's text, kept in place.
#[derive(Clone, Copy)]
struct Label {
    len: u8,
    /// Whether some part is shown (else the text says nothing worth showing).
    shown: bool,
    bytes: [u8; MAX_LABEL_BYTES],
}

impl Label {
    const EMPTY: Label = Label {
        len: 0,
        shown: false,
        bytes: [0; MAX_LABEL_BYTES],
    };

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// Add ` NAME=VALUE` (the value's printable characters, others as `?`).
    fn part(&mut self, name: &str, value: Option<&[u8]>) {
        if self.len > 0 {
            let _ = self.write_str(" ");
        }
        let _ = self.write_str(name);
        let _ = self.write_str("=");
        match value {
            Some(value) => {
                self.shown = true;
                for chunk in value.utf8_chunks() {
                    for c in chunk.valid().chars() {
                        let c = if c.is_control() { '?' } else { c };
                        let _ = self.write_char(c);
                    }
                    if !chunk.invalid().is_empty() {
                        let _ = self.write_char('?');
                    }
                }
            }
            None => {
                let _ = self.write_str("(secret)");
            }
        }
    }
}

impl std::fmt::Write for Label {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let len = usize::from(self.len);
        // Room for the closing `…` (3 bytes) when the text is cut.
        if len + s.len() <= MAX_LABEL_BYTES - 3 {
            self.bytes[len..len + s.len()].copy_from_slice(s.as_bytes());
            self.len = (len + s.len()) as u8;
            return Ok(());
        }
        if len <= MAX_LABEL_BYTES - 3 {
            let mut cut = (MAX_LABEL_BYTES - 3 - len).min(s.len());
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            let end = len + cut;
            self.bytes[len..end].copy_from_slice(&s.as_bytes()[..cut]);
            self.bytes[end..end + 3].copy_from_slice("…".as_bytes());
            // Full: nothing more is written.
            self.len = MAX_LABEL_BYTES as u8;
        }
        Err(std::fmt::Error)
    }
}

/// One policy's recent keys in clear, on one thread.
pub(super) struct Labels {
    slots: Box<[(u64, Label)]>,
}

impl Default for Labels {
    fn default() -> Self {
        Labels {
            slots: vec![(0, Label::EMPTY); SLOTS].into_boxed_slice(),
        }
    }
}

impl Labels {
    fn slot(key: u64) -> usize {
        (key as usize) % SLOTS
    }
}

/// One policy's tables, by thread.
#[derive(Default)]
pub(super) struct PolicyIdentities(thread_local::ThreadLocal<Mutex<Labels>>);

impl PolicyIdentities {
    /// Remember `key`'s text, made by `label` unless the key already holds its slot.
    fn remember(&self, key: u64, label: impl FnOnce(&mut Label)) {
        let mut labels = self
            .0
            .get_or(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let slot = &mut labels.slots[Labels::slot(key)];
        if slot.0 == key && slot.1.len > 0 {
            return;
        }
        let mut text = Label::EMPTY;
        label(&mut text);
        *slot = (key, text);
    }

    /// `key`'s text, if some thread saw it with a part to show.
    fn find(&self, key: u64) -> Option<String> {
        self.0.iter().find_map(|labels| {
            let labels = labels.lock().unwrap_or_else(PoisonError::into_inner);
            let (k, label) = &labels.slots[Labels::slot(key)];
            (*k == key && label.shown).then(|| label.as_str().to_string())
        })
    }
}

impl Rules {
    /// Remember, for `/v1/top`, the keys in clear of the policies `layers` charge (policy,
    /// key) for the request `facts` of route `route` (its place in the rules), the parts
    /// `show` allows shown.
    pub(super) fn remember_keys(
        &self,
        facts: &RequestFacts<'_>,
        route_index: Option<usize>,
        layers: [&[(usize, u64)]; 4],
        show: &ShowIdentities,
    ) {
        let route = route_index.map(|i| self.routes[i].name);
        for &(p, key) in layers.into_iter().flatten() {
            let policy = &self.policies[p];
            policy
                .identities
                .remember(key, |label| match &self.models[p] {
                    Some(model) => {
                        let identity = &self.config.identity;
                        let _ =
                            model.visit(facts, route, identity, |part, name, value| match part {
                                KeyPart::Ip => {
                                    let text = facts.request.client_ip.map(|ip| {
                                        let (grouped, len) = identity.prefixes.group(ip);
                                        (grouped, len, if grouped.is_ipv4() { 32 } else { 128 })
                                    });
                                    let _ =
                                        label.write_str(if label.len > 0 { " ip=" } else { "ip=" });
                                    label.shown = true;
                                    if let Some((grouped, len, full)) = text {
                                        let _ = if len == full {
                                            write!(label, "{grouped}")
                                        } else {
                                            write!(label, "{grouped}/{len}")
                                        };
                                    }
                                }
                                KeyPart::Client => client(label, facts),
                                part => label.part(name, show.shows(part).then_some(value)),
                            });
                    }
                    None => {
                        client(label, facts);
                        // A policy of the route counts under the client's key and the route's.
                        let of_route = route_index.is_some_and(|r| {
                            let layers = &self.routes[r].layers;
                            [
                                &layers.enforced,
                                &layers.shadow,
                                &layers.global,
                                &layers.exact,
                            ]
                            .into_iter()
                            .any(|l| l.contains(&p))
                        });
                        if let Some(route) = route.filter(|_| of_route) {
                            label.part("route", Some(route.as_bytes()));
                        }
                    }
                });
        }
    }

    /// The text of policy `policy`'s key `key`, if this node saw it in clear with a part
    /// that may be shown.
    pub(crate) fn identity_of(&self, policy: &str, key: u64) -> Option<String> {
        let compiled = self.policies.iter().find(|c| c.name == policy)?;
        compiled.identities.find(key)
    }
}

/// The identity chain's part: its source and value, an API key kept secret.
fn client(label: &mut Label, facts: &RequestFacts<'_>) {
    let source = facts.identity.source;
    let value = (source != IdentitySource::ApiKey).then_some(facts.identity.value.as_bytes());
    label.part(source.name(), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_keeps_printable_text_and_cuts_long_text() {
        let mut label = Label::EMPTY;
        label.part("user", Some(b"al\nice\xff"));
        label.part("api_key", None);
        assert_eq!(label.as_str(), "user=al?ice? api_key=(secret)");
        assert!(label.shown);
        let mut long = Label::EMPTY;
        long.part("header:x-account", Some("é".repeat(200).as_bytes()));
        assert!(long.as_str().ends_with('…'), "{}", long.as_str());
        assert!(long.as_str().len() <= MAX_LABEL_BYTES);
        let mut secret = Label::EMPTY;
        secret.part("api_key", None);
        assert!(!secret.shown);
    }

    #[test]
    fn a_key_keeps_its_slot_until_another_takes_it() {
        let table = PolicyIdentities::default();
        let mut made = 0;
        for _ in 0..3 {
            table.remember(7, |l| {
                made += 1;
                l.part("user", Some(b"alice"));
            });
        }
        assert_eq!(made, 1);
        assert_eq!(table.find(7).as_deref(), Some("user=alice"));
        table.remember(7 + SLOTS as u64, |l| l.part("user", Some(b"bob")));
        assert_eq!(table.find(7), None);
        assert_eq!(table.find(7 + SLOTS as u64).as_deref(), Some("user=bob"));
    }
}
