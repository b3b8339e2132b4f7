//! `weir operator --kubernetes` on the real test node (`.ci/k8s`, docs/kubernetes.md): the
//! WeirDeployment CRD from `deploy/kubernetes/crd.yaml`, the operator as a process on the host
//! with the admin kubeconfig, its clusters as Deployments and pods of the test's own `weir`
//! image. Each test checks the counter's output exactly once (part files on a hostPath
//! volume the pods and the host share) and that deleting the resource leaves nothing behind.
//!
//! Needs root and the test node (`.ci/test` sets it up and starts it): without them the tests
//! fail saying what to run.

mod common;
#[path = "common/kubernetes.rs"]
mod kubernetes;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_counts_exactly_once, committed_lines};
use kubernetes::{KubernetesNode, Namespace};

const USERS: u64 = 100;
const EVENTS: u64 = 120_000;
/// The events of a test with several takeovers (about 80 s).
const LONG_EVENTS: u64 = 240_000;
/// Events per second: the job runs about 40 s, long enough for an upgrade in the middle.
const RATE: u64 = 3_000;
/// Longest wait for a deployment to reach a state (pods start in seconds; the debug build and
/// two shared cores make everything slower).
const STATE_MAX: Duration = Duration::from_secs(120);
/// Longest the job may take to process every event.
const JOB_MAX: Duration = Duration::from_secs(300);

/// A `weir operator --kubernetes` process, stopped with SIGTERM (then SIGKILL) when dropped.
struct Operator {
    child: Option<Child>,
    log: PathBuf,
    node: &'static KubernetesNode,
    namespace: String,
}

impl Operator {
    fn start(node: &'static KubernetesNode, ns: &Namespace, shared: &Path, log_name: &str) -> Operator {
        let log = shared.join(log_name);
        let file = std::fs::File::create(&log).unwrap();
        let child = common::weir()
            .args(["operator", "--kubernetes", "--namespace", &ns.name, "--kubeconfig"])
            .arg(node.kubeconfig())
            // A short lease, so a takeover in a test is quick; renewed every 2 s.
            .args(["-D", "kubernetes.operator.leader-election.lease-duration=6s"])
            .env("WEIR_DATA_DIR", shared.join("data"))
            .env("WEIR_LOG", "info")
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Operator { child: Some(child), log, node, namespace: ns.name.clone() }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Reaps a process killed from outside.
    fn terminate_killed(&mut self) -> Option<std::process::ExitStatus> {
        self.child.take().and_then(|mut child| child.wait().ok())
    }

    /// SIGTERM; waits for the exit.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the operator did not exit within 30 s of SIGTERM; its log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // A test that failed before deleting its resource: with no operator left to remove
        // its finalizer, the namespace could not be deleted.
        let mut args = vec!["-n", self.namespace.as_str()];
        args.extend(REMOVE_FINALIZER);
        let _ = self.node.kubectl_within(&args, None, CLEANUP_MAX);
    }
}

/// Where a test reads what the operator said, for its failure messages.
trait OperatorLog {
    fn log(&self) -> String;
}

impl OperatorLog for Operator {
    fn log(&self) -> String {
        Operator::log(self)
    }
}

/// Longest a cleanup step in `Drop` waits for kubectl (an error then, never a panic: a panic
/// while a failed test unwinds aborts the process and leaves everything running).
const CLEANUP_MAX: Duration = Duration::from_secs(90);

/// `kubectl` arguments that take the operator's finalizer off the test's resource.
const REMOVE_FINALIZER: [&str; 6] =
    ["patch", "weirdeployment", "counts", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#];

/// The directory the pods and the host share (a hostPath volume at the same path).
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("weir-k8s-").tempdir_in("/tmp").unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    dir
}

fn install_crd(node: &KubernetesNode) {
    // The tests run in parallel: two applies at once both find no CRD, and one create fails
    // with AlreadyExists. One apply at a time.
    static APPLYING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = APPLYING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let crd = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes/crd.yaml");
    node.kubectl_ok(&["apply", "-f", crd]);
    node.kubectl_ok(&["wait", "--for=condition=Established", "crd/weirdeployments.weir.dev", "--timeout=60s"]);
}

fn manifest(image: &str, shared: &Path, parallelism: u32, mode: &str) -> String {
    manifest_in_state(image, shared, parallelism, mode, "running")
}

fn manifest_in_state(image: &str, shared: &Path, parallelism: u32, mode: &str, state: &str) -> String {
    let output = format!("{}/out", shared.display());
    manifest_with(image, shared, parallelism, mode, state, &output, "")
}

/// The deployment's manifest; `extra` is more of `spec.configuration` (indented lines).
fn manifest_with(
    image: &str,
    shared: &Path,
    parallelism: u32,
    mode: &str,
    state: &str,
    output: &str,
    extra: &str,
) -> String {
    let shared = shared.display();
    // More events (a longer job) when the configuration asks for more time.
    let events = if extra.contains("# long") { LONG_EVENTS } else { EVENTS };
    // A leader and a standby with Kubernetes HA.
    let jobmanagers = if extra.contains("high-availability.type: kubernetes") { 2 } else { 1 };
    format!(
        r#"apiVersion: weir.dev/v1
kind: WeirDeployment
metadata:
  name: counts
spec:
  image: {image}
  imagePullPolicy: Never
  configuration:
    execution.checkpointing.interval: 1s
    state.checkpoints.num-retained: "5"
{extra}  jobManager:
    replicas: {jobmanagers}
  podTemplate:
    spec:
      terminationGracePeriodSeconds: 10
      containers:
      - name: weir
        volumeMounts: [{{name: shared, mountPath: "{shared}"}}]
      volumes:
      - {{name: shared, hostPath: {{path: "{shared}", type: Directory}}}}
  taskManager:
    replicas: 2
    slots: 2
  job:
    name: counter
    args: [--users, "{USERS}", --events, "{events}", --rate, "{RATE}", --output, "{output}"]
    parallelism: {parallelism}
    upgradeMode: {mode}
    state: {state}
"#
    )
}

