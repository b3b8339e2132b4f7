//! Native TaskManagers: a JobManager in a pod creates the TaskManager pods its jobs' slots
//! need and replaces one that dies, as Flink's Kubernetes resource manager does
//! (`kubernetes.pod-template-file.taskmanager` names the pod to create; the operator writes
//! it for `spec.mode: native`).
//!
//! Every half second it compares the pods carrying the template's labels with the slots the
//! jobs use or wait for: ended pods are deleted, missing ones created (named
//! `<generateName><random>`), and when no job needs a slot for
//! `resourcemanager.taskmanager-timeout` the idle pods are deleted.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::client::{Kube, is_not_found};

/// How often the pods are compared with the demand.
const RECONCILE_INTERVAL: Duration = Duration::from_millis(500);

/// What the pool keeps.
pub struct PoolSettings {
    /// The pod to create (a whole `Pod`, with labels, `generateName` and a `weir` container).
    pub template: Value,
    /// The JobManager's RPC address the TaskManagers connect to (`host:port`); `None` with
    /// high availability, where they find the leader themselves.
    pub jobmanager: Option<String>,
    /// Slots of each TaskManager.
    pub slots_per_pod: u32,
    /// Idle pods go after this long without demand.
    pub idle_timeout: Duration,
}

/// A running pool; dropped or [`TaskManagerPods::stop`]ped, it stops acting (its pods stay
/// for the next leader, or go with the cluster).
pub struct TaskManagerPods {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Reads the pod template file: a Pod as JSON or YAML.
pub fn read_template(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read kubernetes.pod-template-file.taskmanager {}: {e}", path.display()))?;
    let template: Value = serde_norway::from_str(&text).map_err(|e| {
        format!("kubernetes.pod-template-file.taskmanager {} is not a Pod in YAML or JSON: {e}", path.display())
    })?;
    labels(&template).ok_or_else(|| {
        format!(
            "kubernetes.pod-template-file.taskmanager {}: the pod needs metadata.labels (they find its TaskManagers again)",
            path.display()
        )
    })?;
    Ok(template)
}

fn labels(template: &Value) -> Option<BTreeMap<String, String>> {
    let labels: BTreeMap<String, String> = serde_json::from_value(template["metadata"]["labels"].clone()).ok()?;
    (!labels.is_empty()).then_some(labels)
}

/// The template with the JobManager's address added to the `weir` container's arguments.
fn pod_to_create(settings: &PoolSettings) -> Value {
    let mut pod = settings.template.clone();
    if let Some(address) = &settings.jobmanager
        && let Some(containers) = pod["spec"]["containers"].as_array_mut()
        && let Some(container) = containers.iter_mut().find(|c| c["name"] == "weir")
    {
        let (host, port) = address.rsplit_once(':').unwrap_or((address.as_str(), "6123"));
        if let Some(args) = container["args"].as_array_mut() {
            for arg in ["-D".to_string(), format!("jobmanager.rpc.address={host}")] {
                args.push(json!(arg));
            }
            for arg in ["-D".to_string(), format!("jobmanager.rpc.port={port}")] {
                args.push(json!(arg));
            }
        }
    }
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod
}

fn ended(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed" | "Succeeded"))
}

/// How many pods `slots` slots need.
fn pods_for(slots: u32, slots_per_pod: u32) -> usize {
    slots.div_ceil(slots_per_pod.max(1)) as usize
}

impl TaskManagerPods {
    /// Starts keeping pods for `demand()` slots in `kube`'s namespace.
    pub fn start(
        kube: Arc<Kube>,
        settings: PoolSettings,
        demand: impl Fn() -> u32 + Send + 'static,
    ) -> Result<TaskManagerPods, String> {
        let selector = labels(&settings.template)
            .ok_or("the TaskManager pod template has no labels")?
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("weir-taskmanager-pods".into())
            .spawn(move || {
                let mut idle_since: Option<Instant> = None;
                while !stopping.load(Ordering::SeqCst) {
                    if let Err(error) = reconcile(&kube, &settings, &selector, demand(), &mut idle_since) {
                        tracing::warn!(%error, "cannot keep the TaskManager pods; retrying");
                    }
                    std::thread::sleep(RECONCILE_INTERVAL);
                }
            })
            .map_err(|e| format!("cannot start the TaskManager pod pool: {e}"))?;
        Ok(TaskManagerPods { stop, thread: Some(thread) })
    }

