//! The admin API's overrides on a node: the table of record, replicated to every member and
//! kept on disk.
//!
//! Each overridden key (a policy and its key's hash: identities are never kept) holds one
//! last-writer-wins register (`crdts::LWWReg`), marked by the wall-clock millisecond it was
//! set at and the node that set it: an override, or its removal. Merging keeps the later
//! mark, so nodes that hear the same changes in any order agree. A change made on one node
//! is sent to every live member at once; a member that missed it (down, cut off, new) gets
//! it from the pull every node makes of a random peer's table every 10 s, which costs one
//! small question while the tables agree (their digests match). Every change is written to
//! the node's `state_dir` (redb, one transaction per change) before it is applied, and the
//! table is read back at start: overrides survive a restart of every node. An override ends
//! at its `until`; a removal is kept until the end of the override it removed, so that an
//! older copy cannot bring it back.

use std::collections::BTreeMap;
use std::path::Path;

use crdts::CvRDT;
use crdts::lwwreg::LWWReg;
use parking_lot::Mutex;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::clock::Nanos;
use crate::rules::Rules;

/// The most overrides a cluster keeps.
pub(crate) const MAX_OVERRIDES: usize = 10_000;

/// The most records one question carries (well under the mesh's 16 KiB for a question).
pub(crate) const PAGE: usize = 40;

/// The longest reason kept with an override, in bytes.
pub(crate) const MAX_REASON_BYTES: usize = 200;

/// The longest an override may last.
pub(crate) const MAX_DURATION_MS: u64 = 366 * 24 * 3600 * 1000;

/// The longest policy or caller name a record from a peer may carry, in bytes.
const MAX_NAME_BYTES: usize = 256;

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("overrides");

/// An override as set: its limit, until when (UNIX ms), why and by whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Limit {
    pub(crate) limit: u64,
    pub(crate) until_ms: u64,
    pub(crate) reason: String,
    pub(crate) by: String,
}

/// One key's register as it travels and is stored: `value: None` is a removal (kept until
/// `keep_until_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) policy: String,
    pub(crate) key: u64,
    pub(crate) value: Option<Limit>,
    /// When it was set (UNIX ms) and by which node: the later mark wins.
    pub(crate) mark: (u64, u64),
    /// A removal's end (the end of the override it removed).
    pub(crate) keep_until_ms: u64,
}

impl Record {
    /// Check a record a peer sent against what a node would set itself: a limit of at least
    /// 1, an end at most [`MAX_DURATION_MS`] after it was set, a reason and names within
    /// their caps. A record that fails is not taken.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        let set_at = self.mark.0;
        let within = |end: u64| end > set_at && end - set_at <= MAX_DURATION_MS;
        if self.policy.is_empty() || self.policy.len() > MAX_NAME_BYTES {
            return Err("policy name");
        }
        match &self.value {
            Some(limit) => {
                if limit.limit == 0 {
                    return Err("a limit of 0");
                }
                if !within(limit.until_ms) {
                    return Err("an end more than 366 days after it was set");
                }
                if limit.reason.len() > MAX_REASON_BYTES || limit.by.len() > MAX_NAME_BYTES {
                    return Err("a reason or caller name too long");
                }
            }
            None if !within(self.keep_until_ms) => {
                return Err("a removal kept more than 366 days");
            }
            None => {}
        }
        Ok(())
    }

    fn ends_ms(&self) -> u64 {
        self.value
            .as_ref()
            .map_or(self.keep_until_ms, |v| v.until_ms)
    }
}

/// Why the table refused a change.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TableError {
    /// The cluster keeps as many overrides as it may.
    #[error("at most {MAX_OVERRIDES} overrides")]
    Full,
    /// The state directory could not be written.
    #[error("the state directory: {0}")]
    Disk(String),
}

type Register = LWWReg<Option<Limit>, (u64, u64)>;

/// The node's table of overrides.
pub(crate) struct Overrides {
    node: u64,
    table: Mutex<BTreeMap<(String, u64), (Register, u64)>>,
    db: Option<redb::Database>,
}

fn db_key(policy: &str, key: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(policy.len() + 9);
    k.extend_from_slice(policy.as_bytes());
    k.push(0);
    k.extend_from_slice(&key.to_be_bytes());
    k
}

