//! What the file sink keeps in snapshots, and what a restored job does with it: commit the
//! pending parts of the restored checkpoint where they were written, and remove in-progress
//! files that no run will ever need, without touching a file another live job is writing.
//!
//! Pending files the restored snapshot does not name are removed only when no savepoint names
//! them either: every savepoint barrier left a [`SavepointMarker`] beside the parts it staged
//! (an intermediate savepoint commits nothing, so its parts wait for its own restore, maybe
//! long after a failover went back to an older checkpoint). A pending part no snapshot and no
//! marker names was staged for a checkpoint that never completed: garbage. In-progress files
//! are never named by any snapshot (a part is renamed pending before its barrier is
//! snapshotted), so an orphaned one is garbage too. What this cannot know: a completed
//! checkpoint newer than the one restored, when the user restores an older one on purpose
//! (its pending parts go; restoring it afterwards would repeat output anyway).
//!
//! A snapshot is untrusted input (its checksums catch corruption, not intent): every name it
//! holds must be a part name this sink writes, and every directory an absolute, normalized
//! path; anything else refuses the restore.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::path::{Component, Path, PathBuf};

use weir_api::error::TaskError;

use super::names::{HiddenKind, PartName, SavepointMarker};

/// A pending commit as the snapshot stores it (postcard): the output directory, the pending
/// name and the committed name. Written by weir 0.2; snapshots of 0.1 hold only the two names
/// ([`CommittableV1`]) and commit into the restored job's output directory.
#[derive(serde::Serialize, serde::Deserialize)]
struct CommittableV2 {
    dir: String,
    pending: String,
    committed: String,
}

#[derive(serde::Deserialize)]
struct CommittableV1 {
    pending: String,
    committed: String,
}

/// One pending part of a completed checkpoint: it must end up committed, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committable {
    /// The directory it was written in (`None` for snapshots that did not record it).
    pub dir: Option<PathBuf>,
    /// Its name.
    pub name: PartName,
}

impl Committable {
    /// The snapshot's bytes for this commit.
    pub fn encode(&self) -> Vec<u8> {
        let record = CommittableV2 {
            dir: self.dir.as_deref().map(|dir| dir.display().to_string()).unwrap_or_default(),
            pending: self.name.pending(),
            committed: self.name.committed(),
        };
        // Serializing three strings into memory cannot fail.
        postcard::to_allocvec(&record).unwrap_or_default()
    }

    /// Decodes and checks one element of the snapshot's `sink-committables` state.
    pub fn decode(bytes: &[u8]) -> Result<Committable, String> {
        let (dir, pending, committed) = match postcard::take_from_bytes::<CommittableV2>(bytes) {
            Ok((record, [])) => (Some(record.dir), record.pending, record.committed),
            _ => match postcard::take_from_bytes::<CommittableV1>(bytes) {
                Ok((record, [])) => (None, record.pending, record.committed),
                _ => return Err("it is not a pending commit of the file sink".to_string()),
            },
        };
        let Some(name) = PartName::parse_committed(&committed) else {
            return Err(format!("{committed:?} is not a part-file name this sink writes"));
        };
        if pending != name.pending() {
            return Err(format!("{pending:?} is not the pending name of {committed:?}"));
        }
        let dir = match dir {
            Some(dir) => Some(checked_dir(&dir)?),
            None => None,
        };
        Ok(Committable { dir, name })
    }
}

/// An absolute directory without `.`/`..` segments, as the sink records it.
fn checked_dir(dir: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(dir);
    let plain = path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !path.is_absolute() || !plain || dir.contains('\0') {
        return Err(format!("{dir:?} is not an absolute, normalized output directory"));
    }
    Ok(path)
}

/// Decodes every pending commit of a snapshot; the error names the element.
pub fn decode_all(elements: &[Vec<u8>]) -> Result<Vec<Committable>, String> {
    let mut all = Vec::with_capacity(elements.len());
    for (index, bytes) in elements.iter().enumerate() {
        let committable = Committable::decode(bytes).map_err(|reason| {
            format!(
                "pending commit {} of {} is refused: {reason}; the snapshot was not written by weir's file sink or was altered",
                index + 1,
                elements.len()
            )
        })?;
        all.push(committable);
    }
    Ok(all)
}

