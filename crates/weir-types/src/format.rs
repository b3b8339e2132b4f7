//! The two layouts of a snapshot's keyed state, shared by the API (barriers ask for one),
//! the snapshot format (`_metadata` records it) and the CLI (`--type`).

/// How a snapshot's keyed state is laid out (Flink's `SavepointFormatType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SnapshotFormat {
    /// Portable: every key group's entries sorted by key bytes; restores into any state
    /// backend, rewritable to another max parallelism. Savepoints' default.
    #[default]
    Canonical,
    /// The backend's own layout, as fast as it can write it (the heap backend: entries in
    /// its tables' order); restores only into the backend that wrote it. Checkpoints use it.
    Native,
}

impl std::str::FromStr for SnapshotFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<SnapshotFormat, String> {
        match text.to_ascii_lowercase().as_str() {
            "canonical" => Ok(SnapshotFormat::Canonical),
            "native" => Ok(SnapshotFormat::Native),
            other => Err(format!("'{other}' is not a snapshot format: use canonical or native")),
        }
    }
}

impl SnapshotFormat {
    /// Flink's spelling: `CANONICAL` or `NATIVE`.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotFormat::Canonical => "CANONICAL",
            SnapshotFormat::Native => "NATIVE",
        }
    }

    /// True for [`SnapshotFormat::Canonical`] (serde's `skip_serializing_if`).
    pub fn is_canonical(&self) -> bool {
        *self == SnapshotFormat::Canonical
    }
}
