//! A standalone cluster of real processes: a JobManager, three TaskManagers, a job at p=4
//! spread over them; three TaskManagers are killed with `kill -9` during the run (a new one
//! starts after each) and the output is still exactly once.

mod common;
use common::BoundedOutput;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{RunningWeir, committed_lines, get, run_weir, start_jobmanager, start_taskmanager};

fn delay(min_ms: u64, spread_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    Duration::from_millis(min_ms + nanos % spread_ms)
}

#[test]
fn three_taskmanager_kills_during_a_run_keep_the_output_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_jobmanager, rest, rpc) = start_jobmanager(&["heartbeat.interval=200ms", "heartbeat.timeout=3s"]);
    let mut taskmanagers: Vec<RunningWeir> = (0..3).map(|_| start_taskmanager(&rpc, 2)).collect();
    let overview = common::poll_json(&format!("{rest}/overview"), |o| o["taskmanagers"] == 3);
    assert_eq!(overview["slots-total"], 6);

    let out = dir.path().join("out");
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let submit = run_weir(&[
        "run",
        "-m",
        rest.trim_start_matches("http://"),
        "-d",
        "-D",
        "execution.checkpointing.interval=100ms",
        "-D",
        &checkpoints,
        "-D",
        "restart-strategy.type=fixed-delay",
        "-D",
        "restart-strategy.fixed-delay.attempts=10",
        "-D",
        "restart-strategy.fixed-delay.delay=0ms",
        "-p",
        "4",
        "counter",
        "--users",
        "40",
        "--events",
        "80000",
        "--rate",
        "10000",
        "--output",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&submit.stdout).to_string();
    assert!(submit.status.success(), "{stdout}{}", String::from_utf8_lossy(&submit.stderr));
    let job_id =
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string();

    for round in 0..3 {
        std::thread::sleep(delay(700, 600));
        // Kill a TaskManager that runs subtasks (the oldest ones always do at the start).
        let victim = round % taskmanagers.len();
        taskmanagers[victim].kill_hard();
        taskmanagers.remove(victim);
        taskmanagers.push(start_taskmanager(&rpc, 2));
    }

    let details = common::wait_for_job_end(&rest, &job_id, Duration::from_secs(90));
    assert_eq!(details["state"], "FINISHED", "{details}");
    assert!(details["numRestarts"].as_u64() >= Some(1), "{details}");
    assert!(details["timestamps"]["RESTARTING"].as_u64().is_some(), "{details}");
    let exceptions = get(&format!("{rest}/jobs/{job_id}/exceptions")).json();
    let entries = exceptions["exceptionHistory"]["entries"].as_array().unwrap();
    assert_eq!(entries.len() as u64, details["numRestarts"].as_u64().unwrap(), "one entry per failure: {exceptions}");
    assert!(entries.iter().all(|e| e["stacktrace"].as_str().unwrap().contains("connection was lost")), "{exceptions}");
    // Each failure is located on the TaskManager that was lost.
    assert!(
        entries.iter().all(|e| {
            let location = e["location"].as_str().unwrap();
            e["stacktrace"].as_str().unwrap().contains(&format!("TaskManager {location} at "))
        }),
        "{exceptions}"
    );

    let mut per_user: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in committed_lines(&out) {
        let (user, count) = line.split_once('\t').unwrap();
        per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    assert_eq!(per_user.len(), 40);
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        assert_eq!(counts, (1..=2000).collect::<Vec<u64>>(), "user {user}: lost or duplicated counts");
    }
}

/// `weir cluster stop` of the cluster in a data directory when dropped, so a failed
/// assertion leaves no process behind.
struct StopCluster(std::path::PathBuf);

impl Drop for StopCluster {
    fn drop(&mut self) {
        if self.0.join("cluster/cluster.pids").exists() {
            let _ = common::weir().env("WEIR_DATA_DIR", &self.0).args(["cluster", "stop"]).bounded_output();
        }
    }
}