/// Waits until the deployment's status satisfies `done`; the resource.
fn wait_status(
    ns: &Namespace,
    operator: &dyn OperatorLog,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + STATE_MAX;
    loop {
        let resource = ns.get_json("weirdeployment/counts").unwrap_or(serde_json::Value::Null);
        if done(&resource) {
            return resource;
        }
        if Instant::now() > deadline {
            give_up(ns, operator, &format!("waited {STATE_MAX:?} for {what}"), &resource);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fails the test: its status first (CI shows the beginning and the end of a long failure),
/// then the pods' diagnostics (also kept in a file), the operator's log, the whole resource.
fn give_up(ns: &Namespace, operator: &dyn OperatorLog, what: &str, resource: &serde_json::Value) -> ! {
    let diagnostics = ns.diagnostics();
    panic!(
        "{what}; its status: {}\n{diagnostics}\noperator log:\n{}\nthe resource: {resource:#}",
        resource["status"],
        operator.log()
    );
}

fn stable_at(resource: &serde_json::Value, generation: u64) -> bool {
    let status = &resource["status"];
    status["observedGeneration"] == generation
        && status["lifecycleState"] == "STABLE"
        && status["jobStatus"]["state"] == "RUNNING"
}

/// Waits for every event to be counted (the job FINISHED), then checks the output.
fn wait_finished_exactly_once(ns: &Namespace, operator: &dyn OperatorLog, out: &Path) {
    wait_finished_exactly_once_of(ns, operator, out, EVENTS);
}

fn wait_finished_exactly_once_of(ns: &Namespace, operator: &dyn OperatorLog, out: &Path, events: u64) {
    let deadline = Instant::now() + JOB_MAX;
    loop {
        let resource = ns.get_json("weirdeployment/counts").unwrap_or(serde_json::Value::Null);
        if resource["status"]["jobStatus"]["state"] == "FINISHED" {
            break;
        }
        if Instant::now() > deadline {
            give_up(ns, operator, &format!("the job did not finish within {JOB_MAX:?}"), &resource);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let lines = committed_lines(out);
    assert_counts_exactly_once(&lines, USERS, events);
}

/// Deletes the resource and checks the operator stopped its job and removed its objects.
fn delete_and_check_nothing_left(ns: &Namespace, operator: &dyn OperatorLog) {
    let started = Instant::now();
    ns.kubectl_ok(&["delete", "weirdeployment", "counts", "--wait=false"]);
    ns.wait_for("the WeirDeployment to be gone (its finalizer removed by the operator)", STATE_MAX, || {
        ns.get_json("weirdeployment/counts").is_none().then_some(())
    });
    ns.wait_for("every object of the deployment to be gone", STATE_MAX, || {
        let left = ns.kubectl_ok(&[
            "get",
            "deployments,services,configmaps,pods",
            "-l",
            "weir.dev/deployment=counts",
            "-o",
            "name",
        ]);
        left.trim().is_empty().then_some(())
    });
    eprintln!("deleted, nothing left, in {:.1} s", started.elapsed().as_secs_f64());
    assert!(operator.log().contains("deleted"), "{}", operator.log());
}

/// apply -> RUNNING; a savepoint-mode upgrade from parallelism 2 to 4 in the middle of the job;
/// every event counted exactly once; delete leaves nothing.
#[test]
fn a_weirdeployment_runs_and_upgrades_in_savepoint_mode_exactly_once() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-sp");
    let shared = shared_dir();
    let out = shared.path().join("out");
    let operator = Operator::start(node, &ns, shared.path(), "operator.log");

    let applied = Instant::now();
    ns.apply(&manifest(&image, shared.path(), 2, "savepoint"));
    wait_status(&ns, &operator, "job RUNNING", |r| r["status"]["jobStatus"]["state"] == "RUNNING");
    eprintln!("BENCH kubectl apply -> job RUNNING: {:.2} s", applied.elapsed().as_secs_f64());
    let first = wait_status(&ns, &operator, "generation 1 STABLE", |r| stable_at(r, 1));
    let first_job = first["status"]["jobStatus"]["jobId"].clone();

    let upgraded = Instant::now();
    ns.apply(&manifest(&image, shared.path(), 4, "savepoint"));
    let second = wait_status(&ns, &operator, "generation 2 RUNNING", |r| {
        r["status"]["observedGeneration"] == 2
            && r["status"]["jobStatus"]["state"] == "RUNNING"
            && r["status"]["jobStatus"]["jobId"] != first_job
            && r["status"].get("operation").is_none()
    });
    eprintln!("BENCH savepoint upgrade p 2 -> 4, apply -> job RUNNING: {:.2} s", upgraded.elapsed().as_secs_f64());
    // Where the time went (shown with --nocapture).
    eprintln!("operator log:\n{}", operator.log());
    let history = second["status"]["savepointHistory"].as_array().cloned().unwrap_or_default();
    assert!(
        history.iter().any(|s| s["triggerType"] == "UPGRADE"),
        "the upgrade savepoint is in the history: {second:#}"
    );
    assert_eq!(second["status"]["jobStatus"]["restoredFrom"], history.last().unwrap()["location"]);
    // The new cluster's pods run, and no container of the old one does (its pod objects may
    // linger while the kubelet cleans up).
    let running = |selector: &str| -> Vec<String> {
        let pods: serde_json::Value =
            serde_json::from_str(&ns.kubectl_ok(&["get", "pods", "-l", selector, "-o", "json"])).unwrap();
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|pod| {
                pod["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|all| all.iter().any(|c| c["state"].get("running").is_some()))
            })
            .map(|pod| pod["metadata"]["name"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    assert_eq!(running("weir.dev/cluster=1").len(), 0, "cluster 1 still runs: {:?}", running("weir.dev/cluster=1"));
    ns.wait_for("both TaskManagers of cluster 2 running", STATE_MAX, || {
        (running("weir.dev/cluster=2,weir.dev/component=taskmanager").len() == 2).then_some(())
    });
    // Every step is an Event on the resource (`kubectl describe wd counts`).
    let events = ns.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=WeirDeployment,involvedObject.name=counts",
        "-o",
        "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
    ]);
    for reason in ["OperationStarted", "PreFlightPassed", "SpecChanged", "UpgradeSavepoint", "ClusterStarted", "Stable"]
    {
        assert!(events.lines().any(|l| l == reason), "no {reason} event among:\n{events}");
    }
    // `kubectl get wd` shows the printer columns.
    let table = ns.kubectl_ok(&["get", "wd", "counts"]);
    assert!(table.contains("RUNNING") && table.contains("savepoint-"), "{table}");

    wait_finished_exactly_once(&ns, &operator, &out);
    delete_and_check_nothing_left(&ns, &operator);
}

/// Two operator replicas: the leader is stopped with SIGTERM and releases its Lease at once;
/// the standby takes over and carries out a last-state upgrade; exactly once.
#[test]
fn a_standby_operator_takes_over_at_once_on_sigterm_and_upgrades_in_last_state_mode() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-ls");
    let shared = shared_dir();
    let out = shared.path().join("out");
    let mut leader = Operator::start(node, &ns, shared.path(), "operator-1.log");
    let leading = |operator: &dyn OperatorLog| operator.log().contains("elected leader");
    let deadline = Instant::now() + STATE_MAX;
    while !leading(&leader) {
        assert!(Instant::now() < deadline, "the first operator never led: {}", leader.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let standby = Operator::start(node, &ns, shared.path(), "operator-2.log");

    ns.apply(&manifest(&image, shared.path(), 2, "last-state"));
    wait_status(&ns, &leader, "generation 1 STABLE", |r| stable_at(r, 1));

    let stopped = Instant::now();
    let status = leader.terminate();
    assert!(status.success(), "the leader exited with {status}: {}", leader.log());
    assert!(leader.log().contains("released its Lease"), "{}", leader.log());
    let deadline = Instant::now() + STATE_MAX;
    while !leading(&standby) {
        assert!(Instant::now() < deadline, "the standby never led: {}", standby.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let handover = stopped.elapsed();
    eprintln!("BENCH operator SIGTERM -> the standby leads: {:.2} s (pid {})", handover.as_secs_f64(), standby.pid());
    // By expiry it would take the 6 s lease.
    assert!(handover < Duration::from_secs(5), "the standby led only after {handover:?}");

    ns.apply(&manifest(&image, shared.path(), 3, "last-state"));
    wait_status(&ns, &standby, "generation 2 STABLE under the new leader", |r| stable_at(r, 2));
    wait_finished_exactly_once(&ns, &standby, &out);
    delete_and_check_nothing_left(&ns, &standby);
}

/// Suspend (a savepoint, the cluster gone) and resume (from it); then the JobManager pod is
/// deleted: its replacement has a new IP and no job, so the operator recovers the deployment
/// from its newest checkpoint. Every event counted exactly once.
#[test]
fn suspend_resume_and_a_deleted_jobmanager_pod_keep_the_counts_exactly_once() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-sr");
    let shared = shared_dir();
    let out = shared.path().join("out");
    let operator = Operator::start(node, &ns, shared.path(), "operator.log");

    ns.apply(&manifest(&image, shared.path(), 2, "savepoint"));
    wait_status(&ns, &operator, "generation 1 STABLE", |r| stable_at(r, 1));

    ns.apply(&manifest_in_state(&image, shared.path(), 2, "savepoint", "suspended"));
    let suspended = wait_status(&ns, &operator, "SUSPENDED", |r| {
        r["status"]["lifecycleState"] == "SUSPENDED" && r["status"].get("operation").is_none()
    });
    let savepoint = suspended["status"]["jobStatus"]["upgradeSavepointPath"].clone();
    assert!(savepoint.as_str().is_some_and(|s| s.contains("savepoint-")), "{suspended:#}");
    ns.wait_for("no pod of the suspended deployment running", STATE_MAX, || {
        let pods = ns.kubectl_ok(&["get", "pods", "-l", "weir.dev/deployment=counts", "-o", "name"]);
        pods.lines().all(|pod| pod.contains("-run-")).then_some(())
    });

    ns.apply(&manifest(&image, shared.path(), 2, "savepoint"));
    let resumed = wait_status(&ns, &operator, "resumed and STABLE", |r| stable_at(r, 3));
    assert_eq!(resumed["status"]["jobStatus"]["restoredFrom"], savepoint, "{resumed:#}");
    let resumed_job = resumed["status"]["jobStatus"]["jobId"].clone();

    let killed = Instant::now();
    ns.kubectl_ok(&["delete", "pod", "-l", "weir.dev/deployment=counts,weir.dev/component=jobmanager", "--wait=false"]);
    let recovered = wait_status(&ns, &operator, "a new job RUNNING after the JobManager pod was deleted", |r| {
        r["status"]["jobStatus"]["state"] == "RUNNING"
            && r["status"]["jobStatus"]["jobId"] != resumed_job
            && r["status"].get("operation").is_none()
    });
    eprintln!("BENCH JobManager pod deleted (no HA) -> recovered job RUNNING: {:.2} s", killed.elapsed().as_secs_f64());
    // From the resumed job's own newest checkpoint, or (it had none yet: the pod is deleted
    // as soon as the job runs) from the savepoint it resumed from; never from a checkpoint
    // of the job before the suspend, which would write again what the suspend committed
    // (that happened: the status still named that job's last checkpoint).
    let restored = recovered["status"]["jobStatus"]["restoredFrom"].as_str().unwrap_or_default().to_string();
    let resumed_job = resumed_job.as_str().unwrap_or_default();
    assert!(
        restored == savepoint.as_str().unwrap_or_default() || restored.contains(&format!("/{resumed_job}/chk-")),
        "recovered from {restored}, neither the resumed job's checkpoint nor its savepoint {savepoint}\n{}",
        operator.log()
    );
    assert!(operator.log().contains("its JobManager is gone"), "{}", operator.log());
    eprintln!("recovered from {restored}");

    wait_finished_exactly_once(&ns, &operator, &out);
    delete_and_check_nothing_left(&ns, &operator);
}

/// A new image tag is an upgrade (the new pods run it); then a release whose job fails at
/// once is rolled back to the last stable spec, with the reason in the status and an Event;
/// every event counted exactly once across all of it.
#[test]
fn a_new_image_tag_upgrades_and_a_failing_release_is_rolled_back_with_its_reason() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-rb");
    let shared = shared_dir();
    let out = shared.path().join("out");
    let output = out.display().to_string();
    let operator = Operator::start(node, &ns, shared.path(), "operator.log");
    let extra = "    restart-strategy.type: none\n    kubernetes.operator.deployment.rollback.enabled: \"true\"\n    kubernetes.operator.deployment.readiness.timeout: 60s\n";
    let spec =
        |image: &str, output: &str| manifest_with(image, shared.path(), 2, "savepoint", "running", output, extra);

    ns.apply(&spec(&image, &output));
    wait_status(&ns, &operator, "generation 1 STABLE", |r| stable_at(r, 1));

    let (repository, _) = image.rsplit_once(':').unwrap();
    let v2 = node.tag_image(&image, &format!("{repository}:v2"));
    ns.apply(&spec(&v2, &output));
    wait_status(&ns, &operator, "generation 2 (the new image) STABLE", |r| stable_at(r, 2));
    let images = ns.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "weir.dev/deployment=counts,weir.dev/cluster=2",
        "-o",
        "jsonpath={.items[*].spec.containers[0].image}",
    ]);
    assert!(!images.is_empty() && images.split_whitespace().all(|i| i == v2), "cluster 2 runs {v2}: {images}");

    // The job of generation 3 fails on its first record (its sink cannot create its
    // directory); with no restarts it is FAILED, and the operator rolls back to generation 2.
    ns.apply(&spec(&v2, "/proc/weir-cannot-write"));
    let rolled_back = wait_status(&ns, &operator, "ROLLED_BACK with the job RUNNING", |r| {
        r["status"]["lifecycleState"] == "ROLLED_BACK" && r["status"]["jobStatus"]["state"] == "RUNNING"
    });
    let error = rolled_back["status"]["error"].as_str().unwrap_or_default().to_string();
    assert!(error.contains("weir-cannot-write"), "the status says why: {rolled_back:#}");
    let events = ns.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=RollingBack",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(events.contains("rolling back"), "a RollingBack event: {events}");

    wait_finished_exactly_once(&ns, &operator, &out);
    delete_and_check_nothing_left(&ns, &operator);
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

/// Two operators. The leader is frozen (SIGSTOP) in the middle of an upgrade: the standby
/// takes the Lease once it expires and finishes the upgrade; woken, the old leader changes
/// nothing. Then the new leader is killed (SIGKILL) in the middle of the next upgrade, and the
/// old one, now the standby, finishes that. Exactly once throughout, one cluster at a time.
#[test]
fn operators_frozen_or_killed_mid_upgrade_are_replaced_and_change_nothing_afterwards() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-ff");
    let shared = shared_dir();
    let out = shared.path().join("out");
    let output = out.display().to_string();
    let spec = |parallelism: u32| {
        manifest_with(&image, shared.path(), parallelism, "savepoint", "running", &output, "    # long\n")
    };
    let first = Operator::start(node, &ns, shared.path(), "operator-1.log");
    let deadline = Instant::now() + STATE_MAX;
    while !first.log().contains("elected leader") {
        assert!(Instant::now() < deadline, "the first operator never led: {}", first.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut second = Operator::start(node, &ns, shared.path(), "operator-2.log");
    ns.apply(&spec(2));
    let stable = wait_status(&ns, &first, "generation 1 STABLE", |r| stable_at(r, 1));
    let first_job = stable["status"]["jobStatus"]["jobId"].clone();

    // Freeze the leader once the upgrade is under way.
    ns.apply(&spec(3));
    wait_status(&ns, &first, "the upgrade to generation 2 under way", |r| r["status"].get("operation").is_some());
    signal(first.pid(), "STOP");
    let upgraded = wait_status(&ns, &second, "generation 2 STABLE under the standby", |r| {
        stable_at(r, 2) && r["status"]["jobStatus"]["jobId"] != first_job
    });
    assert!(second.log().contains("elected leader"), "{}", second.log());
    signal(first.pid(), "CONT");
    // Woken, the old leader finds its Lease gone: no write, no action. The status and the
    // job stay as the new leader left them.
    std::thread::sleep(Duration::from_secs(5));
    let after = ns.get_json("weirdeployment/counts").unwrap();
    assert_eq!(after["status"]["jobStatus"]["jobId"], upgraded["status"]["jobStatus"]["jobId"], "{after:#}");
    assert!(stable_at(&after, 2), "{after:#}\n{}", first.log());
    let jobmanagers = ns.kubectl_ok(&["get", "deployments", "-l", "weir.dev/component=jobmanager", "-o", "name"]);
    assert_eq!(jobmanagers.lines().count(), 1, "one cluster: {jobmanagers}");

    // Kill the new leader in the middle of the next upgrade: the old one finishes it.
    ns.apply(&spec(4));
    wait_status(&ns, &second, "the upgrade to generation 3 under way", |r| r["status"].get("operation").is_some());
    signal(second.pid(), "KILL");
    let _ = second.terminate_killed();
    wait_status(&ns, &first, "generation 3 STABLE under the first operator again", |r| stable_at(r, 3));
    wait_finished_exactly_once_of(&ns, &first, &out, LONG_EVENTS);
    delete_and_check_nothing_left(&ns, &first);
}

/// The HA store of cluster `seq`: (leader's REST address, leader's id).
fn ha_leader(ns: &Namespace, seq: u64) -> Option<(String, String)> {
    let map = ns.get_json(&format!("configmap/deployment-counts-{seq}-cluster-config-map"))?;
    let store: serde_json::Value = serde_json::from_str(map["data"]["weir-ha.json"].as_str()?).ok()?;
    let key = format!("/weir/deployment-counts-{seq}/leader");
    let leader: serde_json::Value = serde_json::from_str(store["keys"][&key]["value"].as_str()?).ok()?;
    Some((leader["rest_address"].as_str()?.to_string(), leader["id"].as_str()?.to_string()))
}

/// The host PID of the JobManager process whose pod has `ip` (the pods run on this machine).
fn jobmanager_pid(ip: &str) -> Option<u32> {
    let wanted = format!("POD_IP={ip}");
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        let is_jobmanager = cmdline.split(|b| *b == 0).any(|arg| arg == b"jobmanager");
        let in_pod = environ.split(|b| *b == 0).any(|var| var == wanted.as_bytes());
        (is_jobmanager && in_pod).then_some(pid)
    })
}

fn wait_job_running(ns: &Namespace, rest: &str, job: &str) {
    ns.wait_for("the job RUNNING under the new leader", STATE_MAX, || {
        let answer = json_at(&format!("http://{rest}/jobs/{job}"))?;
        (answer["state"] == "RUNNING").then_some(())
    });
}

/// `GET url` as JSON, if it answers 200.
fn json_at(url: &str) -> Option<serde_json::Value> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .new_agent();
    let mut response = agent.get(url).call().ok()?;
    if response.status().as_u16() != 200 {
        return None;
    }
    serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()
}

/// The attempt numbers of the committed part files (`part-<job>-<attempt>-...`).
fn part_attempts(dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().to_string_lossy().to_string();
            name.strip_prefix("part-")?.split('-').nth(1).map(str::to_string)
        })
        .collect()
}

/// `high-availability.type: kubernetes`: two JobManager pods elect their leader in the
/// cluster's ConfigMap; the leader's pod force-deleted (SIGKILL, no goodbye) -> the standby
/// takes the job over from the ConfigMap, RECONCILING -> RUNNING, without restarting a task
/// and without the operator recovering anything; then, the JobManager Deployment scaled to
/// nothing, the operator recovers the job from the newest checkpoint recorded in the
/// ConfigMap; every event counted exactly once; delete leaves nothing (the HA ConfigMap goes
/// too).
#[test]
fn a_highly_available_cluster_keeps_its_job_running_when_the_leader_pod_is_killed() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-ha");
    ns.kubectl_ok(&["apply", "-f", concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes/rbac.yaml")]);
    let shared = shared_dir();
    let out = shared.path().join("out");
    let operator = Operator::start(node, &ns, shared.path(), "operator.log");
    let output = out.display().to_string();
    let ha = "    high-availability.type: kubernetes\n    high-availability.reconcile-timeout: 20s\n    # long\n";
    let manifest = manifest_with(&image, shared.path(), 2, "savepoint", "running", &output, ha);
    ns.apply(&manifest);
    let stable = wait_status(&ns, &operator, "generation 1 STABLE", |r| stable_at(r, 1));
    let job = stable["status"]["jobStatus"]["jobId"].as_str().unwrap_or_default().to_string();
    let seq = stable["status"]["clusterInfo"]["seq"].as_u64().unwrap_or_default();
    let (leader_rest, leader_id) = ns.wait_for("a leader in the HA ConfigMap", STATE_MAX, || ha_leader(&ns, seq));
    // Let it checkpoint and commit some output first.
    ns.wait_for("committed output", STATE_MAX, || (!committed_lines(&out).is_empty()).then_some(()));
    let attempts_before = part_attempts(&out);

    // kill -9 of the leader's process (its container restarts in the same pod): the standby
    // takes over once the lease has not been renewed for its duration.
    let leader_ip = leader_rest.split(':').next().unwrap_or_default().to_string();
    let pid = jobmanager_pid(&leader_ip).unwrap_or_else(|| panic!("no JobManager process with POD_IP={leader_ip}"));
    let killed = Instant::now();
    signal(pid, "KILL");
    let (new_rest, new_id) =
        ns.wait_for("another JobManager leading", STATE_MAX, || ha_leader(&ns, seq).filter(|(_, id)| *id != leader_id));
    let took_over = killed.elapsed();
    wait_job_running(&ns, &new_rest, &job);
    eprintln!(
        "BENCH Kubernetes HA: leader JobManager kill -9 -> new leader {:.2} s, job RUNNING {:.2} s",
        took_over.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );

    // The new leader's pod deleted (SIGTERM, then gone): it hands over at once.
    let new_ip = new_rest.split(':').next().unwrap_or_default().to_string();
    let pods = ns.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "weir.dev/deployment=counts,weir.dev/component=jobmanager",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}",
    ]);
    let leader_pod = pods
        .lines()
        .find_map(|line| line.split_once(' ').filter(|(_, ip)| *ip == new_ip).map(|(pod, _)| pod.to_string()))
        .unwrap_or_else(|| panic!("no JobManager pod at the leader's address {new_ip}: {pods}"));
    let deleted = Instant::now();
    ns.kubectl_ok(&["delete", "pod", &leader_pod, "--wait=false"]);
    let (third_rest, _) =
        ns.wait_for("a third leadership", STATE_MAX, || ha_leader(&ns, seq).filter(|(_, id)| *id != new_id));
    let took_over = deleted.elapsed();
    wait_job_running(&ns, &third_rest, &job);
    eprintln!(
        "BENCH Kubernetes HA: leader JobManager pod deleted -> new leader {:.2} s, job RUNNING {:.2} s",
        took_over.as_secs_f64(),
        deleted.elapsed().as_secs_f64()
    );

    // Through both takeovers no task restarted (checked once the third leader committed
    // output) and the job is the one first submitted: the operator recovered nothing.
    let committed = committed_lines(&out).len();
    ns.wait_for("output committed under the third leader", STATE_MAX, || {
        (committed_lines(&out).len() > committed).then_some(())
    });
    assert_eq!(part_attempts(&out), attempts_before, "a task was restarted (new attempt numbers in the output)");
    let resource = ns.get_json("weirdeployment/counts").unwrap_or_default();
    assert_eq!(resource["status"]["jobStatus"]["jobId"], job.as_str(), "the operator replaced the job: {resource:#}");
    assert!(!operator.log().contains("its JobManager is gone"), "the operator recovered:\n{}", operator.log());

    // The JobManager Deployment scaled to nothing: the cluster is gone, and the operator
    // recovers the deployment (kubernetes.operator.jm-deployment-recovery) from the newest
    // checkpoint the HA ConfigMap recorded, as Flink's operator recovers from HA metadata.
    let scaled = Instant::now();
    ns.kubectl_ok(&["scale", "deployment", &format!("counts-{seq}-jobmanager"), "--replicas=0"]);
    let recovered = wait_status(&ns, &operator, "the job recovered on a new cluster", |r| {
        r["status"]["jobStatus"]["state"] == "RUNNING"
            && r["status"]["jobStatus"]["jobId"] != job.as_str()
            && r["status"].get("operation").is_none()
    });
    eprintln!(
        "BENCH Kubernetes HA: JobManager Deployment scaled to 0 -> recovered job RUNNING {:.2} s",
        scaled.elapsed().as_secs_f64()
    );
    let restored = recovered["status"]["jobStatus"]["restoredFrom"].as_str().unwrap_or_default().to_string();
    assert!(restored.contains(&format!("/{job}/chk-")), "restored from a checkpoint of the first job: {recovered:#}");
    // The recovery was decided on the ConfigMap's pointer; the stop may still have reached
    // a JobManager pod on its way out, whose REST answer names a newer checkpoint (the one
    // restored then). Never an older one.
    let log = operator.log();
    let recorded = log
        .split("recorded in its cluster's HA store: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the operator did not read the HA ConfigMap:\n{log}"));
    let checkpoint_id = |path: &str| path.rsplit("/chk-").next().and_then(|id| id.parse::<u64>().ok());
    assert!(recorded.contains(&format!("/{job}/chk-")), "a pointer of the first job: {recorded}");
    assert!(
        checkpoint_id(&restored) >= checkpoint_id(recorded),
        "restored {restored}, older than the recorded {recorded}:\n{log}"
    );

    wait_finished_exactly_once_of(&ns, &operator, &out, LONG_EVENTS);
    delete_and_check_nothing_left(&ns, &operator);
}

