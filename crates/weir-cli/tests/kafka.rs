//! Kafka with the real binary against a real broker (noida-db, started per test): a bounded
//! read that finishes, the group's offsets after checkpoints, Kafka -> counter -> Kafka
//! exactly once through `kill -9` at random points and rescales, a checkpoint that never
//! completed whose transaction never becomes visible, and the errors a user sees.

mod common;
#[path = "common/kafka.rs"]
mod kafka;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{RunningWeir, error_lines, newest_checkpoint, poll_json, run_weir};
use kafka::Broker;

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
    let broker = Broker::start();
    broker.create_topic("lines", 2);
    broker.create_topic("words", 1);
    let lines: Vec<String> = (0..300).map(|i| format!("apple banana w{}", i % 7)).collect();
    broker.produce("lines", 2, lines);
    let input = format!("kafka://{}/lines?group=wc", broker.bootstrap);
    let output = format!("kafka://{}/words", broker.bootstrap);
    let result = run_weir(&[
        "run", "-p", "2", "-D", "execution.checkpointing.interval=200ms", "wordcount", "--input", &input, "--output",
        &output,
    ]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let mut words = broker.read_committed("words", 9, Duration::from_secs(20));
    words.sort();
    let mut expected = vec!["apple\t300".to_string(), "banana\t300".to_string()];
    expected.extend((0..7).map(|k| format!("w{k}\t{}", if k < 300 % 7 { 300 / 7 + 1 } else { 300 / 7 })));
    expected.sort();
    assert_eq!(words, expected);
    assert_eq!(broker.committed("wc", "lines", 2), BTreeMap::from([(0, 150), (1, 150)]));
}
