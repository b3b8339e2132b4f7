//! JobManager high availability against a real etcd, with real processes: the leader is
//! killed (`kill -9`, or an abort at a named crash point) or frozen and woken (two leaders
//! alive at once) again and again, at random points,
//! mid-checkpoint, after a checkpoint's pointer is written but before its commits are sent,
//! during a stop-with-savepoint, during a submit and during a TaskManager failover; a leader
//! is frozen past its lease; etcd restarts under the cluster; the only JobManager dies and a
//! later one takes over. Each time the output is exactly once, and where no task failed the
//! tasks were never restarted (one attempt wrote every part file).
//!
//! The tests share the two cores of a CI machine, so they run one at a time.

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::committed_lines;
use common::ha::{HaCluster, attempts};

/// One cluster at a time (each is etcd + JobManagers + TaskManagers + a job).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A job takes this long at most, failovers included.
const JOB_WAIT_MAX: Duration = Duration::from_secs(120);

/// A delay that differs per run (printed so a failure can be replayed).
fn random_ms(min: u64, spread: u64) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    min + (nanos / 1000) % spread
}

/// Every user's counts are 1..=n exactly once (`events` per user when given, else any n).
fn assert_exactly_once(lines: &[String], users: u64, per_user: Option<u64>) {
    let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in lines {
        let (user, count) = line.split_once('\t').unwrap_or_else(|| panic!("not user<TAB>count: {line:?}"));
        counts.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    assert_eq!(counts.len() as u64, users, "users seen");
    for (user, mut seen) in counts {
        seen.sort_unstable();
        let n = per_user.unwrap_or(seen.len() as u64);
        let expected: Vec<u64> = (1..=n).collect();
        if seen != expected {
            let mut deduplicated = seen.clone();
            deduplicated.dedup();
            let lost = expected.iter().filter(|c| deduplicated.binary_search(c).is_err()).count();
            panic!("user {user}: {} duplicated, {lost} lost of {n}", seen.len() - deduplicated.len());
        }
    }
}

fn bounded_counter<'a>(out: &'a str, events: &'a str, rate: &'a str) -> Vec<&'a str> {
    vec!["-p", "2", "counter", "--users", "20", "--events", events, "--rate", rate, "--output", out]
}

/// Leaders killed (`kill -9`) or frozen (SIGSTOP, woken 0.2 to 3 s later: before or after
/// their lease expired, so two leaders are alive at once, one of them frozen) at random
/// points: a standby (or the woken one) leads, takes the job over without restarting a task,
/// and the output is exactly once.
#[test]
fn leaders_killed_or_frozen_at_random_points_are_replaced_without_restarting_a_task() {
    let _serial = serial();
    let mut cluster = HaCluster::start(2, 2, &[]);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "75000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let mut takeovers = Vec::new();
    // Which leaders freeze rather than die, from a printed seed (splitmix64).
    let mut seed: u64 = std::env::var("WEIR_HA_FREEZE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("WEIR_HA_FREEZE_SEED={seed}");
    let mut freeze = move || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).is_multiple_of(3)
    };
    for kill in 0..10 {
        std::thread::sleep(Duration::from_millis(random_ms(300, 1200)));
        if cluster.job_state(&job).as_deref() == Some("FINISHED") {
            break;
        }
        let killed_at = Instant::now();
        if freeze() {
            let (_, epoch) = cluster.wait_for_leader(None);
            let index = cluster.leader_index();
            let pid = cluster.jobmanagers[index].process.pid().to_string();
            let frozen_for = Duration::from_millis(random_ms(200, 2800));
            eprintln!("kill {kill}: leader of epoch {epoch} frozen for {frozen_for:?}");
            assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
            std::thread::sleep(frozen_for);
            assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
        } else {
            let epoch = cluster.kill_leader();
            eprintln!("kill {kill}: leader of epoch {epoch} killed");
            cluster.start_jobmanager(&[]);
            cluster.wait_for_leader(Some(epoch));
        }
        let state = loop {
            match cluster.job_state(&job).as_deref() {
                Some("RUNNING") | Some("FINISHED") => break cluster.job_state(&job),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
            assert!(killed_at.elapsed() < Duration::from_secs(30), "no takeover");
        };
        takeovers.push(killed_at.elapsed());
        eprintln!("kill {kill}: {state:?} again after {:?}", killed_at.elapsed());
    }
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(3750));
    let exceptions = cluster.get(&format!("/jobs/{job}/exceptions"));
    assert_eq!(attempts(&out), [0].into(), "a takeover restarted tasks; the job's exceptions: {exceptions:?}");
    assert!(takeovers.len() >= 6, "only {} kills happened", takeovers.len());
    let details = cluster.get(&format!("/jobs/{job}")).unwrap();
    assert_eq!(details["numRestarts"].as_u64().unwrap_or(0), 0, "{details}");
    eprintln!("takeovers: {takeovers:?}");
}