    /// Stops acting (the pods stay).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TaskManagerPods {
    fn drop(&mut self) {
        self.halt();
    }
}

fn reconcile(
    kube: &Kube,
    settings: &PoolSettings,
    selector: &str,
    demand: u32,
    idle_since: &mut Option<Instant>,
) -> Result<(), String> {
    let api = kube.api::<Pod>();
    let pods = kube
        .block_on(api.list(&ListParams::default().labels(selector)))
        .map_err(|e| format!("cannot list the TaskManager pods ({selector}): {e}"))?
        .items;
    let mut alive = Vec::new();
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if ended(pod) {
            // Its replacement is created below, as the demand says.
            tracing::info!(pod = %name, "a TaskManager pod ended; deleting it");
            match kube.block_on(api.delete(&name, &DeleteParams::default())) {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(format!("cannot delete the ended TaskManager pod {name}: {error}")),
            }
            continue;
        }
        alive.push(name);
    }
    let needed = pods_for(demand, settings.slots_per_pod);
    if needed > alive.len() {
        *idle_since = None;
        let missing = needed - alive.len();
        tracing::info!(
            slots = demand,
            pods = needed,
            creating = missing,
            "creating TaskManager pods for the jobs' slots"
        );
        let pod: Pod = serde_json::from_value(pod_to_create(settings))
            .map_err(|e| format!("the TaskManager pod template is not a Pod: {e}"))?;
        for _ in 0..missing {
            kube.block_on(api.create(&PostParams::default(), &pod))
                .map_err(|e| format!("cannot create a TaskManager pod: {e}"))?;
        }
        return Ok(());
    }
    if demand > 0 || alive.is_empty() {
        *idle_since = None;
        return Ok(());
    }
    let since = *idle_since.get_or_insert_with(Instant::now);
    if since.elapsed() >= settings.idle_timeout {
        tracing::info!(pods = alive.len(), "no job needs a slot: deleting the idle TaskManager pods");
        for name in &alive {
            match kube.block_on(api.delete(name, &DeleteParams::default())) {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(format!("cannot delete the idle TaskManager pod {name}: {error}")),
            }
        }
        *idle_since = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_up_to_whole_pods() {
        assert_eq!((pods_for(0, 2), pods_for(1, 2), pods_for(4, 2), pods_for(5, 2)), (0, 1, 2, 3));
    }

    #[test]
    fn created_pods_name_the_jobmanager_unless_it_is_found_through_ha() {
        let template = json!({
            "metadata": {"generateName": "counts-1-taskmanager-", "labels": {"weir.dev/component": "taskmanager"}},
            "spec": {"containers": [{"name": "weir", "args": ["taskmanager", "-c", "/opt/weir/conf/config.yaml"]}]},
        });
        let settings = PoolSettings {
            template: template.clone(),
            jobmanager: Some("10.0.0.7:6123".into()),
            slots_per_pod: 2,
            idle_timeout: Duration::from_secs(30),
        };
        let pod = pod_to_create(&settings);
        assert_eq!(
            pod["spec"]["containers"][0]["args"],
            json!([
                "taskmanager",
                "-c",
                "/opt/weir/conf/config.yaml",
                "-D",
                "jobmanager.rpc.address=10.0.0.7",
                "-D",
                "jobmanager.rpc.port=6123"
            ])
        );
        assert_eq!(pod["kind"], "Pod");
        let settings = PoolSettings { jobmanager: None, ..settings };
        assert_eq!(pod_to_create(&settings)["spec"]["containers"][0]["args"].as_array().map(Vec::len), Some(3));
    }
}