/// The TaskManager pods of a deployment: (name, phase, deleting).
fn taskmanager_pods(ns: &Namespace) -> Vec<(String, String, bool)> {
    let listed = ns.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "weir.dev/deployment=counts,weir.dev/component=taskmanager",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ]);
    listed
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some((parts.next()?.to_string(), parts.next()?.to_string(), parts.next().is_some()))
        })
        .collect()
}

/// `spec.mode: native`: no TaskManager Deployment; the JobManager creates the TaskManager
/// pods its job's slots need (parallelism 4 on 2-slot pods: 2 pods), and replaces one that
/// is deleted (the job restarts from its newest checkpoint); a configuration change in
/// last-state mode moves the job to a new native cluster; every event counted exactly once;
/// delete leaves nothing.
#[test]
fn in_native_mode_the_jobmanager_creates_and_replaces_its_taskmanager_pods() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-native");
    ns.kubectl_ok(&["apply", "-f", concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes/rbac.yaml")]);
    let shared = shared_dir();
    let out = shared.path().join("out");
    let operator = Operator::start(node, &ns, shared.path(), "operator.log");
    let output = out.display().to_string();
    let manifest = manifest_with(&image, shared.path(), 4, "savepoint", "running", &output, "    # long\n")
        .replace("  taskManager:\n    replicas: 2\n", "  mode: native\n  taskManager:\n    replicas: 1\n");
    let applied = Instant::now();
    ns.apply(&manifest);
    wait_status(&ns, &operator, "generation 1 STABLE", |r| stable_at(r, 1));
    eprintln!("BENCH native mode: kubectl apply -> job RUNNING {:.2} s", applied.elapsed().as_secs_f64());
    let deployments = ns.kubectl_ok(&["get", "deployments", "-l", "weir.dev/deployment=counts", "-o", "name"]);
    assert!(!deployments.contains("taskmanager"), "a TaskManager Deployment in native mode: {deployments}");
    let pods = taskmanager_pods(&ns);
    assert_eq!(pods.len(), 2, "parallelism 4 on 2-slot TaskManagers needs 2 pods: {pods:?}");
    assert!(pods.iter().all(|(name, _, _)| name.contains("-taskmanager-")), "{pods:?}");
    ns.wait_for("committed output", STATE_MAX, || (!committed_lines(&out).is_empty()).then_some(()));

    let victim = pods[0].0.clone();
    let deleted = Instant::now();
    ns.kubectl_ok(&["delete", "pod", &victim, "--wait=false"]);
    let before: Vec<String> = pods.iter().map(|(name, _, _)| name.clone()).collect();
    let replacement = ns.wait_for("a replacement TaskManager pod running", STATE_MAX, || {
        taskmanager_pods(&ns)
            .into_iter()
            .find(|(name, phase, deleting)| !before.contains(name) && phase == "Running" && !deleting)
            .map(|(name, _, _)| name)
    });
    eprintln!(
        "BENCH native mode: TaskManager pod deleted -> replacement running {:.2} s ({replacement})",
        deleted.elapsed().as_secs_f64()
    );

    // A configuration change in last-state mode: a new native cluster from the newest
    // checkpoint, its TaskManager pods created by its own JobManager.
    wait_status(&ns, &operator, "RUNNING again after the TaskManager loss", |r| {
        r["status"]["jobStatus"]["state"] == "RUNNING"
    });
    let changed = manifest
        .replace("upgradeMode: savepoint", "upgradeMode: last-state")
        .replace("execution.checkpointing.interval: 1s", "execution.checkpointing.interval: 2s");
    ns.apply(&changed);
    let upgraded = wait_status(&ns, &operator, "generation 2 STABLE", |r| stable_at(r, 2));
    let seq = upgraded["status"]["clusterInfo"]["seq"].as_u64().unwrap_or_default();
    let prefix = format!("counts-{seq}-taskmanager-");
    let pods = taskmanager_pods(&ns);
    assert!(
        pods.iter().filter(|(_, _, deleting)| !deleting).all(|(name, _, _)| name.starts_with(&prefix)),
        "TaskManager pods of another cluster after the upgrade: {pods:?}"
    );

    wait_finished_exactly_once_of(&ns, &operator, &out, LONG_EVENTS);
    delete_and_check_nothing_left(&ns, &operator);
}

/// The operator's pods of `deploy/kubernetes/operator.yaml`, read through `kubectl logs`.
struct OperatorPods<'a> {
    ns: &'a Namespace<'a>,
}

