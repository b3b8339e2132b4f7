//! The `WeirDeployment` spec: what a user declares should run, shaped like the Flink
//! Kubernetes Operator's `FlinkDeployment` (`spec.job.upgradeMode`, `state`,
//! `initialSavepointPath`, ...), and its parsing, which names the field path of every
//! mistake (`spec.job.upgradeMode: 'snapshot' is not one of savepoint, last-state, stateless`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_norway::Value;

/// The only `apiVersion`.
pub const API_VERSION: &str = "weir.dev/v1";
/// The only `kind`.
pub const KIND: &str = "WeirDeployment";

/// A declared deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WeirDeployment {
    /// `weir.dev/v1`.
    pub api_version: String,
    /// `WeirDeployment`.
    pub kind: String,
    /// Its name, and the generation the store gave the spec.
    pub metadata: Metadata,
    /// What should run.
    pub spec: DeploymentSpec,
}

/// A deployment's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// Unique per store; lowercase letters, digits and `-` (it names directories and keys).
    pub name: String,
    /// Grows by one with every applied change of the spec (set by the store).
    #[serde(default)]
    pub generation: u64,
}

/// How TaskManagers come to be on Kubernetes (FlinkDeployment's `spec.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KubernetesMode {
    /// The JobManager creates TaskManager pods for its jobs' slots.
    Native,
    /// A TaskManager Deployment of fixed replicas.
    Standalone,
}

/// What should run: the program, its configuration, the cluster and the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpec {
    /// The program holding the job: the `weir` binary or a user's own (the lesson's image).
    /// An absolute path once applied. On Kubernetes, the program inside `image` (`weir`
    /// when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub binary: String,
    /// Kubernetes: the container image of the JobManager and TaskManager pods (one image
    /// for both; its entry point is `weir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Kubernetes: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Kubernetes: the ServiceAccount of the JobManager pods (it creates the TaskManager
    /// pods, and with Kubernetes HA its Lease and ConfigMaps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Kubernetes: `native` (the JobManager creates the TaskManager pods its jobs need, and
    /// replaces those that die) or `standalone` (a TaskManager Deployment of
    /// `taskManager.replicas`), as FlinkDeployment's `mode`. Default: standalone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<KubernetesMode>,
    /// Kubernetes: a Pod the JobManager and TaskManager pods start from (labels, volumes,
    /// sidecars); the operator's own settings win where both set a field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub pod_template: Option<serde_json::Value>,
    /// Flink keys for the deployment's cluster and job.
    #[serde(default)]
    pub configuration: BTreeMap<String, String>,
    /// The JobManagers.
    #[serde(default)]
    pub job_manager: JobManagerSpec,
    /// The TaskManagers.
    #[serde(default)]
    pub task_manager: TaskManagerSpec,
    /// The job.
    pub job: JobSpec,
}

/// The JobManagers of a deployment's cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobManagerSpec {
    /// How many; more than one needs high availability (`high-availability.type`).
    pub replicas: u32,
    /// Kubernetes: the CPU and memory of each JobManager pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
}

impl Default for JobManagerSpec {
    fn default() -> Self {
        JobManagerSpec { replicas: 1, resource: None }
    }
}

/// The CPU and memory of a pod, as `FlinkDeployment`'s `resource`: `cpu: 0.5`,
/// `memory: "1024m"` (Kubernetes quantities: `512Mi`, `2g`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// Cores (requests and limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<serde_json::Number>,
    /// Memory (requests and limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

/// The TaskManagers of a deployment's cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskManagerSpec {
    /// How many (standalone mode; native mode starts what the job needs).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Slots of each (`taskmanager.numberOfTaskSlots`).
    #[serde(default = "one")]
    pub slots: u32,
    /// Kubernetes: the CPU and memory of each TaskManager pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
}

fn one() -> u32 {
    1
}

impl Default for TaskManagerSpec {
    fn default() -> Self {
        TaskManagerSpec { replicas: 1, slots: 1, resource: None }
    }
}

