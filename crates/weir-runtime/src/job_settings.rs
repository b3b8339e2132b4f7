//! What the cluster and the submitter decide about a job beyond its code: parallelism
//! defaults, checkpointing, the snapshot it starts from, restarts, where its subtasks run and
//! its high-availability wiring. Kept apart from the job graph, which needs only the
//! parallelism defaults ([`GraphDefaults`]), so the graph does not depend on executors.

pub use crate::jobgraph::DEFAULT_AUTO_WATERMARK_INTERVAL_MS;
use crate::jobgraph::GraphDefaults;

/// What the cluster and the submitter decide about a job beyond its code.
#[derive(Clone, Default)]
pub struct JobSettings {
    /// `parallelism.default` or `-p`.
    pub default_parallelism: u32,
    /// `pipeline.max-parallelism`, if set (a restore sets the snapshot's).
    pub max_parallelism: Option<u32>,
    /// Checkpointing options.
    pub checkpointing: crate::checkpointing::CheckpointSettings,
    /// The snapshot to start from.
    pub restore: Option<std::sync::Arc<crate::checkpointing::RestoreSource>>,
    /// What happens after a failure.
    pub restart: crate::restart::RestartStrategyConfig,
    /// Where subtasks run (`None`: threads of this process).
    pub executor: Option<std::sync::Arc<dyn crate::executor::Executor>>,
    /// `jobmanager.execution.failover-strategy: full`: every failure restarts the whole job
    /// instead of only the failed pipelined region (Flink's default `region`).
    pub failover_full: bool,
    /// High availability: the job's HA store, and what a new leader recovered.
    pub ha: Option<JobHa>,
    /// `pipeline.auto-watermark-interval` in ms (`None`: Flink's 200 ms).
    pub auto_watermark_interval_ms: Option<u64>,
    /// The job master's clock: the system's, or a test's.
    pub clock: crate::control_clock::ControlClock,
}

/// A job's high-availability wiring.
#[derive(Clone)]
pub struct JobHa {
    /// Where the job master records counters, checkpoint pointers, savepoint requests and
    /// the job's result, under its JobManager's leadership.
    pub store: weir_ha::JobStore,
    /// Set when a new leader recovers the job from the HA store.
    pub recovered: Option<weir_ha::RecoverableJob>,
    /// How long a recovered job waits for the TaskManagers to report its running attempt.
    pub reconcile_timeout: std::time::Duration,
}

impl JobSettings {
    /// Settings with a default parallelism and nothing else.
    pub fn with_parallelism(default_parallelism: u32) -> JobSettings {
        JobSettings { default_parallelism, ..JobSettings::default() }
    }
}

impl GraphDefaults for JobSettings {
    fn default_parallelism(&self) -> u32 {
        self.default_parallelism
    }

    fn max_parallelism(&self) -> Option<u32> {
        self.max_parallelism
    }

    fn auto_watermark_interval_ms(&self) -> Option<u64> {
        self.auto_watermark_interval_ms
    }
}
