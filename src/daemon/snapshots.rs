//! Snapshots on disk of the mesh's long-window counts (`mesh::node::snapshots`), so that a
//! restart of every node at once (a redeploy, a power cut) does not hand out a day's or a
//! month's quota again: each node writes what changed among the authorities and backups it
//! keeps every `[state] snapshot_interval` (one redb transaction), once more after its
//! drain, and reads them back at start. A crash between two writes loses what its
//! authorities granted since the last one (at most one interval of grants: the bound's
//! snapshot term, docs/overshoot.md).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::mesh::SavedKey;
use crate::net::MeshNet;

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("authorities");

/// The node's snapshot file.
pub(crate) struct Snapshots {
    db: Arc<redb::Database>,
}

fn db_key(policy: u32, key: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&policy.to_be_bytes());
    k[4..].copy_from_slice(&key.to_be_bytes());
    k
}

impl Snapshots {
    /// Open (or create) the snapshot file in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Snapshots, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("snapshots.redb");
        let db = redb::Database::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Snapshots { db: Arc::new(db) })
    }

    /// Everything saved.
    pub(crate) fn read(&self) -> Result<Vec<SavedKey>, redb::Error> {
        let read = self.db.begin_read()?;
        let table = match read.open_table(TABLE) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut saved = Vec::new();
        for item in table.iter()? {
            let (k, v) = item?;
            let k = k.value();
            let (Ok(policy), Ok(key)) = (
                k.get(..4)
                    .unwrap_or_default()
                    .try_into()
                    .map(u32::from_be_bytes),
                k.get(4..12)
                    .unwrap_or_default()
                    .try_into()
                    .map(u64::from_be_bytes),
            ) else {
                continue;
            };
            saved.push(SavedKey {
                policy,
                key,
                bytes: Some(v.value().to_vec()),
            });
        }
        Ok(saved)
    }

    /// Write `changes` in one transaction.
    fn write(db: &redb::Database, changes: &[SavedKey]) -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(TABLE)?;
            for c in changes {
                let k = db_key(c.policy, c.key);
                match &c.bytes {
                    Some(bytes) => {
                        table.insert(k.as_slice(), bytes.as_slice())?;
                    }
                    None => {
                        table.remove(k.as_slice())?;
                    }
                }
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Write what changed on `mesh` now (off the async threads); return how many keys.
    pub(crate) async fn write_changes(&self, mesh: &MeshNet) -> usize {
        let changes = mesh.snapshot_changes();
        if changes.is_empty() {
            return 0;
        }
        let n = changes.len();
        let db = Arc::clone(&self.db);
        let written = tokio::task::spawn_blocking(move || Snapshots::write(&db, &changes)).await;
        match written {
            Ok(Ok(())) => {
                metrics::counter!("ratemesh_snapshot_keys_written_total").increment(n as u64);
                n
            }
            Ok(Err(error)) => {
                metrics::counter!("ratemesh_snapshot_failures_total").increment(1);
                tracing::error!(%error, "snapshot not written");
                0
            }
            Err(_) => 0,
        }
    }

    /// Write what changed every `interval` until the task is aborted.
    pub(crate) fn spawn(
        self: Arc<Self>,
        mesh: Arc<MeshNet>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(interval);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                self.write_changes(&mesh).await;
            }
        })
    }
}