/// The job of a deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// The catalog job of `binary` (`weir jobs` lists them).
    pub name: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its parallelism; `parallelism.default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<u32>,
    /// How a change of spec moves the job's state.
    #[serde(default)]
    pub upgrade_mode: UpgradeMode,
    /// Running or suspended.
    #[serde(default)]
    pub state: DesiredState,
    /// The snapshot the first deploy starts from, and an upgrade whose spec sets a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_savepoint_path: Option<String>,
    /// `-n`: start even when the snapshot has state of operators the job lacks.
    #[serde(default)]
    pub allow_non_restored_state: bool,
    /// Changing it takes a savepoint (history trigger type MANUAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savepoint_trigger_nonce: Option<i64>,
}

/// How an upgrade (or a suspend) carries the job's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeMode {
    /// Stop with a savepoint, start the new spec from it.
    Savepoint,
    /// Cancel, start the new spec from the newest completed checkpoint.
    LastState,
    /// Cancel, start the new spec empty (the Flink operator's default).
    #[default]
    Stateless,
}

impl UpgradeMode {
    /// The spelling in specs.
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeMode::Savepoint => "savepoint",
            UpgradeMode::LastState => "last-state",
            UpgradeMode::Stateless => "stateless",
        }
    }
}

/// The state a deployment's job should be in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DesiredState {
    /// Running.
    #[default]
    Running,
    /// Stopped as the upgrade mode says, its cluster gone; `running` resumes it.
    Suspended,
}

/// A mistake in a spec: where and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SpecError {
    /// The field path (`spec.job.upgradeMode`).
    pub path: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

fn error(path: &str, message: impl Into<String>) -> SpecError {
    SpecError { path: path.to_string(), message: message.into() }
}

/// Parses and checks a spec. `warnings` receives what is allowed but probably not meant.
pub fn parse(text: &str, warnings: &mut Vec<String>) -> Result<WeirDeployment, SpecError> {
    let value: Value = serde_norway::from_str(text).map_err(|e| error("(file)", format!("not YAML: {e}")))?;
    let root = mapping(&value, "(file)")?;
    allowed_keys(root, "", &["apiVersion", "kind", "metadata", "spec"])?;
    let api_version = required_string(root, "", "apiVersion")?;
    if api_version.starts_with("flink.apache.org/") {
        return Err(error("apiVersion", flink_deployment_differences(root)));
    }
    if api_version != API_VERSION {
        return Err(error("apiVersion", format!("'{api_version}' is not {API_VERSION}")));
    }
    let kind = required_string(root, "", "kind")?;
    if kind != KIND {
        return Err(error("kind", format!("'{kind}' is not {KIND}")));
    }
    let metadata = mapping(required(root, "", "metadata")?, "metadata")?;
    allowed_keys(metadata, "metadata", &["name", "generation"])?;
    let name = required_string(metadata, "metadata", "name")?;
    check_name(&name)?;
    let spec_value = mapping(required(root, "", "spec")?, "spec")?;
    let spec = parse_spec(spec_value)?;
    for field in kubernetes_fields(&spec) {
        warnings.push(format!(
            "{field}: read only by `weir operator --kubernetes`; this operator runs spec.binary as processes"
        ));
    }
    let deployment = WeirDeployment { api_version, kind, metadata: Metadata { name, generation: 0 }, spec };
    check(&deployment.spec, warnings)?;
    Ok(deployment)
}

/// A FlinkDeployment applied by mistake: every change it needs to be a WeirDeployment, at
/// once (docs/coming-from-flink.md maps each field).
fn flink_deployment_differences(root: &serde_norway::Mapping) -> String {
    let field = |map: Option<&Value>, key: &str| map.and_then(|m| m.as_mapping()).and_then(|m| m.get(key)).cloned();
    let spec = root.get("spec");
    let job = field(spec, "job");
    let has = |key: &str| field(spec, key).is_some();
    let job_has = |key: &str| field(job.as_ref(), key).is_some();
    let mut changes = vec!["apiVersion: weir.dev/v1 and kind: WeirDeployment".to_string()];
    if job_has("jarURI") || job_has("entryClass") {
        changes.push(
            "spec.job.jarURI and spec.job.entryClass -> spec.binary (the weir binary, or your own with your jobs compiled in) and spec.job.name (a job it has: `weir jobs` lists them)"
                .into(),
        );
    } else {
        changes.push("add spec.binary and spec.job.name (`weir jobs` lists the jobs)".into());
    }
    if has("flinkConfiguration") {
        let configuration = field(spec, "flinkConfiguration");
        let slots = field(configuration.as_ref(), "taskmanager.numberOfTaskSlots").is_some();
        let parallelism = field(configuration.as_ref(), "parallelism.default").is_some();
        let mut line = "spec.flinkConfiguration -> spec.configuration (the same keys)".to_string();
        if slots {
            line.push_str(", but taskmanager.numberOfTaskSlots -> spec.taskManager.slots");
        }
        if parallelism {
            line.push_str(", and parallelism.default -> spec.job.parallelism");
        }
        changes.push(line);
    }
    for (key, why) in [
        ("flinkVersion", "weir is one binary"),
        ("logConfiguration", "the log level is WEIR_LOG in the pods' environment"),
        ("ingress", "expose the JobManager's REST Service yourself"),
        ("restartNonce", "apply a changed spec to restart"),
    ] {
        if has(key) {
            changes.push(format!("remove spec.{key} ({why})"));
        }
    }
    for (key, why) in [
        ("checkpointTriggerNonce", "take one with `weir savepoint` or a savepointTriggerNonce"),
        ("savepointRedeployNonce", "set spec.job.initialSavepointPath and apply"),
    ] {
        if job_has(key) {
            changes.push(format!("remove spec.job.{key} ({why})"));
        }
    }
    let kept = ["image", "imagePullPolicy", "serviceAccount", "podTemplate", "mode", "jobManager", "taskManager"];
    let kept: Vec<&str> = kept.into_iter().filter(|key| has(key)).collect();
    if !kept.is_empty() {
        changes.push(format!(
            "spec.{} and spec.job's parallelism, args, upgradeMode, state, initialSavepointPath, savepointTriggerNonce and allowNonRestoredState keep their names",
            kept.join(", spec.")
        ));
    }
    format!(
        "this is the Flink Kubernetes Operator's FlinkDeployment; weir's is a WeirDeployment (weir.dev/v1), and these change: {} (docs/coming-from-flink.md maps every field)",
        changes.join("; ")
    )
}

/// The fields set in `spec` that only the Kubernetes backend reads.
pub fn kubernetes_fields(spec: &DeploymentSpec) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if spec.image.is_some() {
        fields.push("spec.image");
    }
    if spec.image_pull_policy.is_some() {
        fields.push("spec.imagePullPolicy");
    }
    if spec.service_account.is_some() {
        fields.push("spec.serviceAccount");
    }
    if spec.mode.is_some() {
        fields.push("spec.mode");
    }
    if spec.pod_template.is_some() {
        fields.push("spec.podTemplate");
    }
    if spec.job_manager.resource.is_some() {
        fields.push("spec.jobManager.resource");
    }
    if spec.task_manager.resource.is_some() {
        fields.push("spec.taskManager.resource");
    }
    fields
}

fn parse_resource(map: &serde_norway::Mapping, path: &str) -> Result<Option<Resource>, SpecError> {
    let Some(value) = map.get("resource") else { return Ok(None) };
    let path = join(path, "resource");
    let resource = mapping(value, &path)?;
    allowed_keys(resource, &path, &["cpu", "memory"])?;
    let cpu = match resource.get("cpu") {
        None | Some(Value::Null) => None,
        Some(Value::Number(number)) => {
            let cpu = number
                .as_f64()
                .filter(|cpu| cpu.is_finite() && *cpu > 0.0)
                .ok_or_else(|| error(&join(&path, "cpu"), "must be a positive number of cores (`cpu: 0.5`)"))?;
            serde_json::Number::from_f64(cpu)
        }
        Some(_) => return Err(error(&join(&path, "cpu"), "must be a positive number of cores (`cpu: 0.5`)")),
    };
    let memory = optional_string(resource, &path, "memory")?;
    Ok(Some(Resource { cpu, memory }))
}

fn parse_spec(spec: &serde_norway::Mapping) -> Result<DeploymentSpec, SpecError> {
    allowed_keys(
        spec,
        "spec",
        &[
            "binary",
            "image",
            "imagePullPolicy",
            "serviceAccount",
            "mode",
            "podTemplate",
            "configuration",
            "jobManager",
            "taskManager",
            "job",
        ],
    )?;
    let image = optional_string(spec, "spec", "image")?;
    let image_pull_policy = parse_image_pull_policy(spec)?;
    let service_account = optional_string(spec, "spec", "serviceAccount")?;
    let mode = parse_mode(spec)?;
    let pod_template = parse_pod_template(spec)?;
    let binary = parse_binary(spec)?;
    let configuration = parse_configuration(spec)?;
    let job_manager = parse_job_manager(spec)?;
    let task_manager = parse_task_manager(spec)?;
    let job = parse_job(mapping(required(spec, "spec", "job")?, "spec.job")?)?;
    Ok(DeploymentSpec {
        binary,
        image,
        image_pull_policy,
        service_account,
        mode,
        pod_template,
        configuration,
        job_manager,
        task_manager,
        job,
    })
}

fn parse_image_pull_policy(spec: &serde_norway::Mapping) -> Result<Option<String>, SpecError> {
    let image_pull_policy = optional_string(spec, "spec", "imagePullPolicy")?;
    if let Some(policy) = &image_pull_policy
        && !["Always", "IfNotPresent", "Never"].contains(&policy.as_str())
    {
        return Err(error("spec.imagePullPolicy", format!("'{policy}' is not one of Always, IfNotPresent, Never")));
    }
    Ok(image_pull_policy)
}

fn parse_mode(spec: &serde_norway::Mapping) -> Result<Option<KubernetesMode>, SpecError> {
    Ok(match optional_string(spec, "spec", "mode")?.as_deref() {
        None => None,
        Some("native") => Some(KubernetesMode::Native),
        Some("standalone") => Some(KubernetesMode::Standalone),
        Some(other) => return Err(error("spec.mode", format!("'{other}' is not one of native, standalone"))),
    })
}

fn parse_pod_template(spec: &serde_norway::Mapping) -> Result<Option<serde_json::Value>, SpecError> {
    Ok(match spec.get("podTemplate") {
        None | Some(Value::Null) => None,
        Some(value) => {
            mapping(value, "spec.podTemplate")?;
            Some(serde_json::to_value(value).map_err(|e| error("spec.podTemplate", e.to_string()))?)
        }
    })
}

fn parse_binary(spec: &serde_norway::Mapping) -> Result<String, SpecError> {
    let binary = required_string(spec, "spec", "binary")?;
    if binary.trim().is_empty() {
        return Err(error(
            "spec.binary",
            "is empty; name the program that holds the job (the weir binary or your own)",
        ));
    }
    Ok(binary)
}

fn parse_configuration(spec: &serde_norway::Mapping) -> Result<BTreeMap<String, String>, SpecError> {
    let mut configuration = BTreeMap::new();
    if let Some(value) = spec.get("configuration") {
        for (key, value) in mapping(value, "spec.configuration")? {
            let Some(key) = key.as_str() else {
                return Err(error("spec.configuration", "keys must be strings (Flink option names)"));
            };
            let path = format!("spec.configuration.{key}");
            configuration.insert(key.to_string(), scalar(value, &path)?);
        }
    }
    Ok(configuration)
}

fn parse_job_manager(spec: &serde_norway::Mapping) -> Result<JobManagerSpec, SpecError> {
    Ok(match spec.get("jobManager") {
        None => JobManagerSpec::default(),
        Some(value) => {
            let map = mapping(value, "spec.jobManager")?;
            allowed_keys(map, "spec.jobManager", &["replicas", "resource"])?;
            JobManagerSpec {
                replicas: optional_u32(map, "spec.jobManager", "replicas", 1)?.unwrap_or(1),
                resource: parse_resource(map, "spec.jobManager")?,
            }
        }
    })
}

fn parse_task_manager(spec: &serde_norway::Mapping) -> Result<TaskManagerSpec, SpecError> {
    Ok(match spec.get("taskManager") {
        None => TaskManagerSpec::default(),
        Some(value) => {
            let map = mapping(value, "spec.taskManager")?;
            allowed_keys(map, "spec.taskManager", &["replicas", "slots", "resource"])?;
            TaskManagerSpec {
                replicas: optional_u32(map, "spec.taskManager", "replicas", 1)?.unwrap_or(1),
                slots: optional_u32(map, "spec.taskManager", "slots", 1)?.unwrap_or(1),
                resource: parse_resource(map, "spec.taskManager")?,
            }
        }
    })
}

/// Parses `spec.job`, its fields checked in the order written here (the name and the
/// parallelism last): the first mistake is the one reported.
fn parse_job(job: &serde_norway::Mapping) -> Result<JobSpec, SpecError> {
    allowed_keys(
        job,
        "spec.job",
        &[
            "name",
            "args",
            "parallelism",
            "upgradeMode",
            "state",
            "initialSavepointPath",
            "allowNonRestoredState",
            "savepointTriggerNonce",
        ],
    )?;
    let args = parse_args(job)?;
    let upgrade_mode = parse_upgrade_mode(job)?;
    let state = parse_desired_state(job)?;
    let allow_non_restored_state = match job.get("allowNonRestoredState") {
        None => false,
        Some(Value::Bool(value)) => *value,
        Some(_) => return Err(error("spec.job.allowNonRestoredState", "must be true or false")),
    };
    let savepoint_trigger_nonce = match job.get("savepointTriggerNonce") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_i64() {
            Some(nonce) => Some(nonce),
            None => return Err(error("spec.job.savepointTriggerNonce", "must be an integer")),
        },
    };
    let initial_savepoint_path = optional_string(job, "spec.job", "initialSavepointPath")?;
    if initial_savepoint_path.as_deref().is_some_and(|p| p.trim().is_empty()) {
        return Err(error("spec.job.initialSavepointPath", "is empty; remove it or name a savepoint or checkpoint"));
    }
    Ok(JobSpec {
        name: required_string(job, "spec.job", "name")?,
        args,
        parallelism: optional_u32(job, "spec.job", "parallelism", 1)?,
        upgrade_mode,
        state,
        initial_savepoint_path,
        allow_non_restored_state,
        savepoint_trigger_nonce,
    })
}

fn parse_args(job: &serde_norway::Mapping) -> Result<Vec<String>, SpecError> {
    let mut args = Vec::new();
    if let Some(value) = job.get("args") {
        let Some(items) = value.as_sequence() else {
            return Err(error("spec.job.args", "must be a list of arguments (`args: [--users, \"1000\"]`)"));
        };
        for (index, item) in items.iter().enumerate() {
            args.push(scalar(item, &format!("spec.job.args[{index}]"))?);
        }
    }
    Ok(args)
}

