//! The `fjall` state backend with the real binary: a job moves from `hashmap` to `fjall` and
//! back through savepoints at other parallelisms, with a cache budget far below its state so
//! entries go to and come back from the LSM store under `io.tmp.dirs`; it is killed and
//! restored from its own native checkpoint, which the `hashmap` backend refuses with a
//! message saying what to do; and every count comes out exactly once.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    assert_counts_exactly_once, committed_lines, entries_starting_with, newest_checkpoint, poll_json, run_weir,
    start_checkpointed as start, stop_with_savepoint as stop,
};

const USERS: u64 = 5000;
const EVENTS: u64 = 60_000;

fn store_dirs(tmp: &Path) -> Vec<String> {
    entries_starting_with(tmp, "weir-fjall-")
}

#[test]
fn hashmap_to_fjall_and_back_through_savepoints_and_its_own_checkpoint_is_exactly_once() {
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
    // A budget of a few hundred cached entries for 5000 keys: most accesses read the store.
    let fjall = ["-D", "state.backend.type=fjall", "-D", "state.backend.fjall.memory=16kb", "-D", &tmp_dirs];

    // 1. hashmap, p=2, stopped with a (canonical) savepoint.
    let mut args = vec!["run", "-p", "2"];
    args.extend(common);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args, 2);
    let savepoint = stop(&rest, &job_id, &savepoints);
    weir.wait();

    // 2. fjall, p=3, from the savepoint; killed after some checkpoints.
    let mut args = vec!["run", "-p", "3", "-s", savepoint.as_str()];
    args.extend(common);
    args.extend(fjall);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args, 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while store_dirs(&tmp).len() < 3 {
        assert!(Instant::now() < deadline, "three subtasks, but stores {:?}", store_dirs(&tmp));
        std::thread::sleep(Duration::from_millis(20));
    }
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(5));
    drop(weir.stdout_lines());
    weir.kill_hard();
    let job_dir = dir.path().join("chk").join(&job_id);
    let latest = newest_checkpoint(&job_dir).unwrap();
    let metadata = std::fs::read_to_string(latest.join("_metadata")).unwrap();
    assert!(metadata.contains(r#""state_backend":"fjall""#), "{metadata}");
    // A killed process leaves its stores; the next store opened under io.tmp.dirs removes
    // them (step 4 ends with none left).
    assert_eq!(store_dirs(&tmp).iter().filter(|name| !name.ends_with(".lock")).count(), 3, "{:?}", store_dirs(&tmp));
    let latest = latest.to_str().unwrap().to_string();

    // 3. The checkpoint is native: the hashmap backend refuses it and says what to do.
    let mut args = vec!["run", "-p", "2", "-s", latest.as_str()];
    args.extend(common);
    args.extend(job);
    let refused = run_weir(&args);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("native snapshot of the fjall state backend") && stderr.contains("--type canonical"),
        "{stderr}"
    );

    // 4. fjall again, p=1, from its native checkpoint, stopped with a savepoint.
    let mut args = vec!["run", "-p", "1", "-s", latest.as_str()];
    args.extend(common);
    args.extend(fjall);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args, 2);
    let savepoint = stop(&rest, &job_id, &savepoints);
    weir.wait();
    assert!(store_dirs(&tmp).is_empty(), "a store outlived its job or its killed predecessor: {:?}", store_dirs(&tmp));

    // 5. hashmap, p=2, to the end.
    let mut args = vec!["run", "-p", "2", "-s", savepoint.as_str()];
    args.extend(common);
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_counts_exactly_once(&committed_lines(&out), USERS, EVENTS);
}
