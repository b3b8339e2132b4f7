use super::*;
use weir_api::snapshot::{Barrier, BarrierKind, RestoredOperator};

/// The job id of `TaskContext::for_test`.
const TEST_JOB: &str = "00000000000000000000000000000000";

fn part(attempt: u32, subtask: u32, counter: u64) -> PartName {
    PartName { job: TEST_JOB.into(), attempt, subtask, counter }
}

fn format_u64(n: &u64, out: &mut String) {
    use std::fmt::Write as _;
    let _ = write!(out, "{n}");
}

#[allow(clippy::ptr_arg)] // the sink formats its record type, which is String here
fn format_line(line: &String, out: &mut String) {
    out.push_str(line);
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A context of a job restored from a snapshot of job `snapshot_job`.
fn restored_ctx(job: u128, attempt: u32, snapshot_job: &str) -> TaskContext {
    let mut ctx = TaskContext::for_test(0, 1, 8);
    ctx.job_id = weir_types::JobId::from_u128(job);
    ctx.attempt = attempt;
    let restored = RestoredOperator { snapshot_job_id: snapshot_job.to_string(), ..RestoredOperator::default() };
    ctx.operator_uid = "sink".into();
    ctx.restored = Some(std::sync::Arc::new([("sink".to_string(), restored)].into_iter().collect()));
    ctx
}

#[test]
fn two_file_sinks_into_one_directory_are_refused_when_the_job_is_built() {
    use weir_api::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let format = |n: &u64, out: &mut String| out.push_str(&n.to_string());
    let env = StreamExecutionEnvironment::new();
    let numbers = env.from_source(VecSource::new(vec![1u64, 2, 3]));
    numbers.sink_to(FileSink::new(dir.path(), format)).uid("first");
    numbers.sink_to(FileSink::new(dir.path().join("."), format)).uid("second");
    numbers.sink_to(FileSink::new(dir.path().join("other"), format)).uid("third");
    let error = env.build("two sinks").err().expect("refused");
    let message = error.to_string();
    assert!(message.contains("sinks 'first' and 'second' both write to"), "{message}");
    assert!(message.contains("give each sink its own directory"), "{message}");
}

#[test]
fn part_files_are_committed_on_finish() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("out").join("nested");
    let sink = FileSink::new(&dir, format_u64);
    let mut writers: Vec<_> =
        (0..2).map(|index| sink.create_writer(&TaskContext::for_test(index, 2, 8)).unwrap()).collect();
    for (index, writer) in writers.iter_mut().enumerate() {
        let base = index as u64 * 100;
        let mut batch = vec![base, base + 1];
        writer.write_batch(&mut batch).unwrap();
        assert!(batch.is_empty());
        writer.write_batch(&mut vec![base + 2]).unwrap();
        writer.flush().unwrap();
    }
    assert_eq!(names(&dir), vec![part(0, 0, 0).in_progress(), part(0, 1, 0).in_progress()]);
    for writer in &mut writers {
        writer.finish().unwrap();
        writer.finish().unwrap();
    }
    assert_eq!(names(&dir), vec![part(0, 0, 0).committed(), part(0, 1, 0).committed()]);
    assert_eq!(fs::read_to_string(dir.join(part(0, 0, 0).committed())).unwrap(), "0\n1\n2\n");
    assert_eq!(fs::read_to_string(dir.join(part(0, 1, 0).committed())).unwrap(), "100\n101\n102\n");
    assert!(writers[0].write_batch(&mut vec![7]).is_err());
}

#[test]
fn large_batches_are_written_completely() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_u64);
    let mut writer = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
    let mut expected = String::new();
    for round in 0..50u64 {
        let mut batch: Vec<u64> = (round * 5000..(round + 1) * 5000).collect();
        for n in &batch {
            expected.push_str(&format!("{n}\n"));
        }
        writer.write_batch(&mut batch).unwrap();
    }
    writer.finish().unwrap();
    assert_eq!(fs::read_to_string(dir.path().join(part(0, 0, 0).committed())).unwrap(), expected);
}

