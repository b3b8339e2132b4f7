//! One controller at a time per store: a file lock in the data directory, or a leadership in
//! etcd (a second operator stands by and takes over when the first dies).

use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use weir_ha::{Election, EtcdClient, LeaderInfo, Leadership};

/// The lease of an operator's leadership in etcd.
const OPERATOR_LEASE_TTL: Duration = Duration::from_secs(2);

/// The data directory's lock file, held while this process is the controller.
pub struct OperatorLock {
    _file: std::fs::File,
}

fn lock_path(root: &Path) -> PathBuf {
    root.join(".operator.lock")
}

/// Takes the lock file under `root`; an error names the process that holds it.
pub fn lock_file(root: &Path) -> Result<OperatorLock, String> {
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let path = lock_path(root);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(format!(
                "another `weir operator` (pid {}) already controls the deployments in {}; stop it first (`weir operator stop`)",
                holder.trim(),
                root.display()
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(format!("cannot lock {}: {e}", path.display())),
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(file, "{}", std::process::id());
    Ok(OperatorLock { _file: file })
}

/// Whether some process holds the lock file under `root`.
pub fn file_lock_held(root: &Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(lock_path(root)) else { return false };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(_) => true,
    }
}

/// The election of the operator of `cluster_id`'s deployments.
pub fn election(client: Arc<EtcdClient>, cluster_id: &str) -> Election {
    Election::new(client, &format!("/weir/{cluster_id}/operator/leader"), OPERATOR_LEASE_TTL)
}

/// Waits to lead the operators of `cluster_id` in etcd, publishing its REST address; `None`
/// when `stop` was set first.
pub fn lead(
    client: Arc<EtcdClient>,
    cluster_id: &str,
    rest_address: &str,
    stop: &AtomicBool,
) -> Result<Option<Leadership>, String> {
    let info = LeaderInfo {
        id: format!("operator-{}", std::process::id()),
        rest_address: rest_address.to_string(),
        rpc_address: String::new(),
    };
    election(client, cluster_id).campaign(&info, stop).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_file_admits_one_operator() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!file_lock_held(dir.path()));
        let lock = lock_file(dir.path()).unwrap();
        assert!(file_lock_held(dir.path()));
        let err = lock_file(dir.path()).err().unwrap();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(lock);
        assert!(!file_lock_held(dir.path()));
    }
}
