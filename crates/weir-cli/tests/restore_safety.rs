//! Restores that used to duplicate, lose or damage data, each reproduced with the real
//! binary: a final checkpoint restored again, snapshots that lie (crafted names, lengths),
//! output directories that changed or were emptied by a consumer, a restore into a directory
//! another job writes, expired checkpoints, junk snapshots disposed, relative paths on a
//! cluster.

mod common;
use common::BoundedOutput;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    RunningWeir, assert_counts_exactly_once as assert_exactly_once, committed_lines, error_lines, get,
    newest_checkpoint, output_within, poll_json, run_weir, start_running as start, weir,
};
use weir_checkpoint::{DataFileWriter, SnapshotMetadata, decode_metadata, encode_metadata};

fn address(rest: &str) -> String {
    rest.trim_start_matches("http://").to_string()
}

fn savepoint_path(stdout: &str) -> PathBuf {
    let line =
        stdout.lines().find(|l| l.starts_with("Savepoint completed. Path: ")).unwrap_or_else(|| panic!("{stdout}"));
    PathBuf::from(line.trim_start_matches("Savepoint completed. Path: ").trim().trim_start_matches("file://"))
}

/// `weir savepoint` (keep running) or `weir stop` of `job_id` into `dir`.
fn savepoint(rest: &str, job_id: &str, dir: &Path, stop: bool) -> PathBuf {
    let dir = dir.to_str().unwrap();
    let output = if stop {
        run_weir(&["stop", "-m", &address(rest), "--savepoint-path", dir, job_id])
    } else {
        run_weir(&["savepoint", "-m", &address(rest), job_id, dir])
    };
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    savepoint_path(&stdout)
}

fn read_metadata(snapshot: &Path) -> SnapshotMetadata {
    decode_metadata(&std::fs::read(snapshot.join("_metadata")).unwrap(), "test").unwrap()
}

fn write_metadata(snapshot: &Path, metadata: &SnapshotMetadata) {
    std::fs::write(snapshot.join("_metadata"), encode_metadata(metadata)).unwrap();
}

/// Every file of a directory with its bytes (to prove nothing changed).
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().to_string(), std::fs::read(e.path()).unwrap_or_default())
        })
        .collect();
    files.sort();
    files
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for (name, bytes) in files_of(from) {
        std::fs::write(to.join(name), bytes).unwrap();
    }
}

#[test]
fn restoring_the_final_checkpoint_of_a_finished_job_emits_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("words.txt");
    std::fs::write(&input, "to be or not to be\nthat is the question\n".repeat(200)).unwrap();
    let out = dir.path().join("out");
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let job = ["wordcount", "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap()];
    let mut first =
        vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];
    first.extend(["-p", "2"]);
    first.extend(job);
    let output = run_weir(&first);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let job_id = stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim();
    let mut words = committed_lines(&out);
    words.sort();
    assert_eq!(words.len(), 8, "{words:?}");
    let final_checkpoint = newest_checkpoint(&chk_root.join(job_id)).expect("the final checkpoint is retained");
    // The only restore point after a crash in the job's last moments: restoring it again
    // into the same output must not write any word a second time.
    for parallelism in ["2", "3"] {
        let mut again = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms"];
        again.extend(["-D", &checkpoints, "-s", final_checkpoint.to_str().unwrap(), "-p", parallelism]);
        again.extend(job);
        let started = Instant::now();
        let output = run_weir(&again);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(started.elapsed() < Duration::from_secs(15));
        let mut after = committed_lines(&out);
        after.sort();
        assert_eq!(after, words, "restoring the final checkpoint at -p {parallelism} emitted words again");
    }
    // Without periodic checkpoints too.
    let mut plain = vec!["run", "-D", "rest.port=0", "-s", final_checkpoint.to_str().unwrap()];
    plain.extend(job);
    let output = run_weir(&plain);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(committed_lines(&out).len(), 8);

    // What the snapshot records, and what inspect and the dry run say about it.
    let metadata = read_metadata(&final_checkpoint);
    assert!(
        metadata.operators.iter().all(|o| o.is_fully_finished()),
        "the final checkpoint records finished operators"
    );
    // And none of their keyed state (the word counts): nothing would ever read it.
    let keyed: Vec<&str> = metadata
        .operators
        .iter()
        .filter(|o| o.subtasks.iter().any(|s| !s.keyed_states.is_empty()))
        .map(|o| o.uid.as_str())
        .collect();
    assert!(keyed.is_empty(), "the final checkpoint holds keyed state of finished operators {keyed:?}");
    let inspect = run_weir(&["savepoint", "inspect", final_checkpoint.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("finished (its input had ended)"));

    let mut dry = vec!["run", "--dry-run", "-s", final_checkpoint.to_str().unwrap(), "-p", "3"];
    dry.extend(job);
    let dry_run = run_weir(&dry);
    let dry_out = String::from_utf8_lossy(&dry_run.stdout).to_string();
    assert!(dry_out.contains("had finished: they read no input"), "{dry_out}");
}

