//! JSON-schema helpers for the spec and status types, which the Kubernetes backend turns into
//! the `WeirDeployment` CRD's structural schema.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An object of any fields (a pod template): Kubernetes keeps its fields as given
/// (`x-kubernetes-preserve-unknown-fields`) instead of pruning those the schema does not
/// name.
pub fn any_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