fn parse_upgrade_mode(job: &serde_norway::Mapping) -> Result<UpgradeMode, SpecError> {
    Ok(match optional_string(job, "spec.job", "upgradeMode")?.as_deref() {
        None => UpgradeMode::default(),
        Some("savepoint") => UpgradeMode::Savepoint,
        Some("last-state") => UpgradeMode::LastState,
        Some("stateless") => UpgradeMode::Stateless,
        Some(other) => {
            return Err(error(
                "spec.job.upgradeMode",
                format!("'{other}' is not one of savepoint, last-state, stateless"),
            ));
        }
    })
}

fn parse_desired_state(job: &serde_norway::Mapping) -> Result<DesiredState, SpecError> {
    Ok(match optional_string(job, "spec.job", "state")?.as_deref() {
        None => DesiredState::default(),
        Some("running") => DesiredState::Running,
        Some("suspended") => DesiredState::Suspended,
        Some(other) => return Err(error("spec.job.state", format!("'{other}' is not one of running, suspended"))),
    })
}

/// The keys the controller sets from other fields of the spec.
const MANAGED_KEYS: &[(&str, &str)] = &[
    ("taskmanager.numberOfTaskSlots", "spec.taskManager.slots"),
    ("parallelism.default", "spec.job.parallelism"),
    // One per cluster: a new cluster must never recover an earlier cluster's job.
    ("high-availability.cluster-id", "metadata.name (each cluster gets deployment-<name>-<n>)"),
    ("kubernetes.cluster-id", "metadata.name (each cluster gets deployment-<name>-<n>)"),
];

