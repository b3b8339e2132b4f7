//! weir in real Kubernetes pods (the single-node test Kubernetes of `.ci/k8s`, see
//! docs/kubernetes.md): a JobManager pod and two TaskManager pods that reach it over pod IPs
//! (there is no cluster DNS) run the counter at parallelism 4 with its keyed exchange across
//! the two pods, to the exact expected counts; then a TaskManager pod deleted with the default
//! grace period (30 s) ends at once, because `weir taskmanager` as PID 1 handles SIGTERM
//! (issue 26: the data server advertised 127.0.0.1, and SIGTERM was ignored as PID 1).
//!
//! Needs root and the test node (`.ci/test` sets it up and starts it; see
//! `common/kubernetes.rs`): without them the test fails saying what to run.

mod common;
#[path = "common/kubernetes.rs"]
mod kubernetes;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{assert_counts_exactly_once, committed_lines, output_within};
use kubernetes::{KubernetesNode, Namespace};

const REST_PORT: u16 = 8081;
const RPC_PORT: u16 = 6123;
const USERS: u64 = 1000;
const EVENTS: u64 = 2_000_000;
/// Where the TaskManager pods mount the test's output directory (a hostPath volume).
const OUT_IN_POD: &str = "/out";
/// Longest a pod takes from `apply` to Running and ready.
const POD_START_MAX: Duration = Duration::from_secs(120);
/// Longest the job may run (2 M events through a debug build on two shared cores).
const JOB_MAX: Duration = Duration::from_secs(600);

fn jobmanager_pod(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: jobmanager
  labels: {{app: weir, component: jobmanager}}
spec:
  restartPolicy: Never
  containers:
  - name: jobmanager
    image: {image}
    imagePullPolicy: Never
    args: [jobmanager, -D, "jobmanager.rpc.address=$(POD_IP)", -D, "jobmanager.rpc.port={RPC_PORT}",
           -D, "rest.address=$(POD_IP)", -D, "rest.port={REST_PORT}"]
    env:
    - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: WEIR_LOG, value: info}}
    ports: [{{containerPort: {REST_PORT}}}, {{containerPort: {RPC_PORT}}}]
    readinessProbe:
      tcpSocket: {{port: {REST_PORT}}}
      periodSeconds: 1
"#
    )
}

/// A TaskManager pod with two slots registering at `jobmanager` (`ip:port`), with the host
/// directory `out` mounted at [`OUT_IN_POD`]. The default grace period (30 s) on purpose.
fn taskmanager_pod(name: &str, image: &str, jobmanager: &str, out: &std::path::Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: weir, component: taskmanager}}
spec:
  restartPolicy: Never
  containers:
  - name: taskmanager
    image: {image}
    imagePullPolicy: Never
    args: [taskmanager, --jobmanager, "{jobmanager}", -D, taskmanager.numberOfTaskSlots=2]
    env:
    - {{name: WEIR_LOG, value: info}}
    volumeMounts: [{{name: out, mountPath: {OUT_IN_POD}}}]
  volumes:
  - name: out
    hostPath: {{path: "{}", type: Directory}}
"#,
        out.display()
    )
}

fn rest_json(url: &str) -> Option<serde_json::Value> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let mut response = agent.get(url).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()
}

/// Seconds since the epoch of a Kubernetes timestamp (`2006-01-02T15:04:05Z`).
fn epoch_seconds(timestamp: &str) -> i64 {
    let number = |range: std::ops::Range<usize>| -> i64 {
        timestamp.get(range).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a timestamp: {timestamp}"))
    };
    assert!(timestamp.len() == 20 && timestamp.ends_with('Z'), "not a timestamp: {timestamp}");
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    days * 86_400 + number(11..13) * 3600 + number(14..16) * 60 + number(17..19)
}

/// Seconds with one decimal, for the measurements the test prints.
fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[test]
fn epoch_seconds_reads_kubernetes_timestamps() {
    assert_eq!(epoch_seconds("1970-01-01T00:00:00Z"), 0);
    assert_eq!(epoch_seconds("2000-03-01T00:00:00Z"), 951_868_800);
    assert_eq!(epoch_seconds("2026-12-05T12:30:52Z"), 1_796_473_852);
}

