//! A real single-node Kubernetes for tests that run weir in pods: Kubernetes v1.20.2
//! (kube-apiserver, controller-manager, scheduler, kubelet) built from Debian's source
//! package, containerd and runc, the CNI bridge `k8sbr0` whose address 10.244.0.1 is the node
//! IP. The test process reaches every pod IP directly over that bridge; there is no cluster
//! DNS. See docs/kubernetes.md ("The test node") and `.ci/k8s/`.
//!
//! Include it with `#[path = "common/kubernetes.rs"] mod kubernetes;`.
//!
//! **The node.** [`KubernetesNode::get`] is process-wide. When the node is already up (as it
//! is under `.ci/test`, which starts it before `cargo test` and stops it after, once for all
//! test binaries) the tests use it and leave it running. When it is not, the harness starts it
//! with `.ci/k8s/up` and stops it with `.ci/k8s/down` when the test process exits (an
//! `atexit` handler; `WEIR_K8S_KEEP_NODE=1` keeps it up for a look afterwards, a process
//! killed by a signal leaves it up: `.ci/k8s/down` by hand). When the node cannot be had (not
//! root, `.ci/k8s/setup` never run, `up` failing) every test using it fails and says how to
//! get one: a Kubernetes test never passes having tested nothing.
//!
//! **Images.** [`KubernetesNode::weir_image`] packs the very `weir` binary the test runs
//! (debug or release, as cargo built it) into an image with `deploy/image/build-archive.sh`
//! and imports it into the node's containerd, once per binary (keyed by the binary's path,
//! size and modification time; the archive is kept in the cache directory, the three newest
//! only). Pods use it with `imagePullPolicy: Never`.
//!
//! **Namespaces.** [`KubernetesNode::namespace`] makes a namespace of the test's own; dropping
//! it deletes the namespace with everything in it (pods get their grace period), waits until
//! it is gone and no container of it runs any more, and fails the test when something stays.
//!
//! Every wait has a limit and, when it runs out, panics saying what it waited for, with
//! `kubectl describe`, the pods' logs and the namespace's events.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How to get a node when there is none.
pub const SETUP_HINT: &str = "run `.ci/k8s/setup` as root once (it installs containerd, etcd and Go from Debian and \
     builds Kubernetes v1.20.2 from Debian's source package: about 9 CPU-minutes, cached in \
     ~/.cache/weir-k8s), or run the tests with `.ci/test`, which does and starts the node";

/// Longest `.ci/k8s/up` may take (node Ready takes about 16 s; more on a loaded machine).
const UP_MAX: Duration = Duration::from_secs(300);
/// Longest one kubectl call may take.
const KUBECTL_MAX: Duration = Duration::from_secs(60);
/// Longest packing and importing an image may take.
const IMAGE_MAX: Duration = Duration::from_secs(300);
/// Longest a namespace takes to be deleted with its pods (their grace period is 30 s).
const NAMESPACE_DELETE_MAX: Duration = Duration::from_secs(120);
/// How many weir image archives the cache keeps.
const ARCHIVES_KEPT: usize = 3;

/// The repository's root (the harness calls its scripts).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository's root")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `command` to its end with `stdin` as its input, killing it after `limit`; its output,
/// or why it did not end.
pub fn run_bounded(command: &mut Command, stdin: Option<&[u8]>, limit: Duration) -> Result<Output, String> {
    let mut child = command
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let _ = pipe.write_all(input);
    }
    // Read both pipes on threads, so a chatty child never blocks on a full pipe.
    let reader = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = reader(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let stderr = reader(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).to_string();
                return Err(format!("{command:?} did not end within {limit:?}; stderr: {err}"));
            }
            Err(e) => return Err(format!("waiting for {command:?}: {e}")),
        }
    };
    Ok(Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() })
}

/// FNV-1a, 64 bits: a key that is the same in every process (for the image cache).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// Polls `condition` every 200 ms until it gives a value or `timeout` runs out; then panics
/// saying it waited for `what`, with `diagnostics()` (called only then).
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> Option<T>,
    diagnostics: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = condition() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}\n{}", diagnostics());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The running node; see the module documentation.