/// What committing one part found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The pending file was renamed to its committed name.
    Committed,
    /// Only the committed file exists: an earlier commit did it.
    AlreadyCommitted,
    /// Neither exists: a consumer moved or deleted the committed file (treated as committed,
    /// as Flink's committer does).
    Missing,
}

/// Renames `name`'s pending file in `dir` to its committed name, unless that already happened.
pub fn commit_part(dir: &Path, name: &PartName) -> Result<CommitOutcome, TaskError> {
    let pending = dir.join(name.pending());
    let committed = dir.join(name.committed());
    match fs::rename(&pending, &committed) {
        Ok(()) => {
            sync_dir(dir);
            Ok(CommitOutcome::Committed)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if committed.exists() {
                Ok(CommitOutcome::AlreadyCommitted)
            } else {
                Ok(CommitOutcome::Missing)
            }
        }
        Err(error) => Err(TaskError::external(
            format!("file sink: committing {} as {}", pending.display(), committed.display()),
            format!("{error}; check the permissions of the output directory"),
        )),
    }
}

/// Where a restored commit lands: the directory it was written in, or (when its output
/// directory was moved and the job now writes to the new place) `current`.
fn commit_restored_part(current: &Path, committable: &Committable) -> Result<(CommitOutcome, PathBuf), TaskError> {
    let recorded = committable.dir.clone().unwrap_or_else(|| current.to_path_buf());
    let outcome = commit_part(&recorded, &committable.name)?;
    if outcome == CommitOutcome::Missing && recorded != current {
        let moved = commit_part(current, &committable.name)?;
        if moved != CommitOutcome::Missing {
            return Ok((moved, current.to_path_buf()));
        }
    }
    Ok((outcome, recorded))
}

/// Commits the pending parts of a restored checkpoint (idempotent), then removes the orphans
/// of `current`: in-progress part files of the restored job (`snapshot_job`) and of this
/// job's earlier attempts that no live writer holds. Their records come again from the
/// restored sources. Pending files stay (module docs); files of any other job are left alone.
pub fn commit_restored(
    current: &Path,
    committables: &[Committable],
    snapshot_job: Option<&str>,
    job: &str,
    attempt: u32,
) -> Result<(), TaskError> {
    let mut listed = BTreeSet::new();
    for committable in committables {
        let (outcome, dir) = commit_restored_part(current, committable)?;
        if outcome == CommitOutcome::Missing {
            tracing::warn!(
                file = %dir.join(committable.name.committed()).display(),
                "file sink: a part of the restored checkpoint is neither pending nor committed; taking it as committed (a consumer moved or deleted it)"
            );
        }
        listed.insert(committable.name.clone());
    }
    remove_orphans(current, &listed, snapshot_job, job, attempt);
    Ok(())
}

/// The longest savepoint marker read (it lists the parts one subtask had staged).
const MARKER_BYTES_MAX: u64 = 1 << 20;

/// Every part a savepoint marker in `dir` lists; `None` when a marker cannot be read (then no
/// pending file may be taken for garbage).
fn savepoint_parts(dir: &Path) -> Option<BTreeSet<PartName>> {
    let mut parts = BTreeSet::new();
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let file_name = entry.file_name();
        if file_name.to_str().and_then(SavepointMarker::parse).is_none() {
            continue;
        }
        let path = entry.path();
        let small = fs::metadata(&path).is_ok_and(|m| m.len() <= MARKER_BYTES_MAX);
        let text = if small { fs::read_to_string(&path).ok() } else { None };
        let Some(text) = text else {
            tracing::warn!(file = %path.display(), "file sink: a savepoint marker cannot be read; every pending part is kept");
            return None;
        };
        for line in text.lines().filter(|line| !line.is_empty()) {
            let Some(name) = PartName::parse_committed(line) else {
                tracing::warn!(file = %path.display(), "file sink: a savepoint marker names something that is no part; every pending part is kept");
                return None;
            };
            parts.insert(name);
        }
    }
    Some(parts)
}

