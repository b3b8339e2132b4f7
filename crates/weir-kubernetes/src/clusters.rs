//! A deployment's clusters as Kubernetes objects ([`ClusterBackend`]): cluster `seq` of
//! deployment `name` is a ConfigMap with its configuration (`<name>-<seq>-config`), a
//! JobManager Deployment (`<name>-<seq>-jobmanager`), a REST Service
//! (`<name>-<seq>-rest`) and a TaskManager Deployment (`<name>-<seq>-taskmanager`), all
//! labelled `weir.dev/deployment` and `weir.dev/cluster` and owned by the `WeirDeployment`
//! (deleting it deletes them). Pods advertise their pod IPs; TaskManagers are given the
//! JobManager pod's IP (no cluster DNS is assumed). The pre-flight and the submission run
//! the target's binary in a short-lived pod of the target's image, so a new image is
//! checked by its own code before the old job stops.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, EventSource, ObjectReference, Pod, Service};
use kube::api::{AttachParams, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::{Value, json};
use weir_deploy::backend::ClusterBackend;
use weir_deploy::processes::{self, DeploymentDirs, Ports};
use weir_deploy::spec::{DeploymentSpec, KubernetesMode, Resource};
use weir_deploy::status::ClusterInfo;

use crate::client::{Kube, is_not_found};
use crate::resource::WeirDeployment;

/// The label every object of a deployment's clusters carries, valued with its name.
pub const DEPLOYMENT_LABEL: &str = "weir.dev/deployment";

/// The REST port of JobManager pods.
pub const REST_PORT: u16 = 8081;
/// The RPC port of JobManager pods.
pub const RPC_PORT: u16 = 6123;
/// Where the configuration is mounted in every pod.
const CONF_DIR: &str = "/opt/weir/conf";
/// The service account of a cluster's pods with Kubernetes HA or native TaskManagers when the
/// spec names none (deploy/kubernetes/rbac.yaml): it may read and write ConfigMaps and pods.
pub const HA_SERVICE_ACCOUNT: &str = "weir";
/// The file of the cluster's ConfigMap holding the native TaskManager pod.
const TASKMANAGER_POD_FILE: &str = "taskmanager-pod.yaml";
/// The container the operator fills in (a pod template may already name it).
const CONTAINER: &str = "weir";
/// The field manager of the operator's writes.
const MANAGER: &str = "weir-operator";
/// Longest wait for a JobManager pod to run, and for a cluster's pods to be gone.
const POD_WAIT_MAX: Duration = Duration::from_secs(180);
/// Longest wait for a pre-flight or submission pod to end.
const RUNNER_WAIT_MAX: Duration = Duration::from_secs(180);
/// Longest wait for a pre-flight or a submission exec'd in the JobManager pod (`weir run
/// --dry-run`, `weir run -d`: a second or two) to end, connection included. An exec whose
/// end never reaches the operator (no end of its streams, no exit status) held the operator
/// until the 180 s of a runner pod, while its job ran unobserved; now the step is tried
/// again (a fixed job id finds the job if the submission went through).
const EXEC_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long the exit status may lag behind the end of the exec's output.
const EXEC_STATUS_WAIT_MAX: Duration = Duration::from_secs(10);

/// What a command exec'd in a pod printed, and whether it exited 0: `None` when its end
/// was not seen (the wait ran out, or the exit status was lost), so the output may be cut.
struct ExecOutput {
    succeeded: Option<bool>,
    output: String,
}

/// What a pod of a cluster is for: its component label, its ConfigMap, the binary's
/// arguments, its CPU and memory.
struct PodRole<'a> {
    component: &'a str,
    config_map: &'a str,
    args: Vec<String>,
    resource: Option<&'a Resource>,
}

/// Clusters as Kubernetes objects in the namespace of `kube`.
pub struct KubernetesClusters {
    kube: Arc<Kube>,
    /// The deployments' default state directories (`<root>/<name>/{checkpoints,savepoints,ha}`):
    /// the pods must see them at the same path (a volume of the pod template), or the spec
    /// names its own (`state.checkpoints.dir`, `state.savepoints.dir`: S3, say).
    root: PathBuf,
    /// Whether each (deployment, cluster) runs with Kubernetes HA, once known: it never
    /// changes while the cluster lives, and the controller asks every tick.
    highly_available: std::sync::Mutex<std::collections::HashMap<(String, u64), bool>>,
}

impl KubernetesClusters {
    /// The clusters of `kube`'s namespace, with default state directories under `root`.
    pub fn new(kube: Arc<Kube>, root: impl Into<PathBuf>) -> KubernetesClusters {
        KubernetesClusters { kube, root: root.into(), highly_available: Default::default() }
    }

    fn prefix(name: &str, seq: u64) -> String {
        format!("{name}-{seq}")
    }

    /// Whether cluster `seq` runs with Kubernetes HA: its HA ConfigMap exists (an API
    /// error counts as yes: the caller then waits rather than recovers). A yes is kept.
    fn highly_available(&self, name: &str, seq: u64) -> bool {
        let key = (name.to_string(), seq);
        let mut known = match self.highly_available.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(&answer) = known.get(&key) {
            return answer;
        }
        let api = self.kube.api::<ConfigMap>();
        match self.kube.block_on(api.get_metadata(&Self::ha_config_map(name, seq))) {
            Ok(_) => {
                known.insert(key, true);
                true
            }
            // Not created yet or never: asked again (a start may be creating it).
            Err(error) if is_not_found(&error) => false,
            Err(_) => true,
        }
    }