#[test]
fn counter_across_taskmanager_pods_and_sigterm_ends_a_pod_at_once() {
    let node = KubernetesNode::get();
    let image = node.weir_image();
    let ns: Namespace = node.namespace("pods");
    let out = tempfile::tempdir().unwrap();

    // The JobManager first: the TaskManagers need its pod IP.
    let started = Instant::now();
    ns.apply(&jobmanager_pod(&image));
    ns.wait_pod_ready("jobmanager", POD_START_MAX);
    let jm_ip = ns.pod_ip("jobmanager");
    eprintln!("JobManager pod Running and ready in {} at {jm_ip}", secs(started.elapsed()));
    let rest = format!("http://{jm_ip}:{REST_PORT}");

    let started = Instant::now();
    let jobmanager = format!("{jm_ip}:{RPC_PORT}");
    for name in ["taskmanager-0", "taskmanager-1"] {
        ns.apply(&taskmanager_pod(name, &image, &jobmanager, out.path()));
    }
    let tm_ips: BTreeSet<String> = ["taskmanager-0", "taskmanager-1"]
        .iter()
        .map(|name| {
            ns.wait_pod_ready(name, POD_START_MAX);
            ns.pod_ip(name)
        })
        .collect();
    assert_eq!(tm_ips.len(), 2, "two TaskManager pods, two IPs: {tm_ips:?}");
    // The host reaches the pods over the bridge: the JobManager's REST API lists both.
    ns.wait_for("both TaskManagers registered with 4 slots", Duration::from_secs(60), || {
        let overview = rest_json(&format!("{rest}/overview"))?;
        (overview["taskmanagers"] == 2 && overview["slots-total"] == 4).then_some(())
    });
    eprintln!("TaskManager pods Running and registered in {}", secs(started.elapsed()));

    // The counter at parallelism 4 over 2 x 2 slots, submitted from the host.
    let output_dir = format!("{OUT_IN_POD}/counter");
    let started = Instant::now();
    let mut run = common::weir();
    run.args(["run", "-m", &format!("{jm_ip}:{REST_PORT}"), "-p", "4", "counter"]);
    run.args(["--users", &USERS.to_string(), "--events", &EVENTS.to_string(), "--output", &output_dir]);
    let (output, ended) = output_within(run, JOB_MAX);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(ended, "the job did not end within {JOB_MAX:?}: {stdout}{stderr}\n{}", ns.diagnostics());
    assert!(
        output.status.success() && stdout.contains("FINISHED"),
        "the job did not finish: {stdout}{stderr}\n{}",
        ns.diagnostics()
    );
    eprintln!("counter ({EVENTS} events, {USERS} users, p=4) FINISHED in {}", secs(started.elapsed()));

    // Every vertex ran two subtasks on each TaskManager pod, so the keyed exchange crossed
    // the pods (each counter subtask gets keys from every source subtask).
    let job_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
        .unwrap_or_else(|| panic!("no job id in: {stdout}"))
        .trim()
        .to_string();
    let job = rest_json(&format!("{rest}/jobs/{job_id}")).unwrap_or_else(|| panic!("GET /jobs/{job_id}"));
    assert_eq!(job["state"], "FINISHED", "{job}");
    let vertices = job["vertices"].as_array().unwrap();
    assert!(vertices.len() >= 2, "a keyed exchange needs two vertices: {job}");
    for vertex in vertices {
        let subtasks = vertex["subtasks"].as_array().unwrap();
        assert_eq!(subtasks.len(), 4, "{vertex}");
        let taskmanagers: BTreeSet<&str> = subtasks.iter().map(|s| s["taskmanager-id"].as_str().unwrap()).collect();
        assert_eq!(taskmanagers.len(), 2, "vertex {} ran on both TaskManager pods: {vertex}", vertex["name"]);
    }

    // The output, written by the sinks in both pods into the hostPath volume: exactly once.
    let lines = committed_lines(&out.path().join("counter"));
    assert_counts_exactly_once(&lines, USERS, EVENTS);
    eprintln!("{} output lines: every user's counts exactly 1..={}", lines.len(), EVENTS / USERS);

    // kubectl delete with the default grace period (30 s): weir as PID 1 ends on SIGTERM by
    // itself (exit code 0; the kubelet's SIGKILL after the grace period would give 137), and
    // deregisters first (the JobManager knows at once, without a heartbeat timeout). How long
    // it took is read from the pod's own timestamps (the container's finishedAt against the
    // deletion's request time), which do not depend on how fast the kubelet reports it; the
    // kubelet removes the pod object several seconds later (its status sync runs every 10 s).
    let started = Instant::now();
    ns.kubectl_ok(&["delete", "pod", "taskmanager-1", "--wait=false"]);
    let mut container_ended: Option<(Duration, i64)> = None;
    // When the JobManager counted one TaskManager less: the deregistration the pod's weir
    // sends on SIGTERM, seen in real time however slowly the kubelet reports the pod.
    let mut deregistered: Option<Duration> = None;
    let pod_gone = ns.wait_for("pod taskmanager-1 to be gone", Duration::from_secs(90), || {
        if deregistered.is_none()
            && rest_json(&format!("{rest}/overview")).is_some_and(|overview| overview["taskmanagers"] == 1)
        {
            deregistered = Some(started.elapsed());
        }
        let output = ns.kubectl(&["get", "pod", "taskmanager-1", "-o", "json"]);
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains("NotFound"), "kubectl get pod taskmanager-1: {stderr}");
            return Some(started.elapsed());
        }
        let pod: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
        if container_ended.is_none() && terminated.is_object() {
            assert_eq!(terminated["exitCode"], 0, "the TaskManager did not end by itself on SIGTERM: {terminated}");
            // deletionTimestamp is the request's time plus the grace period.
            let deadline = epoch_seconds(pod["metadata"]["deletionTimestamp"].as_str().unwrap());
            let grace = pod["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap();
            assert_eq!(grace, 30, "the default grace period");
            let finished = epoch_seconds(terminated["finishedAt"].as_str().unwrap());
            container_ended = Some((started.elapsed(), finished - (deadline - grace)));
        }
        None
    });
    eprintln!("TaskManager pod deleted (grace period 30 s): the pod object was gone after {}", secs(pod_gone));
    match container_ended {
        Some((seen, took)) => {
            eprintln!(
                "  its container exited 0 about {took} s after the delete (timestamps of 1 s resolution), \
                 reported {} after it",
                secs(seen)
            );
            assert!(took <= 5, "the TaskManager took {took} s to end after SIGTERM");
        }
        None => {
            // Gone before a poll saw it terminated (a busy kubelet reports late, and removes
            // the pod object later still): its weir deregistered on SIGTERM well within the
            // grace period, so it was not the kubelet's SIGKILL that ended it.
            eprintln!("  its TaskManager deregistered {} after the delete", deregistered.map_or("never".into(), secs));
            let prompt = deregistered.is_some_and(|at| at < Duration::from_secs(10));
            assert!(
                pod_gone < Duration::from_secs(30) || prompt,
                "the pod took {} to go and its TaskManager did not deregister within 10 s of the delete",
                secs(pod_gone)
            );
        }
    }
    ns.wait_for("the JobManager to count one TaskManager", Duration::from_secs(10), || {
        let overview = rest_json(&format!("{rest}/overview"))?;
        (overview["taskmanagers"] == 1).then_some(())
    });
    let jm_log = ns.logs("jobmanager");
    assert!(jm_log.contains("TaskManager deregistered"), "the TaskManager did not deregister:\n{jm_log}");

    // Deleting the namespace ends the JobManager and the other TaskManager, and checks that
    // nothing of it is left (no object, no running container).
    drop(ns);
}
