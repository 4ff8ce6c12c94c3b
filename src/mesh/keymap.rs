//! The hasher of a node's maps keyed by [`KeyRef`](crate::mesh::message::KeyRef) or
//! [`NodeId`](crate::mesh::NodeId): a fixed function (splitmix64's finalizer over the
//! words), fast, and the same in every process, so a node's walks over its keys repeat
//! exactly from run to run (the simulator's runs are deterministic). Keys are already
//! [`KeyHasher::key`](crate::ids::KeyHasher::key) values, keyed with the cluster's secret:
//! clients cannot aim collisions at them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::mesh::membership::mix;

/// A map with the fixed hasher.
pub(crate) type FixedMap<K, V> = HashMap<K, V, BuildHasherDefault<FixedHasher>>;

/// Folds the words written into one `u64`, then mixes it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FixedHasher(u64);

impl Hasher for FixedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(23) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn finish(&self) -> u64 {
        mix(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::message::KeyRef;

    #[test]
    fn sequential_keys_spread() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<FixedHasher>::default();
        let tops: std::collections::BTreeSet<u64> = (0..1000u64)
            .map(|key| build.hash_one(KeyRef { policy: 0, key }) >> 57)
            .collect();
        // All 128 values of the top 7 bits (the map's tags) occur.
        assert_eq!(tops.len(), 128);
    }
}