    /// The HA ConfigMap of cluster `seq` (`high-availability.cluster-id` is one per cluster).
    fn ha_config_map(name: &str, seq: u64) -> String {
        crate::ha::config_map_name(&processes::ha_cluster_id(name, seq))
    }

    fn selector(name: &str, seq: Option<u64>, component: Option<&str>) -> String {
        let mut selector = format!("{DEPLOYMENT_LABEL}={name}");
        if let Some(seq) = seq {
            selector.push_str(&format!(",weir.dev/cluster={seq}"));
        }
        if let Some(component) = component {
            selector.push_str(&format!(",weir.dev/component={component}"));
        }
        selector
    }

    fn labels(name: &str, seq: u64, component: &str) -> Value {
        json!({
            "app.kubernetes.io/name": "weir",
            DEPLOYMENT_LABEL: name,
            "weir.dev/cluster": seq.to_string(),
            "weir.dev/component": component,
        })
    }

    /// The owner reference to the deployment's resource: its objects go with it.
    fn owner(&self, name: &str) -> Result<Value, String> {
        let api = self.kube.api::<WeirDeployment>();
        let resource =
            self.kube.block_on(api.get(name)).map_err(|e| format!("cannot read WeirDeployment {name}: {e}"))?;
        let uid = resource.metadata.uid.ok_or_else(|| format!("WeirDeployment {name} has no uid"))?;
        Ok(json!([{
            "apiVersion": "weir.dev/v1",
            "kind": "WeirDeployment",
            "name": name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]))
    }

    /// The cluster's configuration: the spec's, the deployment's default state directories,
    /// and listeners on every interface (each pod advertises its own IP).
    fn configuration(&self, name: &str, seq: u64, target: &DeploymentSpec) -> BTreeMap<String, String> {
        let dirs = DeploymentDirs::new(self.root.join(name));
        let mut config =
            processes::cluster_configuration(target, name, seq, &dirs, Ports { rest: REST_PORT, rpc: RPC_PORT });
        // The pod's IP is given on the command line; a loopback default would be wrong.
        config.remove("rest.address");
        config.remove("jobmanager.rpc.address");
        config.insert("rest.port".into(), REST_PORT.to_string());
        config.insert("jobmanager.rpc.port".into(), RPC_PORT.to_string());
        config.entry("rest.bind-address".into()).or_insert_with(|| "0.0.0.0".into());
        config.entry("jobmanager.bind-host".into()).or_insert_with(|| "0.0.0.0".into());
        config.entry("taskmanager.bind-host".into()).or_insert_with(|| "0.0.0.0".into());
        if uses_api(target) {
            config.insert("kubernetes.namespace".into(), self.kube.namespace().to_string());
        }
        config
    }

    fn put_config_map(
        &self,
        map_name: &str,
        name: &str,
        seq: u64,
        config: &BTreeMap<String, String>,
        files: &[(&str, String)],
    ) -> Result<(), String> {
        let yaml = serde_norway::to_string(config).map_err(|e| e.to_string())?;
        let mut data = serde_json::Map::new();
        data.insert("config.yaml".into(), json!(yaml));
        for (file, text) in files {
            data.insert((*file).to_string(), json!(text));
        }
        let map = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": map_name,
                "labels": Self::labels(name, seq, "config"),
                "ownerReferences": self.owner(name)?,
            },
            "data": data,
        });
        self.apply::<ConfigMap>(map_name, map)
    }

    /// Creates or replaces an object by server-side apply.
    fn apply<K>(&self, object_name: &str, object: Value) -> Result<(), String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + serde::Serialize,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api = self.kube.api::<K>();
        let params = PatchParams::apply(MANAGER).force();
        self.kube
            .block_on(api.patch(object_name, &params, &Patch::Apply(&object)))
            .map(|_| ())
            .map_err(|e| format!("cannot apply {object_name}: {e}"))
    }

    /// A pod spec from the target's pod template with the operator's container filled in.
    fn pod_template(&self, name: &str, seq: u64, target: &DeploymentSpec, role: PodRole<'_>) -> Result<Value, String> {
        let mut pod = target.pod_template.clone().unwrap_or_else(|| json!({}));
        if !pod.is_object() {
            return Err("spec.podTemplate must be a Pod (a mapping of fields)".into());
        }
        let PodRole { component, config_map, args, resource } = role;
        let labels = Self::labels(name, seq, component);
        let metadata = object_field(&mut pod, "metadata")?;
        let pod_labels = object_field(metadata, "labels")?;
        if let (Some(into), Some(from)) = (pod_labels.as_object_mut(), labels.as_object()) {
            for (key, value) in from {
                into.insert(key.clone(), value.clone());
            }
        }
        if let Some(metadata) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("name");
            metadata.remove("namespace");
        }
        let spec = object_field(&mut pod, "spec")?;
        match &target.service_account {
            Some(account) => spec["serviceAccountName"] = json!(account),
            // Kubernetes HA reads and writes a ConfigMap: the account rbac.yaml gives that.
            None if uses_api(target) => spec["serviceAccountName"] = json!(HA_SERVICE_ACCOUNT),
            None => {}
        }
        let volumes = array_field(spec, "volumes")?;
        volumes.push(json!({"name": "weir-config", "configMap": {"name": config_map}}));
        let containers = array_field(spec, "containers")?;
        let index = match containers.iter().position(|c| c["name"] == CONTAINER) {
            Some(index) => index,
            None => {
                containers.insert(0, json!({"name": CONTAINER}));
                0
            }
        };
        let container = &mut containers[index];
        container["image"] = json!(target.image.clone().ok_or("spec.image is required on Kubernetes")?);
        if let Some(policy) = &target.image_pull_policy {
            container["imagePullPolicy"] = json!(policy);
        }
        let binary = if target.binary.is_empty() { "weir" } else { target.binary.as_str() };
        container["command"] = json!([binary]);
        container["args"] = json!(args);
        let env = array_field(container, "env")?;
        env.push(json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}));
        env.push(json!({"name": "WEIR_CONF_DIR", "value": CONF_DIR}));
        if uses_api(target)
            && let Some((host, port)) = api_server_host_port(self.kube.server())
            && !env.iter().any(|e| e["name"] == "KUBERNETES_SERVICE_HOST")
        {
            // The HA store is reached where the operator reaches the API server: the
            // `kubernetes` Service's ClusterIP needs kube-proxy, which a cluster may lack.
            env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": host}));
            env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": port}));
        }
        let mounts = array_field(container, "volumeMounts")?;
        mounts.push(json!({"name": "weir-config", "mountPath": CONF_DIR}));
        if let Some(resource) = resource {
            let mut amounts = serde_json::Map::new();
            if let Some(cpu) = &resource.cpu {
                amounts.insert("cpu".into(), json!(cpu.to_string()));
            }
            if let Some(memory) = &resource.memory {
                amounts.insert("memory".into(), json!(memory_quantity(memory)));
            }
            container["resources"] = json!({"requests": amounts.clone(), "limits": amounts});
        }
        Ok(pod)
    }

    /// A TaskManager pod of the cluster running `weir` with `args`.
    fn taskmanager_pod(
        &self,
        name: &str,
        seq: u64,
        target: &DeploymentSpec,
        config_map: &str,
        args: Vec<String>,
    ) -> Result<Value, String> {
        let role =
            PodRole { component: "taskmanager", config_map, args, resource: target.task_manager.resource.as_ref() };
        self.pod_template(name, seq, target, role)
    }

    fn pods(&self, selector: &str) -> Result<Vec<Pod>, String> {
        let api = self.kube.api::<Pod>();
        self.kube
            .block_on(api.list(&ListParams::default().labels(selector)))
            .map(|list| list.items)
            .map_err(|e| format!("cannot list pods {selector}: {e}"))
    }

    /// Waits for a running JobManager pod of the cluster: its IP.
    fn wait_jobmanager_ip(&self, name: &str, seq: u64) -> Result<String, String> {
        let selector = Self::selector(name, Some(seq), Some("jobmanager"));
        let deadline = Instant::now() + POD_WAIT_MAX;
        loop {
            let pods = self.pods(&selector)?;
            for pod in &pods {
                let status = pod.status.as_ref();
                if status.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && let Some(ip) = status.and_then(|s| s.pod_ip.clone())
                {
                    return Ok(ip);
                }
                if let Some(reason) = container_failure(pod) {
                    return Err(format!("the JobManager pod of cluster {seq} does not start: {reason}"));
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no JobManager pod of cluster {seq} ran within {POD_WAIT_MAX:?} (`kubectl describe pods -l {selector}`)"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `args` of the target's binary in a pod of its image until it ends: its exit
    /// code 0 or not, and its output.
    fn run_pod(
        &self,
        name: &str,
        seq: u64,
        target: &DeploymentSpec,
        config_map: &str,
        args: Vec<String>,
    ) -> Result<(bool, String), String> {
        let pod_name = format!("{name}-run-{}", unique_suffix());
        let mut template =
            self.pod_template(name, seq, target, PodRole { component: "runner", config_map, args, resource: None })?;
        template["apiVersion"] = json!("v1");
        template["kind"] = json!("Pod");
        template["metadata"]["name"] = json!(pod_name);
        template["metadata"]["ownerReferences"] = self.owner(name)?;
        template["spec"]["restartPolicy"] = json!("Never");
        let pod: Pod = serde_json::from_value(template).map_err(|e| format!("spec.podTemplate: {e}"))?;
        let api = self.kube.api::<Pod>();
        self.kube
            .block_on(api.create(&PostParams::default(), &pod))
            .map_err(|e| format!("cannot create pod {pod_name}: {e}"))?;
        let deadline = Instant::now() + RUNNER_WAIT_MAX;
        let outcome = loop {
            let pod = self.kube.block_on(api.get(&pod_name)).map_err(|e| format!("cannot read pod {pod_name}: {e}"))?;
            match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Succeeded") => break Ok(true),
                Some("Failed") => break Ok(false),
                _ => {}
            }
            if let Some(reason) = container_failure(&pod) {
                break Err(format!("pod {pod_name} does not start: {reason}"));
            }
            if Instant::now() > deadline {
                break Err(format!("pod {pod_name} did not end within {RUNNER_WAIT_MAX:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let logs = self.kube.block_on(api.logs(&pod_name, &LogParams::default())).unwrap_or_default();
        let _ = self.kube.block_on(api.delete(&pod_name, &DeleteParams::default()));
        outcome.map(|succeeded| (succeeded, logs))
    }

    /// Creates or replaces the Deployment `<name>-<seq>-<component>` of `replicas` pods of
    /// `pod`, owned by `owner`.
    fn apply_deployment(
        &self,
        name: &str,
        seq: u64,
        component: &str,
        replicas: u32,
        pod: Value,
        owner: &Value,
    ) -> Result<(), String> {
        let deployment_name = format!("{}-{component}", Self::prefix(name, seq));
        let deployment = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": deployment_name, "labels": Self::labels(name, seq, component), "ownerReferences": owner},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": Self::labels(name, seq, component)},
                "template": pod,
            },
        });
        self.apply::<Deployment>(&deployment_name, deployment)
    }

    /// Runs `args` of `binary` in the running JobManager pod of `cluster` (an exec, which
    /// needs no pod to be scheduled: a second or two less than [`Self::run_pod`]); its
    /// output and whether it exited 0. An error: the exec could not be made (no pod, no
    /// `pods/exec` permission).
    fn exec_in_jobmanager(
        &self,
        name: &str,
        cluster: &ClusterInfo,
        binary: &str,
        args: Vec<String>,
    ) -> Result<ExecOutput, String> {
        let host = rest_host(cluster);
        let pods = self.pods(&Self::selector(name, Some(cluster.seq), Some("jobmanager")))?;
        let pod = pods
            .iter()
            .find(|pod| pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(host.as_str()))
            .and_then(|pod| pod.metadata.name.clone())
            .ok_or_else(|| format!("no JobManager pod of cluster {} at {host}", cluster.seq))?;
        let api = self.kube.api::<Pod>();
        let mut command = vec![binary.to_string()];
        command.extend(args);
        self.kube.block_on(async {
            use tokio::io::AsyncReadExt as _;
            use tokio::time::{Instant, timeout_at};
            let deadline = Instant::now() + EXEC_WAIT_MAX;
            let unseen = |output: String| {
                tracing::warn!(deployment = %name, "the exec in pod {pod} did not end within {EXEC_WAIT_MAX:?}");
                ExecOutput { succeeded: None, output }
            };
            let params = AttachParams::default().container(CONTAINER).stdin(false).stdout(true).stderr(true);
            let mut process = match timeout_at(deadline, api.exec(&pod, command, &params)).await {
                Ok(process) => process.map_err(|e| format!("cannot exec in pod {pod}: {e}"))?,
                Err(_) => return Ok(unseen(String::new())),
            };
            let mut stdout = process.stdout().ok_or("the exec has no stdout")?;
            let mut stderr = process.stderr().ok_or("the exec has no stderr")?;
            let status = process.take_status().ok_or("the exec has no status")?;
            // Read into buffers that outlive a timeout: what was printed before it is kept.
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let read = async { tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err)) };
            let ended = timeout_at(deadline, read).await;
            let text =
                |out: &[u8], err: &[u8]| String::from_utf8_lossy(out).into_owned() + &String::from_utf8_lossy(err);
            match ended {
                Ok((Ok(_), Ok(_))) => {}
                Ok((read_out, read_err)) => {
                    let error = read_out.and(read_err).err().map(|e| e.to_string()).unwrap_or_default();
                    tracing::warn!(deployment = %name, "reading the exec's output in pod {pod}: {error}");
                    return Ok(ExecOutput { succeeded: None, output: text(&out, &err) });
                }
                Err(_) => return Ok(unseen(text(&out, &err))),
            }
            let status_deadline = deadline.min(Instant::now() + EXEC_STATUS_WAIT_MAX);
            let succeeded = match timeout_at(status_deadline, status).await {
                Ok(status) => Some(status.and_then(|s| s.status).as_deref() == Some("Success")),
                Err(_) => {
                    tracing::warn!(deployment = %name, "the exec in pod {pod} ended without an exit status");
                    None
                }
            };
            Ok(ExecOutput { succeeded, output: text(&out, &err) })
        })
    }

    /// The cluster of deployment `name` whose JobManager pod runs `image`, if one runs.
    fn running_cluster_with_image(&self, name: &str, image: Option<&str>) -> Option<ClusterInfo> {
        let image = image?;
        let pods = self.pods(&Self::selector(name, None, Some("jobmanager"))).ok()?;
        pods.iter().find_map(|pod| {
            let status = pod.status.as_ref()?;
            let running = status.phase.as_deref() == Some("Running") && pod.metadata.deletion_timestamp.is_none();
            let same_image =
                pod.spec.as_ref()?.containers.iter().any(|c| c.name == CONTAINER && c.image.as_deref() == Some(image));
            let seq = pod.metadata.labels.as_ref()?.get("weir.dev/cluster")?.parse().ok()?;
            (running && same_image).then(|| ClusterInfo {
                rest_address: format!("http://{}:{REST_PORT}", status.pod_ip.as_deref().unwrap_or_default()),
                dir: String::new(),
                binary: image.to_string(),
                seq,
            })
        })
    }

    /// Deletes every object of cluster `seq` and waits until its pods are gone.
    fn delete_cluster(&self, name: &str, seq: u64) -> Result<(), String> {
        let prefix = Self::prefix(name, seq);
        let params = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
        let ignore_missing = |result: Result<(), kube::Error>| match result {
            Err(error) if !is_not_found(&error) => Err(error.to_string()),
            _ => Ok(()),
        };
        // Scaled to nothing first, so no ReplicaSet replaces a pod deleted below (deleting
        // the Deployments first let their ReplicaSets start new pods, which the stop then
        // waited for as well).
        let deployments = self.kube.api::<Deployment>();
        let none = json!({"spec": {"replicas": 0}});
        for component in ["taskmanager", "jobmanager"] {
            ignore_missing(
                self.kube
                    .block_on(deployments.patch(
                        &format!("{prefix}-{component}"),
                        &PatchParams::default(),
                        &Patch::Merge(&none),
                    ))
                    .map(|_| ()),
            )?;
        }
        let selector = Self::selector(name, Some(seq), None);
        let pods = self.kube.api::<Pod>();
        ignore_missing(
            self.kube.block_on(pods.delete_collection(&params, &ListParams::default().labels(&selector))).map(|_| ()),
        )?;
        let deadline = Instant::now() + POD_WAIT_MAX;
        // Done once no process of the cluster runs: the kubelet takes seconds more to
        // remove a pod whose containers have ended (volumes, sandbox), which nothing waits
        // for. Runner pods (pre-flight, submission) end by themselves.
        while self.pods(&selector)?.iter().any(|pod| !is_runner(pod) && !has_ended(pod)) {
            // A native TaskManager pod the JobManager created just before it stopped.
            ignore_missing(
                self.kube
                    .block_on(pods.delete_collection(&params, &ListParams::default().labels(&selector)))
                    .map(|_| ()),
            )?;
            if Instant::now() > deadline {
                return Err(format!(
                    "the pods of cluster {seq} are not gone after {POD_WAIT_MAX:?} (`kubectl get pods -l {selector}`)"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for component in ["taskmanager", "jobmanager"] {
            ignore_missing(
                self.kube.block_on(deployments.delete(&format!("{prefix}-{component}"), &params)).map(|_| ()),
            )?;
        }
        ignore_missing(
            self.kube.block_on(self.kube.api::<Service>().delete(&format!("{prefix}-rest"), &params)).map(|_| ()),
        )?;
        ignore_missing(
            self.kube.block_on(self.kube.api::<ConfigMap>().delete(&format!("{prefix}-config"), &params)).map(|_| ()),
        )?;
        // The cluster's jobs end with it (the controller restores from checkpoints, never
        // from another cluster's HA data).
        ignore_missing(
            self.kube
                .block_on(self.kube.api::<ConfigMap>().delete(&Self::ha_config_map(name, seq), &params))
                .map(|_| ()),
        )
    }
}

/// A cluster [`ClusterBackend::start`] creates: its deployment and number, the spec it runs,
/// its ConfigMap's name, and the owner reference of its objects.
struct NewCluster<'a> {
    name: &'a str,
    seq: u64,
    target: &'a DeploymentSpec,
    config_map: String,
    owner: Value,
}

impl KubernetesClusters {
    /// Native TaskManagers: the file of the pod the JobManager creates for each TaskManager
    /// it needs, named in `config`.
    fn native_taskmanager_pod(
        &self,
        cluster: &NewCluster<'_>,
        config: &mut BTreeMap<String, String>,
    ) -> Result<(&'static str, String), String> {
        let (name, seq, target) = (cluster.name, cluster.seq, cluster.target);
        let prefix = Self::prefix(name, seq);
        // The pod the JobManager creates for each TaskManager it needs (it adds its own
        // address); owned by the resource like every other object of the cluster.
        let args = vec!["taskmanager".into(), "-c".into(), format!("{CONF_DIR}/config.yaml")];
        let mut pod = self.taskmanager_pod(name, seq, target, &cluster.config_map, args)?;
        pod["metadata"]["generateName"] = json!(format!("{prefix}-taskmanager-"));
        // Without blockOwnerDeletion: setting it needs rights on the resource the
        // JobManager's account does not have.
        let mut pod_owner = cluster.owner.clone();
        if let Some(reference) = pod_owner.get_mut(0) {
            reference["blockOwnerDeletion"] = json!(false);
        }
        pod["metadata"]["ownerReferences"] = pod_owner;
        let text = serde_json::to_string_pretty(&pod).map_err(|e| e.to_string())?;
        config.insert("kubernetes.pod-template-file.taskmanager".into(), format!("{CONF_DIR}/{TASKMANAGER_POD_FILE}"));
        // The job's slots start with the JobManager instead of after the submission.
        config
            .entry("slotmanager.number-of-slots.min".into())
            .or_insert_with(|| target.job.parallelism.unwrap_or(1).to_string());
        Ok((TASKMANAGER_POD_FILE, text))
    }

    /// Creates the JobManager Deployment of `cluster`.
    fn start_jobmanagers(&self, cluster: &NewCluster<'_>) -> Result<(), String> {
        let (name, seq, target) = (cluster.name, cluster.seq, cluster.target);
        let jobmanager_args = vec![
            "jobmanager".into(),
            "-c".into(),
            format!("{CONF_DIR}/config.yaml"),
            "-D".into(),
            "rest.address=$(POD_IP)".into(),
            "-D".into(),
            "jobmanager.rpc.address=$(POD_IP)".into(),
        ];
        let jobmanager_pod = self.pod_template(
            name,
            seq,
            target,
            PodRole {
                component: "jobmanager",
                config_map: &cluster.config_map,
                args: jobmanager_args,
                resource: target.job_manager.resource.as_ref(),
            },
        )?;
        self.apply_deployment(name, seq, "jobmanager", target.job_manager.replicas, jobmanager_pod, &cluster.owner)
    }

    /// Creates the Service of `cluster`'s REST API.
    fn apply_rest_service(&self, cluster: &NewCluster<'_>) -> Result<(), String> {
        let (name, seq) = (cluster.name, cluster.seq);
        let prefix = Self::prefix(name, seq);
        let service = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": format!("{prefix}-rest"), "labels": Self::labels(name, seq, "rest"), "ownerReferences": cluster.owner},
            "spec": {
                "selector": Self::labels(name, seq, "jobmanager"),
                "ports": [{"name": "rest", "protocol": "TCP", "port": REST_PORT, "targetPort": REST_PORT}],
            },
        });
        self.apply::<Service>(&format!("{prefix}-rest"), service)
    }

    /// Creates the TaskManager Deployment of a standalone `cluster`, its TaskManagers pointed
    /// at the JobManager at `jobmanager_ip` (a native cluster's JobManager creates its own).
    fn start_taskmanagers(&self, cluster: &NewCluster<'_>, jobmanager_ip: &str) -> Result<(), String> {
        let (name, seq, target) = (cluster.name, cluster.seq, cluster.target);
        let taskmanager_args = vec![
            "taskmanager".into(),
            "-c".into(),
            format!("{CONF_DIR}/config.yaml"),
            "-D".into(),
            format!("jobmanager.rpc.address={jobmanager_ip}"),
        ];
        let taskmanager_pod = self.taskmanager_pod(name, seq, target, &cluster.config_map, taskmanager_args)?;
        if !native(target) {
            self.apply_deployment(
                name,
                seq,
                "taskmanager",
                target.task_manager.replicas,
                taskmanager_pod,
                &cluster.owner,
            )?;
        }
        Ok(())
    }
}

impl ClusterBackend for KubernetesClusters {
    fn describe(&self) -> String {
        format!("Kubernetes objects in namespace {} of {}", self.kube.namespace(), self.kube.server())
    }

    fn clusters(&self, name: &str) -> Result<Vec<u64>, String> {
        let api = self.kube.api::<ConfigMap>();
        let maps = self
            .kube
            .block_on(api.list(&ListParams::default().labels(&Self::selector(name, None, Some("config")))))
            .map_err(|e| format!("cannot list the clusters of {name}: {e}"))?;
        let mut seqs: Vec<u64> = maps
            .items
            .iter()
            .filter_map(|map| map.metadata.labels.as_ref()?.get("weir.dev/cluster")?.parse().ok())
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        Ok(seqs)
    }

    fn stop(&self, name: &str, seq: u64) -> Result<(), String> {
        self.delete_cluster(name, seq)
    }

    fn start(&self, name: &str, seq: u64, target: &DeploymentSpec) -> Result<ClusterInfo, String> {
        // Whatever an interrupted earlier attempt of this step left.
        self.delete_cluster(name, seq)?;
        let prefix = Self::prefix(name, seq);
        let config_map = format!("{prefix}-config");
        let owner = self.owner(name)?;
        let cluster = NewCluster { name, seq, target, config_map, owner };
        let mut config = self.configuration(name, seq, target);
        let mut files = Vec::new();
        if native(target) {
            files.push(self.native_taskmanager_pod(&cluster, &mut config)?);
        }
        self.put_config_map(&cluster.config_map, name, seq, &config, &files)?;
        self.start_jobmanagers(&cluster)?;
        self.apply_rest_service(&cluster)?;
        let jobmanager_ip = self.wait_jobmanager_ip(name, seq)?;
        self.start_taskmanagers(&cluster, &jobmanager_ip)?;
        Ok(ClusterInfo {
            rest_address: format!("http://{jobmanager_ip}:{REST_PORT}"),
            dir: format!("{}/{prefix}-jobmanager", self.kube.namespace()),
            binary: target.image.clone().unwrap_or_default(),
            seq,
        })
    }

    fn jobmanager_alive(&self, name: &str, cluster: &ClusterInfo) -> bool {
        if self.highly_available(name, cluster.seq) {
            // Its Deployment replaces a JobManager pod that died, and the new leader takes
            // the job over from the HA ConfigMap: gone only when the Deployment is.
            let deployments = self.kube.api::<Deployment>();
            let jobmanagers = format!("{}-jobmanager", Self::prefix(name, cluster.seq));
            return match self.kube.block_on(deployments.get(&jobmanagers)) {
                Ok(deployment) => deployment.spec.and_then(|s| s.replicas).unwrap_or(1) > 0,
                Err(error) => !is_not_found(&error),
            };
        }
        let host = rest_host(cluster);
        match self.pods(&Self::selector(name, Some(cluster.seq), Some("jobmanager"))) {
            Ok(pods) => pods.iter().any(|pod| {
                let status = pod.status.as_ref();
                pod.metadata.deletion_timestamp.is_none()
                    && status.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && status.and_then(|s| s.pod_ip.as_deref()) == Some(host.as_str())
            }),
            // Not knowing is not death: the API server may be briefly away.
            Err(_) => true,
        }
    }

    /// With Kubernetes HA: the newest pointer in the cluster's HA ConfigMap.
    fn recorded_checkpoint(&self, name: &str, cluster: &ClusterInfo, job_id: &str) -> Option<String> {
        if !self.highly_available(name, cluster.seq) {
            return None;
        }
        let cluster_id = processes::ha_cluster_id(name, cluster.seq);
        let read = crate::ha::ConfigMapStore::connect(Arc::clone(&self.kube), &cluster_id)
            .map_err(weir_ha::HaError::from)
            .and_then(|store| weir_ha::newest_recorded_checkpoint(&store, &cluster_id, job_id));
        match read {
            Ok(newest) => newest,
            Err(error) => {
                tracing::warn!(deployment = %name, "cannot read the newest checkpoint from the HA ConfigMap: {error}");
                None
            }
        }
    }

    fn rest_address(&self, name: &str, cluster: &ClusterInfo) -> String {
        if !self.highly_available(name, cluster.seq) {
            return cluster.rest_address.clone();
        }
        // Any running JobManager answers for the leader; the one recorded first if it runs.
        let Ok(pods) = self.pods(&Self::selector(name, Some(cluster.seq), Some("jobmanager"))) else {
            return cluster.rest_address.clone();
        };
        let running: Vec<String> = pods
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter_map(|pod| {
                let status = pod.status.as_ref()?;
                (status.phase.as_deref() == Some("Running")).then(|| status.pod_ip.clone()).flatten()
            })
            .collect();
        let recorded = rest_host(cluster);
        match running.iter().find(|ip| **ip == recorded).or(running.first()) {
            Some(ip) => format!("http://{ip}:{REST_PORT}"),
            None => cluster.rest_address.clone(),
        }
    }

    fn event(&self, name: &str, warning: bool, reason: &str, message: &str) {
        let api = self.kube.api::<WeirDeployment>();
        let Ok(resource) = self.kube.block_on(api.get(name)) else { return };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let event = Event {
            metadata: kube::core::ObjectMeta { generate_name: Some(format!("{name}.")), ..Default::default() },
            involved_object: ObjectReference {
                api_version: Some("weir.dev/v1".into()),
                kind: Some("WeirDeployment".into()),
                name: Some(name.to_string()),
                namespace: Some(self.kube.namespace().to_string()),
                uid: resource.metadata.uid.clone(),
                resource_version: resource.metadata.resource_version.clone(),
                ..Default::default()
            },
            reason: Some(reason.to_string()),
            // The API server refuses messages over 1 KiB.
            message: Some(message.chars().take(1000).collect()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            source: Some(EventSource { component: Some(MANAGER.into()), ..Default::default() }),
            reporting_component: Some(MANAGER.into()),
            ..Default::default()
        };
        if let Err(error) = self.kube.block_on(self.kube.api::<Event>().create(&PostParams::default(), &event)) {
            tracing::debug!(%error, "cannot record the event {reason} of {name}");
        }
    }

    fn dry_run(&self, name: &str, target: &DeploymentSpec, snapshot: Option<&str>) -> Result<Vec<String>, String> {
        // When the running cluster has the target's image, its JobManager pod holds the
        // same binary: the pre-flight runs there (an exec), with the target's whole
        // configuration on the command line, instead of in a pod of its own.
        if let Some(cluster) = self.running_cluster_with_image(name, target.image.as_deref()) {
            let binary = if target.binary.is_empty() { "weir" } else { target.binary.as_str() };
            let mut args = vec!["run".to_string(), "--dry-run".into(), "-c".into(), "/dev/null".into()];
            for (key, value) in self.configuration(name, 0, target) {
                args.extend(["-D".to_string(), format!("{key}={value}")]);
            }
            if let Some(snapshot) = snapshot {
                args.extend(["-s".into(), snapshot.to_string()]);
            }
            args.extend(processes::run_arguments(target));
            match self.exec_in_jobmanager(name, &cluster, binary, args) {
                Ok(ExecOutput { succeeded: Some(true), output }) => {
                    return Ok(output.lines().map(str::to_string).collect());
                }
                Ok(ExecOutput { succeeded: Some(false), output }) => {
                    return Err(processes::last_line(output.as_bytes())
                        .unwrap_or_else(|| "the pre-flight failed with no message".into()));
                }
                Ok(ExecOutput { succeeded: None, .. }) => {
                    tracing::info!(deployment = %name, "the pre-flight's exec did not end; running it in a pod of its own")
                }
                Err(error) => tracing::info!(deployment = %name, %error, "running the pre-flight in a pod of its own"),
            }
        }
        let config_map = format!("{name}-preflight-config");
        self.put_config_map(&config_map, name, 0, &self.configuration(name, 0, target), &[])?;
        let mut args = vec!["run".to_string(), "--dry-run".into(), "-c".into(), format!("{CONF_DIR}/config.yaml")];
        if let Some(snapshot) = snapshot {
            args.extend(["-s".into(), snapshot.to_string()]);
        }
        args.extend(processes::run_arguments(target));
        let (succeeded, logs) = self.run_pod(name, 0, target, &config_map, args)?;
        let lines: Vec<String> = logs.lines().map(str::to_string).collect();
        if succeeded {
            Ok(lines)
        } else {
            Err(processes::last_line(logs.as_bytes()).unwrap_or_else(|| "the pre-flight pod failed".into()))
        }
    }

    fn submit(
        &self,
        name: &str,
        cluster: &ClusterInfo,
        target: &DeploymentSpec,
        restore_from: Option<&str>,
        job_id: Option<&str>,
    ) -> Result<String, String> {
        let config_map = format!("{}-config", Self::prefix(name, cluster.seq));
        let mut args = vec![
            "run".to_string(),
            "-d".into(),
            "-m".into(),
            cluster.rest_address.clone(),
            "-c".into(),
            format!("{CONF_DIR}/config.yaml"),
        ];
        if let Some(snapshot) = restore_from {
            args.extend(["-s".into(), snapshot.to_string()]);
        }
        args.extend(processes::fixed_job_id_args(job_id));
        args.extend(processes::run_arguments(target));
        let binary = if target.binary.is_empty() { "weir" } else { target.binary.as_str() };
        // In the new JobManager pod (it runs the target's image); a pod of its own when the
        // exec is refused (no `pods/exec` permission, say).
        let logs = match self.exec_in_jobmanager(name, cluster, binary, args.clone()) {
            Ok(ExecOutput { output, succeeded }) => {
                if let Some(id) = submitted_job_id(&output) {
                    return Ok(id);
                }
                if succeeded.is_none() {
                    // Not known whether it was submitted: the controller tries the step
                    // again, and finds the job if it was (its id is fixed beforehand).
                    return Err(format!(
                        "the end of the submission exec'd in the JobManager pod was not seen (within {EXEC_WAIT_MAX:?}){}",
                        processes::last_line(output.as_bytes())
                            .map(|l| format!(" (it printed: {l})"))
                            .unwrap_or_default()
                    ));
                }
                output
            }
            Err(error) => {
                tracing::info!(deployment = %name, %error, "submitting from a pod of its own instead");
                self.run_pod(name, cluster.seq, target, &config_map, args)?.1
            }
        };
        if let Some(id) = submitted_job_id(&logs) {
            return Ok(id);
        }
        Err(processes::last_line(logs.as_bytes()).unwrap_or_else(|| "the submission pod printed nothing".into()))
    }
}

/// The job id `weir run` printed on submitting a job (as `flink run` prints it).
fn submitted_job_id(output: &str) -> Option<String> {
    output.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).map(|id| id.trim().to_string())
}

/// Whether `target`'s JobManager creates its TaskManager pods (`spec.mode: native`).
fn native(target: &DeploymentSpec) -> bool {
    target.mode == Some(KubernetesMode::Native)
}

/// Whether `target`'s pods talk to the API server (HA on a ConfigMap, or native pods).
fn uses_api(target: &DeploymentSpec) -> bool {
    kubernetes_ha(target) || native(target)
}

/// Whether `target` runs with `high-availability.type: kubernetes`.
fn kubernetes_ha(target: &DeploymentSpec) -> bool {
    weir_deploy::spec::high_availability_type(&target.configuration)
        == Some(weir_config::HighAvailabilityType::Kubernetes)
}

/// The host and port of an API server URL (`https://10.0.0.1:6443`).
fn api_server_host_port(server: &str) -> Option<(String, String)> {
    let rest = server.split_once("://").map_or(server, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => (host, port.to_string()),
        _ => (authority, "443".to_string()),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// The host of a cluster's REST address (its JobManager pod's IP).
fn rest_host(cluster: &ClusterInfo) -> String {
    let address = cluster.rest_address.trim_start_matches("http://");
    address.rsplit_once(':').map_or(address, |(host, _)| host).to_string()
}

/// A field of `value` that must be an object (created empty when missing).
fn object_field<'a>(value: &'a mut Value, key: &str) -> Result<&'a mut Value, String> {
    let field = value
        .as_object_mut()
        .ok_or_else(|| format!("spec.podTemplate: {key} must be in a mapping"))?
        .entry(key)
        .or_insert_with(|| json!({}));
    if !field.is_object() {
        return Err(format!("spec.podTemplate: {key} must be a mapping"));
    }
    Ok(field)
}

/// A field of `value` that must be an array (created empty when missing).
fn array_field<'a>(value: &'a mut Value, key: &str) -> Result<&'a mut Vec<Value>, String> {
    value
        .as_object_mut()
        .ok_or_else(|| format!("spec.podTemplate: {key} must be in a mapping"))?
        .entry(key)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| format!("spec.podTemplate: {key} must be a list"))
}

