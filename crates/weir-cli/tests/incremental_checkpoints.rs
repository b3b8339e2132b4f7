//! Incremental checkpoints with the real binary: checkpoints share the files of unchanged key
//! groups, `kill -9` at random points loses and duplicates nothing, retention and disposal
//! delete exactly the files no checkpoint uses, and CLAIM takes a restored checkpoint over.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{RunningWeir, assert_counts_exactly_once, committed_lines, poll_json, post_json, run_weir};

const USERS: u64 = 2000;
const EVENTS: u64 = 30_000;

/// The `_metadata` of each complete checkpoint of `job_dir`, by checkpoint id.
fn complete_metadata(job_dir: &Path) -> BTreeMap<u64, serde_json::Value> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(job_dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(id) = path.file_name().and_then(|n| n.to_str()?.strip_prefix("chk-")?.parse().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(path.join("_metadata")) else { continue };
        found.insert(id, serde_json::from_str(&text).unwrap());
    }
    found
}

/// Every subtask snapshot of one checkpoint's metadata.
fn subtasks(metadata: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    metadata["metadata"]["operators"].as_array().unwrap().iter().flat_map(|o| o["subtasks"].as_array().unwrap())
}

/// Every keyed state's list of blocks in one checkpoint's metadata.
fn keyed_block_lists(metadata: &serde_json::Value) -> impl Iterator<Item = &Vec<serde_json::Value>> {
    subtasks(metadata)
        .flat_map(|s| s["keyed_states"].as_array().into_iter().flatten())
        .map(|state| state["key_groups"].as_array().unwrap())
}

/// The shared files each complete checkpoint of `job_dir` names, by checkpoint id.
fn checkpoints_and_their_files(job_dir: &Path) -> BTreeMap<u64, BTreeSet<String>> {
    complete_metadata(job_dir)
        .into_iter()
        .map(|(id, metadata)| {
            let files = subtasks(&metadata)
                .flat_map(|s| s["shared_files"].as_array().into_iter().flatten())
                .map(|f| f.as_str().unwrap().to_string())
                .collect();
            (id, files)
        })
        .collect()
}

/// Blocks of the complete checkpoints of `job_dir` that are entry deltas of a key group.
fn entry_deltas(job_dir: &Path) -> usize {
    complete_metadata(job_dir)
        .values()
        .map(|metadata| keyed_block_lists(metadata).flatten().filter(|b| b["delta"] == true).count())
        .sum()
}

/// The most blocks any key group of any keyed state has in a complete checkpoint of
/// `job_dir` (a full block and the entry deltas over it).
fn longest_chain(job_dir: &Path) -> usize {
    let mut longest = 0;
    for metadata in complete_metadata(job_dir).values() {
        for blocks in keyed_block_lists(metadata) {
            let mut chains: BTreeMap<u64, usize> = BTreeMap::new();
            for block in blocks {
                *chains.entry(block["key_group"].as_u64().unwrap()).or_default() += 1;
            }
            longest = longest.max(chains.into_values().max().unwrap_or(0));
        }
    }
    longest
}

fn shared_files_on_disk(job_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(job_dir.join("shared"))
        .map(|entries| entries.map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect())
        .unwrap_or_default()
}

fn random_delay(min_ms: u64, spread_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    let delay = min_ms + nanos % spread_ms;
    eprintln!("kill after {delay} ms");
    Duration::from_millis(delay)
}

fn job_args<'a>(checkpoints: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "-D",
        "rest.port=0",
        "-D",
        "execution.checkpointing.interval=100ms",
        "-D",
        "execution.checkpointing.incremental=true",
        "-D",
        "execution.checkpointing.incremental.materialize-every=4",
        "-D",
        "state.checkpoints.num-retained=2",
        "-D",
        "pipeline.max-parallelism=1024",
        "-D",
        checkpoints,
        "counter",
        "--users",
        "2000",
        "--events",
        "30000",
        "--rate",
        "6000",
        "--output",
        out,
    ]
}

/// A test's directories: the job's output and its checkpoint root.
struct TestDirs {
    dir: tempfile::TempDir,
    out: PathBuf,
    out_arg: String,
    chk_root: PathBuf,
    checkpoints: String,
}

impl TestDirs {
    fn new() -> TestDirs {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let out_arg = out.to_str().unwrap().to_string();
        let chk_root = dir.path().join("chk");
        let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
        TestDirs { dir, out, out_arg, chk_root, checkpoints }
    }

