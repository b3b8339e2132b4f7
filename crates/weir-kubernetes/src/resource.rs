//! The `WeirDeployment` custom resource: [`weir_deploy::DeploymentSpec`] under `spec` and
//! [`weir_deploy::DeploymentStatus`] under `status` (the status subresource), named as the
//! Flink Kubernetes Operator's `FlinkDeployment`. The CRD is generated from these types, so
//! the schema the API server validates against is the one the controller reads;
//! `deploy/kubernetes/crd.yaml` is that CRD, checked by a test against the types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use weir_deploy::{DeploymentSpec, DeploymentStatus};

/// The spec of a `WeirDeployment` resource: the deployment spec, field for field.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "weir.dev",
    version = "v1",
    kind = "WeirDeployment",
    plural = "weirdeployments",
    singular = "weirdeployment",
    shortname = "wd",
    namespaced,
    status = "DeploymentStatus",
    printcolumn = r#"{"name":"Job Status","type":"string","jsonPath":".status.jobStatus.state","description":"The job's state, as last observed"}"#,
    printcolumn = r#"{"name":"Lifecycle State","type":"string","jsonPath":".status.lifecycleState","description":"Where the deployment is in its lifecycle"}"#,
    printcolumn = r#"{"name":"Parallelism","type":"integer","jsonPath":".spec.job.parallelism","description":"The job's parallelism"}"#,
    printcolumn = r#"{"name":"Last Savepoint","type":"string","jsonPath":".status.savepointHistory[-1:].location","description":"The newest savepoint of the history"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct WeirDeploymentSpec {
    /// The deployment spec: image and binary, configuration, JobManagers, TaskManagers, job.
    #[serde(flatten)]
    pub deployment: DeploymentSpec,
}

/// The CRD of `WeirDeployment`.
pub fn crd() -> CustomResourceDefinition {
    WeirDeployment::crd()
}

/// The CRD as the YAML `kubectl apply -f` takes (`deploy/kubernetes/crd.yaml`).
pub fn crd_yaml() -> Result<String, serde_norway::Error> {
    let yaml = serde_norway::to_string(&crd())?;
    Ok(format!(
        "# The WeirDeployment custom resource definition, generated from the Rust types of\n# crates/weir-deploy (spec, status) by crates/weir-kubernetes: do not edit; regenerate with\n#   WEIR_UPDATE_CRD=1 cargo test -p weir-kubernetes crd\n{yaml}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRD is the one the types generate: a change of the spec or status
    /// types that is not regenerated fails here.
    #[test]
    fn the_committed_crd_is_generated_from_the_types() {
        let generated = crd_yaml().unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes/crd.yaml");
        if std::env::var_os("WEIR_UPDATE_CRD").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "deploy/kubernetes/crd.yaml differs from the CRD the Rust types generate; regenerate it with\n  WEIR_UPDATE_CRD=1 cargo test -p weir-kubernetes crd\nand commit it"
        );
    }

    /// Every example manifest reads into the resource and passes the controller's checks.
    #[test]
    fn the_example_manifests_are_valid_deployments() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes/examples");
        let mut checked = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let resource: WeirDeployment =
                serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let mut warnings = Vec::new();
            weir_deploy::spec::check(&resource.spec.deployment, &mut warnings)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked.push(path.file_name().unwrap().to_string_lossy().to_string());
        }
        checked.sort();
        assert_eq!(checked, ["basic.yaml", "ha.yaml", "orders.yaml"]);
    }

    /// A FlinkDeployment-shaped manifest reads into the typed resource, Kubernetes fields
    /// included, and writes back the same fields.
    #[test]
    fn a_manifest_with_the_flink_operators_field_names_round_trips() {
        let manifest = r#"
apiVersion: weir.dev/v1
kind: WeirDeployment
metadata:
  name: orders
spec:
  image: weir.local/weir:dev
  imagePullPolicy: Never
  serviceAccount: weir
  configuration:
    execution.checkpointing.interval: 10s
  jobManager:
    replicas: 1
    resource: { cpu: 0.5, memory: 1024m }
  taskManager:
    replicas: 2
    slots: 2
    resource: { cpu: 1, memory: 2048m }
  podTemplate:
    metadata:
      labels: { team: orders }
  job:
    name: counter
    args: [--users, "1000"]
    parallelism: 4
    upgradeMode: savepoint
"#;
        let resource: WeirDeployment = serde_norway::from_str(manifest).unwrap();
        let spec = &resource.spec.deployment;
        assert_eq!(spec.image.as_deref(), Some("weir.local/weir:dev"));
        assert_eq!(spec.task_manager.resource.as_ref().and_then(|r| r.memory.as_deref()), Some("2048m"));
        assert_eq!(spec.job.parallelism, Some(4));
        assert_eq!(spec.pod_template.as_ref().unwrap()["metadata"]["labels"]["team"], "orders");
        let json = serde_json::to_value(&resource).unwrap();
        assert_eq!(json["spec"]["jobManager"]["resource"]["cpu"], 0.5);
        assert_eq!(json["spec"]["job"]["upgradeMode"], "savepoint");
        assert!(json["spec"].get("binary").is_none(), "an empty binary is not written");
    }
}
