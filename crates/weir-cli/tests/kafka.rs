//! Kafka with the real binary against a real broker (noida-db, started per test): a bounded
//! read that finishes, the group's offsets after checkpoints, Kafka -> counter -> Kafka
//! exactly once through `kill -9` at random points and rescales, a checkpoint that never
//! completed whose transaction never becomes visible, and the errors a user sees.

mod common;
use common::BoundedOutput;
#[path = "common/kafka.rs"]
mod kafka;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{RunningWeir, error_lines, newest_checkpoint, poll_json, run_weir};
use kafka::Broker;

/// One test of this file at a time: four brokers and their jobs at once on two cores make the
/// runs slow enough to time out.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Checks `user<TAB>count` lines: each user's counts are 1..=n once each, and the events
/// total `events`.
fn assert_counts_exactly_once(lines: &[String], events: usize) {
    let mut per_user: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in lines {
        let (user, count) = line.split_once('\t').unwrap_or_else(|| panic!("not user<TAB>count: {line:?}"));
        per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    for (user, counts) in &mut per_user {
        counts.sort_unstable();
        let expected: Vec<u64> = (1..=counts.len() as u64).collect();
        assert_eq!(*counts, expected, "user {user}: counts duplicated or missing");
    }
    assert_eq!(lines.len(), events, "{} counts for {events} events", lines.len());
}

#[test]
fn a_bounded_read_finishes_and_commits_the_group_offsets() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic("lines", 2);
    broker.create_topic("words", 1);
    let lines: Vec<String> = (0..300).map(|i| format!("apple banana w{}", i % 7)).collect();
    broker.produce("lines", 2, lines);
    broker.wait_for_end("lines", 2, 300);
    let input = format!("kafka://{}/lines?group=wc", broker.bootstrap);
    let output = format!("kafka://{}/words", broker.bootstrap);
    let result = run_weir(&[
        "run",
        "-p",
        "2",
        "-D",
        "execution.checkpointing.interval=200ms",
        "wordcount",
        "--input",
        &input,
        "--output",
        &output,
    ]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let mut words = broker.read_committed("words", 9, Duration::from_secs(20));
    words.sort();
    let mut expected = vec!["apple\t300".to_string(), "banana\t300".to_string()];
    expected.extend((0..7).map(|k| format!("w{k}\t{}", if k < 300 % 7 { 300 / 7 + 1 } else { 300 / 7 })));
    expected.sort();
    assert_eq!(words, expected, "{}", String::from_utf8_lossy(&result.stderr));
    assert_eq!(broker.committed("wc", "lines", 2), BTreeMap::from([(0, 150), (1, 150)]));
}

fn counter_args<'a>(parallelism: &'a str, checkpoints: &'a str, input: &'a str, output: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "-p",
        parallelism,
        "-D",
        "rest.port=0",
        "-D",
        "execution.checkpointing.interval=100ms",
        "-D",
        checkpoints,
        "counter",
        "--input",
        input,
        "--output",
        output,
    ]
}

/// Produces `chunks` chunks of 200 counter events (event `i` of user `i mod users`) into
/// `events`, `pause` apart, while the test goes on.
fn produce_in_background(
    broker: &Broker,
    partitions: i32,
    chunks: usize,
    users: usize,
    pause: Duration,
) -> std::thread::JoinHandle<()> {
    let bootstrap = broker.bootstrap.clone();
    std::thread::spawn(move || {
        for chunk in 0..chunks {
            let values = (chunk * 200..(chunk + 1) * 200).map(|i| (i % users).to_string());
            kafka::produce(&bootstrap, "events", partitions, values);
            std::thread::sleep(pause);
        }
    })
}

fn random_delay(min_ms: u64, spread_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    Duration::from_millis(min_ms + nanos % spread_ms)
}