/// A savepoint of a running counter job that writes through the file sink (its sink state
/// lists pending commits); the job is cancelled after it, so nothing commits the savepoint's
/// pending parts. Returns (savepoint, output directory, the job's tempdir).
fn savepoint_with_pending_parts() -> (PathBuf, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    // Checkpoints far apart: the savepoint's staged part stays pending.
    let args = [
        "run",
        "-D",
        "rest.port=0",
        "-D",
        "execution.checkpointing.interval=1h",
        "-p",
        "2",
        "counter",
        "--users",
        "10",
        "--rate",
        "5000",
        "--output",
        &out_arg,
    ];
    let (mut weir, rest, job_id) = start(&args);
    std::thread::sleep(Duration::from_millis(400));
    let location = savepoint(&rest, &job_id, &dir.path().join("sp"), false);
    let cancel = run_weir(&["cancel", "-m", &address(&rest), &job_id]);
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    weir.wait();
    (location, out, dir)
}

#[test]
fn pending_parts_are_committed_where_they_were_written_and_vanished_ones_count_as_committed() {
    let (snapshot, first_out, dir) = savepoint_with_pending_parts();
    assert!(committed_lines(&first_out).is_empty(), "an intermediate savepoint committed its parts");
    let pending_before: Vec<String> =
        files_of(&first_out).into_iter().map(|(n, _)| n).filter(|n| n.ends_with(".pending")).collect();
    assert!(!pending_before.is_empty(), "the savepoint staged nothing");
    // Restored with another --output: the pending parts are committed where they are.
    let second_out = dir.path().join("second");
    let job = ["counter", "--users", "10", "--events", "100", "--output", second_out.to_str().unwrap()];
    let mut dry = vec!["run", "--dry-run", "-s", snapshot.to_str().unwrap()];
    dry.extend(job);
    let report = run_weir(&dry);
    let report = String::from_utf8_lossy(&report.stdout).to_string();
    assert!(
        report.contains(&format!("{} to commit, 0 already committed, 0 missing", pending_before.len())),
        "{report}"
    );
    let mut run = vec!["run", "-D", "rest.port=0", "-s", snapshot.to_str().unwrap()];
    run.extend(job);
    let output = run_weir(&run);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for name in &pending_before {
        let committed = name.trim_start_matches('.').trim_end_matches(".pending");
        assert!(first_out.join(committed).is_file(), "{committed} not committed where it was written");
    }

    // A consumer took the committed parts away: a restore takes them as committed (a
    // warning), instead of failing and restarting forever.
    for (name, _) in files_of(&first_out) {
        std::fs::remove_file(first_out.join(name)).unwrap();
    }
    let report = run_weir(&dry);
    let report = String::from_utf8_lossy(&report.stdout).to_string();
    assert!(
        report.contains(&format!("0 to commit, 0 already committed, {} missing", pending_before.len())),
        "{report}"
    );
    assert!(report.contains("is neither pending nor committed"), "{report}");
    let started = Instant::now();
    let output = run_weir(&run);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("taken as committed"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_crafted_snapshot_is_refused_before_anything_is_touched() {
    let (snapshot, out, dir) = savepoint_with_pending_parts();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let crafted = dir.path().join("crafted");
    copy_dir(&snapshot, &crafted);
    // The sink's pending commit now names a file outside the output directory.
    let mut metadata = read_metadata(&crafted);
    let element = postcard_pair("../victim.txt", "../victim-renamed.txt");
    let mut writer = DataFileWriter::new();
    let block = writer.add_block(&element, None, 1);
    std::fs::write(crafted.join("crafted-0.state"), writer.finish()).unwrap();
    let sink = metadata.operators.iter_mut().find(|o| o.uid == "sink").unwrap();
    for subtask in &mut sink.subtasks {
        subtask.file = Some("crafted-0.state".into());
        for state in &mut subtask.operator_states {
            state.elements = vec![block];
        }
    }
    write_metadata(&crafted, &metadata);
    let before_out = files_of(&out);
    let before_snapshot = files_of(&crafted);
    let job = ["counter", "--users", "10", "--events", "100", "--output", out.to_str().unwrap()];
    for dry in [false, true] {
        let mut args = vec!["run", "-D", "rest.port=0", "-s", crafted.to_str().unwrap()];
        if dry {
            args.push("--dry-run");
        }
        args.extend(job);
        let output = run_weir(&args);
        assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));
        let errors = error_lines(&output);
        assert!(errors[0].contains(crafted.to_str().unwrap()) && errors[0].contains("operator 'sink'"), "{errors:?}");
        assert!(errors[0].contains("not a part-file name") || errors[0].contains("not the pending name"), "{errors:?}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(files_of(&out), before_out, "the output directory changed");
    assert_eq!(files_of(&crafted), before_snapshot, "the snapshot changed");

    // A block length of 2^36 (and 2^63 - 1): refused at once, no allocation of that size.
    for length in [1u64 << 36, (1u64 << 63) - 1] {
        let huge = dir.path().join(format!("huge-{length}"));
        copy_dir(&snapshot, &huge);
        let mut metadata = read_metadata(&huge);
        let counter = metadata.operators.iter_mut().find(|o| o.uid == "counter").unwrap();
        let subtask = counter.subtasks.iter_mut().find(|s| !s.keyed_states.is_empty()).unwrap();
        subtask.keyed_states[0].key_groups[0].length = length;
        write_metadata(&huge, &metadata);
        let started = Instant::now();
        let huge_out = dir.path().join("huge-out");
        let output = run_weir(&[
            "run",
            "-D",
            "rest.port=0",
            "-s",
            huge.to_str().unwrap(),
            "counter",
            "--users",
            "10",
            "--output",
            huge_out.to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
        let errors = error_lines(&output);
        assert!(errors[0].contains(&format!("length {length}")) && errors[0].contains("beyond the end"), "{errors:?}");
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}

/// The postcard bytes of a two-string pending commit, as weir 0.1 wrote them.
fn postcard_pair(pending: &str, committed: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for text in [pending, committed] {
        out.push(text.len() as u8);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

#[test]
fn a_restore_into_a_directory_another_job_writes_leaves_that_job_running() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let common = ["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=200ms", "-D", &checkpoints];
    let job = ["counter", "--users", "10", "--rate", "2000", "--output", &out_arg];
    let mut first = common.to_vec();
    first.extend(job);
    let (mut a, rest_a, job_a) = start(&first);
    std::thread::sleep(Duration::from_millis(300));
    let snapshot = savepoint(&rest_a, &job_a, &dir.path().join("sp"), false);
    let mut second = common.to_vec();
    second.extend(["-s", snapshot.to_str().unwrap()]);
    second.extend(job);
    let (mut b, rest_b, job_b) = start(&second);
    poll_json(&format!("{rest_b}/jobs/{job_b}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(3));
    std::thread::sleep(Duration::from_millis(300));
    let a_state = get(&format!("{rest_a}/jobs/{job_a}")).json();
    let exceptions = get(&format!("{rest_a}/jobs/{job_a}/exceptions")).json();
    assert_eq!(a_state["state"], "RUNNING", "{exceptions}");
    assert_eq!(exceptions["exceptionHistory"]["entries"].as_array().map(Vec::len), Some(0), "{exceptions}");
    for (rest, job) in [(&rest_a, &job_a), (&rest_b, &job_b)] {
        let output = run_weir(&["cancel", "-m", &address(rest), job]);
        assert!(output.status.success());
    }
    a.wait();
    b.wait();
}

#[test]
fn expired_checkpoints_do_not_stall_the_job_and_leave_no_directories() {
    let dir = tempfile::tempdir().unwrap();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    // Slow storage: the first four snapshot writes take 3 s, past the 1 s timeout, so the
    // checkpoints they belong to (and those queued behind them) expire while their writes are
    // under way; the writes that land late must remove what they wrote. The timeout is long
    // enough for the later checkpoints, the final one among them, to complete on a loaded
    // machine (with a timeout every checkpoint misses, a bounded job never finishes: it waits
    // for its final checkpoint, as Flink's does).
    let mut command = weir();
    command.env("FAILPOINTS", "snapshot-before-write=4*sleep(3000)->off").env("WEIR_LOG", "warn").args([
        "run",
        "-D",
        "rest.port=0",
        "-p",
        "4",
        "-D",
        "execution.checkpointing.interval=20ms",
        "-D",
        "execution.checkpointing.timeout=1s",
        "-D",
        "execution.checkpointing.tolerable-failed-checkpoints=1000000",
        "-D",
        &checkpoints,
        "counter",
        "--users",
        "100",
        "--events",
        "2000000",
        "--output",
        "none",
    ]);
    let started = Instant::now();
    let (output, ended) = output_within(command, Duration::from_secs(90));
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(ended && output.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("expired before completing"), "no checkpoint expired: {stderr}");
    // The writes slept 6 s in all on two writer threads; the rest is the job's own time.
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    let job_id = stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim();
    // Only retained checkpoints stay: no aborted chk-<n> directory, no stray file.
    let left: Vec<String> = std::fs::read_dir(chk_root.join(job_id))
        .map(|entries| entries.map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect())
        .unwrap_or_default();
    for name in &left {
        let path = chk_root.join(job_id).join(name);
        assert!(
            path.join("_metadata").is_file(),
            "an aborted checkpoint directory stayed: {name} {:?}",
            files_of(&path)
        );
    }
    assert!(left.len() <= 1, "{left:?}");
}

#[test]
fn dispose_refuses_junk_metadata_and_deletes_only_what_a_snapshot_names() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("not-a-snapshot");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("_metadata"), "{}").unwrap();
    std::fs::write(junk.join("thesis.tex"), "years of work").unwrap();
    let output = run_weir(&["savepoint", "--dispose", junk.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(error_lines(&output)[0].contains("nothing was deleted"), "{:?}", error_lines(&output));
    assert!(junk.join("thesis.tex").is_file() && junk.join("_metadata").is_file());

    let (snapshot, _out, _dir) = savepoint_with_pending_parts();
    std::fs::write(snapshot.join("notes.txt"), "mine").unwrap();
    let output = run_weir(&["savepoint", "--dispose", snapshot.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("notes.txt"));
    assert_eq!(files_of(&snapshot).into_iter().map(|(n, _)| n).collect::<Vec<_>>(), vec!["notes.txt".to_string()]);
}

#[test]
fn a_relative_output_on_a_cluster_is_the_client_s_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cluster_cwd = dir.path().join("cluster");
    let client_cwd = dir.path().join("client");
    std::fs::create_dir_all(&cluster_cwd).unwrap();
    std::fs::create_dir_all(&client_cwd).unwrap();
    let mut jobmanager = RunningWeir::start_with(
        |mut c| {
            c.current_dir(&cluster_cwd);
            c
        },
        &["jobmanager", "-D", "rest.port=0", "-D", "jobmanager.rpc.port=0"],
    );
    let line = jobmanager.stderr_line("REST API at http://");
    let rest = line.split("REST API at http://").nth(1).unwrap().split(',').next().unwrap().to_string();
    let rpc = line.rsplit("connect to ").next().unwrap().trim().to_string();
    let mut taskmanager = RunningWeir::start_with(
        |mut c| {
            c.current_dir(&cluster_cwd);
            c
        },
        &["taskmanager", "--jobmanager", &rpc],
    );
    taskmanager.stderr_line("registered at");
    let output = weir()
        .current_dir(&client_cwd)
        .args(["run", "-m", &rest, "counter", "--users", "5", "--events", "50", "--output", "out"])
        .bounded_output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_exactly_once(&committed_lines(&client_cwd.join("out")), 5, 50);
    assert!(!cluster_cwd.join("out").exists(), "the TaskManager wrote into its own working directory");
}