impl OperatorLog for OperatorPods<'_> {
    fn log(&self) -> String {
        let output = self.ns.kubectl(&["logs", "-l", OPERATOR_SELECTOR, "--tail=-1", "--prefix"]);
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    }
}

impl Drop for OperatorPods<'_> {
    fn drop(&mut self) {
        // As for a process operator: a test that failed before deleting its resource leaves
        // a finalizer nobody would remove once the operator's pods go with the namespace. The
        // operator goes first: a running one would put its finalizer back.
        let operator =
            ["delete", "deployment", "weir-operator", "--cascade=foreground", "--wait=true", "--timeout=60s"];
        let _ = self.ns.kubectl_within(&operator, CLEANUP_MAX);
        let _ = self.ns.kubectl_within(&REMOVE_FINALIZER, CLEANUP_MAX);
    }
}

const OPERATOR_SELECTOR: &str = "app.kubernetes.io/name=weir-operator";

/// The operator's running pods: (name, pod IP).
fn operator_pods(ns: &Namespace) -> Vec<(String, String)> {
    let pods: serde_json::Value =
        serde_json::from_str(&ns.kubectl_ok(&["get", "pods", "-l", OPERATOR_SELECTOR, "-o", "json"])).unwrap();
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null() && pod["status"]["phase"] == "Running")
        .filter_map(|pod| {
            Some((pod["metadata"]["name"].as_str()?.to_string(), pod["status"]["podIP"].as_str()?.to_string()))
        })
        .collect()
}