/// Kafka -> counter -> Kafka while events keep arriving: ten `kill -9`s at random points,
/// each restore from the newest checkpoint at another parallelism (2, 3, 1, ...), then a
/// bounded run to the end. A read_committed consumer sees every count exactly once.
#[test]
fn kafka_to_counter_to_kafka_is_exactly_once_through_kill_9_and_rescales() {
    let _serial = serial();
    const EVENTS: usize = 12_000;
    const USERS: usize = 40;
    let broker = Broker::start();
    broker.create_topic("events", 3);
    broker.create_topic("counts", 2);
    let dir = tempfile::tempdir().unwrap();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let input = format!("kafka://{}/events?group=counter", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);

    let producer = produce_in_background(&broker, 3, 60, USERS, Duration::from_millis(200));

    let mut restore_from: Option<String> = None;
    for (round, parallelism) in ["2", "3", "1"].iter().cycle().take(10).enumerate() {
        let mut args = counter_args(parallelism, &checkpoints, &input, &output);
        if let Some(path) = &restore_from {
            args.splice(3..3, ["-s", path.as_str()]);
        }
        let mut weir = RunningWeir::start(&args);
        let rest = weir.rest_url();
        let job_id = weir.job_id();
        poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(2));
        std::thread::sleep(random_delay(50, 700));
        weir.kill_hard();
        for line in
            weir.stderr_lines().iter().filter(|l| l.contains("kafka") || l.contains("ERROR") || l.contains("WARN"))
        {
            eprintln!("round {round}: {line}");
        }
        let newest =
            newest_checkpoint(&chk_root.join(&job_id)).unwrap_or_else(|| panic!("round {round}: no checkpoint"));
        restore_from = Some(newest.to_str().unwrap().to_string());
    }
    producer.join().unwrap();
    broker.wait_for_end("events", 3, EVENTS as i64);

    // The last run reads to the end of what was produced and finishes.
    let bounded_input = format!("{input}&bounded=true");
    let mut args = counter_args("2", &checkpoints, &bounded_input, &output);
    let path = restore_from.unwrap();
    args.splice(3..3, ["-s", path.as_str()]);
    let result = run_weir(&args);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    eprintln!("FINAL RUN STDERR: {}", String::from_utf8_lossy(&result.stderr));
    let counts = broker.read_committed("counts", EVENTS, Duration::from_secs(60));
    if counts.len() != EVENTS {
        let events = broker.read("events", EVENTS, Duration::from_secs(5), "read_uncommitted");
        let all = broker.read("counts", EVENTS * 3, Duration::from_secs(20), "read_uncommitted");
        eprintln!("counts watermarks: {:?}", broker.watermarks("counts", 2));
        eprintln!("events in the input: {}; counts written, committed or not: {}", events.len(), all.len());
        eprintln!("group offsets: {:?}", broker.committed("counter", "events", 3));
        let again = broker.read_committed("counts", EVENTS, Duration::from_secs(10));
        let seen: std::collections::BTreeSet<&String> = counts.iter().collect();
        let missing: std::collections::BTreeSet<&String> = all.iter().filter(|l| !seen.contains(l)).collect();
        eprintln!(
            "a second read_committed reader sees {}; {} distinct counts exist only uncommitted: {:?}",
            again.len(),
            missing.len(),
            missing.iter().take(10).collect::<Vec<_>>()
        );
    }
    assert_counts_exactly_once(&counts, EVENTS);
}

/// A crash after every subtask acknowledged the fifth checkpoint but before its `_metadata`:
/// the sink's pre-committed transaction belongs to a checkpoint that never completed.
/// Restored from the fourth, the job aborts it, so it never becomes visible: every count
/// exactly once.
#[test]
fn the_transaction_of_a_checkpoint_that_never_completed_never_becomes_visible() {
    let _serial = serial();
    const EVENTS: usize = 6_000;
    let broker = Broker::start();
    broker.create_topic("events", 2);
    broker.create_topic("counts", 1);
    let dir = tempfile::tempdir().unwrap();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let input = format!("kafka://{}/events?group=crash", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);
    // Events keep arriving, so the crashed checkpoint's transaction holds records.
    let producer = produce_in_background(&broker, 2, 30, 25, Duration::from_millis(60));
    let args = counter_args("2", &checkpoints, &input, &output);
    let mut weir = RunningWeir::start_with(
        |mut command| {
            command.env("FAILPOINTS", "checkpoint-before-metadata=4*off->return");
            command
        },
        &args,
    );
    let job_id = weir.job_id();
    assert_ne!(weir.wait(), Some(0));
    let newest = newest_checkpoint(&chk_root.join(&job_id)).expect("two checkpoints completed before the crash");
    assert!(newest.ends_with("chk-4"), "{newest:?}");
    producer.join().unwrap();
    broker.wait_for_end("events", 2, EVENTS as i64);

    let bounded_input = format!("{input}&bounded=true");
    let mut args = counter_args("1", &checkpoints, &bounded_input, &output);
    args.splice(3..3, ["-s", newest.to_str().unwrap()]);
    let result = run_weir(&args);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    eprintln!("FINAL RUN STDERR: {}", String::from_utf8_lossy(&result.stderr));
    let counts = broker.read_committed("counts", EVENTS, Duration::from_secs(30));
    assert_counts_exactly_once(&counts, EVENTS);
}