    /// Starts the job at p=2 and waits for `completed` checkpoints; returns it, its REST
    /// address and its id.
    fn start_checkpointed(&self, completed: u64) -> (RunningWeir, String, String) {
        let mut args = vec!["run", "-p", "2"];
        args.extend(job_args(&self.checkpoints, &self.out_arg));
        let mut weir = RunningWeir::start(&args);
        let rest = weir.rest_url();
        let job_id = weir.job_id();
        poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| {
            c["counts"]["completed"].as_u64() >= Some(completed)
        });
        (weir, rest, job_id)
    }
}

/// A checkpointed run is killed at a random point, then restored from its newest checkpoint
/// (which names files of older checkpoints) at another parallelism, and killed and restored
/// once more: every count exactly once, every file a complete checkpoint names is there, and
/// once the job finished nothing in `shared/` is left that no checkpoint names.
#[test]
fn kill_9_and_restore_from_incremental_checkpoints_is_exactly_once_and_leaves_no_garbage() {
    kill_9_and_restore_rounds(&[]);
}

/// The same with the `fjall` backend and a 16 KB cache: its entries go to the store and come
/// back between checkpoints, and its entry deltas hold what evictions wrote.
#[test]
fn kill_9_and_restore_from_fjall_incremental_checkpoints_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let tmp_dirs = format!("io.tmp.dirs={}", tmp.path().display());
    kill_9_and_restore_rounds(&[
        "-D",
        "state.backend.type=fjall",
        "-D",
        "state.backend.fjall.memory=16kb",
        "-D",
        &tmp_dirs,
    ]);
}

fn kill_9_and_restore_rounds(backend: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let mut restore_from: Option<String> = None;
    let mut reused_somewhere = false;
    let mut deltas_restored = 0;
    for (round, parallelism) in ["2", "3", "1"].into_iter().enumerate() {
        let mut args = vec!["run", "-p", parallelism];
        if let Some(latest) = &restore_from {
            args.extend(["-s", latest.as_str()]);
        }
        args.extend(backend);
        args.extend(job_args(&checkpoints, &out_arg));
        if round == 2 {
            // The last round runs to the end.
            let output = run_weir(&args);
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            let stdout = String::from_utf8_lossy(&output.stdout).to_string();
            let job_id =
                stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim();
            let job_dir = chk_root.join(job_id);
            let named: BTreeSet<String> = checkpoints_and_their_files(&job_dir).into_values().flatten().collect();
            assert_eq!(shared_files_on_disk(&job_dir), named, "files no checkpoint names are left in shared/");
            break;
        }
        let mut weir = RunningWeir::start(&args);
        let rest = weir.rest_url();
        let job_id = weir.job_id();
        poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(5));
        std::thread::sleep(random_delay(100, 900));
        drop(weir.stdout_lines());
        weir.kill_hard();

        let job_dir = chk_root.join(&job_id);
        let complete = checkpoints_and_their_files(&job_dir);
        assert!(!complete.is_empty() && complete.len() <= 3, "retained {complete:?}");
        let on_disk = shared_files_on_disk(&job_dir);
        for (id, files) in &complete {
            for file in files {
                assert!(on_disk.contains(file), "checkpoint {id} names {file}, which is gone");
            }
            reused_somewhere |= files.iter().any(|f| !f.starts_with(&format!("chk-{id}-")));
        }
        let (latest, _) = complete.last_key_value().unwrap();
        let latest = job_dir.join(format!("chk-{latest}"));
        deltas_restored += std::fs::read_to_string(latest.join("_metadata")).unwrap().matches("\"delta\":true").count();
        eprintln!("entry deltas in the complete checkpoints: {}", entry_deltas(&job_dir));
        // materialize-every=4: each key group is written whole once in 4 checkpoints.
        let longest = longest_chain(&job_dir);
        assert!(longest <= 4, "a key group's chain has {longest} blocks, more than materialize-every (4)");
        restore_from = Some(latest.to_str().unwrap().to_string());
    }
    assert!(reused_somewhere, "no checkpoint reused an older checkpoint's file");
    // About two keys per key group and a few hundred updates per checkpoint: many groups
    // change by one key of two, which is an entry delta.
    assert!(deltas_restored > 0, "no restored checkpoint held an entry delta");
    assert_counts_exactly_once(&committed_lines(&out), USERS, EVENTS);
}

