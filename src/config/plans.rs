//! The plans file (`plans_file`): the tier of each API key, by its hash, for as many keys as a
//! SaaS has customers. One line per key, `api_key:HASH,TIER` (a comma or spaces between),
//! `#` comments and blank lines allowed:
//!
//! ```text
//! # exported from billing, 2026-12-06
//! api_key:9f2c41d07ab3e6f1,pro
//! api_key:0c5e77a1b2d3f405,enterprise
//! ```
//!
//! The hashes are the ones `ratemesh hash-key` prints under the policy file's `key_secret`
//! (`--plans` turns `KEY,TIER` lines into these). A million keys take 10 MB: a hash and a
//! tier number each, sorted; a lookup interpolates (the hashes are spread evenly), a few
//! probes near where the hash would be.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::source::{ConfigError, Source};
use super::tiers::check_tenant;

/// The most keys a plans file may list (160 MB of memory at most).
const MAX_PLAN_KEYS: usize = 16 << 20;

/// The most tiers a plans file may name.
const MAX_PLAN_TIERS: usize = u16::MAX as usize;

/// The longest line of a plans file.
const MAX_LINE: usize = 4096;

/// The API keys of a plans file and their tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plans {
    path: PathBuf,
    /// The tiers the file names, by their number.
    tiers: Vec<String>,
    /// The API keys' hashes (the digest after `api_key:`), ascending.
    keys: Vec<u64>,
    /// The tier number of each key of `keys`.
    tier_of_key: Vec<u16>,
}

impl Plans {
    /// Return the file the plans were read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Return the number of API keys listed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Tell whether the file lists no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Return the tier of the API key whose hash is `digest` (what follows `api_key:`).
    #[inline]
    pub fn tier_of(&self, digest: u64) -> Option<&str> {
        let at = find(&self.keys, digest)?;
        self.tiers
            .get(usize::from(self.tier_of_key[at]))
            .map(String::as_str)
    }
}

/// The index of `key` in `keys` (ascending, spread about evenly over the `u64`s): where it
/// would be if they were spread exactly, then a search outwards in doubling steps and a
/// binary search of the last step (a few probes, all near each other).
#[inline]
fn find(keys: &[u64], key: u64) -> Option<usize> {
    let n = keys.len();
    if n == 0 {
        return None;
    }
    // Below `n`: `key < 2^64`.
    let guess = ((u128::from(key) * n as u128) >> 64) as usize;
    // A range `low..high` with `keys[low] <= key` (or `low` 0) and `keys[high] > key` (or
    // `high` n): `key` is in it if anywhere.
    let (mut low, mut high);
    let mut step = 1;
    if keys[guess] <= key {
        low = guess;
        loop {
            high = low + step;
            if high >= n {
                high = n;
                break;
            }
            if keys[high] > key {
                break;
            }
            low = high;
            step *= 2;
        }
    } else {
        high = guess;
        loop {
            if high < step {
                low = 0;
                break;
            }
            low = high - step;
            if keys[low] <= key {
                break;
            }
            high = low;
            step *= 2;
        }
    }
    keys[low..high].binary_search(&key).ok().map(|i| low + i)
}