#[test]
fn uncreatable_directory_is_an_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let blocker = root.path().join("file");
    fs::write(&blocker, "x").unwrap();
    let sink = FileSink::new(blocker.join("sub"), format_u64);
    let err = sink.create_writer(&TaskContext::for_test(0, 1, 8)).err().unwrap().to_string();
    assert!(err.contains("file/sub"), "{err}");
}

#[test]
fn two_phase_commit_stages_at_the_barrier_and_commits_on_completion() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_line);
    let ctx = TaskContext::for_test(0, 1, 8);
    let mut writer = sink.create_writer(&ctx).unwrap();
    writer.write_batch(&mut vec!["a".to_string(), "b".to_string()]).unwrap();
    let committables = writer.prepare_commit(1).unwrap();
    assert_eq!(committables.len(), 1);
    assert_eq!(names(dir.path()), vec![part(0, 0, 0).pending()]);
    writer.write_batch(&mut vec!["c".to_string()]).unwrap();
    writer.commit(1).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 1).in_progress(), part(0, 0, 0).committed()]);
    assert_eq!(fs::read_to_string(dir.path().join(part(0, 0, 0).committed())).unwrap(), "a\nb\n");

    // A crash now: the restore commits what the snapshot lists and drops the rest.
    let pending = writer.prepare_commit(2).unwrap();
    drop(writer);
    let restored_ctx = restored_ctx(u128::MAX, 0, TEST_JOB);
    let _ = sink.restore_writer(&restored_ctx, pending.clone()).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 0).committed(), part(0, 0, 1).committed()]);
    // Restoring twice from the same snapshot is harmless.
    let _ = sink.restore_writer(&restored_ctx, pending).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 0).committed(), part(0, 0, 1).committed()]);
}

/// The rename `.inprogress` -> `.pending` of the pre-commit is made durable: the directory
/// is synced after it (the sync sees the pending name, not the in-progress one).
#[test]
fn the_pre_commit_rename_is_followed_by_a_directory_sync() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_line);
    let mut writer = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
    writer.write_batch(&mut vec!["a".to_string()]).unwrap();
    recovery::synced::take();
    writer.prepare_commit(1).unwrap();
    let syncs = recovery::synced::take();
    let synced_after_rename = syncs.iter().any(|(synced, names)| {
        synced == dir.path()
            && names.contains(&part(0, 0, 0).pending())
            && !names.contains(&part(0, 0, 0).in_progress())
    });
    assert!(synced_after_rename, "no sync of {} after the rename: {syncs:?}", dir.path().display());
}

fn barrier(checkpoint_id: u64, savepoint: bool) -> Barrier {
    let kind = if savepoint {
        BarrierKind::Savepoint { terminate: false, format: Default::default(), drain: false }
    } else {
        BarrierKind::Checkpoint { full: false, unaligned: false }
    };
    Barrier { checkpoint_id, timestamp_ms: 0, kind, location: "memory://file-sink-test/chk".into() }
}

/// Checkpoint 1, then an intermediate savepoint 2 (its marker lists the parts staged then),
/// then checkpoint 3, which never completes, then a crash. The restore from checkpoint 1
/// removes what was being written and the part staged for checkpoint 3 (no snapshot names
/// it), and keeps the savepoint's: restoring the savepoint later commits them, and its marker
/// goes.
#[test]
fn a_restore_keeps_the_parts_a_savepoint_staged_and_removes_those_of_a_checkpoint_that_never_completed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_line);
    let ctx = TaskContext::for_test(0, 1, 8);
    let mut writer = sink.create_writer(&ctx).unwrap();
    writer.write_batch(&mut vec!["kept".to_string()]).unwrap();
    let snapshot = writer.prepare_commit_at(&barrier(1, false)).unwrap();
    writer.write_batch(&mut vec!["staged for the savepoint".to_string()]).unwrap();
    let savepoint = writer.prepare_commit_at(&barrier(2, true)).unwrap();
    let marker = SavepointMarker { job: TEST_JOB.into(), attempt: 0, subtask: 0, checkpoint_id: 2 }.file_name();
    assert_eq!(
        fs::read_to_string(dir.path().join(&marker)).unwrap(),
        format!("{}\n{}\n", part(0, 0, 0).committed(), part(0, 0, 1).committed())
    );
    writer.write_batch(&mut vec!["staged for a checkpoint that never completes".to_string()]).unwrap();
    let _never_completes = writer.prepare_commit_at(&barrier(3, false)).unwrap();
    writer.write_batch(&mut vec!["replayed".to_string()]).unwrap();
    writer.flush().unwrap();
    drop(writer);
    let _ = sink.restore_writer(&restored_ctx(u128::MAX, 0, TEST_JOB), snapshot).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 1).pending(), marker.clone(), part(0, 0, 0).committed()]);
    assert_eq!(fs::read_to_string(dir.path().join(part(0, 0, 0).committed())).unwrap(), "kept\n");

    // Later, a new job restores the savepoint into the same directory.
    let _ = sink.restore_writer(&restored_ctx(u128::MAX - 1, 0, TEST_JOB), savepoint).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 0).committed(), part(0, 0, 1).committed()]);
    assert_eq!(fs::read_to_string(dir.path().join(part(0, 0, 1).committed())).unwrap(), "staged for the savepoint\n");
}