/// `POST /jobs/{id}/checkpoints` with `checkpointType: FULL` (what `flink checkpoint -full`
/// sends) of an incremental job: that checkpoint names only its own files and holds no entry
/// delta, while the checkpoints around it reuse older files; the run is exactly once.
#[test]
fn a_full_checkpoint_on_request_names_no_earlier_file() {
    let dirs = TestDirs::new();
    let mut args = vec!["run", "-p", "2"];
    // Keep every checkpoint, to read the full one and the ones around it.
    args.extend(
        job_args(&dirs.checkpoints, &dirs.out_arg)
            .into_iter()
            .map(|a| if a == "state.checkpoints.num-retained=2" { "state.checkpoints.num-retained=1000" } else { a }),
    );
    let mut weir = RunningWeir::start(&args);
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(3));

    let answer = post_json(&format!("{rest}/jobs/{job_id}/checkpoints"), r#"{"checkpointType": "FULL"}"#);
    assert_eq!(answer.status, 202, "{}", answer.body);
    let request_id = answer.json()["request-id"].as_str().unwrap().to_string();
    let done =
        poll_json(&format!("{rest}/jobs/{job_id}/checkpoints/{request_id}"), |r| r["status"]["id"] == "COMPLETED");
    let full = done["operation"]["checkpointId"].as_u64().unwrap_or_else(|| panic!("no checkpoint: {done}"));
    assert_eq!(weir.wait(), Some(0));

    let job_dir = dirs.chk_root.join(&job_id);
    let files = checkpoints_and_their_files(&job_dir);
    let own = format!("chk-{full}-");
    let full_files = &files[&full];
    assert!(!full_files.is_empty() && full_files.iter().all(|f| f.starts_with(&own)), "{full}: {full_files:?}");
    let metadata = &complete_metadata(&job_dir)[&full];
    assert!(keyed_block_lists(metadata).flatten().all(|b| b["delta"] != true), "the full checkpoint holds deltas");
    let reuses = |id: u64| files.get(&id).is_some_and(|f| f.iter().any(|f| !f.starts_with(&format!("chk-{id}-"))));
    assert!(reuses(full - 1), "the checkpoint before the full one reused nothing: the test proves nothing");
    assert!(files.range(full + 1..).any(|(id, _)| reuses(*id)), "no checkpoint after the full one is incremental");
    assert_counts_exactly_once(&committed_lines(&dirs.out), USERS, EVENTS);
}