/// The pod whose operator holds the Lease (its identity is `<pod name>-<pid>`).
fn operator_leader(ns: &Namespace) -> Option<String> {
    let lease = ns.get_json("lease/weir-operator")?;
    let holder = lease["spec"]["holderIdentity"].as_str()?;
    operator_pods(ns).into_iter().map(|(name, _)| name).find(|name| holder.starts_with(&format!("{name}-")))
}

/// The shipped RBAC and operator manifests as they are (only the image, the node's API
/// server address, which the test node has no kube-proxy to route, and the shared directory
/// changed): two operator pods, one leading; `GET /deployments` from each; apply -> RUNNING;
/// the leading pod deleted (SIGTERM as PID 1: it releases the Lease) in the middle of the job,
/// and an upgrade 2 -> 4 done by the pod that took over; exactly once; delete leaves nothing.
#[test]
fn the_shipped_operator_manifests_run_the_operator_in_pods_that_hand_over_on_deletion() {
    let node = KubernetesNode::get();
    install_crd(node);
    let image = node.weir_image();
    let ns = node.namespace("op-pods");
    let shared = shared_dir();
    let out = shared.path().join("out");
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    ns.kubectl_ok(&["apply", "-f", &format!("{repo}/deploy/kubernetes/rbac.yaml")]);

    let kubeconfig = std::fs::read_to_string(node.kubeconfig()).unwrap();
    let server = kubeconfig.split("server: \"https://").nth(1).and_then(|rest| rest.split('"').next()).unwrap();
    let (api_host, api_port) = server.rsplit_once(':').unwrap();
    let shipped = std::fs::read_to_string(format!("{repo}/deploy/kubernetes/operator.yaml")).unwrap();
    let mut operator_manifest = shipped.clone();
    for (from, to) in [
        ("image: weir.local/weir:dev".to_string(), format!("image: {image}")),
        ("imagePullPolicy: IfNotPresent".to_string(), "imagePullPolicy: Never".to_string()),
        (
            "# - {name: KUBERNETES_SERVICE_HOST, value: 10.244.0.1}".to_string(),
            format!("- {{name: KUBERNETES_SERVICE_HOST, value: \"{api_host}\"}}"),
        ),
        (
            "# - {name: KUBERNETES_SERVICE_PORT, value: \"6443\"}".to_string(),
            format!("- {{name: KUBERNETES_SERVICE_PORT, value: \"{api_port}\"}}"),
        ),
        ("/var/lib/weir".to_string(), shared.path().display().to_string()),
    ] {
        assert!(
            operator_manifest.contains(&from),
            "deploy/kubernetes/operator.yaml no longer has `{from}`: update this test"
        );
        operator_manifest = operator_manifest.replace(&from, &to);
    }
    ns.apply(&operator_manifest);
    let operator = OperatorPods { ns: &ns };
    let leader = ns.wait_for("two operator pods, one of them leading", STATE_MAX, || {
        (operator_pods(&ns).len() == 2).then_some(())?;
        operator_leader(&ns)
    });

    ns.apply(&manifest(&image, shared.path(), 2, "savepoint"));
    wait_status(&ns, &operator, "generation 1 STABLE", |r| stable_at(r, 1));
    // Every replica serves the deployments, the standby too.
    for (name, ip) in operator_pods(&ns) {
        let listed = ns.wait_for(&format!("GET /deployments from operator pod {name}"), STATE_MAX, || {
            json_at(&format!("http://{ip}:8085/deployments"))
        });
        let names: Vec<_> =
            listed["deployments"].as_array().into_iter().flatten().map(|d| d["metadata"]["name"].clone()).collect();
        assert_eq!(names, vec![serde_json::json!("counts")], "{name}: {listed:#}");
    }

    // The leading pod deleted: its operator stops on SIGTERM and releases the Lease, and the
    // other pod (or the Deployment's replacement) leads and carries out the upgrade.
    let started = Instant::now();
    ns.kubectl_ok(&["delete", "pod", &leader, "--wait=false"]);
    let successor =
        ns.wait_for("another operator pod to lead", STATE_MAX, || operator_leader(&ns).filter(|name| *name != leader));
    eprintln!("operator pod {leader} deleted -> {successor} leads in {:.2} s", started.elapsed().as_secs_f64());
    ns.apply(&manifest(&image, shared.path(), 4, "savepoint"));
    let upgraded = wait_status(&ns, &operator, "generation 2 STABLE at parallelism 4", |r| stable_at(r, 2));
    let history = upgraded["status"]["savepointHistory"].as_array().cloned().unwrap_or_default();
    let upgrade_savepoint = history.iter().rev().find(|s| s["triggerType"] == "UPGRADE");
    assert!(
        upgrade_savepoint.is_some_and(|s| s["location"] == upgraded["status"]["jobStatus"]["restoredFrom"]),
        "the new leader upgraded through a savepoint: {upgraded:#}"
    );

    wait_finished_exactly_once(&ns, &operator, &out);
    delete_and_check_nothing_left(&ns, &operator);
}
