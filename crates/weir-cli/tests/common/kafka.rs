//! A real Kafka-protocol broker with transactions for the tests: noida-db (PyPI), started on
//! a free port with a fresh data directory and killed when dropped. `$WEIR_NOIDA_DB` names
//! its binary; without it the copy `.ci/test` installs in `.ci/venv` is used. Missing, the
//! test fails naming the install command.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const INSTALL: &str =
    "python3 -m venv .ci/venv && .ci/venv/bin/pip install noida-db==0.2.3 (.ci/test does it and sets WEIR_NOIDA_DB)";

fn binary() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if let Ok(path) = std::env::var("WEIR_NOIDA_DB") {
        // Relative to the workspace (tests run in their crate's directory).
        return root.join(path);
    }
    let lib = root.join(".ci/venv/lib");
    for entry in std::fs::read_dir(&lib).into_iter().flatten().flatten() {
        let candidate = entry.path().join("site-packages/noida_db/noida-db");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "the Kafka broker noida-db is not installed (no $WEIR_NOIDA_DB, nothing in {}); install it: {INSTALL}",
        lib.display()
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running broker.
pub struct Broker {
    child: Child,
    _data: tempfile::TempDir,
    pub bootstrap: String,
}

impl Broker {
    pub fn start() -> Broker {
        Broker::start_with("127.0.0.1", free_port, |program| Command::new(program))
    }

    /// A broker listening on `host` (and advertising it) on a port `port` gives, run by the
    /// command `command` makes for the broker's binary (on a host of the multi-host test bed,
    /// say).
    #[allow(dead_code)]
    pub fn start_with(host: &str, port: impl Fn() -> u16, command: impl Fn(&std::path::Path) -> Command) -> Broker {
        // Another test's broker may take the free port first: then ours exits, and we retry.
        for _ in 0..5 {
            let data = tempfile::tempdir().unwrap();
            let port = port();
            let mut child = command(&binary())
                .args(["start", "--only", "kafka", "--data-dir"])
                .arg(data.path())
                .args(["--host", host, "--kafka-port", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start noida-db: {e}; install it: {INSTALL}"));
            let bootstrap = format!("{host}:{port}");
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::net::TcpStream::connect(&bootstrap).is_err() && child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "noida-db did not open {bootstrap} within 20 s");
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(200));
            if child.try_wait().unwrap().is_none() {
                return Broker { child, _data: data, bootstrap };
            }
        }
        panic!("noida-db exited at start five times");
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap).set("log_level", "3");
        config
    }

    pub fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.config().create().unwrap();
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let results = futures::executor::block_on(admin.create_topics([&topic], &AdminOptions::new())).unwrap();
        for result in results {
            result.unwrap();
        }
    }

    /// Grows `topic` to `partitions` partitions.
    pub fn add_partitions(&self, topic: &str, partitions: usize) {
        let admin: AdminClient<DefaultClientContext> = self.config().create().unwrap();
        let grow = rdkafka::admin::NewPartitions::new(topic, partitions);
        let results = futures::executor::block_on(admin.create_partitions([&grow], &AdminOptions::new())).unwrap();
        for result in results {
            result.unwrap();
        }
    }

    /// Produces `values` round-robin over `partitions` partitions.
    pub fn produce(&self, topic: &str, partitions: i32, values: impl IntoIterator<Item = String>) {
        produce(&self.bootstrap, topic, partitions, values);
    }

    /// Every value a `read_committed` consumer reads from `topic`, waiting until there are at
    /// least `expected` or `within` passed.
    pub fn read_committed(&self, topic: &str, expected: usize, within: Duration) -> Vec<String> {
        self.read(topic, expected, within, "read_committed")
    }

    /// As [`Broker::read_committed`] with `isolation` (`read_uncommitted` sees aborted records).
    pub fn read(&self, topic: &str, expected: usize, within: Duration, isolation: &str) -> Vec<String> {
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", format!("test-reader-{}-{isolation}", std::process::id()))
            .set("isolation.level", isolation)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let mut values = Vec::new();
        let deadline = Instant::now() + within;
        while values.len() < expected && Instant::now() < deadline {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
                values.push(String::from_utf8_lossy(message.payload().unwrap_or_default()).to_string());
            }
        }
        // Anything more (duplicates) that arrives shortly after.
        let settle = Instant::now() + Duration::from_millis(500);
        while Instant::now() < settle {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) {
                values.push(String::from_utf8_lossy(message.payload().unwrap_or_default()).to_string());
            }
        }
        values
    }

    /// Waits until the partitions of `topic` end at `total` records in all, as the broker's
    /// offsets say (a bounded read stops at the offsets the broker gives when it starts, and
    /// this broker acknowledges a write a moment before its end offset shows it).
    pub fn wait_for_end(&self, topic: &str, partitions: i32, total: i64) {
        let consumer: BaseConsumer =
            self.config().set("group.id", "test-end").set("isolation.level", "read_uncommitted").create().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let end: i64 = (0..partitions)
                .map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(5)).map(|(_, high)| high).unwrap_or(0))
                .sum();
            if end >= total {
                return;
            }
            assert!(Instant::now() < deadline, "'{topic}' ends at {end} records, not {total}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The (low, high) offsets of each partition of `topic`.
    pub fn watermarks(&self, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
        let consumer: BaseConsumer =
            self.config().set("group.id", "test-end").set("isolation.level", "read_uncommitted").create().unwrap();
        (0..partitions).map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(5)).unwrap()).collect()
    }

    /// The offsets group `group` committed for `topic`'s partitions.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        let consumer: BaseConsumer = self.config().set("group.id", group).create().unwrap();
        let mut list = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(topic, p);
        }
        let committed = consumer.committed_offsets(list, Duration::from_secs(10)).unwrap();
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect()
    }
}

/// Produces `values` round-robin over `partitions` partitions of `topic` on `bootstrap`.
pub fn produce(bootstrap: &str, topic: &str, partitions: i32, values: impl IntoIterator<Item = String>) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("log_level", "3").create().unwrap();
    for (i, value) in values.into_iter().enumerate() {
        let partition = (i as i32) % partitions;
        let mut record = BaseRecord::<str, str>::to(topic).payload(&value).partition(partition);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, returned)) => {
                    record = returned;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