/// `weir savepoint --dispose` of an incremental checkpoint deletes its `_metadata` and the
/// shared files no other complete checkpoint names, and keeps the others; CLAIM makes the job
/// restored from a checkpoint dispose it once its own checkpoints subsume it, with what of
/// the old job's files nothing names (a killed job leaves the files of the checkpoint it was
/// writing).
#[test]
fn disposal_and_claim_delete_only_the_files_nothing_else_uses() {
    let dirs = TestDirs::new();
    let TestDirs { out, out_arg, chk_root, checkpoints, .. } = &dirs;
    let (mut weir, _, job_id) = dirs.start_checkpointed(6);
    std::thread::sleep(random_delay(50, 300));
    drop(weir.stdout_lines());
    weir.kill_hard();
    let job_dir = chk_root.join(&job_id);
    let complete = checkpoints_and_their_files(&job_dir);
    assert!((2..=3).contains(&complete.len()), "{complete:?}");
    let (&older, older_files) = complete.first_key_value().unwrap();
    let (&newest, _) = complete.last_key_value().unwrap();
    let others: BTreeSet<String> =
        complete.iter().filter(|(id, _)| **id != older).flat_map(|(_, files)| files.clone()).collect();

    // Inspect says where the blocks are.
    let newest_path = job_dir.join(format!("chk-{newest}"));
    let output = run_weir(&["savepoint", "inspect", newest_path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success() && text.contains("incremental:      blocks in "), "{text}");

    // Disposing the oldest keeps what the others name and deletes what only it named.
    let older_dir: PathBuf = job_dir.join(format!("chk-{older}"));
    let output = run_weir(&["savepoint", "--dispose", older_dir.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!older_dir.join("_metadata").exists());
    let on_disk = shared_files_on_disk(&job_dir);
    assert!(others.is_subset(&on_disk), "a file another checkpoint names is gone");
    for file in older_files.difference(&others) {
        assert!(!on_disk.contains(file), "{file}, named only by the disposed checkpoint {older}, is still there");
    }

    // CLAIM: the restored checkpoint is the new job's; once two of its own checkpoints
    // subsume it, it is disposed and nothing of the old job's that no checkpoint names stays.
    let newest_dir = job_dir.join(format!("chk-{newest}"));
    let mut args =
        vec!["run", "-p", "2", "-s", newest_dir.to_str().unwrap(), "-D", "execution.state-recovery.claim-mode=CLAIM"];
    args.extend(job_args(checkpoints, out_arg));
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!newest_dir.join("_metadata").exists(), "the claimed checkpoint is still there");
    let named: BTreeSet<String> = checkpoints_and_their_files(&job_dir).into_values().flatten().collect();
    assert_eq!(shared_files_on_disk(&job_dir), named, "the old job's unnamed files stayed");
    assert_counts_exactly_once(&committed_lines(out), USERS, EVENTS);
}

/// Crashes an incremental run at `point` on its seventh checkpoint, then restores the newest
/// checkpoint with a `_metadata` under CLAIM at another parallelism and runs to the end:
/// every file a complete checkpoint names was there after the crash, the counts are exactly
/// once, and the files the crashed checkpoint wrote are gone once the claim subsumed it.
/// `backend` is the state backend of both runs (`fjall`'s checkpoints are native: they
/// restore only into `fjall`).
fn crash_at_and_recover(point: &str, backend: &str) {
    let backend_arg = format!("state.backend.type={backend}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    // The crashed process's local stores stay in the test's directory.
    let tmp_dirs = format!("io.tmp.dirs={}", dir.path().display());
    let mut args = vec!["run", "-p", "2", "-D", &backend_arg, "-D", &tmp_dirs];
    args.extend(job_args(&checkpoints, &out_arg));
    let failpoints = format!("{point}=6*off->return");
    let mut weir = RunningWeir::start_with(
        |mut command| {
            command.env("FAILPOINTS", &failpoints);
            command
        },
        &args,
    );
    let job_id = weir.job_id();
    let code = weir.wait();
    assert_ne!(code, Some(0), "the run did not crash at {point}");
    assert!(
        weir.stderr_lines().iter().any(|l| l.contains(&format!("crash point '{point}' reached"))),
        "{:?}",
        weir.stderr_lines()
    );

    let job_dir = chk_root.join(&job_id);
    let complete = checkpoints_and_their_files(&job_dir);
    let (&newest, _) = complete.last_key_value().expect("a complete checkpoint before the crash");
    let on_disk = shared_files_on_disk(&job_dir);
    for (id, files) in &complete {
        for file in files {
            assert!(on_disk.contains(file), "after the crash at {point}, checkpoint {id} names {file}, which is gone");
        }
    }
    if point == "checkpoint-after-metadata" {
        // Its _metadata is written: the crashed checkpoint is the restore point.
        assert_eq!(newest, 7, "{complete:?}");
    } else {
        assert!(newest < 7, "{complete:?}");
        assert!(
            on_disk.iter().any(|f| f.starts_with("chk-7-")),
            "the crashed checkpoint wrote no shared file, so the test proves nothing: {on_disk:?}"
        );
    }

    let newest_dir = job_dir.join(format!("chk-{newest}"));
    let mut args = vec![
        "run",
        "-p",
        "3",
        "-s",
        newest_dir.to_str().unwrap(),
        "-D",
        "execution.state-recovery.claim-mode=CLAIM",
        "-D",
        &backend_arg,
        "-D",
        &tmp_dirs,
    ];
    args.extend(job_args(&checkpoints, &out_arg));
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let named: BTreeSet<String> = checkpoints_and_their_files(&job_dir).into_values().flatten().collect();
    let left = shared_files_on_disk(&job_dir);
    assert_eq!(left, named, "files of the crashed job that no checkpoint names stayed");
    assert!(!left.iter().any(|f| f.starts_with("chk-7-") && point != "checkpoint-after-metadata"));
    assert_counts_exactly_once(&committed_lines(&out), USERS, EVENTS);
}

#[test]
fn a_crash_after_the_files_before_the_metadata_recovers_exactly_once() {
    crash_at_and_recover("checkpoint-before-metadata", "hashmap");
}

#[test]
fn a_crash_after_the_metadata_before_the_acknowledgement_recovers_exactly_once() {
    crash_at_and_recover("checkpoint-after-metadata", "hashmap");
}

/// The native path: the `fjall` backend's incremental checkpoints, read from its store.
#[test]
fn a_fjall_crash_after_the_files_before_the_metadata_recovers_exactly_once() {
    crash_at_and_recover("checkpoint-before-metadata", "fjall");
}

#[test]
fn a_fjall_crash_after_the_metadata_before_the_acknowledgement_recovers_exactly_once() {
    crash_at_and_recover("checkpoint-after-metadata", "fjall");
}

/// A crash between a checkpoint's shared files and its `_metadata` leaves shared files no
/// checkpoint names (and any incomplete `chk-7`); the next job that starts with the same
/// `state.checkpoints.dir` (a fresh one, not a restore, so nothing claims the old one)
/// removes them and keeps every complete checkpoint and the files those name.
#[test]
fn the_next_job_to_start_removes_what_a_crashed_job_left() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let mut args = vec!["run", "-p", "2"];
    args.extend(job_args(&checkpoints, &out_arg));
    let mut weir = RunningWeir::start_with(
        |mut command| {
            command.env("FAILPOINTS", "checkpoint-before-metadata=6*off->return");
            command
        },
        &args,
    );
    let crashed = weir.job_id();
    assert_ne!(weir.wait(), Some(0), "the run did not crash");
    let job_dir = chk_root.join(&crashed);
    let complete = checkpoints_and_their_files(&job_dir);
    let named: BTreeSet<String> = complete.values().flatten().cloned().collect();
    assert!(!job_dir.join("chk-7/_metadata").exists(), "chk-7 completed");
    assert!(shared_files_on_disk(&job_dir).iter().any(|f| f.starts_with("chk-7-")), "chk-7 wrote no shared file");
    assert!(job_dir.join(".weir-job.lock").exists(), "the crashed job left no lock file");

    let second_out = dir.path().join("out2");
    let second_out_arg = second_out.to_str().unwrap().to_string();
    let mut args = vec!["run", "-p", "2"];
    args.extend(job_args(&checkpoints, &second_out_arg));
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    assert_eq!(checkpoints_and_their_files(&job_dir), complete, "a complete checkpoint of the crashed job changed");
    assert_eq!(shared_files_on_disk(&job_dir), named, "files no checkpoint of the crashed job names stayed");
    assert!(!job_dir.join("chk-7").exists(), "the incomplete chk-7 stayed");
    assert!(!job_dir.join(".weir-job.lock").exists());
    // The second job ended cleanly: its own directory keeps no lock file either, and its
    // output is whole.
    let second: Vec<PathBuf> = std::fs::read_dir(&chk_root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != crashed.as_str()))
        .collect();
    assert_eq!(second.len(), 1, "{second:?}");
    assert!(!second[0].join(".weir-job.lock").exists());
    assert_counts_exactly_once(&committed_lines(&second_out), USERS, EVENTS);
}

