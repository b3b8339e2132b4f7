//! Flink's configuration keys that weir does not take, classified, so that a Flink
//! `config.yaml` brought over gets a warning that says why each key is ignored and what to
//! do instead, not one "unknown key" for all of them.

/// Why weir ignores a Flink key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlinkKeyClass {
    /// It configures something weir does not have (a JVM, its memory pools, Akka/Pekko,
    /// YARN, a blob server, a classloader).
    NotApplicable,
    /// It chooses something weir always does one way.
    AlwaysSo,
    /// weir does not do it yet.
    NotSupportedYet,
}

impl FlinkKeyClass {
    fn words(self) -> &'static str {
        match self {
            FlinkKeyClass::NotApplicable => "not applicable in weir",
            FlinkKeyClass::AlwaysSo => "always so in weir",
            FlinkKeyClass::NotSupportedYet => "not supported by weir yet",
        }
    }
}

/// Flink's keys, or key prefixes (ending in `.`), by class, with the reason a user reads.
/// The first match wins, so an exact key comes before a prefix that covers it.
const FLINK_KEYS: &[(&str, FlinkKeyClass, &str)] = {
    use FlinkKeyClass::{AlwaysSo, NotApplicable, NotSupportedYet};
    &[
        // Memory: no JVM, so no heap, off-heap, managed or network pools to size.
        (
            "taskmanager.memory.",
            NotApplicable,
            "no JVM: a TaskManager's memory is not divided into heap, off-heap, managed and network pools; cap the process with taskmanager.memory.process.size and size the state backend with state.backend.spillable.memory or state.backend.fjall.memory",
        ),
        ("jobmanager.memory.", NotApplicable, "no JVM: the JobManager's memory is not divided into pools"),
        (
            "taskmanager.network.",
            NotApplicable,
            "no network buffer pools: exchanges are bounded channels with credit-based flow control",
        ),
        ("env.java.", NotApplicable, "no JVM to pass options to"),
        ("env.", NotApplicable, "Flink's start scripts' environment; weir is one binary (WEIR_DATA_DIR, WEIR_LOG)"),
        ("classloader.", NotApplicable, "jobs are compiled into the binary: no classloading"),
        ("pekko.", NotApplicable, "no Pekko: the control plane is weir's own RPC"),
        ("akka.", NotApplicable, "no Akka: the control plane is weir's own RPC"),
        ("blob.", NotApplicable, "no blob server: jobs are compiled into the binary"),
        ("yarn.", NotApplicable, "weir does not run on YARN"),
        ("python.", NotApplicable, "no PyFlink: jobs are Rust compiled into the binary"),
        ("web.upload.dir", NotApplicable, "no jar uploads: jobs are compiled into the binary"),
        ("web.tmpdir", NotApplicable, "the Web UI is compiled into the binary"),
        ("jobmanager.archive.", NotApplicable, "no history server"),
        ("historyserver.", NotApplicable, "no history server"),
        (
            "state.backend.rocksdb.",
            NotApplicable,
            "weir's disk state backend is fjall (state.backend.type: fjall, state.backend.fjall.memory), not RocksDB",
        ),
        // Always one way.
        ("web.submit.enable", AlwaysSo, "off: jobs are compiled into the binary (weir jobs lists them)"),
        ("web.cancel.enable", AlwaysSo, "on: the Web UI cancels jobs"),
        (
            "metrics.reporter.",
            AlwaysSo,
            "Prometheus text is always served at the REST port's /metrics, under Flink's names",
        ),
        ("metrics.reporters", AlwaysSo, "Prometheus text is always served at the REST port's /metrics"),
        (
            "pipeline.object-reuse",
            AlwaysSo,
            "records are owned values passed on, never copied between chained operators",
        ),
        ("pipeline.generic-types", AlwaysSo, "records are Rust types serialised with serde; there is no Kryo fallback"),
        ("pipeline.closure-cleaner-level", AlwaysSo, "no closures to clean: jobs are compiled Rust"),
        (
            "execution.checkpointing.externalized-checkpoint-retention",
            AlwaysSo,
            "RETAIN_ON_CANCELLATION: the newest state.checkpoints.num-retained checkpoints outlive a cancel",
        ),
        (
            "execution.checkpointing.snapshot-compression",
            AlwaysSo,
            "snapshots are written as weir's format chooses (docs/savepoint-format.md)",
        ),
        ("cluster.evenly-spread-out-slots", AlwaysSo, "slots are taken in order of the TaskManagers' registration"),
        ("execution.runtime-mode", AlwaysSo, "STREAMING: bounded inputs end the job when they end"),
        // Not yet.
        (
            "execution.checkpointing.unaligned.",
            NotSupportedYet,
            "of the unaligned options only execution.checkpointing.unaligned.enabled is taken; in-flight records are always part of the checkpoint",
        ),
        (
            "execution.checkpointing.aligned-checkpoint-timeout",
            NotSupportedYet,
            "a checkpoint is aligned or unaligned from its start (execution.checkpointing.unaligned.enabled)",
        ),
        (
            "state.changelog.",
            NotSupportedYet,
            "no changelog state backend; incremental checkpoints are execution.checkpointing.incremental",
        ),
        ("state.backend.changelog.", NotSupportedYet, "no changelog state backend"),
        (
            "jobmanager.scheduler",
            NotSupportedYet,
            "no adaptive scheduler: rescale by stop and restore with a new -p (or a deployment upgrade)",
        ),
        ("scheduler-mode", NotSupportedYet, "no reactive mode: rescale by stop and restore"),
        ("jobmanager.adaptive-scheduler.", NotSupportedYet, "no adaptive scheduler"),
        ("table.", NotSupportedYet, "no SQL yet"),
        ("sql-client.", NotSupportedYet, "no SQL yet"),
        ("sql-gateway.", NotSupportedYet, "no SQL yet"),
        ("security.kerberos.", NotSupportedYet, "no Kerberos"),
        (
            "security.ssl.rest.",
            NotSupportedYet,
            "the REST API has no TLS of its own: put a TLS proxy in front (security.ssl.internal.* protects the cluster's own connections)",
        ),
        (
            "security.ssl.enabled",
            NotSupportedYet,
            "use security.ssl.internal.enabled for the cluster's own connections",
        ),
        (
            "s3.",
            NotSupportedYet,
            "S3 is configured with the AWS_* environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)",
        ),
        (
            "fs.",
            NotSupportedYet,
            "file systems are chosen by URL scheme (file://, s3://); S3 takes the AWS_* environment variables",
        ),
        (
            "high-availability.zookeeper.",
            NotSupportedYet,
            "high availability runs on etcd or Kubernetes (high-availability.type: etcd | kubernetes)",
        ),
        (
            "kubernetes.jobmanager.",
            NotSupportedYet,
            "the operator's WeirDeployment takes the JobManager's pod settings",
        ),
        (
            "kubernetes.taskmanager.",
            NotSupportedYet,
            "the operator's WeirDeployment takes the TaskManagers' pod settings",
        ),
        (
            "execution.buffer-timeout",
            NotSupportedYet,
            "partial batches are flushed every 100 ms and whenever a task goes idle",
        ),
        ("rest.bind-port", NotSupportedYet, "use rest.port (0 for any free port)"),
        (
            "jobmanager.rpc.",
            NotSupportedYet,
            "jobmanager.rpc.address and jobmanager.rpc.port are taken; the others are Pekko's",
        ),
        ("heartbeat.rpc-failure-threshold", NotSupportedYet, "a lost connection counts as a lost TaskManager at once"),
        (
            "restart-strategy.",
            NotSupportedYet,
            "weir takes restart-strategy.type and the fixed-delay, failure-rate and exponential-delay keys",
        ),
        (
            "execution.checkpointing.",
            NotSupportedYet,
            "see docs/configuration.md for the checkpointing keys weir takes",
        ),
        ("state.", NotSupportedYet, "see docs/configuration.md for the state keys weir takes"),
        ("metrics.", NotSupportedYet, "metrics are always Prometheus text at /metrics"),
        ("web.", NotSupportedYet, "the Web UI is served at the REST port, without further settings"),
        ("jobmanager.", NotSupportedYet, "see docs/configuration.md for the JobManager keys weir takes"),
        ("taskmanager.", NotSupportedYet, "see docs/configuration.md for the TaskManager keys weir takes"),
        ("high-availability.", NotSupportedYet, "see docs/high-availability.md for the keys weir takes"),
        ("kubernetes.", NotSupportedYet, "see docs/kubernetes.md for the keys weir takes"),
        ("pipeline.", NotSupportedYet, "see docs/configuration.md for the pipeline keys weir takes"),
        ("execution.", NotSupportedYet, "see docs/configuration.md for the execution keys weir takes"),
        ("rest.", NotSupportedYet, "weir takes rest.address, rest.port, rest.bind-address and rest.retry.*"),
        ("cluster.", NotSupportedYet, "no such cluster setting in weir"),
        ("parallelism.", NotSupportedYet, "weir takes parallelism.default"),
        ("security.", NotSupportedYet, "see docs/security.md for the keys weir takes"),
    ]
};