/// What no field can show alone: the configuration's values, HA for several JobManagers,
/// enough slots for the parallelism.
pub fn check(spec: &DeploymentSpec, warnings: &mut Vec<String>) -> Result<(), SpecError> {
    for (key, field) in MANAGED_KEYS {
        if spec.configuration.contains_key(*key) {
            return Err(error(
                &format!("spec.configuration.{key}"),
                format!("is set by the controller; set {field} instead"),
            ));
        }
    }
    let mut config = configuration(spec);
    // Validated as the controller runs it: it gives an HA cluster a storage directory of the
    // deployment's own when the spec names none.
    if high_availability(&spec.configuration) && !spec.configuration.contains_key("high-availability.storageDir") {
        config.set_from("high-availability.storageDir", "file:///deployment/ha", "the controller's default");
    }
    config.validate().map_err(|e| error("spec.configuration", e.to_string()))?;
    for warning in config.warnings() {
        warnings.push(format!("spec.configuration: {warning}"));
    }
    let ha = config
        .get(&weir_config::options::HIGH_AVAILABILITY_TYPE)
        .map_err(|e| error("spec.configuration", e.to_string()))?;
    if spec.job_manager.replicas > 1 && !ha.is_enabled() {
        return Err(error(
            "spec.jobManager.replicas",
            format!(
                "{} JobManagers need high-availability.type: etcd (or kubernetes on Kubernetes) in spec.configuration (standbys take over through it)",
                spec.job_manager.replicas
            ),
        ));
    }
    let parallelism = spec.job.parallelism.unwrap_or(1);
    let slots = u64::from(spec.task_manager.replicas) * u64::from(spec.task_manager.slots);
    // In native mode the JobManager creates as many TaskManagers as the slots need.
    if u64::from(parallelism) > slots && spec.mode != Some(KubernetesMode::Native) {
        return Err(error(
            "spec.job.parallelism",
            format!(
                "{parallelism} needs {parallelism} slots, and spec.taskManager gives {slots} ({} TaskManager(s) with {} slot(s)); raise spec.taskManager.replicas or .slots",
                spec.task_manager.replicas, spec.task_manager.slots
            ),
        ));
    }
    let checkpointing = config.get(&weir_config::options::CHECKPOINTING_INTERVAL).ok().flatten().is_some();
    if spec.job.upgrade_mode == UpgradeMode::LastState && !checkpointing {
        warnings.push(
            "spec.job.upgradeMode: last-state without execution.checkpointing.interval in spec.configuration: an upgrade will find no checkpoint to start from".to_string(),
        );
    }
    Ok(())
}