pub struct KubernetesNode {
    repo: PathBuf,
    pub cache: PathBuf,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    kubectl_cache: PathBuf,
    containerd_sock: PathBuf,
    images_dir: PathBuf,
    /// The node IP: the bridge's address, where the apiserver listens and pods' gateway.
    pub node_ip: String,
    pub node_name: String,
    /// Whether this process started the node (and so stops it at exit).
    pub started_here: bool,
    /// Images imported by this process: binary path -> image name.
    images: Mutex<HashMap<PathBuf, String>>,
}

static NODE: OnceLock<Result<KubernetesNode, String>> = OnceLock::new();
/// The repository root for the exit handler (which cannot capture anything).
static STOP_SCRIPT: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn stop_node_at_exit() {
    let Some(script) = STOP_SCRIPT.get() else { return };
    eprintln!("kubernetes harness: stopping the node this test process started ({})", script.display());
    let started = Instant::now();
    match run_bounded(&mut Command::new(script), None, Duration::from_secs(180)) {
        Ok(output) => {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
            eprintln!(
                "kubernetes harness: node stopped in {:.1} s ({})",
                started.elapsed().as_secs_f64(),
                output.status
            );
        }
        Err(e) => eprintln!("kubernetes harness: .ci/k8s/down failed: {e}"),
    }
}

