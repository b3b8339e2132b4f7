//! Named crash points on the checkpoint, stop and submit paths, for the tests that kill a
//! JobManager exactly there. `FAILPOINTS="<name>=return"` (or `"<name>=2*off->return"`: on
//! the third time it is reached) makes the process abort at that point, as `kill -9` would:
//! no cleanup runs. Unset, a point costs one read of an empty registry.
//!
//! The points: `checkpoint-before-metadata` (every subtask acknowledged, `_metadata` not
//! written), `checkpoint-after-metadata` (written, its HA pointer not), `checkpoint-after-pointer`
//! (complete, the sinks not told to commit), `stop-savepoint-triggered` (a stop-with-savepoint's
//! barriers are out), `stop-subtask-finished` (its savepoint completed and a subtask finished
//! after committing it; the job has not ended), `submit-after-record` (a submitted job is recorded in the HA store,
//! not started). The deployment controller's, between the steps of an upgrade:
//! `operator-after-stop-triggered`, `operator-after-savepoint-recorded`,
//! `operator-after-job-cancelled`, `operator-after-cluster-stopped`,
//! `operator-after-cluster-started`, `operator-after-submit`, and `operator-in-pre-flight`
//! (before the pre-flight's dry run; armed with the `fail` crate's `sleep(ms)` instead of
//! `return`, it holds the controller there, for the tests that freeze it mid-upgrade).
//! `snapshot-before-write` is reached by a snapshot writer thread before each subtask's
//! snapshot is written; armed with `sleep(ms)` it plays slow checkpoint storage.

/// Aborts the process here when the crash point `name` is armed.
pub fn point(name: &str) {
    fail::fail_point!(name, |_| {
        eprintln!("crash point '{name}' reached: aborting the process");
        std::process::abort()
    });
}

/// Arms the crash points `FAILPOINTS` names (`name=actions;...`, the `fail` crate's syntax);
/// an unreadable entry is an error naming it.
pub fn arm_from_env() -> Result<(), String> {
    let Ok(points) = std::env::var("FAILPOINTS") else {
        return Ok(());
    };
    for entry in points.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, actions)) = entry.split_once('=') else {
            return Err(format!("FAILPOINTS entry '{entry}' is not name=actions"));
        };
        fail::cfg(name.trim(), actions.trim()).map_err(|e| format!("FAILPOINTS entry '{entry}': {e}"))?;
    }
    Ok(())
}