impl Overrides {
    /// The table of node `node`, read back from `dir` (created if missing) when given.
    pub(crate) fn open(node: u64, dir: Option<&Path>) -> Result<Overrides, TableError> {
        let disk = |e: &dyn std::fmt::Display| TableError::Disk(e.to_string());
        let db = match dir {
            None => None,
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| disk(&format_args!("{}: {e}", dir.display())))?;
                let path = dir.join("overrides.redb");
                Some(
                    redb::Database::create(&path)
                        .map_err(|e| disk(&format_args!("{}: {e}", path.display())))?,
                )
            }
        };
        let overrides = Overrides {
            node,
            table: Mutex::new(BTreeMap::new()),
            db,
        };
        let records = overrides.read_disk().map_err(|e| disk(&e))?;
        overrides.merge(records, false)?;
        Ok(overrides)
    }

    fn read_disk(&self) -> Result<Vec<Record>, redb::Error> {
        let Some(db) = &self.db else {
            return Ok(Vec::new());
        };
        let read = db.begin_read()?;
        let table = match read.open_table(TABLE) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut records = Vec::new();
        for item in table.iter()? {
            let (_, value) = item?;
            // A record this build cannot read is skipped (and overwritten by the next
            // change of its key).
            if let Ok(record) = serde_json::from_slice::<Record>(value.value()) {
                records.push(record);
            }
        }
        Ok(records)
    }

    fn write_disk(&self, records: &[Record]) -> Result<(), TableError> {
        let Some(db) = &self.db else {
            return Ok(());
        };
        let write = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            {
                let mut table = txn.open_table(TABLE)?;
                for r in records {
                    let value = serde_json::to_vec(r).unwrap_or_default();
                    table.insert(db_key(&r.policy, r.key).as_slice(), value.as_slice())?;
                }
            }
            txn.commit()?;
            Ok(())
        };
        write().map_err(|e| TableError::Disk(e.to_string()))
    }

    /// Set (or with `None` remove) the override of `key` under `policy` at `now_ms`: the
    /// record to apply and send to the members.
    pub(crate) fn set(
        &self,
        policy: &str,
        key: u64,
        value: Option<Limit>,
        now_ms: u64,
    ) -> Result<Record, TableError> {
        let table = self.table.lock();
        let slot = (policy.to_string(), key);
        let (previous_mark, previous_end) = table
            .get(&slot)
            .map_or(((0, 0), 0), |(r, end)| (r.marker, *end));
        if value.is_some() && previous_mark == (0, 0) && table.len() >= MAX_OVERRIDES {
            return Err(TableError::Full);
        }
        // Later than whatever this node has seen of the key, whatever its clock says.
        let mark = (now_ms.max(previous_mark.0 + 1), self.node);
        let record = Record {
            policy: policy.to_string(),
            key,
            keep_until_ms: previous_end,
            value,
            mark,
        };
        drop(table);
        self.merge(vec![record.clone()], true)?;
        Ok(record)
    }

    /// Merge `records` from a peer (or the disk): return those that changed the table.
    /// With `write`, the changes are written to disk first.
    pub(crate) fn merge(
        &self,
        records: Vec<Record>,
        write: bool,
    ) -> Result<Vec<Record>, TableError> {
        let mut table = self.table.lock();
        let mut changed = Vec::new();
        for record in records {
            let slot = (record.policy.clone(), record.key);
            let incoming = Register {
                val: record.value.clone(),
                marker: record.mark,
            };
            match table.get_mut(&slot) {
                Some((register, end)) => {
                    if register.validate_merge(&incoming).is_err() || register.marker >= record.mark
                    {
                        continue;
                    }
                    register.merge(incoming);
                    *end = record.ends_ms();
                }
                None => {
                    if table.len() >= MAX_OVERRIDES {
                        continue;
                    }
                    table.insert(slot, (incoming, record.ends_ms()));
                }
            }
            changed.push(record);
        }
        drop(table);
        if write && !changed.is_empty() {
            self.write_disk(&changed)?;
        }
        Ok(changed)
    }

    /// Every record, in key order (after `after`, at most `n`), and whether more follow.
    pub(crate) fn page(&self, after: Option<&(String, u64)>, n: usize) -> (Vec<Record>, bool) {
        let table = self.table.lock();
        let mut out = Vec::new();
        let mut more = false;
        let start = match after {
            Some(a) => std::ops::Bound::Excluded(a.clone()),
            None => std::ops::Bound::Unbounded,
        };
        for ((policy, key), (register, end)) in table.range((start, std::ops::Bound::Unbounded)) {
            if out.len() == n {
                more = true;
                break;
            }
            out.push(Record {
                policy: policy.clone(),
                key: *key,
                value: register.val.clone(),
                mark: register.marker,
                keep_until_ms: *end,
            });
        }
        (out, more)
    }

    /// The overrides in force at `now_ms` (removals left out).
    pub(crate) fn list(&self, now_ms: u64) -> Vec<Record> {
        let (all, _) = self.page(None, usize::MAX);
        all.into_iter()
            .filter(|r| r.value.as_ref().is_some_and(|v| v.until_ms > now_ms))
            .collect()
    }

    /// A digest of the whole table: equal on two nodes whose tables agree.
    pub(crate) fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let table = self.table.lock();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for ((policy, key), (register, _)) in table.iter() {
            (policy, key, register.marker).hash(&mut h);
        }
        table.len().hash(&mut h);
        h.finish()
    }

    /// Forget what ended by `now_ms` (overrides and their removals), on disk too; return the
    /// keys whose override ended.
    pub(crate) fn sweep(&self, now_ms: u64) -> Vec<(String, u64)> {
        let mut table = self.table.lock();
        let ended: Vec<(String, u64)> = table
            .iter()
            .filter(|(_, (_, end))| *end <= now_ms)
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in &ended {
            table.remove(slot);
        }
        drop(table);
        if let Some(db) = &self.db
            && !ended.is_empty()
        {
            let remove = || -> Result<(), redb::Error> {
                let txn = db.begin_write()?;
                {
                    let mut t = txn.open_table(TABLE)?;
                    for (policy, key) in &ended {
                        t.remove(db_key(policy, *key).as_slice())?;
                    }
                }
                txn.commit()?;
                Ok(())
            };
            if let Err(error) = remove() {
                tracing::warn!(%error, "ended overrides not removed from the state directory");
            }
        }
        ended
    }

    /// Apply `record` to `rules` at `now` (UNIX ns).
    pub(crate) fn apply(rules: &Rules, record: &Record, now: Nanos) {
        let limit = record
            .value
            .as_ref()
            .filter(|v| u128::from(v.until_ms) * 1_000_000 > u128::from(now))
            .map(|v| (v.limit, v.until_ms.saturating_mul(1_000_000)));
        if let Err(error) = rules.set_override(&record.policy, record.key, limit, now) {
            tracing::warn!(policy = record.policy, %error, "override not applied");
        }
    }

    /// Apply every record to `rules` (at start, and after a reload).
    pub(crate) fn apply_all(&self, rules: &Rules, now: Nanos) {
        let (all, _) = self.page(None, usize::MAX);
        for record in &all {
            Overrides::apply(rules, record, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(n: u64) -> Option<Limit> {
        Some(Limit {
            limit: n,
            until_ms: 10_000,
            reason: String::new(),
            by: "ops".into(),
        })
    }

    #[test]
    fn records_no_node_would_set_are_refused() {
        let good = Record {
            policy: "per_key".into(),
            key: 7,
            value: limit(5),
            mark: (1_000, 1),
            keep_until_ms: 0,
        };
        assert_eq!(good.check(), Ok(()));
        let bad = |change: fn(&mut Record)| {
            let mut r = good.clone();
            change(&mut r);
            r.check().is_err()
        };
        assert!(bad(|r| r.policy.clear()));
        assert!(bad(|r| r.policy = "p".repeat(300)));
        assert!(bad(|r| r.value.as_mut().unwrap().limit = 0));
        assert!(bad(|r| r.value.as_mut().unwrap().until_ms = 999));
        assert!(bad(
            |r| r.value.as_mut().unwrap().until_ms = 1_000 + MAX_DURATION_MS + 1
        ));
        assert!(bad(
            |r| r.value.as_mut().unwrap().reason = "x".repeat(MAX_REASON_BYTES + 1)
        ));
        assert!(bad(|r| r.value.as_mut().unwrap().by = "x".repeat(300)));
        assert!(bad(|r| {
            r.value = None;
            r.keep_until_ms = u64::MAX;
        }));
        let removal = Record {
            value: None,
            keep_until_ms: 2_000,
            ..good.clone()
        };
        assert_eq!(removal.check(), Ok(()));
    }

    #[test]
    fn the_later_mark_wins_in_any_order_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let a = Overrides::open(1, Some(dir.path())).unwrap();
        let b = Overrides::open(2, None).unwrap();
        let first = a.set("p", 7, limit(100), 1_000).unwrap();
        let second = b.set("p", 7, limit(200), 2_000).unwrap();
        let removal = a.set("p", 8, None, 1_500).unwrap();
        // Heard in either order, both agree on the later.
        a.merge(vec![second.clone()], true).unwrap();
        b.merge(vec![first.clone(), removal], true).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.list(0)[0].value.as_ref().unwrap().limit, 200);
        assert!(
            a.merge(vec![first], true).unwrap().is_empty(),
            "older: no change"
        );
        // Read back from disk.
        drop(a);
        let a = Overrides::open(1, Some(dir.path())).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.list(0).len(), 1);
        // Ended: swept, on disk too.
        assert_eq!(a.sweep(20_000).len(), 2);
        drop(a);
        assert!(
            Overrides::open(1, Some(dir.path()))
                .unwrap()
                .list(0)
                .is_empty()
        );
    }

    #[test]
    fn a_node_marks_its_change_after_any_it_has_seen() {
        let a = Overrides::open(1, None).unwrap();
        let remote = Record {
            policy: "p".into(),
            key: 1,
            value: limit(5),
            mark: (9_000, 2),
            keep_until_ms: 0,
        };
        a.merge(vec![remote], false).unwrap();
        // This node's clock is behind: its removal still wins.
        let removal = a.set("p", 1, None, 100).unwrap();
        assert_eq!(removal.mark, (9_001, 1));
        assert!(a.list(0).is_empty());
    }
}