impl KubernetesNode {
    /// The node, started if it is not running; panics, saying how to get one, when there is
    /// none to be had.
    pub fn get() -> &'static KubernetesNode {
        match NODE.get_or_init(KubernetesNode::bring_up) {
            Ok(node) => node,
            Err(e) => panic!("no Kubernetes node for this test: {e}"),
        }
    }

    fn bring_up() -> Result<KubernetesNode, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(format!("the test node needs root (bridges, mounts, containers); {SETUP_HINT}"));
        }
        let repo = repo();
        let env = run_bounded(&mut Command::new(repo.join(".ci/k8s/env")), None, KUBECTL_MAX)?;
        if !env.status.success() {
            return Err(format!(".ci/k8s/env failed: {}", String::from_utf8_lossy(&env.stderr)));
        }
        let settings: HashMap<String, String> = String::from_utf8_lossy(&env.stdout)
            .lines()
            .filter_map(|line| line.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        let setting = |key: &str| settings.get(key).cloned().ok_or_else(|| format!(".ci/k8s/env printed no {key}"));
        let cache = PathBuf::from(setting("WEIR_K8S_CACHE")?);
        if setting("WEIR_K8S_SET_UP")? != "1" {
            return Err(format!("the test node is not set up in {}: {SETUP_HINT}", cache.display()));
        }
        let mut node = KubernetesNode {
            repo: repo.clone(),
            cache,
            kubectl: PathBuf::from(setting("KUBECTL")?),
            kubeconfig: PathBuf::from(setting("KUBECONFIG")?),
            kubectl_cache: PathBuf::from(setting("KUBECTL_CACHE")?),
            containerd_sock: PathBuf::from(setting("CONTAINERD_SOCK")?),
            images_dir: PathBuf::from(setting("K8S_IMAGES")?),
            node_ip: setting("K8S_NODE_IP")?,
            node_name: setting("K8S_NODE_NAME")?,
            started_here: false,
            images: Mutex::new(HashMap::new()),
        };
        if node.ready() {
            eprintln!("kubernetes harness: using the running node (started outside this test process)");
            return Ok(node);
        }
        let started = Instant::now();
        let up = run_bounded(&mut Command::new(repo.join(".ci/k8s/up")), None, UP_MAX)?;
        let up_output = String::from_utf8_lossy(&up.stderr).to_string();
        if !up.status.success() {
            // Every test that asks for the node shows this, so keep it to the end of it.
            let lines: Vec<&str> = up_output.lines().collect();
            let tail = lines[lines.len().saturating_sub(60)..].join("\n");
            return Err(format!(".ci/k8s/up failed ({}):\n{tail}", up.status));
        }
        eprint!("{up_output}");
        eprintln!("kubernetes harness: node up in {:.1} s", started.elapsed().as_secs_f64());
        node.started_here = true;
        if std::env::var_os("WEIR_K8S_KEEP_NODE").is_none_or(|v| v != "1") {
            let _ = STOP_SCRIPT.set(repo.join(".ci/k8s/down"));
            // SAFETY: registers a plain function without arguments; it runs at exit.
            unsafe { libc::atexit(stop_node_at_exit) };
        }
        if !node.ready() {
            return Err(".ci/k8s/up succeeded but the node is not Ready".to_string());
        }
        Ok(node)
    }

    /// True when the apiserver answers and the node is Ready.
    pub fn ready(&self) -> bool {
        let ready = |args: &[&str]| self.kubectl(args).status.success();
        ready(&["get", "--raw", "/readyz"])
            && ready(&["wait", "--for=condition=Ready", &format!("node/{}", self.node_name), "--timeout=1s"])
    }

    /// The admin kubeconfig (for a weir process that talks to the apiserver itself).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `kubectl args...` with the admin kubeconfig, bounded in time.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with_input(args, None)
    }

    /// As [`kubectl`](Self::kubectl), with `input` on its stdin (`apply -f -`).
    pub fn kubectl_with_input(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        self.kubectl_within(args, input, KUBECTL_MAX).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// `kubectl args...` ended after `limit`, as an error rather than a panic: for cleanup
    /// in `Drop`, where a panic while a failed test unwinds aborts the test process and
    /// leaves everything running.
    pub fn kubectl_within(&self, args: &[&str], input: Option<&[u8]>, limit: Duration) -> Result<Output, String> {
        let mut command = Command::new(&self.kubectl);
        command
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.kubectl_cache.display()))
            .args(args);
        run_bounded(&mut command, input, limit)
    }

    /// `kubectl args...`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {args:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).to_string()
    }

    fn ctr(&self, args: &[&str]) -> Output {
        let mut command = Command::new("ctr");
        command.arg("-a").arg(&self.containerd_sock).args(["-n", "k8s.io"]).args(args);
        run_bounded(&mut command, None, IMAGE_MAX).unwrap_or_else(|e| panic!("ctr {args:?}: {e}"))
    }

    fn image_present(&self, name: &str) -> bool {
        let output = self.ctr(&["images", "ls", "-q", &format!("name=={name}")]);
        output.status.success() && String::from_utf8_lossy(&output.stdout).lines().any(|l| l.trim() == name)
    }

    /// The image of the `weir` binary this test runs, imported into the node; its name.
    pub fn weir_image(&self) -> String {
        self.image_of(Path::new(env!("CARGO_BIN_EXE_weir")))
    }

    /// The image of `binary` (a weir binary), imported into the node; its name,
    /// `weir.local/weir:test-<key>`, with a key of the binary's path, size and mtime.
    pub fn image_of(&self, binary: &Path) -> String {
        let mut images = lock(&self.images);
        if let Some(name) = images.get(binary) {
            return name.clone();
        }
        let metadata = std::fs::metadata(binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let modified = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let key = format!("{:016x}", fnv1a(format!("{}\0{}\0{modified}", binary.display(), metadata.len()).as_bytes()));
        let name = format!("weir.local/weir:test-{key}");
        let archive = self.images_dir.join(format!("weir-test-{key}.tar"));
        let started = Instant::now();
        if !archive.is_file() {
            std::fs::create_dir_all(&self.images_dir).expect("the cache's image directory");
            let mut command = Command::new(self.repo.join("deploy/image/build-archive.sh"));
            command.arg(binary).arg(&archive).arg(&name);
            let output = run_bounded(&mut command, None, IMAGE_MAX).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                output.status.success(),
                "deploy/image/build-archive.sh failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            self.prune_archives();
        }
        let packed = started.elapsed();
        if !self.image_present(&name) {
            let mut command = Command::new(self.repo.join(".ci/k8s/import-image"));
            command.arg(&archive);
            let output = run_bounded(&mut command, None, IMAGE_MAX).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                output.status.success(),
                ".ci/k8s/import-image failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(self.image_present(&name), "{name} is not in containerd after importing {}", archive.display());
        }
        eprintln!(
            "kubernetes harness: image {name} of {} (packed in {:.1} s, ready in {:.1} s)",
            binary.display(),
            packed.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        images.insert(binary.to_path_buf(), name.clone());
        name
    }

    /// Tags the imported image `source` as `target` too (e.g. `weir.local/weir:v2`, for an
    /// upgrade that changes the image's tag); returns `target`.
    pub fn tag_image(&self, source: &str, target: &str) -> String {
        let output = self.ctr(&["images", "tag", "--force", source, target]);
        assert!(
            output.status.success(),
            "ctr images tag {source} {target}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        target.to_string()
    }

    /// Deletes all but the newest weir test image archives.
    fn prune_archives(&self) {
        let Ok(entries) = std::fs::read_dir(&self.images_dir) else { return };
        let mut archives: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                (name.starts_with("weir-test-") && name.ends_with(".tar"))
                    .then(|| Some((e.metadata().ok()?.modified().ok()?, e.path())))?
            })
            .collect();
        archives.sort();
        let excess = archives.len().saturating_sub(ARCHIVES_KEPT);
        for (_, path) in archives.into_iter().take(excess) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// A namespace of this test's own, `wt-<prefix>-<pid>-<n>`; see [`Namespace`].
    pub fn namespace(&self, prefix: &str) -> Namespace<'_> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!("wt-{prefix}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        assert!(name.len() <= 63, "namespace name {name} is too long: use a shorter prefix");
        self.kubectl_ok(&["create", "namespace", &name]);
        self.kubectl_ok(&["label", "namespace", &name, "weir-test=true"]);
        let namespace = Namespace { node: self, name };
        // Pods are refused until the service-account controller made the default account.
        namespace.wait_for("the namespace's default ServiceAccount", Duration::from_secs(60), || {
            namespace.kubectl(&["get", "serviceaccount", "default"]).status.success().then_some(())
        });
        namespace
    }

    /// Containers of pods of `namespace` that still run (containerd's view).
    fn running_containers_of(&self, namespace: &str) -> Vec<String> {
        let filter = format!("labels.\"io.kubernetes.pod.namespace\"=={namespace}");
        let containers = self.ctr(&["containers", "ls", "-q", &filter]);
        let containers = String::from_utf8_lossy(&containers.stdout).to_string();
        let tasks = self.ctr(&["tasks", "ls"]);
        let tasks = String::from_utf8_lossy(&tasks.stdout).to_string();
        tasks
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (id, status) = (fields.next()?, fields.nth(1)?);
                (status == "RUNNING" && containers.lines().any(|c| c.trim() == id)).then(|| id.to_string())
            })
            .collect()
    }
}