/// Removes the hidden part files of `dir` written by `snapshot_job` (any attempt) or by `job`
/// before `attempt`: in-progress ones, and pending ones that neither the restored snapshot
/// (`listed`) nor a savepoint marker names; never one a live writer holds (each writer keeps
/// an exclusive lock on its in-progress and pending files until they are committed). A marker
/// of those runs whose parts are all gone (committed) is removed too. The whole
/// [`OrphanPlan`] is decided from one listing before the first removal.
pub fn remove_orphans(dir: &Path, listed: &BTreeSet<PartName>, snapshot_job: Option<&str>, job: &str, attempt: u32) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let names: Vec<String> =
        entries.flatten().filter_map(|entry| entry.file_name().to_str().map(str::to_string)).collect();
    let in_savepoints = savepoint_parts(dir);
    let mut marker_parts = Vec::new();
    for name in &names {
        if let Some(marker) = SavepointMarker::parse(name)
            && let Ok(text) = fs::read_to_string(dir.join(name))
        {
            marker_parts.push((name.clone(), marker, text.lines().filter_map(PartName::parse_committed).collect()));
        }
    }
    let runs = Runs { snapshot_job, job, attempt };
    let plan = plan_orphans(&names, listed, in_savepoints.as_ref(), &marker_parts, &runs);
    for name in &plan.parts {
        let path = dir.join(name);
        if held_by_live_writer(&path) {
            continue;
        }
        if let Err(error) = fs::remove_file(&path) {
            tracing::warn!(file = %path.display(), %error, "file sink: cannot remove a leftover part file");
        }
    }
    for name in &plan.markers {
        let path = dir.join(name);
        if let Err(error) = fs::remove_file(&path) {
            tracing::warn!(file = %path.display(), %error, "file sink: cannot remove a savepoint marker");
        }
    }
    sync_dir(dir);
}

/// The runs whose leftovers a restore takes over: the restored job's (any attempt) and this
/// job's attempts before `attempt`.
pub struct Runs<'a> {
    /// The job the restored snapshot is of.
    pub snapshot_job: Option<&'a str>,
    /// This job.
    pub job: &'a str,
    /// This attempt.
    pub attempt: u32,
}

impl Runs<'_> {
    fn taken_over(&self, part: &PartName) -> bool {
        let ours_before = part.written_by(self.job) && part.attempt < self.attempt;
        let restored_job =
            self.snapshot_job.is_some_and(|snapshot_job| snapshot_job != self.job && part.written_by(snapshot_job));
        ours_before || restored_job
    }
}

/// What a restore removes from an output directory, decided before anything is removed.
#[derive(Debug, Default, PartialEq)]
pub struct OrphanPlan {
    /// Hidden part files no run will need (still skipped when a live writer holds one).
    pub parts: Vec<String>,
    /// Savepoint markers of taken-over runs whose parts are all committed.
    pub markers: Vec<String>,
}

/// The orphans among `names` (one listing of the directory): hidden parts of taken-over runs
/// that the restored snapshot does not list, except pending ones a savepoint marker names (or
/// any pending one when a marker could not be read: `in_savepoints` is `None`); and the
/// markers (file name, marker, parts) of taken-over runs none of whose parts is pending.
pub fn plan_orphans(
    names: &[String],
    listed: &BTreeSet<PartName>,
    in_savepoints: Option<&BTreeSet<PartName>>,
    markers: &[(String, SavepointMarker, Vec<PartName>)],
    runs: &Runs<'_>,
) -> OrphanPlan {
    let present: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let mut plan = OrphanPlan::default();
    for name in names.iter().filter(|name| SavepointMarker::parse(name).is_none()) {
        let Some((part, kind)) = PartName::parse_hidden(name) else { continue };
        if !runs.taken_over(&part) || listed.contains(&part) {
            continue;
        }
        if kind == HiddenKind::Pending && in_savepoints.is_none_or(|parts| parts.contains(&part)) {
            continue;
        }
        plan.parts.push(name.clone());
    }
    for (name, marker, parts) in markers {
        let as_part =
            PartName { job: marker.job.clone(), attempt: marker.attempt, subtask: marker.subtask, counter: 0 };
        let still_pending = parts.iter().any(|part| present.contains(part.pending().as_str()));
        if runs.taken_over(&as_part) && !still_pending {
            plan.markers.push(name.clone());
        }
    }
    plan
}

/// True unless `path` can be locked now: a live writer holds its lock (or locking is not
/// supported, when nothing can be told and the file is kept).
fn held_by_live_writer(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return true;
    };
    file.try_lock().is_err()
}