/// Leaders abort at `point` (on its `after`+1-th hit) `crashes` times; the job still ends
/// exactly once. Returns the number of leaders that crashed.
fn crash_leaders_at(point: &str, crashes: usize) -> usize {
    let mut cluster = HaCluster::start(0, 0, &["execution.checkpointing.interval: 150ms"]);
    let arm = || format!("{point}={}*off->return", random_ms(1, 4));
    // The first `crashes` JobManagers are armed: each crashes once it leads long enough.
    let mut armed = 0;
    let mut start = |cluster: &mut HaCluster| {
        if armed < crashes {
            armed += 1;
            let failpoints = arm();
            cluster.start_jobmanager(&[("FAILPOINTS", failpoints.as_str())]);
        } else {
            cluster.start_jobmanager(&[]);
        }
    };
    start(&mut cluster);
    cluster.wait_for_leader(None);
    start(&mut cluster);
    cluster.start_taskmanager();
    cluster.start_taskmanager();
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "52000", "4000"));
    let mut crashed = 0;
    let deadline = Instant::now() + JOB_WAIT_MAX;
    while cluster.job_state(&job).as_deref() != Some("FINISHED") {
        assert!(Instant::now() < deadline, "job did not finish; {crashed} crashes");
        let gone = cluster.forget_exited();
        for _ in 0..gone {
            crashed += 1;
            eprintln!("{point}: leader crash {crashed}");
            start(&mut cluster);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_exactly_once(&committed_lines(&out), 20, Some(2600));
    assert!(crashed >= 1, "{point} was never reached");
    crashed
}

#[test]
fn leaders_crashing_mid_checkpoint_and_between_the_pointer_and_the_commit_lose_nothing() {
    let _serial = serial();
    let mut kills = 0;
    for point in ["checkpoint-before-metadata", "checkpoint-after-metadata", "checkpoint-after-pointer"] {
        kills += crash_leaders_at(point, 3);
    }
    eprintln!("{kills} leader crashes");
    assert!(kills >= 6, "only {kills} crashes");
}

#[test]
fn a_leader_dying_during_a_stop_a_submit_or_a_taskmanager_failover_loses_nothing() {
    let _serial = serial();
    // During a stop-with-savepoint: the stop fails, the job keeps running, a second stop ends it.
    let mut cluster = HaCluster::start(0, 0, &[]);
    cluster.start_jobmanager(&[("FAILPOINTS", "stop-savepoint-triggered=return")]);
    cluster.wait_for_leader(None);
    cluster.start_jobmanager(&[]);
    cluster.start_taskmanager();
    cluster.start_taskmanager();
    let out = cluster.output("stopped");
    let out_arg = out.to_str().unwrap().to_string();
    let job = cluster.submit(&["-p", "2", "counter", "--users", "20", "--rate", "2000", "--output", &out_arg]);
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    std::thread::sleep(Duration::from_millis(random_ms(300, 600)));
    let savepoints = cluster.output("savepoints");
    let body = serde_json::json!({ "targetDirectory": savepoints.to_str().unwrap() }).to_string();
    let (status, trigger) = cluster.post(&format!("/jobs/{job}/stop"), &body);
    assert_eq!(status, 202, "{trigger}");
    let request_id = trigger["request-id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.forget_exited() == 0 {
        assert!(Instant::now() < deadline, "the leader did not crash during the stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.start_jobmanager(&[]);
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    // The new leader answers the orphaned stop: failed, with a message, and forgotten in etcd.
    assert_orphaned_request_failed(&cluster, &job, &request_id);
    let second_stop = loop {
        let output =
            common::run_weir(&["stop", "-m", &cluster.rest(), "--savepoint-path", savepoints.to_str().unwrap(), &job]);
        if output.status.success() {
            break output;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(String::from_utf8_lossy(&second_stop.stdout).contains("Savepoint completed"));
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, None);
    assert_eq!(attempts(&out), [0].into(), "the aborted stop restarted tasks");
    drop(cluster);

    // During a submit: recorded, then the leader died; the next leader runs the job.
    let mut cluster = HaCluster::start(0, 0, &[]);
    cluster.start_jobmanager(&[("FAILPOINTS", "submit-after-record=return")]);
    cluster.wait_for_leader(None);
    cluster.start_jobmanager(&[]);
    cluster.start_taskmanager();
    cluster.start_taskmanager();
    let out = cluster.output("submitted");
    let rest = cluster.rest();
    let mut args = vec!["run", "-m", &rest, "-d"];
    let out_arg = out.to_str().unwrap().to_string();
    args.extend(bounded_counter(&out_arg, "6000", "3000"));
    let refused = common::run_weir(&args);
    assert!(!refused.status.success(), "the submit was acknowledged by a leader that crashed");
    cluster.forget_exited();
    cluster.wait_for_leader(None);
    let job = loop {
        if let Some(jobs) = cluster.get("/jobs/overview")
            && let Some(job) = jobs["jobs"].as_array().and_then(|j| j.first()).and_then(|j| j["jid"].as_str())
        {
            break job.to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(300));
    drop(cluster);

    // During a TaskManager failover: a TaskManager dies, then the leader.
    let mut cluster = HaCluster::start(2, 3, &[]);
    let out = cluster.output("failover");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    std::thread::sleep(Duration::from_millis(random_ms(500, 1500)));
    let mut taskmanager = cluster.taskmanagers.remove(0);
    taskmanager.kill_hard();
    std::thread::sleep(Duration::from_millis(random_ms(10, 300)));
    let epoch = cluster.kill_leader();
    cluster.start_jobmanager(&[]);
    cluster.wait_for_leader(Some(epoch));
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));

    // The job ended under that leader; the next one still tells how (from the result store).
    let epoch = cluster.kill_leader();
    cluster.wait_for_leader(Some(epoch));
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    let listed = common::run_weir(&["list", "-m", &cluster.rest()]);
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.contains(&job) && listed.contains("FINISHED"), "{listed}");
}

#[test]
fn a_leader_frozen_past_its_lease_writes_and_commits_nothing_when_it_wakes() {
    let _serial = serial();
    let mut cluster = HaCluster::start(2, 2, &[]);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "45000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    std::thread::sleep(Duration::from_millis(random_ms(300, 700)));
    let (_, frozen_epoch) = cluster.wait_for_leader(None);
    let frozen = cluster.leader_index();
    let pid = cluster.jobmanagers[frozen].process.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let (_, epoch) = cluster.wait_for_leader(Some(frozen_epoch));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    // Awake, it sees its leadership gone and stands by; the new leader stays the leader.
    cluster.jobmanagers[frozen].process.stderr_line("lost its leadership");
    let leadership_lines = |cluster: &HaCluster| -> Vec<String> {
        let mut lines = Vec::new();
        for (index, jm) in cluster.jobmanagers.iter().enumerate() {
            for line in jm.process.stderr_lines() {
                if line.contains("leads cluster") || line.contains("lost its leadership") {
                    lines.push(format!("JobManager {index}: {line}"));
                }
            }
        }
        lines
    };
    assert_eq!(
        cluster.wait_for_leader(None).1,
        epoch,
        "the leadership changed again: {:#?}",
        leadership_lines(&cluster)
    );
    assert!(!cluster.jobmanagers[frozen].process.exited(), "the woken JobManager should stand by");
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    // Had it committed anything after waking, records would be lost or twice in the output.
    assert_exactly_once(&committed_lines(&out), 20, Some(2250));
    assert_eq!(attempts(&out), [0].into());
}

#[test]
fn etcd_restarted_under_a_running_cluster_and_a_late_jobmanager_taking_over() {
    let _serial = serial();
    // etcd goes away for 3 s (past the lease) and comes back with its data.
    let mut cluster = HaCluster::start(2, 2, &[]);
    let out = cluster.output("etcd-restart");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    std::thread::sleep(Duration::from_millis(random_ms(300, 700)));
    cluster.etcd.restart(Duration::from_secs(3));
    cluster.wait_for_leader(None);
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));
    drop(cluster);

    // The only JobManager dies; the tasks run on; a JobManager started later takes over.
    let mut cluster = HaCluster::start(1, 2, &[]);
    let out = cluster.output("late");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    std::thread::sleep(Duration::from_millis(random_ms(300, 700)));
    let epoch = cluster.kill_leader();
    // Nothing leads for a while; the subtasks keep writing.
    let written = |dir: &std::path::Path| -> u64 {
        std::fs::read_dir(dir)
            .map(|e| e.flatten().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    };
    let before = written(&out);
    let deadline = Instant::now() + Duration::from_secs(20);
    while written(&out) <= before {
        assert!(Instant::now() < deadline, "the tasks stopped without a leader");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.start_jobmanager(&[]);
    cluster.wait_for_leader(Some(epoch));
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));
    assert_eq!(attempts(&out), [0].into(), "the late leader restarted tasks");
}

