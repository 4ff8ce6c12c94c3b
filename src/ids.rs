//! The names that must agree across processes: a node's id, and the keyed hash that turns a
//! client's identity into the 64-bit key of its counters.
//!
//! The key hash is what nodes exchange (mesh frames carry it) and what Redis keys are built
//! from, so it is the same in every process that shares the secret, in every build: SipHash-1-3
//! with a 16-byte key, over length-prefixed parts. Without the secret, clients cannot aim
//! collisions at it, and keys and log labels reveal no identity.

use std::hash::{BuildHasher, Hasher};

use siphasher::sip::SipHasher13;
use siphasher::sip128::SipHasher13 as SipHasher13x128;

/// A node's identity in the cluster (from its certificate in the QUIC driver): 1 to
/// [`MAX_NODE_ID`].
pub type NodeId = u64;

/// The largest node id (2^63 − 1): the mesh names the records of departed holders with the
/// ids above.
pub const MAX_NODE_ID: NodeId = (1 << 63) - 1;

/// What a hash is for: the same parts hash differently for each use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Domain {
    /// The key of a client's counters (sent to peers, part of Redis keys).
    Key = 0,
    /// A label that names a client in logs.
    Label = 1,
    /// The digest of a configuration nodes must share.
    Config = 2,
}

/// Hash identities with a secret key (SipHash-1-3), so keys and labels reveal nothing.
#[derive(Clone)]
pub struct KeyHasher {
    key: [u8; 16],
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(<secret>)")
    }
}

impl KeyHasher {
    /// Derive the key from a configured secret (the same secret gives the same keys on
    /// every node and across restarts).
    pub fn from_secret(secret: &str) -> Self {
        let hash = SipHasher13x128::new_with_keys(0x7261_7465_6d65_7368, 0x6b65_7973_6563_7274)
            .hash(secret.as_bytes());
        KeyHasher {
            key: hash.as_bytes(),
        }
    }

    /// Use a 16-byte key as it is.
    pub fn from_key(key: [u8; 16]) -> Self {
        KeyHasher { key }
    }

    /// Make a random key for this process (keys then differ between processes).
    pub fn random() -> Self {
        let mut key = [0u8; 16];
        for half in key.chunks_mut(8) {
            let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
            half.copy_from_slice(&random.to_le_bytes());
        }
        KeyHasher { key }
    }

    fn hash(&self, domain: Domain, parts: &[&[u8]]) -> u64 {
        let mut hasher = SipHasher13::new_with_key(&self.key);
        hasher.write_u8(domain as u8);
        absorb(&mut hasher, parts);
        hasher.finish()
    }

    /// Hash the first `parts` of keys once (the environment and the identity source, the
    /// same for most requests), for [`KeyPrefix::key`] to finish with the rest.
    #[cfg(feature = "http")]
    pub(crate) fn key_prefix(&self, parts: &[&[u8]]) -> KeyPrefix {
        let mut hasher = SipHasher13::new_with_key(&self.key);
        hasher.write_u8(Domain::Key as u8);
        absorb(&mut hasher, parts);
        KeyPrefix(hasher)
    }

    /// Return the key of the counters named by `parts` (e.g. environment, identity source,
    /// identity, route): the same on every node that shares the secret.
    pub fn key(&self, parts: &[&[u8]]) -> u64 {
        self.hash(Domain::Key, parts)
    }

    /// Return the digest of a configuration made of `parts`: the same on nodes that share
    /// the secret and the parts, different (almost surely) if either differs, and revealing
    /// neither.
    pub fn config_digest(&self, parts: &[&[u8]]) -> u64 {
        self.hash(Domain::Config, parts).max(1)
    }

    /// Return a short, secret-free label for logs: `api_key:9f2c41d07ab3e6f1` for `kind`
    /// `api_key`.
    pub fn label(&self, kind: &str, value: &[u8]) -> String {
        format!("{kind}:{:016x}", self.label_digest(kind, value))
    }

    /// Return the digest of [`KeyHasher::label`] (what follows `kind:`, as a number).
    pub fn label_digest(&self, kind: &str, value: &[u8]) -> u64 {
        self.hash(Domain::Label, &[kind.as_bytes(), value])
    }
}

/// Length-prefix each of `parts` into `hasher`.
fn absorb(hasher: &mut SipHasher13, parts: &[&[u8]]) {
    for part in parts {
        hasher.write_usize(part.len());
        hasher.write(part);
    }
}