fn is_runner(pod: &Pod) -> bool {
    pod.metadata.labels.as_ref().and_then(|l| l.get("weir.dev/component")).is_some_and(|c| c == "runner")
}

/// Whether a pod being deleted runs no container any more (or never started one).
fn has_ended(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    if matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")) {
        return true;
    }
    let running = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|all| all.iter().any(|c| c.state.as_ref().is_none_or(|state| state.terminated.is_none())));
    pod.metadata.deletion_timestamp.is_some() && !running
}

/// Why a pod's container cannot run, if it is stuck (a missing image, a crash loop).
fn container_failure(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    for status in statuses {
        let waiting = status.state.as_ref().and_then(|s| s.waiting.as_ref());
        if let Some(waiting) = waiting {
            let reason = waiting.reason.as_deref().unwrap_or("");
            if matches!(
                reason,
                "ErrImageNeverPull"
                    | "ImagePullBackOff"
                    | "ErrImagePull"
                    | "InvalidImageName"
                    | "CrashLoopBackOff"
                    | "CreateContainerConfigError"
            ) {
                return Some(format!("{reason}: {}", waiting.message.as_deref().unwrap_or("")));
            }
        }
    }
    None
}

/// Flink's memory sizes (`1024m`, `2g`: mebibytes, gibibytes) as Kubernetes quantities
/// (`1024Mi`, `2Gi`); a Kubernetes quantity passes unchanged.
pub fn memory_quantity(memory: &str) -> String {
    let memory = memory.trim();
    let split = memory.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(memory.len());
    let (number, unit) = memory.split_at(split);
    match unit.to_ascii_lowercase().as_str() {
        "m" | "mb" => format!("{number}Mi"),
        "g" | "gb" => format!("{number}Gi"),
        "k" | "kb" => format!("{number}Ki"),
        _ => memory.to_string(),
    }
}

