//! Scratch directories of the local stores (`io.tmp.dirs`), and the removal of those a
//! killed process left behind.
//!
//! A store's directory is scratch: a restart restores from the checkpoint. fjall deletes it
//! when the store closes, but a process killed with SIGKILL (or a machine that lost power)
//! leaves it, and state that spilled to disk can be gigabytes. So each directory `<name>`
//! has a lock file `<name>.lock` beside it, which its process holds an exclusive lock on
//! while the store is open. A store opening under the same parent first removes every
//! directory whose lock nobody holds: the lock dies with its process, whatever its PID
//! namespace, so a store of a live process (in another container sharing the directory,
//! say) is never touched. A directory without a lock file is not ours to judge and is kept.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory of one open store, and the lock that marks it in use. Dropping it
/// removes the lock file (the store removes the directory itself).
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a lock file left behind names a directory that is gone, and the next
        // sweep removes it.
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Names a new directory `<prefix>-<pid>-<n>` under `parent` and locks it (the directory
/// itself is left to the store to create), after removing the abandoned ones of `prefix`.
pub(crate) fn claim(parent: &Path, prefix: &str) -> io::Result<ScratchDir> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(parent)?;
    remove_abandoned(parent, prefix);
    loop {
        let name = format!("{prefix}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let path = parent.join(&name);
        let lock_path = parent.join(format!("{name}.lock"));
        // A name a dead process used (its PID reused) is skipped, not taken over.
        let lock = match OpenOptions::new().write(true).create_new(true).open(&lock_path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        if path.exists() {
            drop(lock);
            let _ = std::fs::remove_file(&lock_path);
            continue;
        }
        // Another store's sweep may find the file between its creation and this lock, and
        // remove it: that name is gone (held by the sweep, or locked here but no longer
        // on disk), so take the next.
        match lock.try_lock() {
            Ok(()) if still_at(&lock, &lock_path) => return Ok(ScratchDir { path, lock_path, _lock: lock }),
            Ok(()) | Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Whether `file` is still the file at `path` (not removed, nor replaced, since opened).
fn still_at(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

/// Removes the directories of `prefix` under `parent` whose lock nobody holds, with their
/// lock files. Failures are logged and skipped: they cost disk space, not correctness.
pub(crate) fn remove_abandoned(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return removed;
    };
    let start = format!("{prefix}-");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str().and_then(|n| n.strip_prefix(&start)).and_then(|n| n.strip_suffix(".lock"))
        else {
            continue;
        };
        let lock_path = entry.path();
        let Ok(lock) = OpenOptions::new().write(true).open(&lock_path) else {
            continue;
        };
        // Held: its process lives. An error (a file system without locks): leave it.
        if lock.try_lock().is_err() {
            continue;
        }
        let dir = parent.join(format!("{start}{name}"));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "removed the local store of a process that is gone");
                removed.push(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the local store of a process that is gone; remove it by hand");
                continue;
            }
        }
        let _ = std::fs::remove_file(&lock_path);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_directory_whose_lock_nobody_holds_is_removed_and_a_held_one_kept() {
        let parent = tempfile::tempdir().unwrap();
        let held = claim(parent.path(), "weir-test").unwrap();
        std::fs::create_dir(&held.path).unwrap();
        std::fs::write(held.path.join("data"), b"live").unwrap();
        // What a killed process leaves: a directory and its lock file, the lock released.
        let dead = parent.path().join("weir-test-999999-7");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("data"), b"abandoned").unwrap();
        std::fs::write(parent.path().join("weir-test-999999-7.lock"), b"").unwrap();
        // Not ours to judge: no lock file, or another prefix.
        std::fs::create_dir(parent.path().join("weir-test-999999-8")).unwrap();
        std::fs::create_dir(parent.path().join("weir-other-999999-7")).unwrap();
        std::fs::write(parent.path().join("weir-other-999999-7.lock"), b"").unwrap();

        assert_eq!(remove_abandoned(parent.path(), "weir-test"), [dead]);
        let held_name = held.path.file_name().unwrap().to_string_lossy().into_owned();
        let mut expected = vec![
            held_name.clone(),
            format!("{held_name}.lock"),
            "weir-other-999999-7".into(),
            "weir-other-999999-7.lock".into(),
            "weir-test-999999-8".into(),
        ];
        expected.sort();
        assert_eq!(names(parent.path()), expected);

        // Closed: its lock file goes with it (the store removes the directory).
        drop(held);
        assert!(!names(parent.path()).contains(&format!("{held_name}.lock")));
    }

    #[test]
    fn a_lock_file_removed_under_its_opener_is_noticed() {
        let parent = tempfile::tempdir().unwrap();
        let path = parent.path().join("weir-test-1-0.lock");
        let file = File::create(&path).unwrap();
        assert!(still_at(&file, &path));
        std::fs::remove_file(&path).unwrap();
        assert!(!still_at(&file, &path));
        // Another file under the same name is not the one opened.
        std::fs::write(&path, b"").unwrap();
        assert!(!still_at(&file, &path));
    }

    #[test]
    fn each_claim_gets_a_fresh_name() {
        let parent = tempfile::tempdir().unwrap();
        let a = claim(parent.path(), "weir-test").unwrap();
        let b = claim(parent.path(), "weir-test").unwrap();
        assert_ne!(a.path, b.path);
        assert!(remove_abandoned(parent.path(), "weir-test").is_empty());
    }
}