/// The spec's configuration as a [`weir_config::Configuration`], each value from
/// `spec.configuration`.
pub fn configuration(spec: &DeploymentSpec) -> weir_config::Configuration {
    let mut config = weir_config::Configuration::new();
    for (key, value) in &spec.configuration {
        config.set_from(key.clone(), value.clone(), "spec.configuration");
    }
    config
}

/// The differences between two specs that an upgrade must carry out: everything but the
/// fields only the controller's decisions read (`upgradeMode`, `allowNonRestoredState`,
/// `savepointTriggerNonce`, `state`) and the operator's own `kubernetes.operator.*` keys, as
/// the Flink operator diffs. A new `initialSavepointPath` counts: the new spec starts there
/// (the lesson's manual rollback).
pub fn upgrade_diff(old: &DeploymentSpec, new: &DeploymentSpec) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if old.binary != new.binary {
        changed.push("spec.binary");
    }
    if old.image != new.image {
        changed.push("spec.image");
    }
    if old.image_pull_policy != new.image_pull_policy {
        changed.push("spec.imagePullPolicy");
    }
    if old.service_account != new.service_account {
        changed.push("spec.serviceAccount");
    }
    if old.mode != new.mode {
        changed.push("spec.mode");
    }
    if old.pod_template != new.pod_template {
        changed.push("spec.podTemplate");
    }
    let relevant = |spec: &DeploymentSpec| -> BTreeMap<String, String> {
        spec.configuration
            .iter()
            .filter(|(key, _)| !key.starts_with("kubernetes.operator."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    if relevant(old) != relevant(new) {
        changed.push("spec.configuration");
    }
    if old.job_manager != new.job_manager {
        changed.push("spec.jobManager");
    }
    if old.task_manager != new.task_manager {
        changed.push("spec.taskManager");
    }
    if old.job.name != new.job.name {
        changed.push("spec.job.name");
    }
    if old.job.args != new.job.args {
        changed.push("spec.job.args");
    }
    if old.job.parallelism != new.job.parallelism {
        changed.push("spec.job.parallelism");
    }
    if new.job.initial_savepoint_path.is_some() && old.job.initial_savepoint_path != new.job.initial_savepoint_path {
        changed.push("spec.job.initialSavepointPath");
    }
    changed
}

fn check_name(name: &str) -> Result<(), SpecError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(error(
            "metadata.name",
            format!(
                "'{name}' is not a valid name: 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
            ),
        ))
    }
}