/// Keys' first parts, hashed ([`KeyHasher::key_prefix`]).
#[cfg(feature = "http")]
#[derive(Clone)]
pub(crate) struct KeyPrefix(SipHasher13);

#[cfg(feature = "http")]
impl std::fmt::Debug for KeyPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The hasher's state holds the secret key.
        f.write_str("KeyPrefix(<secret>)")
    }
}

#[cfg(feature = "http")]
impl KeyPrefix {
    /// Return the key of the first parts followed by `parts`: what [`KeyHasher::key`] returns
    /// for all of them, with the first parts' share of the work already done.
    pub(crate) fn key(&self, parts: &[&[u8]]) -> u64 {
        let mut hasher = self.0;
        absorb(&mut hasher, parts);
        hasher.finish()
    }

    /// A key to add parts to one at a time: [`PartialKey::finish`] returns what
    /// [`KeyPrefix::key`] returns for the parts added.
    pub(crate) fn start(&self) -> PartialKey {
        PartialKey(self.0)
    }
}

/// A key being made part by part ([`KeyPrefix::start`]).
#[cfg(feature = "http")]
pub(crate) struct PartialKey(SipHasher13);

#[cfg(feature = "http")]
impl PartialKey {
    /// Add a part.
    #[inline]
    pub(crate) fn part(&mut self, part: &[u8]) {
        absorb(&mut self.0, &[part]);
    }

    /// The key of the parts added.
    pub(crate) fn finish(&self) -> u64 {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed vectors: nodes of different builds (and Redis keys written by them) must agree,
    /// so a change here is a change of the wire format.
    #[test]
    #[cfg(feature = "http")]
    fn a_prefix_finishes_as_the_whole_key() {
        let hasher = KeyHasher::from_secret("ratemesh-cluster");
        let prefix = hasher.key_prefix(&[b"prod", b"api_key"]);
        assert_eq!(prefix.key(&[b"tenant-42"]), KEY_VECTOR);
        assert_eq!(
            prefix.key(&[b"tenant-42", b"/upload"]),
            hasher.key(&[b"prod", b"api_key", b"tenant-42", b"/upload"])
        );
        assert_eq!(hasher.key_prefix(&[]).key(&[b"x"]), hasher.key(&[b"x"]));
        let mut partial = prefix.start();
        partial.part(b"tenant-42");
        partial.part(b"/upload");
        assert_eq!(partial.finish(), prefix.key(&[b"tenant-42", b"/upload"]));
    }

    #[test]
    fn keys_are_stable_across_processes_and_keyed() {
        let hasher = KeyHasher::from_secret("ratemesh-cluster");
        let parts: [&[u8]; 3] = [b"prod", b"api_key", b"tenant-42"];
        assert_eq!(hasher.key(&parts), KEY_VECTOR);
        assert_eq!(
            hasher.key(&[b"prod", b"api_key", b"tenant-42", b"search"]),
            ROUTE_KEY_VECTOR
        );
        assert_eq!(hasher.label("api_key", b"tenant-42"), LABEL_VECTOR);
        assert_eq!(KeyHasher::from_key([7; 16]).key(&parts), RAW_KEY_VECTOR);
        assert_ne!(hasher.key(&[b"prod", b"api_key", b"tenant-43"]), KEY_VECTOR);
        assert_ne!(
            KeyHasher::from_secret("another-cluster").key(&parts),
            KEY_VECTOR
        );
        // Length prefixes keep part boundaries: ("ab", "c") is not ("a", "bc").
        assert_ne!(hasher.key(&[b"ab", b"c"]), hasher.key(&[b"a", b"bc"]));
        // Keys and labels are different uses of the same parts.
        assert_ne!(
            hasher.key(&[b"api_key", b"tenant-42"]),
            u64::from_str_radix(&LABEL_VECTOR["api_key:".len()..], 16).unwrap()
        );
    }

    const KEY_VECTOR: u64 = 0x0dea_c08b_d02d_a08a;
    const ROUTE_KEY_VECTOR: u64 = 0xca7b_8120_9e77_305e;
    const RAW_KEY_VECTOR: u64 = 0xc1f8_cc43_d290_1ae8;
    const LABEL_VECTOR: &str = "api_key:b840f41d02e4c263";
}