/// Two jobs write one topic with the default transactional id prefix. Job A crashes after a
/// checkpoint's `_metadata` and before it committed the checkpoint's transactions; job B
/// starts on the same topic and runs to the end; A restored from that checkpoint commits
/// them. B must not have aborted A's pre-committed transactions: every count exactly once.
#[test]
fn a_second_job_on_the_same_topic_never_aborts_the_first_jobs_pre_committed_transactions() {
    let _serial = serial();
    const EVENTS: usize = 6_000;
    let broker = Broker::start();
    broker.create_topic("events", 2);
    broker.create_topic("lines", 1);
    broker.create_topic("counts", 1);
    let dir = tempfile::tempdir().unwrap();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let input = format!("kafka://{}/events?group=first", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);
    let producer = produce_in_background(&broker, 2, 30, 25, Duration::from_millis(60));
    let args = counter_args("2", &checkpoints, &input, &output);
    let mut first = RunningWeir::start_with(
        |mut command| {
            command.env("FAILPOINTS", "checkpoint-after-metadata=3*off->return");
            command
        },
        &args,
    );
    let job_id = first.job_id();
    assert_ne!(first.wait(), Some(0));
    let newest = newest_checkpoint(&chk_root.join(&job_id)).expect("a checkpoint completed before the crash");
    assert!(newest.ends_with("chk-4"), "{newest:?}");

    // Another job writes the same topic while the first one is down.
    broker.produce("lines", 1, (0..50).map(|_| "apple banana".to_string()));
    broker.wait_for_end("lines", 1, 50);
    let lines = format!("kafka://{}/lines", broker.bootstrap);
    let second = run_weir(&["run", "-D", "rest.port=0", "wordcount", "--input", &lines, "--output", &output]);
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));

    producer.join().unwrap();
    broker.wait_for_end("events", 2, EVENTS as i64);
    let bounded_input = format!("{input}&bounded=true");
    let mut args = counter_args("2", &checkpoints, &bounded_input, &output);
    args.splice(3..3, ["-s", newest.to_str().unwrap()]);
    let result = run_weir(&args);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(!stderr.contains("can no longer be committed"), "a pre-committed transaction was lost: {stderr}");
    let all = broker.read_committed("counts", EVENTS + 2, Duration::from_secs(30));
    let (words, counts): (Vec<String>, Vec<String>) = all.into_iter().partition(|l| l.starts_with(char::is_alphabetic));
    let mut words = words;
    words.sort();
    assert_eq!(words, ["apple\t50", "banana\t50"]);
    assert_counts_exactly_once(&counts, EVENTS);
}

#[test]
fn errors_name_the_topic_the_servers_and_the_schemes_weir_knows() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic("counts", 1);
    let output = run_weir(&["run", "counter", "--users", "3", "--events", "10", "--output", "s3://bucket/counts"]);
    assert!(!output.status.success());
    let text = error_lines(&output).join("\n");
    assert!(text.contains("'s3://'") && text.contains("kafka://HOST:PORT/TOPIC"), "{text}");

    let input = format!("kafka://{}/no-such-topic", broker.bootstrap);
    let output =
        run_weir(&["run", "-D", "restart-strategy.type=none", "counter", "--input", &input, "--output", "none"]);
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(text.contains("topic 'no-such-topic'") && text.contains("does not exist"), "{text}");

    let input = "kafka://127.0.0.1:1/events?startup-timeout-ms=1500";
    let output =
        run_weir(&["run", "-D", "restart-strategy.type=none", "counter", "--input", input, "--output", "none"]);
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(text.contains("reaching the brokers 127.0.0.1:1"), "{text}");
}

