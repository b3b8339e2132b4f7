//! SIGTERM and SIGINT stop every process gracefully, with real processes: an embedded run
//! cancels its job and names the checkpoint to resume from; a run following a job on a
//! cluster detaches from it, saying how to reach it; a TaskManager cancels its
//! subtasks and deregisters (its job restarts elsewhere at once); a JobManager without high
//! availability cancels its jobs and exits 0; a second signal exits at once. (The leader's
//! hand-over with high availability is in `high_availability.rs`, the operator's in
//! examples/custom-job's `operator_failover.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::{RunningWeir, get, poll_json, run_weir, start_jobmanager};

const PACED_COUNTER: [&str; 7] = ["counter", "--users", "10", "--rate", "500", "--output", "none"];

#[test]
fn ctrl_c_cancels_an_embedded_run_and_names_the_checkpoint_to_resume_from() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = format!("state.checkpoints.dir=file://{}", dir.path().display());
    let mut args = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=200ms", "-D", &checkpoints];
    args.extend(PACED_COUNTER);
    let mut weir = RunningWeir::start(&args);
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(1));
    weir.signal("INT");
    assert_eq!(weir.wait(), Some(1), "a cancelled job exits 1");
    let stderr = weir.stderr_lines().join("\n");
    assert!(stderr.contains(&format!("Cancelling job {job_id} (interrupted)")), "{stderr}");
    let resume = stderr.lines().find_map(|l| l.split("resume with: weir run -s ").nth(1)).expect(&stderr);
    let path = resume.split_whitespace().next().unwrap().trim_start_matches("file://");
    assert!(std::path::Path::new(path).join("_metadata").is_file(), "{path} is not a retained checkpoint");
    assert!(weir.stdout_lines().iter().any(|l| l.contains("ended with state CANCELED")));
}

/// The first signal starts a graceful stop; one sent while that stop is under way ends the
/// process at once with 128 + 2. A stop may finish before the second signal arrives, so the
/// test tries a few times and needs one such exit.
#[test]
fn a_second_signal_exits_at_once() {
    let mut codes = Vec::new();
    for _ in 0..5 {
        let mut args = vec!["run", "-D", "rest.port=0"];
        args.extend(PACED_COUNTER);
        let mut weir = RunningWeir::start(&args);
        weir.job_id();
        weir.signal("INT");
        weir.stderr_line("SIGINT received");
        if !weir.exited() {
            weir.signal("INT");
        }
        let code = weir.wait();
        if code == Some(130) {
            assert!(weir.stderr_lines().iter().any(|l| l.contains("second signal")), "{:?}", weir.stderr_lines());
            return;
        }
        codes.push(code);
    }
    panic!("no run exited at once on its second signal: {codes:?}");
}

/// The id a TaskManager printed when it registered.
fn taskmanager_id(taskmanager: &mut RunningWeir) -> String {
    let line = taskmanager.stderr_line("registered at");
    line.split("TaskManager ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap_or_default().to_string()
}

/// Ctrl-C on `weir run -m` following a job (attached, as `flink run` without `-d`): the
/// client goes, the job keeps running on the cluster, and the client says how to cancel or
/// stop it and where a new run would resume from.
#[test]
fn ctrl_c_detaches_from_a_job_on_a_cluster_and_says_how_to_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut jobmanager, rest, rpc) = start_jobmanager(&["heartbeat.timeout=60s"]);
    let mut taskmanager = RunningWeir::start(&["taskmanager", "--jobmanager", &rpc]);
    taskmanager.stderr_line("registered at");
    let checkpoints = format!("state.checkpoints.dir=file://{}", dir.path().display());
    let address = rest.trim_start_matches("http://").to_string();
    let mut args = vec!["run", "-m", &address, "-p", "1", "-D", "execution.checkpointing.interval=200ms"];
    args.extend(["-D", &checkpoints]);
    args.extend(PACED_COUNTER);
    let mut run = RunningWeir::start(&args);
    let job_id = run.job_id();
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(1));
    run.signal("INT");
    assert_eq!(run.wait(), Some(130), "an interrupted client exits 130");
    let stderr = run.stderr_lines().join("\n");
    assert!(stderr.contains(&format!("Detached from job {job_id}: it keeps running")), "{stderr}");
    assert!(stderr.contains(&format!("weir cancel -m {address} {job_id}")), "{stderr}");
    let resume = stderr.lines().find_map(|l| l.split("resumes from it with: weir run -s ").nth(1)).expect(&stderr);
    let path = resume.split_whitespace().next().unwrap().trim_start_matches("file://");
    assert!(std::path::Path::new(path).join("_metadata").is_file(), "{path} is not a retained checkpoint");
    assert_eq!(get(&format!("{rest}/jobs/{job_id}")).json()["state"], "RUNNING", "the job did not keep running");
    jobmanager.signal("TERM");
    assert_eq!(jobmanager.wait(), Some(0));
    taskmanager.signal("TERM");
    taskmanager.wait();
}