#[test]
fn cluster_start_and_stop_manage_background_processes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let _stopped_at_the_end = StopCluster(dir.path().to_path_buf());
    let start = common::weir()
        .env("WEIR_DATA_DIR", data)
        // The cluster's processes log as they do by default (warnings), for the slot wait below.
        .env_remove("WEIR_LOG")
        .args(["cluster", "start", "--taskmanagers", "2", "-D", "rest.port=18391", "-D", "jobmanager.rpc.port=18392"])
        .args(["-D", "taskmanager.numberOfTaskSlots=2"])
        .bounded_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&start.stdout).to_string();
    assert!(start.status.success(), "{stdout}{}", String::from_utf8_lossy(&start.stderr));
    assert!(stdout.contains("2 TaskManager(s)"), "{stdout}");
    let taskmanagers = get("http://127.0.0.1:18391/taskmanagers").json();
    assert_eq!(taskmanagers["taskmanagers"].as_array().unwrap().len(), 2);
    // As Flink: the last heartbeat as a time (its dashboard shows it as a date), and the
    // machine's cores and memory.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    for tm in taskmanagers["taskmanagers"].as_array().unwrap() {
        let heartbeat = tm["timeSinceLastHeartbeat"].as_u64().unwrap();
        assert!(heartbeat <= now + 1000 && heartbeat + 30_000 >= now, "{tm}");
        assert!(tm["hardware"]["cpuCores"].as_u64() >= Some(1), "{tm}");
        assert!(tm["hardware"]["physicalMemory"].as_u64() > Some(0), "{tm}");
    }
    // The JobManager logs at info by default, and serves its log where Flink does.
    let log = get("http://127.0.0.1:18391/jobmanager/log").body;
    assert!(log.contains("INFO") && log.contains("TaskManager registered"), "{log}");
    // A second cluster on the same ports: its JobManager cannot listen, which it says at
    // once, and its TaskManager is stopped rather than left registered with the first one.
    let other = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let clash = common::weir()
        .env("WEIR_DATA_DIR", other.path())
        .args(["cluster", "start", "-D", "rest.port=18391", "-D", "jobmanager.rpc.port=18392"])
        .bounded_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&clash.stderr).to_string();
    assert_eq!(clash.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("jobmanager") && stderr.contains("Address already in use"), "{stderr}");
    assert!(stderr.contains("what it had started is stopped"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "noticed after {:?}", started.elapsed());
    assert!(!other.path().join("cluster/cluster.pids").exists(), "the failed start left its pid file");
    std::thread::sleep(Duration::from_millis(500));
    let taskmanagers = get("http://127.0.0.1:18391/taskmanagers").json();
    assert_eq!(taskmanagers["taskmanagers"].as_array().unwrap().len(), 2, "{taskmanagers}");
    // A job submitted with -m runs on the cluster and the CLI follows it to the end.
    let run =
        run_weir(&["run", "-m", "127.0.0.1:18391", "counter", "--users", "5", "--events", "1000", "--output", "none"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).contains("ended with state FINISHED"));
    // A job that needs more slots than the cluster has says so in the JobManager's log.
    let waiting =
        run_weir(&["run", "-m", "127.0.0.1:18391", "-d", "-p", "6", "counter", "--users", "5", "--output", "none"]);
    assert!(waiting.status.success(), "{}", String::from_utf8_lossy(&waiting.stderr));
    let waiting_job = String::from_utf8_lossy(&waiting.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
        .unwrap()
        .trim()
        .to_string();
    let log = std::path::Path::new(data).join("cluster/jobmanager.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("the job waits for 6 slots") {
        assert!(std::time::Instant::now() < deadline, "{}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    }
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("have 4 of 4 free") && said.contains("weir cluster add-taskmanager"), "{said}");
    let cancel = run_weir(&["cancel", "-m", "127.0.0.1:18391", &waiting_job]);
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    // One more TaskManager, as Flink's `taskmanager.sh start`: with the configuration the
    // cluster was started with (its ports, 2 slots), registered, and stopped with the rest.
    let add = common::weir().env("WEIR_DATA_DIR", data).args(["cluster", "add-taskmanager"]).bounded_output().unwrap();
    let stdout = String::from_utf8_lossy(&add.stdout).to_string();
    assert!(add.status.success(), "{stdout}{}", String::from_utf8_lossy(&add.stderr));
    assert!(stdout.contains("TaskManager started in") && stdout.contains("taskmanager-2.log"), "{stdout}");
    let taskmanagers = get("http://127.0.0.1:18391/taskmanagers").json();
    let taskmanagers = taskmanagers["taskmanagers"].as_array().unwrap().clone();
    assert_eq!(taskmanagers.len(), 3);
    assert!(taskmanagers.iter().all(|tm| tm["slotsNumber"] == 2), "{taskmanagers:?}");
    let stop = common::weir().env("WEIR_DATA_DIR", data).args(["cluster", "stop"]).bounded_output().unwrap();
    assert!(stop.status.success());
    assert!(String::from_utf8_lossy(&stop.stdout).contains("Stopped 4 cluster process(es)."));
    // Without a cluster there is nothing to add to.
    let add = common::weir().env("WEIR_DATA_DIR", data).args(["cluster", "add-taskmanager"]).bounded_output().unwrap();
    assert_eq!(add.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&add.stderr).contains("start one with `weir cluster start`"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(ureq::get("http://127.0.0.1:18391/overview").call().is_err(), "the JobManager still answers");
}

/// Subtask counters live in the TaskManagers; the JobManager's REST API and `/metrics` show
/// them, with exact totals once the job finished.
#[test]
fn taskmanager_counters_reach_the_jobmanager_rest_api_and_metrics() {
    let (_jobmanager, rest, rpc) = start_jobmanager(&[]);
    let _taskmanagers: Vec<RunningWeir> = (0..2).map(|_| start_taskmanager(&rpc, 2)).collect();
    common::poll_json(&format!("{rest}/overview"), |o| o["taskmanagers"] == 2);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = run_weir(&[
        "run",
        "-m",
        rest.trim_start_matches("http://"),
        "-p",
        "4",
        "counter",
        "--users",
        "10",
        "--events",
        "30000",
        "--output",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    let job_id =
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string();
    let details = get(&format!("{rest}/jobs/{job_id}")).json();
    let vertices = details["vertices"].as_array().unwrap();
    let written: Vec<u64> = vertices.iter().map(|v| v["metrics"]["write-records"].as_u64().unwrap()).collect();
    assert_eq!(written, vec![30_000, 30_000], "{details}");
    // Four subtasks on two TaskManagers of two slots: the keyed exchange crosses TCP, and
    // its bytes are counted on both sides (Flink's numBytesOut / numBytesIn).
    let bytes = |vertex: usize, name: &str| vertices[vertex]["metrics"][name].as_u64().unwrap();
    assert!(bytes(0, "write-bytes") > 30_000, "at least a byte per record sent over TCP: {details}");
    assert_eq!(bytes(1, "read-bytes"), bytes(0, "write-bytes"), "every byte sent was received: {details}");
    let metrics = get(&format!("{rest}/metrics")).body;
    let source_out: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("weir_task_records_out_total{") && l.contains(&job_id) && l.contains("task=\"Source"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(source_out, 30_000, "{metrics}");
    // Operator counters travel too: the keyed counter saw every event.
    let counter_in: u64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("weir_operator_records_in_total{")
                && l.contains(&job_id)
                && l.contains("operator=\"counter\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(counter_in, 30_000, "{metrics}");
}

/// A job waiting for TaskManager slots is cancelled at once, not after the slot wait.
#[test]
fn a_job_waiting_for_slots_is_cancelled_at_once() {
    let (_jobmanager, rest, rpc) = start_jobmanager(&[]);
    let _taskmanager = start_taskmanager(&rpc, 2);
    common::poll_json(&format!("{rest}/overview"), |o| o["slots-total"] == 2);
    let address = rest.trim_start_matches("http://");
    // Parallelism 3 needs 3 slots; the cluster has 2, so the deploy waits for a TaskManager.
    let submit = run_weir(&[
        "run", "-m", address, "-d", "-p", "3", "counter", "--users", "10", "--rate", "100", "--output", "none",
    ]);
    let stdout = String::from_utf8_lossy(&submit.stdout).to_string();
    assert!(submit.status.success(), "{stdout}{}", String::from_utf8_lossy(&submit.stderr));
    let job_id =
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string();
    std::thread::sleep(Duration::from_millis(300));
    // As in Flink: the job is RUNNING and its subtasks SCHEDULED while they wait for slots.
    let waiting = get(&format!("{rest}/jobs/{job_id}")).json();
    assert_eq!(waiting["state"], "RUNNING", "{waiting}");
    assert!(waiting["vertices"].as_array().unwrap().iter().all(|v| v["status"] == "SCHEDULED"), "{waiting}");

    let started = Instant::now();
    let cancel = run_weir(&["cancel", "-m", address, &job_id]);
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    let details = common::poll_json(&format!("{rest}/jobs/{job_id}"), |d| d["state"] == "CANCELED");
    assert!(started.elapsed() < Duration::from_secs(5), "cancel took {:?}", started.elapsed());
    assert!(details["failure-cause"].is_null(), "a cancel is not a failure: {details}");
    // The slots the waiting deploy did not get are all free again.
    common::poll_json(&format!("{rest}/overview"), |o| o["slots-available"] == 2);
}

/// `-D $internal.pipeline.job-id=<id>` (Flink's fixed job id, which the deployment controller
/// sets): the job takes that id; a second submission of it is refused, as is an id that is
/// not one.
#[test]
fn a_fixed_job_id_is_taken_and_refused_the_second_time() {
    let (_jobmanager, rest, rpc) = start_jobmanager(&[]);
    let _taskmanager = start_taskmanager(&rpc, 2);
    common::poll_json(&format!("{rest}/overview"), |o| o["taskmanagers"] == 1);
    let address = rest.trim_start_matches("http://");
    let id = "0123456789abcdef0123456789abcdef";
    let fixed = format!("$internal.pipeline.job-id={id}");
    let submit = |fixed: &str| {
        run_weir(&[
            "run", "-m", address, "-d", "-D", fixed, "counter", "--users", "3", "--rate", "100", "--output", "none",
        ])
    };
    let first = submit(&fixed);
    let stdout = String::from_utf8_lossy(&first.stdout).to_string();
    assert!(first.status.success(), "{stdout}{}", String::from_utf8_lossy(&first.stderr));
    assert!(stdout.contains(&format!("Job has been submitted with JobID {id}")), "{stdout}");
    common::poll_json(&format!("{rest}/jobs/{id}"), |d| d["state"] == "RUNNING");

    let again = submit(&fixed);
    let stderr = String::from_utf8_lossy(&again.stderr).to_string();
    assert!(!again.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("job {id} was submitted already")), "{stderr}");

    let bad = submit("$internal.pipeline.job-id=not-an-id");
    let stderr = String::from_utf8_lossy(&bad.stderr).to_string();
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bad value 'not-an-id' for configuration key '$internal.pipeline.job-id'"), "{stderr}");
    assert!(stderr.contains("expected a job id: 32 hexadecimal characters"), "{stderr}");

    let cancel = run_weir(&["cancel", "-m", address, id]);
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    common::poll_json(&format!("{rest}/jobs/{id}"), |d| d["state"] == "CANCELED");
}

/// A TaskManager over `taskmanager.memory.process.size` fails its subtasks with an error that
/// names the limit and what to change, instead of being ended by the kernel's OOM killer;
/// the TaskManager itself lives on (it is still registered after the job failed).
#[test]
fn a_taskmanager_over_its_memory_limit_fails_the_job_naming_the_limit() {
    let (_jobmanager, rest, rpc) = start_jobmanager(&[]);
    let mut taskmanager =
        RunningWeir::start(&["taskmanager", "--jobmanager", &rpc, "-D", "taskmanager.memory.process.size=160m"]);
    taskmanager.stderr_line("registered at");
    let address = rest.trim_start_matches("http://");
    // Twenty million keys of heap state: far more than 160 MiB.
    let run = run_weir(&[
        "run",
        "-m",
        address,
        "-D",
        "restart-strategy.type=none",
        "counter",
        "--users",
        "20000000",
        "--events",
        "40000000",
        "--output",
        "none",
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    let stderr = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(!run.status.success(), "the job finished within 160 MiB: {stdout}{stderr}");
    let job_id =
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string();
    let details = common::poll_json(&format!("{rest}/jobs/{job_id}"), |d| d["state"] == "FAILED");
    let exceptions = get(&format!("{rest}/jobs/{job_id}/exceptions")).body;
    for needle in ["more than its taskmanager.memory.process.size of 160 MiB", "raise taskmanager.memory.process.size"]
    {
        assert!(exceptions.contains(needle), "no '{needle}' in {exceptions}\n{details}");
    }
    assert!(
        stderr.contains("taskmanager.memory.process.size") || stdout.contains("taskmanager.memory.process.size"),
        "weir run names the cause: {stdout}{stderr}"
    );
    common::poll_json(&format!("{rest}/overview"), |o| o["taskmanagers"] == 1);
}