/// Makes renames durable; not every file system can fsync a directory, and the data itself is
/// synced before any rename, so a failure here is not an error.
pub fn sync_dir(dir: &Path) {
    if let Ok(handle) = File::open(dir) {
        let _ = handle.sync_all();
    }
    #[cfg(test)]
    synced::record(dir);
}

/// Tests see each directory sync of their thread, with the directory's file names then.
#[cfg(test)]
pub(crate) mod synced {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    thread_local! {
        static SYNCS: RefCell<Vec<(PathBuf, Vec<String>)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn record(dir: &Path) {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        SYNCS.with(|syncs| syncs.borrow_mut().push((dir.to_path_buf(), names)));
    }

    /// The syncs of this thread since the last call.
    pub(crate) fn take() -> Vec<(PathBuf, Vec<String>)> {
        SYNCS.with(|syncs| std::mem::take(&mut *syncs.borrow_mut()))
    }
}

/// The pre-flight report of a restore: what committing `committables` into `current` would
/// find, without changing anything (the lines `weir run --dry-run` prints).
pub fn describe_restore(current: &Path, committables: &[Committable]) -> Vec<String> {
    let (mut to_commit, mut committed, mut missing) = (0, 0, Vec::new());
    for committable in committables {
        let mut found = false;
        let mut places = vec![committable.dir.clone().unwrap_or_else(|| current.to_path_buf())];
        if places[0] != current {
            places.push(current.to_path_buf());
        }
        for dir in &places {
            if dir.join(committable.name.pending()).exists() {
                to_commit += 1;
                found = true;
                break;
            }
            if dir.join(committable.name.committed()).exists() {
                committed += 1;
                found = true;
                break;
            }
        }
        if !found {
            missing.push(places[0].join(committable.name.committed()));
        }
    }
    let mut lines = Vec::new();
    if committables.is_empty() {
        return lines;
    }
    lines.push(format!(
        "{} pending part file(s) of the snapshot: {to_commit} to commit, {committed} already committed, {} missing",
        committables.len(),
        missing.len()
    ));
    for path in missing.iter().take(5) {
        lines.push(format!(
            "warning: {} is neither pending nor committed; it is taken as committed (a consumer moved or deleted it)",
            path.display()
        ));
    }
    if missing.len() > 5 {
        lines.push(format!("warning: ... and {} more such part file(s)", missing.len() - 5));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(job: &str, attempt: u32, counter: u64) -> PartName {
        PartName { job: job.into(), attempt, subtask: 0, counter }
    }

    const JOB_A: &str = "aaaaaaaa000000000000000000000000";
    const JOB_B: &str = "bbbbbbbb000000000000000000000000";

    #[test]
    fn committables_round_trip_and_old_ones_decode() {
        let committable = Committable { dir: Some("/data/out".into()), name: name(JOB_A, 1, 4) };
        assert_eq!(Committable::decode(&committable.encode()).unwrap(), committable);
        let old = postcard::to_allocvec(&(".part-4f1c2e0d-0-0-1.pending", "part-4f1c2e0d-0-0-1")).unwrap();
        let decoded = Committable::decode(&old).unwrap();
        assert_eq!(decoded.dir, None);
        assert_eq!(decoded.name.committed(), "part-4f1c2e0d-0-0-1");
    }

    #[test]
    fn crafted_names_and_directories_are_refused() {
        let crafted = |dir: &str, pending: &str, committed: &str| {
            postcard::to_allocvec(&CommittableV2 {
                dir: dir.into(),
                pending: pending.into(),
                committed: committed.into(),
            })
            .unwrap()
        };
        let good = name(JOB_A, 0, 0);
        for (bytes, expected) in [
            (crafted("/out", "../../etc/passwd", &good.committed()), "is not the pending name"),
            (crafted("/out", &good.pending(), "/etc/passwd"), "is not a part-file name"),
            (crafted("/out", ".part-x.pending", "part-x"), "is not a part-file name"),
            (crafted("out", &good.pending(), &good.committed()), "absolute"),
            (crafted("/out/../etc", &good.pending(), &good.committed()), "absolute, normalized"),
            (b"\x05hello".to_vec(), "not a pending commit"),
        ] {
            let error = decode_all(&[bytes]).unwrap_err();
            assert!(error.contains(expected) && error.contains("pending commit 1 of 1"), "{error}");
        }
    }

    #[test]
    fn restored_commits_land_where_they_were_written_and_missing_ones_count_as_committed() {
        let root = tempfile::tempdir().unwrap();
        let written = root.path().join("written");
        let current = root.path().join("current");
        fs::create_dir_all(&written).unwrap();
        fs::create_dir_all(&current).unwrap();
        let here = name(JOB_A, 0, 0);
        let gone = name(JOB_A, 0, 1);
        let moved = name(JOB_A, 0, 2);
        fs::write(written.join(here.pending()), "a\n").unwrap();
        fs::write(current.join(moved.pending()), "c\n").unwrap();
        let committables: Vec<Committable> = [&here, &gone, &moved]
            .iter()
            .map(|n| Committable { dir: Some(written.clone()), name: (*n).clone() })
            .collect();
        let report = describe_restore(&current, &committables);
        assert_eq!(report[0], "3 pending part file(s) of the snapshot: 2 to commit, 0 already committed, 1 missing");
        assert!(report[1].contains(&gone.committed()) && report[1].starts_with("warning:"), "{report:?}");
        commit_restored(&current, &committables, Some(JOB_A), JOB_B, 0).unwrap();
        assert_eq!(fs::read_to_string(written.join(here.committed())).unwrap(), "a\n");
        assert_eq!(fs::read_to_string(current.join(moved.committed())).unwrap(), "c\n");
        // Idempotent.
        commit_restored(&current, &committables, Some(JOB_A), JOB_B, 0).unwrap();
        assert_eq!(
            describe_restore(&current, &committables)[0].split(": ").nth(1).unwrap(),
            "0 to commit, 2 already committed, 1 missing"
        );
    }

    #[test]
    fn orphans_are_removed_but_savepoint_parts_live_writers_and_other_jobs_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let dead_a = name(JOB_A, 0, 0).in_progress();
        let dead_a_pending = name(JOB_A, 0, 1).pending();
        let live_a = name(JOB_A, 0, 2).in_progress();
        let other_job = name("cccccccc000000000000000000000000", 0, 0).in_progress();
        let ours_earlier = name(JOB_B, 0, 0).pending();
        let ours_now = name(JOB_B, 1, 0).in_progress();
        for file in [&dead_a, &dead_a_pending, &live_a, &other_job, &ours_earlier, &ours_now] {
            fs::write(dir.join(file), "x").unwrap();
        }
        fs::write(dir.join("unrelated.txt"), "keep").unwrap();
        let held = File::open(dir.join(&live_a)).unwrap();
        held.try_lock().unwrap();
        // A savepoint of job A named one of its pending parts.
        let in_savepoint = name(JOB_A, 0, 3);
        fs::write(dir.join(in_savepoint.pending()), "x").unwrap();
        let marker = SavepointMarker { job: JOB_A.into(), attempt: 0, subtask: 0, checkpoint_id: 7 }.file_name();
        fs::write(dir.join(&marker), format!("{}\n", in_savepoint.committed())).unwrap();
        remove_orphans(dir, &BTreeSet::new(), Some(JOB_A), JOB_B, 1);
        let mut left: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        // The pending parts no snapshot names went; the savepoint's stays, with its marker.
        let mut expected = vec![
            live_a.clone(),
            other_job.clone(),
            ours_now.clone(),
            in_savepoint.pending(),
            marker.clone(),
            "unrelated.txt".to_string(),
        ];
        expected.sort();
        assert_eq!(left, expected);
        drop(held);

        // An unreadable marker keeps every pending part.
        let another = name(JOB_A, 0, 4).pending();
        fs::write(dir.join(&another), "x").unwrap();
        fs::write(dir.join(&marker), "not a part name\n").unwrap();
        remove_orphans(dir, &BTreeSet::new(), Some(JOB_A), JOB_B, 1);
        assert!(dir.join(&another).exists());
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Committable::decode(&bytes);
        }
    }

