//! The `spillable` state backend with the real binary: a job moves from `hashmap` to
//! `spillable` and back through savepoints (and through a native checkpoint) at other
//! parallelisms, spilling to `io.tmp.dirs` on a small memory budget, and every count comes
//! out exactly once.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    assert_counts_exactly_once, committed_lines, entries_starting_with, newest_checkpoint, poll_json, run_weir,
    start_checkpointed as start, stop_with_savepoint as stop,
};

const USERS: u64 = 5000;
const EVENTS: u64 = 60_000;

fn spill_dirs(tmp: &Path) -> Vec<String> {
    entries_starting_with(tmp, "weir-spill-")
}

#[test]
fn hashmap_to_spillable_and_back_through_savepoints_and_a_checkpoint_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let checkpoints = format!("state.checkpoints.dir=file://{}", dir.path().join("chk").display());
    let tmp_dirs = format!("io.tmp.dirs={}", tmp.display());
    let savepoints = dir.path().join("savepoints");
    let job = ["counter", "--users", "5000", "--events", "60000", "--rate", "8000", "--output", &out_arg];
    let common = ["-D", "rest.port=0", "-D", "execution.checkpointing.interval=200ms", "-D", &checkpoints];
    let spillable =
        ["-D", "state.backend.type=spillable", "-D", "state.backend.spillable.memory=16kb", "-D", &tmp_dirs];

    // 1. hashmap, p=2, stopped with a (canonical) savepoint.
    let mut args = vec!["run", "-p", "2"];
    args.extend(common);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args, 2);
    let savepoint = stop(&rest, &job_id, &savepoints);
    weir.wait();

    // 2. spillable, p=3, from the savepoint; it spills, and is killed after a checkpoint.
    let mut args = vec!["run", "-p", "3", "-s", savepoint.as_str()];
    args.extend(common);
    args.extend(spillable);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args, 3);
    let deadline = Instant::now() + Duration::from_secs(20);
    while spill_dirs(&tmp).is_empty() {
        assert!(Instant::now() < deadline, "the spillable backend never spilled");
        std::thread::sleep(Duration::from_millis(20));
    }
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(5));
    drop(weir.stdout_lines());
    weir.kill_hard();
    let job_dir = dir.path().join("chk").join(&job_id);
    let latest = newest_checkpoint(&job_dir).unwrap();
    let metadata = std::fs::read_to_string(latest.join("_metadata")).unwrap();
    assert!(metadata.contains(r#""state_backend":"spillable""#), "{metadata}");
    // A killed process leaves its spill directories; the next store opened under
    // io.tmp.dirs removes them (step 3 ends with none left).
    assert!(spill_dirs(&tmp).iter().any(|name| !name.ends_with(".lock")), "{:?}", spill_dirs(&tmp));

    // 3. spillable again, p=1, from the native checkpoint, stopped with a savepoint.
    let latest = latest.to_str().unwrap().to_string();
    let mut args = vec!["run", "-p", "1", "-s", latest.as_str()];
    args.extend(common);
    args.extend(spillable);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args, 2);
    let savepoint = stop(&rest, &job_id, &savepoints);
    weir.wait();
    assert!(
        spill_dirs(&tmp).is_empty(),
        "a spill directory outlived its job or its killed predecessor: {:?}",
        spill_dirs(&tmp)
    );

    // 4. hashmap, p=2, to the end.
    let mut args = vec!["run", "-p", "2", "-s", savepoint.as_str()];
    args.extend(common);
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_counts_exactly_once(&committed_lines(&out), USERS, EVENTS);
}
