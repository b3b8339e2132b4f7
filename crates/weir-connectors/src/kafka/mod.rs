//! Kafka: [`KafkaSource`], whose partitions are its splits and whose offsets live in
//! checkpoints, and [`KafkaSink`], with Flink's delivery guarantees (`none`, `at-least-once`,
//! `exactly-once` through one transaction per subtask and checkpoint). Both go through
//! `rdkafka` (librdkafka); [`protocol`] speaks the three requests a restore needs to finish a
//! transaction that a dead process opened.
//!
//! [`tools`] creates, lists, fills and reads topics (`weir kafka`).
//!
//! [`KafkaUrl`] parses the `kafka://HOST:PORT[,HOST:PORT]/TOPIC?key=value` form the built-in
//! jobs take for `--input` and `--output`.

mod protocol;
mod sink;
mod source;
pub mod tools;
mod url;

pub use sink::{DeliveryGuarantee, KafkaSink, KafkaSinkRecord};
pub use source::{
    Json, KafkaDeserializer, KafkaRecord, KafkaSource, OffsetReset, RawBytes, StartingOffsets, Topics, Utf8Lines,
};
pub use url::KafkaUrl;

use rdkafka::ClientConfig;
use std::collections::BTreeMap;

/// A client configuration: `bootstrap.servers` and the user's properties, passed through.
fn client_config(bootstrap: &str, properties: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    // librdkafka logs through its own logger; keep it to errors and warnings.
    config.set("log_level", "4");
    for (key, value) in properties {
        config.set(key, value);
    }
    config
}

/// Java's `String.hashCode`, so partitions are spread over subtasks as Flink's KafkaSource
/// spreads them (`((hash * 31) & 0x7FFFFFFF) % p`, then round robin by partition).
fn java_string_hash(text: &str) -> i32 {
    let mut hash: i32 = 0;
    for unit in text.encode_utf16() {
        hash = hash.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    hash
}

/// The subtask of `parallelism` that reads `partition` of `topic` (Flink's
/// `KafkaSourceEnumerator.getSplitOwner`).
pub fn partition_owner(topic: &str, partition: i32, parallelism: u32) -> u32 {
    let parallelism = i64::from(parallelism.max(1));
    let start = i64::from(java_string_hash(topic).wrapping_mul(31) & 0x7FFF_FFFF) % parallelism;
    ((start + i64::from(partition.max(0))) % parallelism) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn java_hash_matches_the_jvm() {
        // Values from `"...".hashCode()` on a JVM.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("events"), -1291329255);
        assert_eq!(java_string_hash("counts"), -1354575548);
    }

    proptest! {
        #[test]
        fn every_partition_has_exactly_one_owner_and_owners_are_balanced(
            topic in "[a-z.-]{1,12}",
            partitions in 1i32..64,
            parallelism in 1u32..9,
        ) {
            let mut per_subtask = vec![0u32; parallelism as usize];
            for partition in 0..partitions {
                let owner = partition_owner(&topic, partition, parallelism);
                prop_assert!(owner < parallelism);
                per_subtask[owner as usize] += 1;
            }
            let (min, max) = (per_subtask.iter().min().unwrap(), per_subtask.iter().max().unwrap());
            prop_assert!(max - min <= 1, "{per_subtask:?}");
        }
    }
}