/// A savepoint's marker goes once the next checkpoint committed its parts.
#[test]
fn a_savepoint_marker_is_removed_once_its_parts_are_committed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_line);
    let mut writer = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
    writer.write_batch(&mut vec!["a".to_string()]).unwrap();
    writer.prepare_commit_at(&barrier(1, true)).unwrap();
    writer.write_batch(&mut vec!["b".to_string()]).unwrap();
    writer.prepare_commit_at(&barrier(2, false)).unwrap();
    assert!(names(dir.path()).iter().any(|n| n.starts_with(".savepoint-")));
    writer.commit(2).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 0).committed(), part(0, 0, 1).committed()]);
}

#[test]
fn a_restore_into_a_directory_another_job_writes_leaves_that_job_alone() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_line);
    // Job 0 runs on: one part pending for checkpoint 1, one in progress.
    let mut running = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
    running.write_batch(&mut vec!["first".to_string()]).unwrap();
    let savepoint = running.prepare_commit(1).unwrap();
    running.write_batch(&mut vec!["second".to_string()]).unwrap();
    running.flush().unwrap();
    // Job 7 restores job 0's savepoint into the same directory while job 0 runs.
    let _ = sink.restore_writer(&restored_ctx(7, 0, TEST_JOB), savepoint).unwrap();
    assert!(dir.path().join(part(0, 0, 1).in_progress()).exists(), "the running job's file was removed");
    // Job 0 goes on undisturbed: its commit finds its pending part already committed.
    running.commit(1).unwrap();
    let _ = running.prepare_commit(2).unwrap();
    running.commit(2).unwrap();
    assert_eq!(names(dir.path()), vec![part(0, 0, 0).committed(), part(0, 0, 1).committed()]);
}

#[test]
fn a_restart_without_a_checkpoint_removes_what_earlier_attempts_left_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::new(dir.path(), format_line);
    let mut first = sink.create_writer(&TaskContext::for_test(0, 1, 8)).unwrap();
    first.write_batch(&mut vec!["lost in the crash".to_string()]).unwrap();
    first.flush().unwrap();
    drop(first);
    let mut ctx = TaskContext::for_test(0, 1, 8);
    ctx.attempt = 1;
    let _ = sink.create_writer(&ctx).unwrap();
    assert_eq!(names(dir.path()), Vec::<String>::new());
}

#[test]
fn a_crafted_snapshot_cannot_reach_outside_the_sink_s_own_files() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("out");
    let victim = root.path().join("victim.txt");
    fs::write(&victim, "precious").unwrap();
    let sink = FileSink::new(&dir, format_line);
    let crafted = postcard::to_allocvec(&("../victim.txt", "part-x")).unwrap();
    let error = sink.restore_writer(&restored_ctx(1, 0, TEST_JOB), vec![crafted.clone()]).err().unwrap().to_string();
    assert!(error.contains("not a part-file name") || error.contains("not a pending commit"), "{error}");
    assert!(sink.check_restore(&[crafted]).is_err());
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
}