/// Each partition's offset and lag are in `/metrics` (also as Flink's `pendingRecords` and
/// Kafka's `records-lag-max`) and in the source vertex's subtasks.
#[test]
fn metrics_show_each_partitions_offset_and_lag() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic("events", 2);
    broker.produce("events", 2, (0..1000).map(|i| (i % 10).to_string()));
    broker.wait_for_end("events", 2, 1000);
    let input = format!("kafka://{}/events", broker.bootstrap);
    let mut weir = RunningWeir::start(&["run", "-D", "rest.port=0", "counter", "--input", &input, "--output", "none"]);
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = common::get(&format!("{rest}/metrics")).body;
        let caught_up = ["events-0", "events-1"].iter().all(|split| {
            let line = |name: &str| {
                text.lines()
                    .find(|l| l.starts_with(name) && l.contains(&format!("split=\"{split}\"")))
                    .map(str::to_string)
            };
            line("weir_source_split_current_offset").is_some_and(|l| l.ends_with(" 500"))
                && line("weir_source_split_lag").is_some_and(|l| l.ends_with(" 0"))
        });
        // Flink's names too: the source operator's pending records and largest lag.
        let flink = ["pendingRecords", "KafkaSourceReader_KafkaConsumer_records_lag_max"].iter().all(|name| {
            text.lines()
                .any(|l| l.starts_with(&format!("flink_taskmanager_job_task_operator_{name}{{")) && l.ends_with(" 0"))
        });
        if caught_up && flink {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no offsets 500 and lag 0 in /metrics: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let job = common::get(&format!("{rest}/jobs/{job_id}")).json();
    let source =
        job["vertices"].as_array().unwrap().iter().find(|v| v["name"].as_str().unwrap().contains("source")).unwrap();
    let vertex = common::get(&format!("{rest}/jobs/{job_id}/vertices/{}", source["id"].as_str().unwrap())).json();
    let splits = &vertex["subtasks"][0]["splits"];
    assert_eq!(splits.as_array().map(Vec::len), Some(2), "{vertex}");
    weir.kill_hard();
}

/// The lesson's upgrade modes over Kafka. Savepoint mode: stop with a savepoint, more events
/// arrive, the new version (another parallelism) resumes from the savepoint's offsets: every
/// count once. Stateless mode: a start without `-s` resumes from the offsets the group got
/// from the last completed checkpoint, so it reads only what came after (with empty state).
#[test]
fn upgrades_keep_their_offsets_from_a_savepoint_or_from_the_group() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic("events", 3);
    broker.create_topic("counts", 2);
    broker.create_topic("fresh-counts", 1);
    broker.produce("events", 3, (0..3000).map(|i| (i % 30).to_string()));
    broker.wait_for_end("events", 3, 3000);
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = format!("state.checkpoints.dir=file://{}", dir.path().join("chk").display());
    let input = format!("kafka://{}/events?group=upgrade", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);

    let mut weir = RunningWeir::start(&counter_args("2", &checkpoints, &input, &output));
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    assert_eq!(broker.read_committed("counts", 3000, Duration::from_secs(30)).len(), 3000);
    let savepoints = dir.path().join("savepoints");
    let address = rest.trim_start_matches("http://").to_string();
    let stopped = run_weir(&["stop", "-m", &address, "--savepoint-path", savepoints.to_str().unwrap(), &job_id]);
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    let savepoint = common::savepoint_location(&String::from_utf8_lossy(&stopped.stdout));
    assert_eq!(weir.wait(), Some(0));

    // Savepoint mode, -p 2 -> 3.
    broker.produce("events", 3, (3000..5000).map(|i| (i % 30).to_string()));
    broker.wait_for_end("events", 3, 5000);
    let bounded = format!("{input}&bounded=true");
    let mut args = counter_args("3", &checkpoints, &bounded, &output);
    args.splice(3..3, ["-s", savepoint.as_str()]);
    let result = run_weir(&args);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    assert_counts_exactly_once(&broker.read_committed("counts", 5000, Duration::from_secs(30)), 5000);
    assert_eq!(broker.committed("upgrade", "events", 3).values().sum::<i64>(), 5000, "the group's offsets");

    // Stateless mode: no -s; the group's offsets say where to go on.
    broker.produce("events", 3, (5000..5600).map(|i| (i % 30).to_string()));
    broker.wait_for_end("events", 3, 5600);
    let fresh = format!("kafka://{}/fresh-counts", broker.bootstrap);
    let result = run_weir(&counter_args("1", &checkpoints, &bounded, &fresh));
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let counts = broker.read_committed("fresh-counts", 600, Duration::from_secs(30));
    assert_counts_exactly_once(&counts, 600);
}

