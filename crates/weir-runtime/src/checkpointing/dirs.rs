//! Where each in-flight checkpoint's files go, shared between whoever learns of checkpoints
//! (the coordinator; on a TaskManager, the JobManager's messages) and the subtasks' snapshot
//! sinks, which look up the directory of every barrier they snapshot.
//!
//! A checkpoint that completed or was aborted is *retired*: a snapshot of it arriving late is
//! dropped at once instead of waiting for a directory that will never come.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use weir_checkpoint::storage::BlockingStorage;

/// Retired checkpoint ids remembered, at most (older ones are far past any barrier).
const RETIRED_MAX: usize = 4096;
/// An open directory this many ids older than the newest one opened is retired: its
/// checkpoint ended long ago (a TaskManager does not hear of every completion).
const OPEN_WINDOW: u64 = 1024;

#[derive(Default)]
struct Inner {
    open: HashMap<u64, Arc<BlockingStorage>>,
    retired: BTreeSet<u64>,
}

/// Checkpoint directories by id.
#[derive(Default)]
pub struct SnapshotDirectories {
    inner: Mutex<Inner>,
    changed: Condvar,
}

/// The directories of one job (or one attempt on a TaskManager).
pub type SnapshotDirs = Arc<SnapshotDirectories>;

impl SnapshotDirectories {
    /// An empty registry.
    pub fn new() -> SnapshotDirs {
        Arc::new(SnapshotDirectories::default())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checkpoint `id` writes into `dir` (ignored when it was retired already).
    pub fn open(&self, id: u64, dir: Arc<BlockingStorage>) {
        let mut inner = self.lock();
        if inner.retired.contains(&id) {
            return;
        }
        inner.open.insert(id, dir);
        let stale: Vec<u64> = inner.open.keys().copied().filter(|open| *open + OPEN_WINDOW < id).collect();
        for old in stale {
            retire_locked(&mut inner, old);
        }
        drop(inner);
        self.changed.notify_all();
    }

    /// Checkpoint `id` completed or was aborted: no more snapshots of it are written.
    pub fn retire(&self, id: u64) {
        retire_locked(&mut self.lock(), id);
        self.changed.notify_all();
    }

    /// True once checkpoint `id` completed or was aborted.
    pub fn is_retired(&self, id: u64) -> bool {
        self.lock().retired.contains(&id)
    }

    /// The directory of checkpoint `id`, if it is open.
    pub fn get(&self, id: u64) -> Option<Arc<BlockingStorage>> {
        self.lock().open.get(&id).cloned()
    }

    /// The directory of checkpoint `id`, waiting up to `timeout` for it to be opened (on a
    /// TaskManager it may arrive just after the barrier); `None` at once when it is retired.
    pub fn wait_for(&self, id: u64, timeout: Duration) -> Option<Arc<BlockingStorage>> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            if let Some(dir) = inner.open.get(&id) {
                return Some(Arc::clone(dir));
            }
            let now = Instant::now();
            if inner.retired.contains(&id) || now >= deadline {
                return None;
            }
            inner = match self.changed.wait_timeout(inner, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

fn retire_locked(inner: &mut Inner, id: u64) {
    inner.open.remove(&id);
    inner.retired.insert(id);
    while inner.retired.len() > RETIRED_MAX {
        inner.retired.pop_first();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_checkpoint::SnapshotStorage;

    fn dir() -> Arc<BlockingStorage> {
        Arc::new(SnapshotStorage::from_url("memory://dirs-test/x").unwrap().blocking())
    }

    #[test]
    fn a_retired_checkpoint_is_not_waited_for() {
        let dirs = SnapshotDirectories::new();
        dirs.open(1, dir());
        assert!(dirs.wait_for(1, Duration::ZERO).is_some());
        dirs.retire(1);
        let started = Instant::now();
        assert!(dirs.wait_for(1, Duration::from_secs(5)).is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        // A directory that arrives after its checkpoint was retired stays closed.
        dirs.open(1, dir());
        assert!(dirs.get(1).is_none());
    }

    #[test]
    fn a_directory_opened_while_waiting_is_returned() {
        let dirs = SnapshotDirectories::new();
        let opener = Arc::clone(&dirs);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            opener.open(7, dir());
        });
        assert!(dirs.wait_for(7, Duration::from_secs(5)).is_some());
        thread.join().unwrap();
        // Old open directories are retired as newer ones open.
        dirs.open(7 + OPEN_WINDOW + 1, dir());
        assert!(dirs.get(7).is_none());
    }
}
