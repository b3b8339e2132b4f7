//! The checkpoint options of a job (Flink's `execution.checkpointing.*` and `state.*`).

use std::time::Duration;

/// The default state backend (`state.backend.type`), recorded in each snapshot: a native
/// snapshot restores only into a backend of the same layout.
pub const STATE_BACKEND: &str = "hashmap";

/// How a job checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointSettings {
    /// Time between periodic checkpoints; `None` turns them off (savepoints still work).
    pub interval: Option<Duration>,
    /// Align barriers (exactly-once) or not (at-least-once).
    pub exactly_once: bool,
    /// Unaligned checkpoints (`execution.checkpointing.unaligned.enabled`, exactly-once
    /// only): barriers overtake queued records, which are snapshotted as in-flight state.
    /// Savepoints stay aligned, as in Flink.
    pub unaligned: bool,
    /// A checkpoint not complete after this long is aborted.
    pub timeout: Duration,
    /// Least time between the end of one checkpoint and the start of the next.
    pub min_pause: Duration,
    /// Periodic checkpoints in flight at once, at most.
    pub max_concurrent: u32,
    /// Consecutive failed checkpoints tolerated before the job fails.
    pub tolerable_failures: u32,
    /// Completed checkpoints kept; older ones are deleted.
    pub num_retained: u32,
    /// Where checkpoints go (`state.checkpoints.dir`): `<url>/<job id>/chk-<n>/`.
    pub checkpoints_url: String,
    /// Default target of savepoints (`state.savepoints.dir`).
    pub savepoints_url: Option<String>,
    /// Incremental checkpoints (`execution.checkpointing.incremental`): `Some(n)`, each key
    /// group written whole again once every n checkpoints of its subtask
    /// (`execution.checkpointing.incremental.materialize-every`).
    pub incremental: Option<u32>,
    /// `execution.state-recovery.claim-mode: CLAIM`: a restored checkpoint becomes the job's
    /// and is disposed once the job's own checkpoints subsume it.
    pub claim_restored: bool,
    /// `state.backend.type: spillable` or `fjall`: the local store's directory, memory
    /// budget and layout; `None` for `hashmap`.
    pub spill: Option<weir_state::spill::SpillOptions>,
}

impl CheckpointSettings {
    /// The state backend's name, as snapshots record it.
    pub fn state_backend(&self) -> &'static str {
        self.spill.as_ref().map_or(STATE_BACKEND, |spill| spill.backend_name())
    }
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            interval: None,
            exactly_once: true,
            unaligned: false,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 0,
            num_retained: 1,
            checkpoints_url: default_checkpoints_url(),
            savepoints_url: None,
            incremental: None,
            claim_restored: false,
            spill: None,
        }
    }
}

/// `file://<data dir>/checkpoints`, where the data dir is `$WEIR_DATA_DIR`, else
/// `$HOME/.local/share/weir`, else `./.weir`.
pub fn default_checkpoints_url() -> String {
    let data_dir = match std::env::var_os("WEIR_DATA_DIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => match std::env::var_os("HOME") {
            Some(home) => std::path::PathBuf::from(home).join(".local/share/weir"),
            None => std::path::PathBuf::from(".weir"),
        },
    };
    let dir = data_dir.join("checkpoints");
    // A URL needs an absolute path; a relative WEIR_DATA_DIR counts from the working directory.
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    format!("file://{}", dir.display())
}
