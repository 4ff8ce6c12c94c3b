//! How many cases a property test runs: its own count, or `PROPTEST_CASES` when set (a
//! deeper run).

/// `n` cases, or `PROPTEST_CASES` when set.
pub fn cases(n: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n)
}