fn mapping<'a>(value: &'a Value, path: &str) -> Result<&'a serde_norway::Mapping, SpecError> {
    value.as_mapping().ok_or_else(|| error(path, "must be a mapping of fields"))
}

fn allowed_keys(map: &serde_norway::Mapping, path: &str, allowed: &[&str]) -> Result<(), SpecError> {
    for key in map.keys() {
        let name = key.as_str().unwrap_or("?");
        if !allowed.contains(&name) {
            let at = if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
            return Err(error(&at, format!("unknown field; expected one of {}", allowed.join(", "))));
        }
    }
    Ok(())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn required<'a>(map: &'a serde_norway::Mapping, path: &str, key: &str) -> Result<&'a Value, SpecError> {
    map.get(key).ok_or_else(|| error(&join(path, key), "is required"))
}

fn required_string(map: &serde_norway::Mapping, path: &str, key: &str) -> Result<String, SpecError> {
    let value = required(map, path, key)?;
    value.as_str().map(str::to_string).ok_or_else(|| error(&join(path, key), "must be a string"))
}

fn optional_string(map: &serde_norway::Mapping, path: &str, key: &str) -> Result<Option<String>, SpecError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(error(&join(path, key), "must be a string")),
    }
}

fn optional_u32(map: &serde_norway::Mapping, path: &str, key: &str, min: u32) -> Result<Option<u32>, SpecError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= min => Ok(Some(n)),
            _ => Err(error(&join(path, key), format!("must be an integer of at least {min}"))),
        },
    }
}

/// A string, number or boolean as text (configuration values and arguments).
fn scalar(value: &Value, path: &str) -> Result<String, SpecError> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Number(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        _ => Err(error(path, "must be a string, number or boolean")),
    }
}

/// Whether `configuration` turns high availability on (`high-availability.type` etcd or
/// kubernetes).
pub fn high_availability(configuration: &BTreeMap<String, String>) -> bool {
    high_availability_type(configuration).is_some_and(|ha| ha.is_enabled())
}

