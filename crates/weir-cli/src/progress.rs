//! Progress bars (indicatif, on stderr) for the long operations: a savepoint or stop being
//! written, and a job reading its state back on `run -s`. They draw only on a terminal, so
//! scripts and logs see just the final lines.

use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use weir_runtime::status::JobDetails;
use weir_types::{ExecutionState, Lifecycle};

use crate::error::CliError;

/// Longest `run -s` waits for the restore to finish before leaving the bar.
const RESTORE_WAIT_MAX: Duration = Duration::from_secs(600);
/// Longest the job may take to start its restore.
const RESTORE_APPEARS_MAX: Duration = Duration::from_secs(10);

fn style(template: &str) -> ProgressStyle {
    // The templates are constants of this module; fall back to the default on a typo.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> ")
}

fn bar(template: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(style(template));
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// A savepoint (or stop-with-savepoint) being written: subtasks done, bytes written.
pub struct SavepointBar {
    bar: ProgressBar,
}

impl SavepointBar {
    /// A bar for `what` (e.g. `savepoint of job <id>`).
    pub fn new(what: &str) -> SavepointBar {
        let bar = bar("{spinner} {prefix} [{bar:30}] {pos}/{len} subtasks written, {msg}");
        bar.set_prefix(what.to_string());
        bar.set_message("0 B");
        SavepointBar { bar }
    }

    /// Updates from the `progress` of `GET /jobs/{id}/savepoints/{request}`.
    pub fn update(&self, progress: &serde_json::Value) {
        if let (Some(done), Some(total)) =
            (progress["num_acknowledged_subtasks"].as_u64(), progress["num_subtasks"].as_u64())
        {
            self.bar.set_length(total);
            self.bar.set_position(done);
        }
        if let Some(bytes) = progress["state_size"].as_u64() {
            self.bar.set_message(HumanBytes(bytes).to_string());
        }
    }

    /// Removes the bar (the caller prints the outcome).
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// Follows a job restoring from a snapshot until every subtask runs (or the job ends),
/// drawing bytes read against the snapshot's size; then prints one line with what was read.
pub fn follow_restore(mut details: impl FnMut() -> Result<JobDetails, CliError>) -> Result<(), CliError> {
    let started = Instant::now();
    let bar = bar("{spinner} restoring [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}) {msg}");
    let deadline = started + RESTORE_WAIT_MAX;
    loop {
        let job = details()?;
        let Some(restore) = &job.restore else {
            // The job master records the restore as it starts the job.
            if job.state.is_terminal() || started.elapsed() > RESTORE_APPEARS_MAX {
                bar.finish_and_clear();
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        bar.set_length(restore.bytes_total.max(1));
        bar.set_position(restore.bytes_read.min(restore.bytes_total));
        let subtasks: Vec<ExecutionState> =
            job.vertices.iter().flat_map(|v| v.subtasks.iter().map(|s| s.status)).collect();
        let running =
            subtasks.iter().filter(|s| matches!(s, ExecutionState::Running | ExecutionState::Finished)).count();
        bar.set_message(format!("{running}/{} subtasks running", subtasks.len()));
        let restored = !subtasks.is_empty() && running == subtasks.len();
        if restored || job.state.is_terminal() || Instant::now() >= deadline {
            bar.finish_and_clear();
            if restored {
                eprintln!(
                    "Restored {} from {} (checkpoint {}) in {:.2} s",
                    HumanBytes(restore.bytes_read),
                    restore.external_path,
                    restore.checkpoint_id,
                    started.elapsed().as_secs_f64()
                );
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