/// Every file of a snapshot directory and of the shared files its `_metadata` names, with
/// its bytes.
fn snapshot_bytes(snapshot: &Path, job_dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(snapshot).unwrap() {
        let path = entry.unwrap().path();
        files.insert(path.clone(), std::fs::read(&path).unwrap());
    }
    let text = std::fs::read_to_string(snapshot.join("_metadata")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    for operator in value["metadata"]["operators"].as_array().unwrap() {
        for subtask in operator["subtasks"].as_array().unwrap() {
            for file in subtask["shared_files"].as_array().into_iter().flatten() {
                let path = job_dir.join("shared").join(file.as_str().unwrap());
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// Flink's claim modes on what a job is restored from: under NO_CLAIM (the default) an
/// incremental checkpoint, its `_metadata` and every shared file it names, is byte for byte
/// as it was after the restored job ran to its end (its first checkpoint was full, and its
/// retention deleted only its own); under CLAIM a savepoint is the job's, disposed once the
/// job's own checkpoints subsume it.
#[test]
fn no_claim_leaves_the_restored_checkpoint_as_it_was_and_claim_disposes_a_savepoint() {
    let dirs = TestDirs::new();
    let TestDirs { out_arg, chk_root, checkpoints, .. } = &dirs;
    let (mut weir, rest, job_id) = dirs.start_checkpointed(5);
    let savepoints = dirs.dir.path().join("sp");
    let output =
        run_weir(&["savepoint", "-m", rest.trim_start_matches("http://"), &job_id, savepoints.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let savepoint = PathBuf::from(
        common::savepoint_location(&String::from_utf8_lossy(&output.stdout)).trim_start_matches("file://"),
    );
    std::thread::sleep(Duration::from_millis(300));
    drop(weir.stdout_lines());
    weir.kill_hard();

    let job_dir = chk_root.join(&job_id);
    let newest = common::newest_checkpoint(&job_dir).unwrap();
    let before = snapshot_bytes(&newest, &job_dir);
    assert!(before.keys().any(|path| path.starts_with(job_dir.join("shared"))), "{before:?}");
    let mut args = vec!["run", "-p", "3", "-s", newest.to_str().unwrap()];
    args.extend(job_args(checkpoints, out_arg));
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(snapshot_bytes(&newest, &job_dir), before, "NO_CLAIM changed the restored checkpoint");

    assert!(savepoint.join("_metadata").exists());
    let mut args =
        vec!["run", "-p", "2", "-s", savepoint.to_str().unwrap(), "-D", "execution.state-recovery.claim-mode=CLAIM"];
    args.extend(job_args(checkpoints, out_arg));
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!savepoint.join("_metadata").exists(), "the claimed savepoint is still there");
}
