//! The one builder of snapshot paths: every snapshot directory and file name is made here.
//!
//! Layout (relative to a storage location):
//!
//! - checkpoints: `<state.checkpoints.dir>/<job id>/chk-<n>/` ([`checkpoint_dir`]);
//! - savepoints: `<target dir>/savepoint-<first 6 of job id>-<12 hex>/` ([`savepoint_dir_name`]);
//! - inside either: [`METADATA_FILE`] and one data file per subtask that holds state
//!   ([`data_file_name`]). Names inside a snapshot are relative to its directory.

use std::sync::atomic::{AtomicU64, Ordering};

/// The metadata file of every snapshot directory.
pub const METADATA_FILE: &str = "_metadata";

/// The prefix of a checkpoint directory's name.
pub const CHECKPOINT_DIR_PREFIX: &str = "chk-";

/// The prefix of a savepoint directory's name.
pub const SAVEPOINT_DIR_PREFIX: &str = "savepoint-";

/// The directory of checkpoint `checkpoint_id` of a job, relative to `state.checkpoints.dir`:
/// `<job id>/chk-<n>`.
pub fn checkpoint_dir(job_id: &str, checkpoint_id: u64) -> String {
    format!("{job_id}/{}", checkpoint_dir_name(checkpoint_id))
}

/// The name of a checkpoint's own directory: `chk-<n>`.
pub fn checkpoint_dir_name(checkpoint_id: u64) -> String {
    format!("{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")
}

/// The directory holding a job's checkpoints, relative to `state.checkpoints.dir`: `<job id>`.
pub fn job_checkpoints_dir(job_id: &str) -> String {
    job_id.to_string()
}

/// A savepoint directory's name: `savepoint-<first 6 characters of the job id>-<random12>`.
pub fn savepoint_dir_name(job_id: &str, random12: &str) -> String {
    let short: String = job_id.chars().take(6).collect();
    format!("{SAVEPOINT_DIR_PREFIX}{short}-{random12}")
}

/// A fresh savepoint directory name for `job_id`, with 12 pseudo-random hex digits (from the
/// clock, the process id, a per-process counter and the job id).
pub fn new_savepoint_dir_name(job_id: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64);
    let mut seed = nanos ^ (u64::from(std::process::id()) << 32);
    seed = splitmix64(seed ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for byte in job_id.bytes() {
        seed = splitmix64(seed ^ u64::from(byte));
    }
    savepoint_dir_name(job_id, &format!("{:012x}", seed & 0xffff_ffff_ffff))
}

/// The splitmix64 finalizer: a cheap, well-mixed 64-bit permutation.
fn splitmix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The directory of a job's incremental-checkpoint data files, beside its `chk-<n>`
/// directories (Flink's `shared/`): `<job id>/shared/`.
pub const SHARED_DIR: &str = "shared";

/// The data file that checkpoint `checkpoint_id` of an incremental job writes for one
/// subtask into the job's [`SHARED_DIR`]: `chk-<n>-task-<vertex>-<subtask>.state`. Later
/// checkpoints may name its blocks too.
pub fn shared_data_file_name(checkpoint_id: u64, vertex_index: usize, subtask: u32) -> String {
    format!("{CHECKPOINT_DIR_PREFIX}{checkpoint_id}-{}", data_file_name(vertex_index, subtask))
}

/// The checkpoint that wrote a file of the shared directory (`chk-<n>-...`).
pub fn shared_file_checkpoint(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(CHECKPOINT_DIR_PREFIX)?;
    let (digits, _) = rest.split_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The data file of one subtask of one job vertex inside a snapshot directory:
/// `task-<vertex>-<subtask>.state`.
pub fn data_file_name(vertex_index: usize, subtask: u32) -> String {
    format!("task-{vertex_index}-{subtask}.state")
}

/// The checkpoint id of a directory named `chk-<n>`; `None` for any other name.
pub fn parse_checkpoint_id(dir_name: &str) -> Option<u64> {
    let digits = dir_name.strip_prefix(CHECKPOINT_DIR_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The snapshot directory of a location given by a user, who may name the directory itself
/// or its `_metadata` file (as Flink accepts both): strips a trailing `/_metadata` and slashes.
pub fn snapshot_dir_of(location: &str) -> &str {
    let trimmed = location.trim_end_matches('/');
    match trimmed.strip_suffix(METADATA_FILE) {
        Some(rest) if rest.ends_with('/') => rest.trim_end_matches('/'),
        _ => trimmed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(checkpoint_dir("abc", 7), "abc/chk-7");
        assert_eq!(job_checkpoints_dir("abc"), "abc");
        assert_eq!(savepoint_dir_name("cca7bc0123456789", "bb1e257f0dab"), "savepoint-cca7bc-bb1e257f0dab");
        assert_eq!(data_file_name(2, 3), "task-2-3.state");
        assert_eq!(parse_checkpoint_id("chk-12"), Some(12));
        assert_eq!(parse_checkpoint_id(&checkpoint_dir_name(u64::MAX)), Some(u64::MAX));
        for bad in ["chk-", "chk-+1", "chk--1", "chk-1a", "savepoint-1", "chk-99999999999999999999"] {
            assert_eq!(parse_checkpoint_id(bad), None, "{bad}");
        }
        assert_eq!(snapshot_dir_of("/tmp/sp/savepoint-a-b/_metadata"), "/tmp/sp/savepoint-a-b");
        assert_eq!(snapshot_dir_of("s3://b/x/chk-3/"), "s3://b/x/chk-3");
        assert_eq!(snapshot_dir_of("/tmp/x_metadata"), "/tmp/x_metadata");
    }

    #[test]
    fn fresh_savepoint_names_are_well_formed_and_distinct() {
        let job = "0123456789abcdef0123456789abcdef";
        let names: std::collections::BTreeSet<String> = (0..1000).map(|_| new_savepoint_dir_name(job)).collect();
        assert_eq!(names.len(), 1000);
        for name in &names {
            let random = name.strip_prefix("savepoint-012345-").unwrap();
            assert_eq!(random.len(), 12);
            assert!(random.bytes().all(|byte| byte.is_ascii_hexdigit() && !byte.is_ascii_uppercase()));
        }
    }
}
