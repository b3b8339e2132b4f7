//! The embedded clusters `weir run` serves on this machine, recorded under
//! `<data dir>/runs/<pid>.json` while they run, so that `weir list`, `stop`, `cancel` and
//! `savepoint` without `-m` find a job whose run could not take the default REST port
//! (another cluster holds 8081), instead of asking that other cluster.

use std::path::PathBuf;

use crate::settings;

/// One `weir run` serving a job.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// The `weir run` process.
    pub pid: u32,
    /// Its job.
    pub job_id: String,
    /// Its REST API, `http://HOST:PORT`.
    pub rest: String,
}

fn runs_dir() -> PathBuf {
    settings::data_dir().join("runs")
}

/// This process's record while it lives; removed when dropped.
pub struct Registration(Option<PathBuf>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Records that this process serves `job_id` at `rest`. Best effort: a run whose data
/// directory cannot be written still runs (and is found with `-m`).
pub fn register(job_id: &str, rest: &str) -> Registration {
    let record = RunRecord { pid: std::process::id(), job_id: job_id.to_string(), rest: rest.to_string() };
    let path = runs_dir().join(format!("{}.json", record.pid));
    let written = std::fs::create_dir_all(runs_dir())
        .ok()
        .and_then(|()| serde_json::to_vec(&record).ok())
        .and_then(|bytes| std::fs::write(&path, bytes).ok());
    Registration(written.map(|()| path))
}

/// Whether `pid` is a live `weir run` (a record whose process was killed is stale).
fn running(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| cmdline.split(|b| *b == 0).any(|arg| arg == b"run"))
}

/// The runs alive now, by pid; stale records are removed.
pub fn live() -> Vec<RunRecord> {
    let Ok(entries) = std::fs::read_dir(runs_dir()) else { return Vec::new() };
    let mut runs: Vec<RunRecord> = entries
        .flatten()
        .filter_map(|entry| {
            let record: RunRecord = serde_json::from_slice(&std::fs::read(entry.path()).ok()?).ok()?;
            if running(record.pid) {
                Some(record)
            } else {
                let _ = std::fs::remove_file(entry.path());
                None
            }
        })
        .collect();
    runs.sort_by_key(|run| run.pid);
    runs
}

#[cfg(test)]
mod tests {
    use super::RunRecord;

    #[test]
    fn a_record_reads_back() {
        let record = RunRecord { pid: 7, job_id: "ab".into(), rest: "http://127.0.0.1:1".into() };
        let bytes = serde_json::to_vec(&record).unwrap();
        assert_eq!(serde_json::from_slice::<RunRecord>(&bytes).unwrap(), record);
    }
}
