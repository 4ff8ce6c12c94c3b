//! How a key given to a decision becomes the key a store keeps.
//!
//! A decision takes the key borrowed, as `HashMap::get` does: a `Limiter<String>` is
//! checked with a `&str`, a `Limiter<Arc<str>>` or `Limiter<Box<str>>` too, and a
//! `Limiter<u64>` with a `&u64`. The store looks the key up through `Borrow` and makes an
//! owned key only the first time it sees one ([`ToKey::to_key`]), so a known key costs no
//! allocation.

use std::sync::Arc;

/// A borrowed form of the key type `K` that can make a `K` (when a store first sees the
/// key); the lifetime `'a` is that of the borrow, so a `Limiter<&'a str>` takes a `&'a str`.
///
/// Implemented for every `K: Clone` (the key itself, `check(&42, 1)` on a `Limiter<u64>`),
/// for `str` as `String`, `Box<str>`, `Arc<str>` and `&str` keys, and for `[T]` as
/// `Vec<T>`, `Box<[T]>`, `Arc<[T]>` and `&[T]` keys. For a key type of your own with a
/// borrowed form, implement it with `K: Borrow<Self>`, hashing and comparing alike.
pub trait ToKey<'a, K> {
    /// Make the key to keep.
    fn to_key(&'a self) -> K;
}

impl<K: Clone> ToKey<'_, K> for K {
    #[inline]
    fn to_key(&self) -> K {
        self.clone()
    }
}

impl ToKey<'_, String> for str {
    fn to_key(&self) -> String {
        self.to_owned()
    }
}

impl ToKey<'_, Box<str>> for str {
    fn to_key(&self) -> Box<str> {
        Box::from(self)
    }
}

impl ToKey<'_, Arc<str>> for str {
    fn to_key(&self) -> Arc<str> {
        Arc::from(self)
    }
}

impl<'a> ToKey<'a, &'a str> for str {
    fn to_key(&'a self) -> &'a str {
        self
    }
}

impl<T: Clone> ToKey<'_, Vec<T>> for [T] {
    fn to_key(&self) -> Vec<T> {
        self.to_vec()
    }
}

impl<T: Clone> ToKey<'_, Box<[T]>> for [T] {
    fn to_key(&self) -> Box<[T]> {
        Box::from(self)
    }
}

impl<T: Clone> ToKey<'_, Arc<[T]>> for [T] {
    fn to_key(&self) -> Arc<[T]> {
        Arc::from(self)
    }
}

impl<'a, T> ToKey<'a, &'a [T]> for [T] {
    fn to_key(&'a self) -> &'a [T] {
        self
    }
}