/// Read the plans file named at `line` of the policy file (`source`), relative to it: every
/// tier must be one of `tiers`, every key listed once, and not in `tenants` too.
pub(super) fn load_plans(
    source: &Source<'_>,
    line: usize,
    name: &str,
    tiers: &BTreeMap<String, Vec<String>>,
    tenants: &BTreeMap<String, String>,
) -> Result<Plans, ConfigError> {
    if name.is_empty() {
        return Err(source.error(line, "plans_file", "name a file"));
    }
    let base = Path::new(source.file).parent().unwrap_or(Path::new(""));
    let path = base.join(name);
    let file = path.display().to_string();
    let error = |at: usize, field: &str, reason: String| ConfigError {
        file: file.clone(),
        line: at,
        field: field.to_string(),
        reason,
    };
    let opened = std::fs::File::open(&path)
        .map_err(|e| error(1, "(file)", format!("cannot read the file: {e}")))?;
    let mut reader = BufReader::with_capacity(1 << 16, opened);
    let mut entries: Vec<(u64, u16)> = Vec::new();
    let mut tier_names: Vec<String> = Vec::new();
    let mut numbers: HashMap<String, u16> = HashMap::new();
    let mut bytes = Vec::with_capacity(128);
    let mut at = 0;
    loop {
        bytes.clear();
        let read = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut bytes)
            .map_err(|e| error(at + 1, "(file)", format!("cannot read the file: {e}")))?;
        if read == 0 {
            break;
        }
        at += 1;
        if bytes.len() > MAX_LINE && bytes.last() != Some(&b'\n') {
            return Err(error(
                at,
                "(line)",
                format!("a line longer than {MAX_LINE} bytes"),
            ));
        }
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return Err(error(at, "(line)", "not UTF-8 text".to_string()));
        };
        let entry = text.trim();
        if entry.is_empty() || entry.starts_with('#') {
            continue;
        }
        let (key, tier) = parse_line(entry).map_err(|reason| error(at, "api_key", reason))?;
        if !tiers.contains_key(tier) {
            return Err(error(
                at,
                "tier",
                format!("no tier named `{}` in {}", shown(tier), source.file),
            ));
        }
        if tenants.contains_key(key) {
            return Err(error(
                at,
                "api_key",
                format!(
                    "`{key}` is listed in `tenants` of {} too: list it once",
                    source.file
                ),
            ));
        }
        if entries.len() >= MAX_PLAN_KEYS {
            return Err(error(
                at,
                "api_key",
                format!("more than {MAX_PLAN_KEYS} API keys"),
            ));
        }
        let number = match numbers.get(tier) {
            Some(&number) => number,
            None => {
                if tier_names.len() >= MAX_PLAN_TIERS {
                    return Err(error(
                        at,
                        "tier",
                        format!("more than {MAX_PLAN_TIERS} tiers"),
                    ));
                }
                let number = tier_names.len() as u16;
                tier_names.push(tier.to_string());
                numbers.insert(tier.to_string(), number);
                number
            }
        };
        let digest = u64::from_str_radix(&key["api_key:".len()..], 16)
            .map_err(|e| error(at, "api_key", format!("`{key}`: {e}")))?;
        entries.push((digest, number));
    }
    entries.sort_unstable_by_key(|&(digest, _)| digest);
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        let key = format!("api_key:{:016x}", pair[0].0);
        let lines = lines_of(&path, &key);
        return Err(error(
            lines.get(1).copied().unwrap_or(1),
            "api_key",
            format!("`{key}` is listed twice (lines {lines:?})"),
        ));
    }
    Ok(Plans {
        path,
        tiers: tier_names,
        keys: entries.iter().map(|&(digest, _)| digest).collect(),
        tier_of_key: entries.iter().map(|&(_, tier)| tier).collect(),
    })
}

/// A line's API key and tier: `api_key:HASH,TIER`, a comma or spaces between.
fn parse_line(entry: &str) -> Result<(&str, &str), String> {
    let split = entry
        .find(|c: char| c == ',' || c.is_ascii_whitespace())
        .ok_or("write `api_key:HASH,TIER`")?;
    let key = &entry[..split];
    let tier = entry[split..]
        .trim_start_matches(|c: char| c == ',' || c.is_ascii_whitespace())
        .trim();
    if !key.starts_with("api_key:") {
        return Err(
            "a plans file lists API keys (`api_key:HASH`, as `ratemesh hash-key` prints them)"
                .to_string(),
        );
    }
    // Never echoed: a line that is not a hash may be a key in clear.
    if check_tenant(key).is_err() {
        return Err(
            "not `api_key:` and 16 lowercase hex digits: an API key is listed by its \
             hash, never in clear (`ratemesh hash-key --config FILE --plans` turns `KEY,TIER` \
             lines into `api_key:HASH,TIER`)"
                .to_string(),
        );
    }
    Ok((key, tier))
}

/// The lines of the plans file at `path` that list `key` (an error's second look).
fn lines_of(path: &Path, key: &str) -> Vec<usize> {
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    BufReader::new(file)
        .split(b'\n')
        .enumerate()
        .filter(|(_, line)| {
            line.as_ref()
                .is_ok_and(|l| l.trim_ascii().starts_with(key.as_bytes()))
        })
        .map(|(n, _)| n + 1)
        .take(2)
        .collect()
}