/// A namespace of one test. Dropping it deletes it with all it holds and checks nothing of it
/// stays (no object, no running container).
pub struct Namespace<'a> {
    pub node: &'a KubernetesNode,
    pub name: String,
}

impl Namespace<'_> {
    /// `kubectl -n <namespace> args...`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        self.node.kubectl(&all)
    }

    /// `kubectl -n <namespace> args...` bounded by `limit`, as an error rather than a panic
    /// (for cleanup in `Drop`: see [`KubernetesNode::kubectl_within`]).
    pub fn kubectl_within(&self, args: &[&str], limit: Duration) -> Result<Output, String> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        self.node.kubectl_within(&all, None, limit)
    }

    /// `kubectl -n <namespace> args...`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        self.node.kubectl_ok(&all)
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON) in this namespace.
    pub fn apply(&self, manifest: &str) {
        let output = self.node.kubectl_with_input(&["-n", &self.name, "apply", "-f", "-"], Some(manifest.as_bytes()));
        assert!(
            output.status.success(),
            "kubectl apply failed: {}\nmanifest:\n{manifest}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The object `kind/name` as JSON, if it exists.
    pub fn get_json(&self, object: &str) -> Option<serde_json::Value> {
        let output = self.kubectl(&["get", object, "-o", "json"]);
        if !output.status.success() {
            return None;
        }
        serde_json::from_slice(&output.stdout).ok()
    }

    /// As [`wait_for`], with this namespace's pods and events as the diagnostics.
    pub fn wait_for<T>(&self, what: &str, timeout: Duration, condition: impl FnMut() -> Option<T>) -> T {
        wait_for(&format!("{what} (namespace {})", self.name), timeout, condition, || self.diagnostics())
    }

    /// Waits until pod `name` is Running with every container ready; the pod's JSON.
    pub fn wait_pod_ready(&self, name: &str, timeout: Duration) -> serde_json::Value {
        self.wait_for(&format!("pod {name} to be Running and ready"), timeout, || {
            let pod = self.get_json(&format!("pod/{name}"))?;
            if pod["status"]["phase"] == "Failed" || pod["status"]["phase"] == "Succeeded" {
                panic!(
                    "pod {name} ended ({}) while waiting for it to be ready\n{}",
                    pod["status"]["phase"],
                    self.diagnostics()
                );
            }
            let ready = pod["status"]["phase"] == "Running"
                && pod["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["ready"] == true));
            ready.then_some(pod)
        })
    }

    /// The IP of pod `name` (it must have one).
    pub fn pod_ip(&self, name: &str) -> String {
        let pod = self.get_json(&format!("pod/{name}")).unwrap_or_else(|| panic!("no pod {name}"));
        pod["status"]["podIP"].as_str().unwrap_or_else(|| panic!("pod {name} has no IP yet")).to_string()
    }

    /// The log of pod `name`'s containers.
    pub fn logs(&self, name: &str) -> String {
        let output = self.kubectl(&["logs", name, "--all-containers"]);
        String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr)
    }

    /// `kubectl describe pods`, each pod's last 60 log lines (and its previous container's) and
    /// the namespace's events, for failure messages. The text is also kept in
    /// `<cache>/logs/failures/<namespace>.txt`, named first: CI shows only the beginning and the
    /// end of a long failure, and its node's logs stay on the machine.
    pub fn diagnostics(&self) -> String {
        let text = self.collect_diagnostics();
        let dir = self.node.cache.join("logs/failures");
        let path = dir.join(format!("{}.txt", self.name));
        match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &text)) {
            Ok(()) => format!("(the pods' logs, descriptions and events are kept in {})\n{text}", path.display()),
            Err(error) => format!("(could not keep them in {}: {error})\n{text}", path.display()),
        }
    }

    fn collect_diagnostics(&self) -> String {
        let text = |output: Output| {
            String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr)
        };
        let mut out = format!("== kubectl -n {} describe pods\n", self.name);
        out += &text(self.kubectl(&["describe", "pods"]));
        let pods = text(self.kubectl(&["get", "pods", "-o", "name"]));
        for pod in pods.lines().filter(|l| l.starts_with("pod/")) {
            out += &format!("== kubectl logs {pod} --tail=60\n");
            out += &text(self.kubectl(&["logs", pod, "--all-containers", "--tail=60"]));
            let previous = self.kubectl(&["logs", pod, "--all-containers", "--tail=60", "--previous"]);
            if previous.status.success() {
                out += &format!("== kubectl logs {pod} --previous\n{}", text(previous));
            }
        }
        out += "== events\n";
        out += &text(self.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]));
        out
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let started = Instant::now();
        // The workloads first, waiting until their pods are gone: the namespace controller
        // would otherwise requeue the namespace for the pods' remaining grace period (up to
        // 30 s) even when they end at once.
        let mut left = Vec::new();
        // kubectl's own --timeout ends these; the bound above it only catches a hung kubectl.
        let timeout = format!("--timeout={}s", NAMESPACE_DELETE_MAX.as_secs());
        let bound = NAMESPACE_DELETE_MAX + Duration::from_secs(30);
        match self.kubectl_within(&["delete", "all", "--all", "--wait=true", &timeout], bound) {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                left.push(format!("kubectl delete all --all failed: {}", String::from_utf8_lossy(&output.stderr)))
            }
            Err(error) => left.push(format!("kubectl delete all --all: {error}")),
        }
        match self.node.kubectl_within(&["delete", "namespace", &self.name, "--wait=true", &timeout], None, bound) {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                left.push(format!("kubectl delete namespace failed: {}", String::from_utf8_lossy(&output.stderr)))
            }
            Err(error) => left.push(format!("kubectl delete namespace: {error}")),
        }
        let exists = || {
            self.node
                .kubectl_within(&["get", "namespace", &self.name], None, KUBECTL_MAX)
                .is_ok_and(|output| output.status.success())
        };
        let deadline = Instant::now() + NAMESPACE_DELETE_MAX;
        while exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        if exists() {
            left.push(format!("namespace {} still exists", self.name));
        }
        // A pod object is gone once the kubelet stopped its containers; give containerd's
        // view a moment to agree.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut running = self.node.running_containers_of(&self.name);
        while !running.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            running = self.node.running_containers_of(&self.name);
        }
        if !running.is_empty() {
            left.push(format!("containers still running: {running:?}"));
        }
        eprintln!("kubernetes harness: namespace {} deleted in {:.1} s", self.name, started.elapsed().as_secs_f64());
        if !left.is_empty() {
            let message = format!("namespace {} left something behind: {}", self.name, left.join("; "));
            if std::thread::panicking() {
                eprintln!("{message}");
            } else {
                panic!("{message}");
            }
        }
    }
}