    proptest! {
        /// A valid pending commit, mutated: an error, or a commit of one of the sink's own
        /// plain names in an absolute directory; never a panic or a claimed-size allocation.
        #[test]
        fn mutated_committables_decode_or_fail_cleanly(
            counter in 0u64..1000,
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let valid = Committable { dir: Some("/data/out".into()), name: name(JOB_A, 1, counter) }.encode();
            let bytes = weir_types::fuzzing::mutate(&valid, &mutations);
            let decoded = weir_types::fuzzing::with_allocation_cap(64 << 20, || Committable::decode(&bytes));
            match decoded {
                Err(refused) => prop_assert!(false, "decoding asked for {} bytes at once", refused),
                Ok(Err(_)) => {}
                Ok(Ok(committable)) => {
                    let committed = committable.name.committed();
                    prop_assert!(!committed.contains('/') && !committed.contains(".."), "{}", committed);
                    prop_assert!(committable.dir.is_none_or(|dir| dir.is_absolute()));
                }
            }
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use proptest::prelude::*;

    const JOBS: [&str; 3] =
        ["0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210", "00000000000000000000000000000001"];

    fn part(job: usize, attempt: u32, subtask: u32, counter: u64) -> PartName {
        PartName { job: JOBS[job].to_string(), attempt, subtask, counter }
    }

    fn parts() -> impl Strategy<Value = Vec<(PartName, bool)>> {
        prop::collection::vec(((0usize..3, 0u32..3, 0u32..2, 0u64..4), any::<bool>()), 0..24)
            .prop_map(|v| v.into_iter().map(|((j, a, s, c), pending)| (part(j, a, s, c), pending)).collect())
    }

    proptest! {
        /// The plan never names a part the restored snapshot lists, a pending part a
        /// savepoint marker names (any pending part when a marker could not be read), or a
        /// file of a run that is not taken over; and it names every other hidden part of a
        /// taken-over run.
        #[test]
        fn the_plan_removes_exactly_the_orphans(
            files in parts(),
            listed_picks in prop::collection::vec(any::<bool>(), 24),
            marked_picks in prop::collection::vec(any::<bool>(), 24),
            markers_readable in any::<bool>(),
            snapshot_job in prop::option::of(0usize..3),
            attempt in 0u32..3,
        ) {
            let names: Vec<String> =
                files.iter().map(|(p, pending)| if *pending { p.pending() } else { p.in_progress() }).collect();
            let listed: BTreeSet<PartName> =
                files.iter().zip(&listed_picks).filter(|(_, pick)| **pick).map(|((p, _), _)| p.clone()).collect();
            let marked: BTreeSet<PartName> =
                files.iter().zip(&marked_picks).filter(|(_, pick)| **pick).map(|((p, _), _)| p.clone()).collect();
            let in_savepoints = markers_readable.then_some(&marked);
            let runs = Runs { snapshot_job: snapshot_job.map(|j| JOBS[j]), job: JOBS[0], attempt };
            let plan = plan_orphans(&names, &listed, in_savepoints, &[], &runs);
            for ((part, pending), name) in files.iter().zip(&names) {
                let taken_over = runs.taken_over(part);
                let protected = listed.contains(part)
                    || (*pending && in_savepoints.is_none_or(|marked| marked.contains(part)));
                let planned = plan.parts.contains(name);
                prop_assert_eq!(planned, taken_over && !protected, "{} (taken over {}, protected {})", name, taken_over, protected);
            }
        }
    }

    #[test]
    fn a_marker_goes_once_none_of_its_parts_is_pending() {
        let marker = SavepointMarker { job: JOBS[0].into(), attempt: 0, subtask: 0, checkpoint_id: 7 };
        let staged = part(0, 0, 0, 1);
        let runs = Runs { snapshot_job: None, job: JOBS[0], attempt: 1 };
        let markers = vec![(marker.file_name(), marker.clone(), vec![staged.clone()])];
        let waiting = vec![marker.file_name(), staged.pending()];
        let plan = plan_orphans(&waiting, &BTreeSet::new(), Some(&BTreeSet::from([staged.clone()])), &markers, &runs);
        assert_eq!(plan, OrphanPlan::default(), "its part is still pending: both stay");
        let committed = vec![marker.file_name(), staged.committed()];
        let plan = plan_orphans(&committed, &BTreeSet::new(), Some(&BTreeSet::from([staged])), &markers, &runs);
        assert_eq!(plan.markers, vec![marker.file_name()]);
        assert!(plan.parts.is_empty());
    }
}