/// The `high-availability.type` `configuration` names, if a valid one.
pub fn high_availability_type(configuration: &BTreeMap<String, String>) -> Option<weir_config::HighAvailabilityType> {
    configuration.get("high-availability.type").and_then(|t| t.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: weir.dev/v1
kind: WeirDeployment
metadata:
  name: orders
spec:
  binary: /usr/bin/weir
  configuration:
    execution.checkpointing.interval: 1s
    state.checkpoints.num-retained: 2
  taskManager:
    replicas: 2
    slots: 2
  job:
    name: counter
    args: [--users, 1000, --output, /tmp/out]
    parallelism: 4
    upgradeMode: savepoint
"#;

    fn parse_ok(text: &str) -> WeirDeployment {
        parse(text, &mut Vec::new()).unwrap()
    }

    fn parse_err(text: &str) -> String {
        parse(text, &mut Vec::new()).unwrap_err().to_string()
    }

    #[test]
    fn a_full_spec_parses_with_defaults_filled_in() {
        let deployment = parse_ok(GOOD);
        assert_eq!(deployment.metadata.name, "orders");
        assert_eq!(deployment.spec.job.args, ["--users", "1000", "--output", "/tmp/out"]);
        assert_eq!(deployment.spec.configuration["state.checkpoints.num-retained"], "2");
        assert_eq!(deployment.spec.job.upgrade_mode, UpgradeMode::Savepoint);
        assert_eq!(deployment.spec.job.state, DesiredState::Running);
        assert_eq!(deployment.spec.job_manager.replicas, 1);
        assert_eq!(deployment.spec.task_manager, TaskManagerSpec { replicas: 2, slots: 2, resource: None });
        // It round-trips through the store's JSON.
        let json = serde_json::to_string(&deployment).unwrap();
        assert_eq!(serde_json::from_str::<WeirDeployment>(&json).unwrap(), deployment);
    }

    /// The Kubernetes fields parse (so one manifest serves both operators) and the process
    /// operator says it does not read them; their mistakes name the field.
    #[test]
    fn kubernetes_fields_parse_with_a_warning_and_their_mistakes_name_the_field() {
        let text = GOOD.replace(
            "  taskManager:\n    replicas: 2\n",
            "  image: weir.local/weir:dev\n  imagePullPolicy: Never\n  podTemplate:\n    metadata: { labels: { team: a } }\n  taskManager:\n    resource: { cpu: 0.5, memory: 1g }\n    replicas: 2\n",
        );
        let mut warnings = Vec::new();
        let deployment = parse(&text, &mut warnings).unwrap();
        assert_eq!(deployment.spec.image.as_deref(), Some("weir.local/weir:dev"));
        assert_eq!(deployment.spec.pod_template.as_ref().unwrap()["metadata"]["labels"]["team"], "a");
        let resource = deployment.spec.task_manager.resource.clone().unwrap();
        assert_eq!((resource.cpu.unwrap().as_f64(), resource.memory.as_deref()), (Some(0.5), Some("1g")));
        for field in ["spec.image", "spec.imagePullPolicy", "spec.podTemplate", "spec.taskManager.resource"] {
            assert!(
                warnings.iter().any(|w| w.starts_with(&format!("{field}: read only by `weir operator --kubernetes`"))),
                "{warnings:?}"
            );
        }
        let policy = text.replace("imagePullPolicy: Never", "imagePullPolicy: Sometimes");
        assert_eq!(parse_err(&policy), "spec.imagePullPolicy: 'Sometimes' is not one of Always, IfNotPresent, Never");
        let cpu = text.replace("cpu: 0.5", "cpu: -1");
        assert!(
            parse_err(&cpu).starts_with("spec.taskManager.resource.cpu: must be a positive number"),
            "{}",
            parse_err(&cpu)
        );
        // A new image is an upgrade.
        let mut newer = deployment.spec.clone();
        newer.image = Some("weir.local/weir:v2".into());
        assert_eq!(upgrade_diff(&deployment.spec, &newer), ["spec.image"]);
    }

    #[test]
    fn mistakes_name_the_field_path_and_the_allowed_values() {
        let bad_mode = GOOD.replace("upgradeMode: savepoint", "upgradeMode: snapshot");
        assert_eq!(
            parse_err(&bad_mode),
            "spec.job.upgradeMode: 'snapshot' is not one of savepoint, last-state, stateless"
        );
        let bad_state = GOOD.replace("upgradeMode: savepoint", "state: paused");
        assert_eq!(parse_err(&bad_state), "spec.job.state: 'paused' is not one of running, suspended");
        let unknown = GOOD.replace("parallelism: 4", "paralellism: 4");
        assert!(parse_err(&unknown).starts_with("spec.job.paralellism: unknown field; expected one of name, args"));
        let missing = GOOD.replace("    name: counter\n", "");
        assert_eq!(parse_err(&missing), "spec.job.name: is required");
        let zero = GOOD.replace("parallelism: 4", "parallelism: 0");
        assert_eq!(parse_err(&zero), "spec.job.parallelism: must be an integer of at least 1");
        let too_wide = GOOD.replace("parallelism: 4", "parallelism: 5");
        assert!(parse_err(&too_wide).starts_with("spec.job.parallelism: 5 needs 5 slots"), "{}", parse_err(&too_wide));
        let bad_value = GOOD.replace("interval: 1s", "interval: soon");
        let text = parse_err(&bad_value);
        assert!(text.starts_with("spec.configuration:") && text.contains("execution.checkpointing.interval"), "{text}");
        let managed = GOOD.replace("interval: 1s", "interval: 1s\n    taskmanager.numberOfTaskSlots: 4");
        assert_eq!(
            parse_err(&managed),
            "spec.configuration.taskmanager.numberOfTaskSlots: is set by the controller; set spec.taskManager.slots instead"
        );
        let ha = GOOD.replace("  taskManager:", "  jobManager:\n    replicas: 2\n  taskManager:");
        assert!(
            parse_err(&ha).starts_with(
                "spec.jobManager.replicas: 2 JobManagers need high-availability.type: etcd (or kubernetes"
            )
        );
        let name = GOOD.replace("name: orders", "name: Orders_1");
        assert!(parse_err(&name).starts_with("metadata.name: 'Orders_1' is not a valid name"));
        let version = GOOD.replace("weir.dev/v1", "flink.apache.org/v1alpha9");
        assert!(parse_err(&version).starts_with("apiVersion: this is the Flink Kubernetes Operator's FlinkDeployment"));
        let version = GOOD.replace("weir.dev/v1", "example.com/v1");
        assert_eq!(parse_err(&version), "apiVersion: 'example.com/v1' is not weir.dev/v1");
        assert!(parse_err("just text").starts_with("(file): must be a mapping"));
        assert!(parse_err("a: [").starts_with("(file): not YAML"));
    }

    /// A FlinkDeployment applied by mistake gets every change it needs in one error.
    #[test]
    fn a_flink_deployment_is_told_every_difference_at_once() {
        let flink = "apiVersion: flink.apache.org/v1beta1\nkind: FlinkDeployment\nmetadata:\n  name: basic\nspec:\n  image: flink:1.17\n  flinkVersion: v1_17\n  flinkConfiguration:\n    taskmanager.numberOfTaskSlots: \"2\"\n  serviceAccount: flink\n  jobManager:\n    resource: {memory: 2048m, cpu: 1}\n  taskManager:\n    resource: {memory: 2048m, cpu: 1}\n  job:\n    jarURI: local:///opt/flink/examples/streaming/StateMachineExample.jar\n    entryClass: org.apache.flink.examples.StateMachine\n    parallelism: 2\n    upgradeMode: stateless\n    checkpointTriggerNonce: 1\n";
        let text = parse_err(flink);
        for needle in [
            "apiVersion: weir.dev/v1 and kind: WeirDeployment",
            "spec.job.jarURI and spec.job.entryClass -> spec.binary",
            "spec.flinkConfiguration -> spec.configuration (the same keys), but taskmanager.numberOfTaskSlots -> spec.taskManager.slots",
            "remove spec.flinkVersion",
            "remove spec.job.checkpointTriggerNonce",
            "spec.image, spec.serviceAccount, spec.jobManager, spec.taskManager and spec.job's parallelism",
            "docs/coming-from-flink.md",
        ] {
            assert!(text.contains(needle), "no '{needle}' in: {text}");
        }
    }

    #[test]
    fn last_state_without_checkpoints_is_a_warning() {
        let text = GOOD
            .replace("upgradeMode: savepoint", "upgradeMode: last-state")
            .replace("    execution.checkpointing.interval: 1s\n", "");
        let mut warnings = Vec::new();
        parse(&text, &mut warnings).unwrap();
        assert!(
            warnings.iter().any(|w| w.contains("last-state without execution.checkpointing.interval")),
            "{warnings:?}"
        );
    }

    #[test]
    fn the_upgrade_diff_ignores_what_only_decisions_read() {
        let old = parse_ok(GOOD).spec;
        let mut new = old.clone();
        new.job.upgrade_mode = UpgradeMode::LastState;
        new.job.allow_non_restored_state = true;
        new.job.savepoint_trigger_nonce = Some(3);
        new.job.state = DesiredState::Suspended;
        new.configuration.insert("kubernetes.operator.deployment.rollback.enabled".into(), "true".into());
        assert!(upgrade_diff(&old, &new).is_empty());
        new.job.parallelism = Some(3);
        new.binary = "/usr/local/bin/my-weir".into();
        new.job.initial_savepoint_path = Some("/sp/savepoint-1".into());
        assert_eq!(upgrade_diff(&old, &new), ["spec.binary", "spec.job.parallelism", "spec.job.initialSavepointPath"]);
    }
}