/// The class of a Flink key weir does not take, and why, if it is one of Flink's.
pub fn classify(key: &str) -> Option<(FlinkKeyClass, &'static str)> {
    FLINK_KEYS
        .iter()
        .find(|(pattern, _, _)| if pattern.ends_with('.') { key.starts_with(pattern) } else { key == *pattern })
        .map(|(_, class, reason)| (*class, *reason))
}

/// The warning for a Flink key weir does not take, from `source`.
pub fn warning(key: &str, source: &str) -> Option<String> {
    let (class, reason) = classify(key)?;
    Some(format!("configuration key '{key}' (from {source}) is {}: {reason}; it is ignored", class.words()))
}

#[cfg(test)]
mod tests {
    use super::{FlinkKeyClass, classify, warning};

    #[test]
    fn flink_keys_are_classified_by_the_first_pattern_that_fits() {
        assert_eq!(classify("taskmanager.memory.task.heap.size").map(|c| c.0), Some(FlinkKeyClass::NotApplicable));
        assert_eq!(classify("taskmanager.memory.managed.fraction").map(|c| c.0), Some(FlinkKeyClass::NotApplicable));
        assert_eq!(classify("env.java.opts.all").map(|c| c.0), Some(FlinkKeyClass::NotApplicable));
        assert_eq!(classify("metrics.reporter.prom.factory.class").map(|c| c.0), Some(FlinkKeyClass::AlwaysSo));
        assert_eq!(
            classify("execution.checkpointing.unaligned.enabled").map(|c| c.0),
            Some(FlinkKeyClass::NotSupportedYet)
        );
        assert_eq!(classify("state.backend.rocksdb.memory.managed").map(|c| c.0), Some(FlinkKeyClass::NotApplicable));
        assert_eq!(classify("no.such.key"), None);
        let text = warning("web.submit.enable", "config.yaml").unwrap();
        assert!(text.contains("is always so in weir: off") && text.contains("(from config.yaml)"), "{text}");
    }
}