/// Partitions added while the job runs are found (`partition.discovery.interval.ms`) and read
/// from their earliest offset.
#[test]
fn partitions_added_while_the_job_runs_are_read() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic("events", 1);
    broker.create_topic("counts", 1);
    broker.produce("events", 1, (0..300).map(|i| (i % 10).to_string()));
    let input = format!("kafka://{}/events?partition.discovery.interval.ms=300", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = format!("state.checkpoints.dir=file://{}", dir.path().join("chk").display());
    let mut weir = RunningWeir::start(&counter_args("2", &checkpoints, &input, &output));
    assert_eq!(broker.read_committed("counts", 300, Duration::from_secs(30)).len(), 300);
    broker.add_partitions("events", 3);
    // Round robin over three partitions: 200 of these 300 land in the new ones.
    broker.produce("events", 3, (300..600).map(|i| (i % 10).to_string()));
    let counts = broker.read_committed("counts", 600, Duration::from_secs(30));
    weir.kill_hard();
    assert_counts_exactly_once(&counts, 600);
}

/// A record the job cannot decode fails it, naming topic, partition and offset; with
/// `skip-undeserializable=true` it is skipped and counted in `/metrics`.
#[test]
fn an_undecodable_record_fails_the_job_or_is_skipped_and_counted() {
    let _serial = serial();
    let broker = Broker::start();
    broker.create_topic("events", 1);
    broker.produce("events", 1, ["1".to_string(), "not a user".to_string(), "2".to_string()]);
    let input = format!("kafka://{}/events?bounded=true", broker.bootstrap);
    let output =
        run_weir(&["run", "-D", "restart-strategy.type=none", "counter", "--input", &input, "--output", "none"]);
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(text.contains("offset 1 of 'events' partition 0") && text.contains("skip-undeserializable"), "{text}");

    let input = format!("kafka://{}/events?skip-undeserializable=true", broker.bootstrap);
    let mut weir = RunningWeir::start(&["run", "-D", "rest.port=0", "counter", "--input", &input, "--output", "none"]);
    let rest = weir.rest_url();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = common::get(&format!("{rest}/metrics")).body;
        if text.lines().any(|l| l.starts_with("weir_source_records_skipped_total{") && l.ends_with(" 1")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no skipped record in /metrics: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    weir.kill_hard();
}

/// Kafka -> counter -> Kafka on a high-availability cluster (etcd, two JobManagers, three
/// TaskManagers) while events keep arriving: ten `kill -9`s at random points, of a
/// TaskManager (the region restarts from the newest checkpoint, its transactions are
/// committed or aborted on restore) or of the leading JobManager (a standby takes over and
/// re-sends the newest completion, so commits must be idempotent). Each killed process is
/// replaced. A read_committed consumer sees every count exactly once.
#[test]
fn kafka_on_a_cluster_is_exactly_once_through_taskmanager_and_leader_kills() {
    let _serial = serial();
    const EVENTS: usize = 12_000;
    const USERS: usize = 40;
    let broker = Broker::start();
    broker.create_topic("events", 3);
    broker.create_topic("counts", 2);
    let mut cluster = common::ha::HaCluster::start(2, 3, &[]);
    let input = format!("kafka://{}/events?group=counter", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);
    let job = cluster.submit(&["-p", "2", "counter", "--input", &input, "--output", &output]);
    cluster.wait_job(&job, "RUNNING", Duration::from_secs(60));
    let producer = produce_in_background(&broker, 3, 60, USERS, Duration::from_millis(150));

    let mut kills = Vec::new();
    let leader_first = random_delay(0, 2).as_millis() == 1;
    for kill in 0..10 {
        std::thread::sleep(random_delay(200, 1200));
        if (kill % 2 == 0) == leader_first {
            let epoch = cluster.kill_leader();
            cluster.start_jobmanager(&[]);
            cluster.wait_for_leader(Some(epoch));
            kills.push(format!("leader of epoch {epoch}"));
            cluster.wait_job(&job, "RUNNING", Duration::from_secs(60));
        } else {
            // A TaskManager that runs some of the job's subtasks (asked again while the
            // JobManagers do not answer, or name no TaskManager yet: a leader that just took
            // over shows its subtasks' hosts once their TaskManagers report).
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let running_one = |hosts: &std::collections::BTreeSet<String>| {
                cluster.taskmanagers.iter().position(|tm| hosts.contains(&common::ha::taskmanager_id(tm)))
            };
            let mut hosts = cluster.subtask_hosts(&job);
            while running_one(&hosts).is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                hosts = cluster.subtask_hosts(&job);
            }
            let index =
                running_one(&hosts).unwrap_or_else(|| panic!("no TaskManager runs the job's subtasks: {hosts:?}"));
            let mut victim = cluster.taskmanagers.remove(index);
            let id = common::ha::taskmanager_id(&victim);
            victim.kill_hard();
            cluster.start_taskmanager();
            kills.push(format!("taskmanager {id}"));
            // Failed over: every subtask RUNNING again, none on the dead TaskManager.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                cluster.wait_job(&job, "RUNNING", Duration::from_secs(60));
                if !cluster.subtask_hosts(&job).contains(&id) {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "the job never left TaskManager {id}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        eprintln!("kill {kill}: {}", kills.last().unwrap());
    }
    producer.join().unwrap();
    broker.wait_for_end("events", 3, EVENTS as i64);

    // The job reads on until the group's offsets (committed on checkpoint completion, after
    // the sink's transactions) reach the end of the input.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while broker.committed("counter", "events", 3).values().sum::<i64>() < EVENTS as i64 {
        assert!(std::time::Instant::now() < deadline, "the job did not catch up: {:?}", cluster.job_state(&job));
        std::thread::sleep(Duration::from_millis(200));
    }
    let counts = broker.read_committed("counts", EVENTS, Duration::from_secs(60));
    // (A JobManager that just took over may not answer yet: the restart count is only shown.)
    let restarts = cluster.get(&format!("/jobs/{job}")).map(|details| details["numRestarts"].clone());
    eprintln!("kills: {kills:?}; restarts: {restarts:?}");
    assert_counts_exactly_once(&counts, EVENTS);
    assert_eq!(kills.len(), 10);
}

/// The TaskManager ids the job's subtasks run on, as the leader reports them.
/// A deployment controller and what it started: on drop the deployment is deleted, the
/// controller stopped, and any process still naming the data directory killed.
struct Operator {
    process: RunningWeir,
    data_dir: tempfile::TempDir,
}

impl Operator {
    fn start() -> Operator {
        let data_dir = tempfile::tempdir().unwrap();
        let path = data_dir.path().to_path_buf();
        let mut process = RunningWeir::start_with(
            |mut command| {
                command.env("WEIR_DATA_DIR", &path);
                command
            },
            &["operator", "-D", "operator.rest.port=0"],
        );
        process.stderr_line("REST API");
        Operator { process, data_dir }
    }

    fn weir(&self, args: &[&str]) -> std::process::Output {
        common::weir().args(args).env("WEIR_DATA_DIR", self.data_dir.path()).bounded_output().unwrap()
    }

    /// Applies the counter over Kafka at `parallelism` in `mode`.
    fn apply(&self, generation: u64, input: &str, output: &str, parallelism: u32, mode: &str) {
        let spec = format!(
            "apiVersion: weir.dev/v1\nkind: WeirDeployment\nmetadata:\n  name: orders\nspec:\n  binary: {}\n  configuration:\n    execution.checkpointing.interval: 200ms\n  taskManager:\n    replicas: 1\n    slots: 3\n  job:\n    name: counter\n    args: [--input, \"{input}\", --output, \"{output}\"]\n    parallelism: {parallelism}\n    upgradeMode: {mode}\n",
            env!("CARGO_BIN_EXE_weir")
        );
        let file = self.data_dir.path().join("orders.yaml");
        std::fs::write(&file, spec).unwrap();
        let applied = self.weir(&["deployment", "apply", "-f", file.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&applied.stdout);
        assert!(
            stdout.contains(&format!("(generation {generation})")),
            "{stdout}{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        // STABLE at this generation: the job runs and a checkpoint completed.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let got = self.weir(&["deployment", "get", "orders", "-o", "json"]);
            let json: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap_or_default();
            let status = &json["status"];
            if status["observedGeneration"] == generation && status["lifecycleState"] == "STABLE" {
                return;
            }
            assert!(status["lifecycleState"] != "FAILED", "generation {generation} failed: {status}");
            assert!(std::time::Instant::now() < deadline, "generation {generation} not STABLE: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.weir(&["deployment", "delete", "orders"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // Gone from the store once its job and cluster ended.
        while self.weir(&["deployment", "get", "orders"]).status.success() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.process.kill_hard();
        common::kill_processes_naming(self.data_dir.path());
    }
}

/// The deployment controller upgrades Kafka -> counter -> Kafka while events keep arriving:
/// parallelism 2 -> 3 in savepoint mode (stop with a savepoint, restore it), then 3 -> 1 in
/// last-state mode (cancel, restore the newest checkpoint). The offsets travel in the
/// snapshots, the sink's transactions are committed or aborted on restore, and a
/// read_committed consumer sees every count exactly once.
#[test]
fn deployment_upgrades_over_kafka_keep_offsets_and_counts_exactly_once() {
    let _serial = serial();
    const EVENTS: usize = 9_000;
    let broker = Broker::start();
    broker.create_topic("events", 3);
    broker.create_topic("counts", 2);
    let input = format!("kafka://{}/events?group=orders", broker.bootstrap);
    let output = format!("kafka://{}/counts", broker.bootstrap);
    let operator = Operator::start();
    operator.apply(1, &input, &output, 2, "savepoint");
    let producer = produce_in_background(&broker, 3, 45, 30, Duration::from_millis(100));
    std::thread::sleep(random_delay(500, 1500));
    operator.apply(2, &input, &output, 3, "savepoint");
    std::thread::sleep(random_delay(500, 1500));
    operator.apply(3, &input, &output, 1, "last-state");
    producer.join().unwrap();
    broker.wait_for_end("events", 3, EVENTS as i64);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while broker.committed("orders", "events", 3).values().sum::<i64>() < EVENTS as i64 {
        assert!(std::time::Instant::now() < deadline, "the job did not catch up");
        std::thread::sleep(Duration::from_millis(200));
    }
    let history = operator.weir(&["deployment", "history", "orders"]);
    assert!(String::from_utf8_lossy(&history.stdout).contains("UPGRADE"), "{history:?}");
    assert_counts_exactly_once(&broker.read_committed("counts", EVENTS, Duration::from_secs(60)), EVENTS);
}

/// `weir kafka`: a topic created, listed, filled from stdin and with counter events, and read
/// back read_committed, with nothing but the weir binary and a broker.
#[test]
fn the_weir_binary_creates_fills_lists_and_reads_topics() {
    let _serial = serial();
    let broker = Broker::start();
    let weir = |args: &[&str], stdin: Option<&str>| {
        let mut command = common::weir();
        command.args(args).stdin(std::process::Stdio::piped());
        command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut input, stdin.unwrap_or_default().as_bytes()).unwrap();
        drop(input);
        let output = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "weir {args:?}: {text}");
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    let b = broker.bootstrap.as_str();
    weir(&["kafka", "create", "-b", b, "tool-topic", "--partitions", "3"], None);
    let listed = weir(&["kafka", "topics", "-b", b], None);
    assert!(listed.contains("tool-topic\t3 partition(s)"), "{listed}");
    weir(&["kafka", "produce", "-b", b, "tool-topic"], Some("first\nsecond\n"));
    weir(&["kafka", "produce", "-b", b, "tool-topic", "--events", "100", "--users", "10"], None);
    let read = weir(&["kafka", "consume", "-b", b, "tool-topic", "--max-messages", "102", "--timeout", "10s"], None);
    let values: Vec<&str> = read.lines().collect();
    assert_eq!(values.len(), 102, "{read}");
    assert!(values.contains(&"first") && values.contains(&"second"), "{read}");
    assert_eq!(values.iter().filter(|v| **v == "7").count(), 10, "{read}");
    let counted = weir(&["kafka", "consume", "-b", b, "tool-topic", "--count", "--timeout", "2s"], None);
    assert_eq!(counted.trim(), "102");
}