/// At most 80 characters of `text` for an error message (a line may be anything).
fn shown(text: &str) -> String {
    let mut end = text.len().min(80);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{}…", &text[..end])
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers() -> BTreeMap<String, Vec<String>> {
        ["free", "pro"]
            .into_iter()
            .map(|t| (t.to_string(), vec!["p".to_string()]))
            .collect()
    }

    fn load(text: &str, tenants: &BTreeMap<String, String>) -> Result<Plans, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plans.csv"), text).unwrap();
        let policy_file = dir.path().join("policies.toml").display().to_string();
        let source = Source {
            file: &policy_file,
            text: "plans_file = \"plans.csv\"\n",
        };
        load_plans(&source, 1, "plans.csv", &tiers(), tenants)
    }

    #[test]
    fn find_agrees_with_a_binary_search_on_even_and_skewed_keys() {
        // xorshift64*: no dependency for the test.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for n in [0usize, 1, 2, 3, 10, 1000, 100_000] {
            for skew in [0u32, 8, 40] {
                let mut keys: Vec<u64> = (0..n).map(|_| next() >> skew).collect();
                keys.sort_unstable();
                keys.dedup();
                for &k in keys.iter().step_by(7) {
                    assert_eq!(find(&keys, k), keys.binary_search(&k).ok(), "{n} {skew}");
                }
                for _ in 0..2000 {
                    let k = next() >> skew;
                    assert_eq!(find(&keys, k), keys.binary_search(&k).ok(), "{n} {skew}");
                }
                for k in [0, 1, u64::MAX, u64::MAX - 1] {
                    assert_eq!(find(&keys, k), keys.binary_search(&k).ok(), "{n} {skew}");
                }
            }
        }
    }

    #[test]
    fn keys_by_hash_with_comma_or_spaces_comments_and_blank_lines() {
        let plans = load(
            "# billing export\n\napi_key:9f2c41d07ab3e6f1,pro\napi_key:0c5e77a1b2d3f405   free\r\n",
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans.tier_of(0x9f2c_41d0_7ab3_e6f1), Some("pro"));
        assert_eq!(plans.tier_of(0x0c5e_77a1_b2d3_f405), Some("free"));
        assert_eq!(plans.tier_of(1), None);
    }

    #[test]
    fn bad_lines_name_the_file_the_line_and_what_is_wrong() {
        let cases = [
            (
                "api_key:9f2c41d07ab3e6f1,gold\n",
                1,
                "tier",
                "no tier named `gold`",
            ),
            (
                "\napi_key:9f2c41d07ab3e6f1\n",
                2,
                "api_key",
                "write `api_key:HASH,TIER`",
            ),
            (
                "api_key:secret-in-clear,pro\n",
                1,
                "api_key",
                "never in clear",
            ),
            ("user:alice,pro\n", 1, "api_key", "lists API keys"),
            (
                "api_key:9F2C41D07AB3E6F1,pro\n",
                1,
                "api_key",
                "never in clear",
            ),
            (
                "api_key:9f2c41d07ab3e6f1,pro\n# again\napi_key:9f2c41d07ab3e6f1,free\n",
                3,
                "api_key",
                "listed twice",
            ),
        ];
        for (text, line, field, reason) in cases {
            let error = load(text, &BTreeMap::new()).unwrap_err();
            assert!(error.file.ends_with("plans.csv"), "{error}");
            assert_eq!((error.line, error.field.as_str()), (line, field), "{error}");
            assert!(error.reason.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_key_in_tenants_too_is_refused_and_a_missing_file_is_named() {
        let tenants: BTreeMap<String, String> =
            [("api_key:9f2c41d07ab3e6f1".to_string(), "pro".to_string())].into();
        let error = load("api_key:9f2c41d07ab3e6f1,pro\n", &tenants).unwrap_err();
        assert!(error.reason.contains("`tenants`"), "{error}");
        let source = Source {
            file: "/nonexistent/policies.toml",
            text: "",
        };
        let error = load_plans(&source, 1, "plans.csv", &tiers(), &BTreeMap::new()).unwrap_err();
        assert!(error.file.ends_with("plans.csv"), "{error}");
        assert!(error.reason.contains("cannot read"), "{error}");
    }

    #[test]
    fn a_line_of_any_bytes_is_an_error_never_a_panic() {
        let long = format!("api_key:{},pro\n", "é".repeat(10_000));
        for text in [
            long.as_str(),
            "api_key:,pro",
            ",,,",
            "api_key:9f2c41d07ab3e6f1,",
            "\u{0}",
        ] {
            assert!(load(text, &BTreeMap::new()).is_err(), "{text:?}");
        }
    }
}
