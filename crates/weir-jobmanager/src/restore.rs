//! The restore rules of a job started from a snapshot, in one place: which snapshot a path
//! names, whether this job can start from it (uids, max parallelism, parallelism, the state
//! backend of a native snapshot, key types, the kind and type of every declared state), and
//! every source's and sink's own check of its restored state. All of it reads and nothing is
//! written: `weir run --dry-run`, `weir run -s`, and a JobManager accepting or recovering a
//! job refuse the same snapshots with the same words before anything starts.

use std::sync::Arc;

use weir_api::graph::{StreamGraph, StreamNode};
use weir_checkpoint::SnapshotMetadata;
use weir_checkpoint::storage::SnapshotStorage;
use weir_runtime::JobSettings;
use weir_runtime::checkpointing::{RestoreOpenError, RestoreSource};

use crate::error::JobManagerError as Error;

/// The snapshot directory of `path` (a directory, or its `_metadata` file).
pub fn snapshot_storage(path: &str) -> Result<SnapshotStorage, Error> {
    let trimmed = path.trim_end_matches('/');
    let dir = trimmed.strip_suffix("/_metadata").unwrap_or(trimmed);
    SnapshotStorage::from_url(dir).map_err(|e| Error::usage(format!("snapshot path '{path}': {e}")))
}

/// Plans `graph`'s restore from the snapshot at `path` into `settings` (its restore source
/// and max parallelism); the lines for the user: the snapshot restored, state left behind,
/// what the sources and sinks will do with theirs.
pub(crate) fn restore_from(
    path: &str,
    graph: &StreamGraph,
    settings: &mut JobSettings,
    allow_non_restored_state: bool,
) -> Result<Vec<String>, Error> {
    let restore = plan_restore(path, graph, settings, allow_non_restored_state)?;
    let mut notes = vec![format!(
        "Restoring from {} ({} {}, max parallelism {})",
        restore.location, restore.metadata.kind, restore.metadata.checkpoint_id, restore.plan.max_parallelism
    )];
    for uid in &restore.plan.non_restored {
        notes.push(format!("warning: the state of operator '{uid}' is not restored (-n/--allow-non-restored-state)"));
    }
    notes.extend(check_restored_states(path, graph, &restore)?);
    settings.max_parallelism = Some(restore.plan.max_parallelism);
    settings.restore = Some(Arc::new(restore));
    Ok(notes)
}

/// Runs every source's and sink's check of its restored state (read positions, pending
/// commits) before anything starts: a refusal names the snapshot and the operator; the lines
/// are what the restore will do.
fn check_restored_states(path: &str, graph: &StreamGraph, restore: &RestoreSource) -> Result<Vec<String>, Error> {
    let mut lines = Vec::new();
    for node in graph.nodes() {
        let Some(check) = &node.restore_check else { continue };
        let uid = node.uid_or_generated();
        if !restore.plan.operators.contains_key(&uid) {
            continue;
        }
        let refused = |reason: String| Error::usage(format!("cannot restore from {path}: operator '{uid}': {reason}"));
        let elements = restore.operator_state_elements(&uid, check.state).map_err(refused)?;
        for line in (check.check)(&elements).map_err(refused)? {
            lines.push(match line.strip_prefix("warning: ") {
                Some(warning) => format!("warning: operator '{uid}': {warning}"),
                None => format!("operator '{uid}': {line}"),
            });
        }
    }
    Ok(lines)
}

/// Reads the snapshot at `path` and checks that this job can start from it: uids, max
/// parallelism, parallelism. Nothing is written anywhere; a refusal changes nothing.
fn plan_restore(
    path: &str,
    graph: &StreamGraph,
    settings: &JobSettings,
    allow_non_restored_state: bool,
) -> Result<RestoreSource, Error> {
    let storage = snapshot_storage(path)?;
    let request = weir_runtime::checkpointing::restore::restore_request(
        graph,
        |node| node.parallelism.or(graph.parallelism).unwrap_or(settings.default_parallelism),
        graph.max_parallelism.or(settings.max_parallelism),
        allow_non_restored_state,
    );
    let source = RestoreSource::read(storage, &request).map_err(|e| match e {
        RestoreOpenError::Plan(e) => Error::usage(format!("cannot restore from {path}: {e}")),
        e => Error::usage(e),
    })?;
    let metadata = &source.metadata;
    // A native snapshot is the writing backend's own layout: only that backend reads it.
    let backend = settings.checkpointing.state_backend();
    if !metadata.format.is_canonical()
        && !weir_runtime::checkpointing::coordinator::native_compatible(metadata.backend(), backend)
    {
        return Err(Error::usage(format!(
            "cannot restore from {path}: it is a native snapshot of the {} state backend, and this job's backend is {backend} (state.backend.type); only the backend that wrote a native snapshot reads it: take a canonical savepoint of the old job (`weir savepoint --type canonical JOBID DIR` or `weir stop --type canonical`) and restore that",
            metadata.backend()
        )));
    }
    // Pre-flight: a keyed operator must keep its key type, and every state it declares the
    // kind and type the snapshot recorded (the tasks check the same again when they restore;
    // neither touches the snapshot).
    for node in graph.nodes() {
        check_declared_states(path, node, metadata)?;
    }
    for node in graph.nodes() {
        let uid = node.uid_or_generated();
        let recorded =
            metadata.operators.iter().find(|o| o.uid == uid && o.has_keyed_state()).and_then(|o| o.key_type.as_deref());
        if let (Some(recorded), Some(declared)) = (recorded, node.key_type)
            && recorded != declared
        {
            return Err(Error::usage(format!(
                "cannot restore from {path}: operator '{uid}' was keyed by {recorded} in the snapshot and is keyed by {declared} now; the key type of a stateful operator cannot change (give the operator a new uid and pass -n to start it empty)"
            )));
        }
    }
    Ok(source)
}

/// Every state `node` declares must be of the kind and type the snapshot recorded for a state
/// of that name, if it recorded one.
fn check_declared_states(path: &str, node: &StreamNode, metadata: &SnapshotMetadata) -> Result<(), Error> {
    let uid = node.uid_or_generated();
    let Some(recorded) = metadata.operators.iter().find(|o| o.uid == uid) else { return Ok(()) };
    for declared in &node.declared_states {
        let handle = recorded.subtasks.iter().flat_map(|s| &s.keyed_states).find(|h| h.name == declared.name);
        if let Some(handle) = handle
            && (handle.kind != declared.kind.to_string() || handle.value_type != declared.cell_type)
        {
            return Err(Error::usage(format!(
                "cannot restore from {path}: state '{}' of operator '{uid}' is a {} state of {} in the snapshot, and the job now declares it as a {}; keep the old type, give the new state another name, or give the operator a new uid and pass -n to start it empty",
                declared.name,
                handle.kind,
                handle.value_type,
                declared.describe()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_path_names_its_directory_with_or_without_metadata() {
        let dir = snapshot_storage("file:///tmp/savepoints/savepoint-1/").unwrap();
        let metadata = snapshot_storage("file:///tmp/savepoints/savepoint-1/_metadata").unwrap();
        assert_eq!(dir.url(), metadata.url());
        assert!(!metadata.url().ends_with("_metadata"), "{}", metadata.url());
    }
}