#[test]
fn sigterm_deregisters_a_taskmanager_and_stops_a_jobmanager_with_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut jobmanager, rest, rpc) = start_jobmanager(&["heartbeat.timeout=60s"]);
    let mut taskmanagers: Vec<RunningWeir> = (0..2)
        .map(|_| {
            let mut tm = RunningWeir::start(&["taskmanager", "--jobmanager", &rpc]);
            tm.stderr_line("registered at");
            tm
        })
        .collect();
    let checkpoints = format!("state.checkpoints.dir=file://{}", dir.path().display());
    let mut args = vec!["run", "-m", rest.trim_start_matches("http://"), "-d", "-p", "1"];
    args.extend(["-D", "execution.checkpointing.interval=200ms", "-D", &checkpoints]);
    args.extend(["-D", "restart-strategy.type=fixed-delay", "-D", "restart-strategy.fixed-delay.delay=0ms"]);
    args.extend(PACED_COUNTER);
    let submit = run_weir(&args);
    assert!(submit.status.success(), "{}", String::from_utf8_lossy(&submit.stderr));
    let stdout = String::from_utf8_lossy(&submit.stdout).to_string();
    let job =
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string();
    let host = || {
        let job = get(&format!("{rest}/jobs/{job}")).json();
        let running = job["state"] == "RUNNING";
        let host = job["vertices"][0]["subtasks"][0]["host"].as_str().unwrap_or("").to_string();
        running.then_some(host)
    };
    let ids: Vec<String> = taskmanagers.iter_mut().map(taskmanager_id).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let running_on = loop {
        if let Some(host) = host().filter(|h| ids.contains(h)) {
            break host;
        }
        assert!(Instant::now() < deadline, "the job never ran on one of {ids:?}: {:?}", host());
        std::thread::sleep(Duration::from_millis(20));
    };
    // Stop the TaskManager that runs the job (one slot each: the other one is free).
    let index = ids.iter().position(|id| *id == running_on).expect("one of them runs it");
    let mut stopped = taskmanagers.remove(index);
    let stopped_at = Instant::now();
    stopped.signal("TERM");
    assert_eq!(stopped.wait(), Some(0), "a TaskManager stopped by SIGTERM exits 0");
    let lines = stopped.stderr_lines();
    assert!(lines.iter().any(|l| l.contains("deregistered from the JobManager")), "{lines:?}");
    // Noticed at once, not after heartbeat.timeout (60 s here): the job runs on the other one.
    loop {
        if host().is_some_and(|h| ids.contains(&h) && h != running_on) {
            break;
        }
        assert!(stopped_at.elapsed() < Duration::from_secs(30), "the job did not move to the other TaskManager");
        std::thread::sleep(Duration::from_millis(20));
    }
    let exceptions = get(&format!("{rest}/jobs/{job}/exceptions")).body;
    assert!(exceptions.contains("the TaskManager shut down"), "{exceptions}");

    jobmanager.signal("TERM");
    assert_eq!(jobmanager.wait(), Some(0), "a JobManager stopped by SIGTERM exits 0");
    let stderr = jobmanager.stderr_lines().join("\n");
    assert!(stderr.contains(&format!("job {job} Canceled")), "{stderr}");
}