/// A short suffix that differs between calls (pod names).
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:x}", nanos & 0xfffff, COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_server_urls_give_host_and_port() {
        assert_eq!(api_server_host_port("https://10.244.0.1:6443/"), Some(("10.244.0.1".into(), "6443".into())));
        assert_eq!(api_server_host_port("https://api.example.com"), Some(("api.example.com".into(), "443".into())));
        assert_eq!(api_server_host_port("https://[fd00::1]:6443"), Some(("fd00::1".into(), "6443".into())));
    }

    #[test]
    fn flink_memory_sizes_become_kubernetes_quantities() {
        assert_eq!(memory_quantity("1024m"), "1024Mi");
        assert_eq!(memory_quantity("2g"), "2Gi");
        assert_eq!(memory_quantity("512Mi"), "512Mi");
        assert_eq!(memory_quantity("1.5G"), "1.5Gi");
    }

    #[test]
    fn the_submitted_job_id_is_read_from_what_weir_run_printed_even_when_cut() {
        let printed = "Job has been submitted with JobID 6f2a62c1d0e84b3f9a1b2c3d4e5f6a7b\nWaiting for";
        assert_eq!(submitted_job_id(printed).as_deref(), Some("6f2a62c1d0e84b3f9a1b2c3d4e5f6a7b"));
        assert_eq!(submitted_job_id("error: cannot reach the JobManager"), None);
    }
}