/// Polls the status of savepoint/stop request `request_id` until it is no longer
/// IN_PROGRESS, then checks that it failed with the new leader's message and that etcd
/// forgot it.
fn assert_orphaned_request_failed(cluster: &HaCluster, job: &str, request_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        if let Some(answer) = cluster.get(&format!("/jobs/{job}/savepoints/{request_id}"))
            && answer["status"]["id"] != "IN_PROGRESS"
        {
            break answer;
        }
        assert!(Instant::now() < deadline, "the orphaned request stayed IN_PROGRESS");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(answer["status"]["id"], "COMPLETED", "{answer}");
    let cause = answer["operation"]["failure-cause"]["stack-trace"].as_str().unwrap_or_default();
    assert!(cause.contains("lost its leadership") && cause.contains("trigger the savepoint again"), "{answer}");
    assert_eq!(cluster.etcd_keys(&format!("jobs/{job}/savepoints/")), Vec::<String>::new());
}

/// A leader armed to crash at `crash_point`, a standby and one TaskManager; a counter job
/// checkpoints, runs `ms_after_checkpoint` more, and is stopped with a savepoint, which the
/// leader dies in. The cluster, the job, its output and savepoint directories, and the stop's
/// request id.
fn stop_through_a_leader_crash(
    crash_point: &str,
    ms_after_checkpoint: u64,
) -> (HaCluster, String, std::path::PathBuf, std::path::PathBuf, String) {
    let mut cluster = HaCluster::start(0, 0, &[]);
    cluster.start_jobmanager(&[("FAILPOINTS", &format!("{crash_point}=return"))]);
    cluster.wait_for_leader(None);
    cluster.start_jobmanager(&[]);
    cluster.start_taskmanager();
    let out = cluster.output("out");
    let out_arg = out.to_str().unwrap().to_string();
    let job = cluster.submit(&["-p", "2", "counter", "--users", "20", "--rate", "2000", "--output", &out_arg]);
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    // A checkpoint or two complete first, so that a restart has one to restore.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.etcd_keys(&format!("jobs/{job}/checkpoints/")).is_empty() {
        assert!(Instant::now() < deadline, "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(ms_after_checkpoint));
    let savepoints = cluster.output("savepoints");
    let body = serde_json::json!({ "targetDirectory": savepoints.to_str().unwrap() }).to_string();
    let (status, trigger) = cluster.post(&format!("/jobs/{job}/stop"), &body);
    assert_eq!(status, 202, "{trigger}");
    let request_id = trigger["request-id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.forget_exited() == 0 {
        assert!(Instant::now() < deadline, "the leader did not reach {crash_point} during the stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    (cluster, job, out, savepoints, request_id)
}

/// `weir stop` into `savepoints`, asked again until a leader takes it; then the job must
/// end FINISHED with every count exactly once.
fn stop_again_exactly_once(cluster: &HaCluster, job: &str, out: &std::path::Path, savepoints: &std::path::Path) {
    let stopped = loop {
        let output =
            common::run_weir(&["stop", "-m", &cluster.rest(), "--savepoint-path", savepoints.to_str().unwrap(), job]);
        if output.status.success() {
            break output;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(String::from_utf8_lossy(&stopped.stdout).contains("Savepoint completed"));
    cluster.wait_job(job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(out), 20, None);
}

#[test]
fn a_stop_orphaned_by_the_leader_fails_cleanly_when_reconciling_times_out_and_the_job_restarts() {
    let _serial = serial();
    let (mut cluster, job, out, savepoints, request_id) = stop_through_a_leader_crash("stop-savepoint-triggered", 0);
    // The TaskManager that ran the job dies too: nobody reports the attempt, so the new leader's
    // reconciling times out (high-availability.reconcile-timeout: 3s) and it restarts the job
    // from its newest checkpoint on a fresh TaskManager.
    let mut taskmanager = cluster.taskmanagers.remove(0);
    taskmanager.kill_hard();
    cluster.start_taskmanager();
    assert_orphaned_request_failed(&cluster, &job, &request_id);
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let details = cluster.get(&format!("/jobs/{job}")).unwrap();
    assert!(details["numRestarts"].as_u64().unwrap_or(0) >= 1, "{details}");
    let exceptions = cluster.get(&format!("/jobs/{job}/exceptions")).unwrap().to_string();
    assert!(exceptions.contains("high-availability.reconcile-timeout"), "{exceptions}");
    // The restarted job stops cleanly and its output is exactly once.
    stop_again_exactly_once(&cluster, &job, &out, &savepoints);
}

#[test]
fn a_leader_dying_after_a_stop_committed_has_the_job_restored_from_that_savepoint_not_an_older_checkpoint() {
    let _serial = serial();
    // Records after the newest checkpoint, which only the stop's savepoint holds.
    let (mut cluster, job, out, savepoints, request_id) =
        stop_through_a_leader_crash("stop-subtask-finished", random_ms(200, 600));
    // A subtask committed what the stop staged and ended; then the TaskManager dies, so the
    // new leader has no attempt to take over and restarts the job from its restart point. An
    // older checkpoint would write the committed records again.
    let mut taskmanager = cluster.taskmanagers.remove(0);
    taskmanager.kill_hard();
    cluster.start_taskmanager();
    assert_orphaned_request_failed(&cluster, &job, &request_id);
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    stop_again_exactly_once(&cluster, &job, &out, &savepoints);
    // Both savepoints are the user's: the job deleted neither.
    let kept = std::fs::read_dir(&savepoints).map(|entries| entries.flatten().count()).unwrap_or(0);
    assert_eq!(kept, 2, "savepoints left in {}", savepoints.display());
}

/// Bytes in the files of `dir` (staged and committed part files alike).
fn bytes_written(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map(|e| e.flatten().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

#[test]
fn a_new_leader_commits_the_checkpoint_its_predecessor_recorded_but_never_committed() {
    let _serial = serial();
    // Periodic checkpoints effectively off: only the checkpoint triggered below completes, so
    // nothing but the takeover's re-sent completion can commit its files.
    let mut cluster = HaCluster::start(0, 0, &["execution.checkpointing.interval: 1h"]);
    cluster.start_jobmanager(&[("FAILPOINTS", "checkpoint-after-pointer=return")]);
    cluster.wait_for_leader(None);
    cluster.start_jobmanager(&[]);
    cluster.start_taskmanager();
    cluster.start_taskmanager();
    let out = cluster.output("out");
    let out_arg = out.to_str().unwrap().to_string();
    let job = cluster.submit(&["-p", "2", "counter", "--users", "20", "--rate", "2000", "--output", &out_arg]);
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let deadline = Instant::now() + Duration::from_secs(30);
    while bytes_written(&out) == 0 {
        assert!(Instant::now() < deadline, "the sink staged nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, answer) = cluster.post(&format!("/jobs/{job}/checkpoints"), "{}");
    assert_eq!(status, 202, "{answer}");
    // The leader records the checkpoint's pointer in etcd and aborts before sending a commit.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.forget_exited() == 0 {
        assert!(Instant::now() < deadline, "the leader never reached checkpoint-after-pointer");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cluster.etcd_keys(&format!("jobs/{job}/checkpoints/")).len(), 1, "the pointer is not in etcd");
    assert!(committed_lines(&out).is_empty(), "something was committed before the takeover");
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let running = Instant::now();
    while committed_lines(&out).is_empty() {
        assert!(
            running.elapsed() < Duration::from_secs(5),
            "the new leader did not commit the checkpoint its predecessor recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cluster.job_state(&job).as_deref(), Some("RUNNING"));
    let details = cluster.get(&format!("/jobs/{job}")).unwrap();
    assert_eq!(details["numRestarts"].as_u64().unwrap_or(0), 0, "{details}");
    // What was committed is a prefix of each user's counts; the stop commits the rest.
    let savepoints = cluster.output("savepoints");
    let stopped =
        common::run_weir(&["stop", "-m", &cluster.rest(), "--savepoint-path", savepoints.to_str().unwrap(), &job]);
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, None);
    assert_eq!(attempts(&out), [0].into(), "the takeover restarted tasks");
}

/// `weir list` run the moment the leader is killed waits out the failover, as Flink's CLI
/// does with `rest.retry.*`: etcd still names the dead leader until its lease expires, the
/// CLI tries again, asks etcd again, and lists the job from the new leader.
#[test]
fn the_cli_waits_out_a_jobmanager_failover() {
    let _serial = serial();
    let mut cluster = HaCluster::start(2, 1, &[]);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "1000000", "2000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let config = cluster.config.to_str().unwrap().to_string();
    cluster.kill_leader();
    let listed = common::run_weir(&["list", "-c", &config, "-D", "rest.retry.delay=200ms"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&listed.stdout), String::from_utf8_lossy(&listed.stderr));
    assert!(listed.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(&job), "the job is not listed: {stdout}");
    assert!(stderr.contains("does not answer") && stderr.contains("trying again every 200ms"), "{stderr}");
}

#[test]
fn a_standby_jobmanagers_rest_api_answers_with_the_leaders_data() {
    let _serial = serial();
    let cluster = HaCluster::start(2, 1, &[]);
    let leader = cluster.leader_index();
    let standby = 1 - leader;
    let (leader_rest, standby_rest) = (&cluster.jobmanagers[leader].rest, &cluster.jobmanagers[standby].rest);
    assert_ne!(cluster.wait_for_leader(None).0.rest_address, *standby_rest);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "1000000", "2000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let overview = common::get(&format!("http://{standby_rest}/overview"));
    assert_eq!(overview.status, 200, "{}", overview.body);
    let overview = overview.json();
    assert_eq!(
        overview["high-availability"]["leader-pid"].as_u64(),
        Some(u64::from(cluster.jobmanagers[leader].process.pid())),
        "{overview}"
    );
    assert_eq!(
        overview["high-availability"]["leader-address"].as_str(),
        Some(format!("http://{leader_rest}").as_str()),
        "{overview}"
    );
    for path in ["/jobs", "/jobs/overview"] {
        let through_standby = common::get(&format!("http://{standby_rest}{path}"));
        assert_eq!(through_standby.status, 200, "{path}: {}", through_standby.body);
        assert!(through_standby.body.contains(&job), "{path} via the standby: {}", through_standby.body);
    }
    let through_standby = common::get(&format!("http://{standby_rest}/jobs/{job}")).json();
    let from_leader = common::get(&format!("http://{leader_rest}/jobs/{job}")).json();
    assert_eq!(through_standby["jid"], from_leader["jid"]);
    assert_eq!(through_standby["state"], "RUNNING", "{through_standby}");
    assert_eq!(through_standby["vertices"].as_array().map(Vec::len), from_leader["vertices"].as_array().map(Vec::len));
    // A request with a body: a stop through the standby, and its status through the standby.
    let savepoints = cluster.output("savepoints");
    let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let mut response = agent
        .post(&format!("http://{standby_rest}/jobs/{job}/stop"))
        .header("Content-Type", "application/json")
        .send(serde_json::json!({ "targetDirectory": savepoints.to_str().unwrap() }).to_string())
        .unwrap();
    let body = response.body_mut().read_to_string().unwrap();
    assert_eq!(response.status().as_u16(), 202, "{body}");
    let request_id =
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["request-id"].as_str().unwrap().to_string();
    let status = common::poll_json(&format!("http://{standby_rest}/jobs/{job}/savepoints/{request_id}"), |status| {
        status["status"]["id"] == "COMPLETED"
    });
    assert!(status["operation"]["location"].is_string(), "{status}");
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
}

#[test]
fn reconciling_that_times_out_restarts_the_job_from_its_newest_checkpoint() {
    let _serial = serial();
    // high-availability.reconcile-timeout is 3s in the test configuration.
    let mut cluster = HaCluster::start(2, 1, &[]);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.etcd_keys(&format!("jobs/{job}/checkpoints/")).is_empty() {
        assert!(Instant::now() < deadline, "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The leader dies, then the only TaskManager: nobody will report the running attempt.
    let epoch = cluster.kill_leader();
    let mut taskmanager = cluster.taskmanagers.remove(0);
    taskmanager.kill_hard();
    cluster.start_taskmanager();
    cluster.wait_for_leader(Some(epoch));
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.job_state(&job).as_deref() != Some("RECONCILING") {
        assert!(Instant::now() < deadline, "the new leader never reconciled: {:?}", cluster.job_state(&job));
        std::thread::sleep(Duration::from_millis(10));
    }
    let reconciling = Instant::now();
    while cluster.job_state(&job).as_deref() == Some("RECONCILING") {
        assert!(reconciling.elapsed() < Duration::from_secs(20), "reconciling never timed out");
        std::thread::sleep(Duration::from_millis(10));
    }
    let waited = reconciling.elapsed();
    assert!(waited >= Duration::from_millis(2500), "reconciling gave up after {waited:?}, before its 3 s timeout");
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    let details = cluster.get(&format!("/jobs/{job}")).unwrap();
    assert!(details["numRestarts"].as_u64().unwrap_or(0) >= 1, "{details}");
    let exceptions = cluster.get(&format!("/jobs/{job}/exceptions")).unwrap().to_string();
    assert!(exceptions.contains("high-availability.reconcile-timeout"), "{exceptions}");
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));
    assert!(
        attempts(&out).iter().any(|attempt| *attempt > 0),
        "no restarted attempt wrote output: {:?}",
        attempts(&out)
    );
}

/// Waits until etcd holds a completed checkpoint of `job`.
fn wait_checkpointed(cluster: &HaCluster, job: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.etcd_keys(&format!("jobs/{job}/checkpoints/")).is_empty() {
        assert!(Instant::now() < deadline, "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The leader and a TaskManager running half of the job die together (one slot per
/// TaskManager, a replacement TaskManager starts). The new leader cannot take the attempt
/// over, half of it being gone: after the reconcile timeout it restarts the job. The
/// surviving TaskManager's half, reported but not taken over, must be cancelled there and
/// free its slot, or the restart waits for a slot that never comes and the job FAILS.
#[test]
fn the_leader_and_a_taskmanager_dying_together_restart_the_job_in_the_surviving_slot() {
    let _serial = serial();
    let mut cluster = HaCluster::start(2, 2, &["taskmanager.numberOfTaskSlots: 1"]);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    wait_checkpointed(&cluster, &job);
    let index = cluster.taskmanager_running(&job);
    let mut taskmanager = cluster.taskmanagers.remove(index);
    let killed = common::ha::taskmanager_id(&taskmanager);
    let epoch = cluster.kill_leader();
    taskmanager.kill_hard();
    cluster.start_taskmanager();
    let fresh = common::ha::taskmanager_id(cluster.taskmanagers.last().unwrap());
    cluster.wait_for_leader(Some(epoch));
    // Reconciling gives up after 3 s; the restart needs both slots at once, so the job ends
    // on the surviving TaskManager and the fresh one. (Not `numRestarts`: a leader that loses
    // its lease after the restart, as a loaded machine can make it, hands over an attempt the
    // next leader takes over, and the count is per leader, as Flink's.)
    cluster.wait_job(&job, "FINISHED", Duration::from_secs(60));
    let hosts = cluster.subtask_hosts(&job);
    assert!(hosts.contains(&fresh) && !hosts.contains(&killed), "killed {killed}, fresh {fresh}, hosts {hosts:?}");
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));
}

/// A TaskManager frozen (SIGSTOP) past `heartbeat.timeout`: the leader counts it lost and
/// restarts its subtasks elsewhere. Woken, it registers again and reports the attempt it
/// still runs. That attempt is stale: the leader cancels it at once, so the TaskManager's
/// slot is free again (it stayed reserved for nobody before).
#[test]
fn a_taskmanager_woken_after_its_subtasks_restarted_elsewhere_has_its_stale_attempt_cancelled() {
    let _serial = serial();
    let cluster = HaCluster::start(
        1,
        3,
        &["taskmanager.numberOfTaskSlots: 1", "heartbeat.interval: 200ms", "heartbeat.timeout: 2s"],
    );
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    wait_checkpointed(&cluster, &job);
    let index = cluster.taskmanager_running(&job);
    let id = common::ha::taskmanager_id(&cluster.taskmanagers[index]);
    let pid = cluster.taskmanagers[index].pid().to_string();
    let frozen = std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    assert!(frozen.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.subtask_hosts(&job).contains(&id) || cluster.job_state(&job).as_deref() != Some("RUNNING") {
        assert!(Instant::now() < deadline, "the frozen TaskManager's subtasks were not restarted elsewhere");
        std::thread::sleep(Duration::from_millis(50));
    }
    let woken = std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    assert!(woken.success());
    let free_slots = |cluster: &HaCluster| {
        let list = cluster.get("/taskmanagers").unwrap_or_default();
        let entry =
            list["taskmanagers"].as_array().and_then(|tms| tms.iter().find(|tm| tm["id"] == id.as_str()).cloned());
        entry.and_then(|tm| tm["freeSlots"].as_u64())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while free_slots(&cluster).is_none() {
        assert!(Instant::now() < deadline, "the woken TaskManager did not register again");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Registered again: its stale attempt holds no slot, now or a little later.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(free_slots(&cluster), Some(1), "the woken TaskManager's slot stays reserved for its stale attempt");
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));
}

/// SIGTERM of the leader: it steps down at once (its lease revoked), so a standby leads long
/// before the lease could expire (10 s here: a hand-over by expiry would take over 6 s), takes
/// the job over without restarting a task, and the old leader exits 0.
#[test]
fn a_leader_stopped_with_sigterm_hands_over_at_once_without_restarting_a_task() {
    let _serial = serial();
    let mut cluster = HaCluster::start(2, 2, &["high-availability.etcd.lease-ttl: 10s"]);
    let out = cluster.output("out");
    let job = cluster.submit(&bounded_counter(out.to_str().unwrap(), "30000", "3000"));
    cluster.wait_job(&job, "RUNNING", JOB_WAIT_MAX);
    wait_checkpointed(&cluster, &job);
    let (_, epoch) = cluster.wait_for_leader(None);
    let index = cluster.leader_index();
    let mut leader = cluster.jobmanagers.remove(index);
    let stopped_at = Instant::now();
    leader.process.signal("TERM");
    cluster.wait_for_leader(Some(epoch));
    let handed_over = stopped_at.elapsed();
    eprintln!("a standby leads {handed_over:?} after the leader's SIGTERM");
    assert!(handed_over < Duration::from_secs(5), "the standby led only after {handed_over:?}: the lease expired");
    assert_eq!(leader.process.wait(), Some(0), "{:?}", leader.process.stderr_lines());
    assert!(leader.process.stderr_lines().iter().any(|l| l.contains("steps down")));
    cluster.wait_job(&job, "FINISHED", JOB_WAIT_MAX);
    assert_exactly_once(&committed_lines(&out), 20, Some(1500));
    assert_eq!(attempts(&out), [0].into(), "the hand-over restarted tasks");
}
