//! The Kafka side of `bench/kafka.sh`: creates a topic and fills it with counter events, and
//! reads a topic with a bare librdkafka consumer (the baseline weir's source is compared to).
//!
//! ```text
//! kafka_tool create   BOOTSTRAP TOPIC PARTITIONS
//! kafka_tool produce  BOOTSTRAP TOPIC EVENTS USERS
//! kafka_tool consume  BOOTSTRAP TOPIC EVENTS
//! kafka_tool latency  BOOTSTRAP EVENTS_TOPIC COUNTS_TOPIC SAMPLES
//! ```
//!
//! `latency` sends one event of a new user every 100 ms into EVENTS_TOPIC while a
//! read_committed consumer reads COUNTS_TOPIC (where a running counter job writes), and
//! reports how long each user's first count took from its send to being visible.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap).set("log_level", "3");
    config
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: kafka_tool create BOOTSTRAP TOPIC PARTITIONS | produce BOOTSTRAP TOPIC EVENTS USERS | consume BOOTSTRAP TOPIC EVENTS | latency BOOTSTRAP EVENTS_TOPIC COUNTS_TOPIC SAMPLES";
    let (Some(command), Some(bootstrap), Some(topic)) = (args.get(1), args.get(2), args.get(3)) else {
        return Err(usage.into());
    };
    let number =
        |i: usize| -> Result<u64, Box<dyn std::error::Error>> { Ok(args.get(i).ok_or(usage)?.parse::<u64>()?) };
    match command.as_str() {
        "create" => {
            let admin: AdminClient<DefaultClientContext> = config(bootstrap).create()?;
            let new = NewTopic::new(topic, number(4)? as i32, TopicReplication::Fixed(1));
            for result in futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new()))? {
                result.map_err(|(topic, e)| format!("creating {topic}: {e}"))?;
            }
        }
        "produce" => {
            let (events, users) = (number(4)?, number(5)?);
            let producer: BaseProducer =
                config(bootstrap).set("linger.ms", "5").set("batch.num.messages", "10000").create()?;
            let started = Instant::now();
            for i in 0..events {
                let value = (i % users).to_string();
                let mut record = BaseRecord::<str, str>::to(topic).payload(&value);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((_, returned)) => {
                            record = returned;
                            producer.poll(Duration::from_millis(1));
                        }
                    }
                }
                if i % 1000 == 0 {
                    producer.poll(Duration::ZERO);
                }
            }
            producer.flush(Duration::from_secs(120))?;
            let seconds = started.elapsed().as_secs_f64();
            eprintln!("produced {events} events in {seconds:.2} s ({:.0}/s)", events as f64 / seconds);
        }
        "consume" => {
            let events = number(4)?;
            let consumer: BaseConsumer = config(bootstrap)
                .set("group.id", "bare-consumer")
                .set("auto.offset.reset", "earliest")
                .set("enable.auto.commit", "false")
                .create()?;
            consumer.subscribe(&[topic])?;
            let mut read = 0u64;
            let mut bytes = 0u64;
            let mut started = None;
            while read < events {
                if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                    let message = message?;
                    started.get_or_insert_with(Instant::now);
                    bytes += message.payload().map(|p| p.len() as u64).unwrap_or(0);
                    read += 1;
                }
            }
            let seconds = started.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
            println!(
                "bare consumer: {read} records ({bytes} bytes) in {seconds:.2} s: {:.0} records/s",
                read as f64 / seconds
            );
        }
        "latency" => latency(bootstrap, topic, args.get(4).ok_or(usage)?, number(5)?)?,
        _ => return Err(usage.into()),
    }
    Ok(())
}

/// Users of the latency probes: far above any benchmark's, so their first count is theirs.
const PROBE_USER_BASE: u64 = 1_000_000_000;

fn latency(bootstrap: &str, events: &str, counts: &str, samples: u64) -> Result<(), Box<dyn std::error::Error>> {
    let consumer: BaseConsumer = config(bootstrap)
        .set("group.id", format!("latency-{}", std::process::id()))
        .set("auto.offset.reset", "latest")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[counts])?;
    // Join the group before the first probe, so no count is missed.
    let joined = Instant::now();
    while consumer.assignment()?.count() == 0 && joined.elapsed() < Duration::from_secs(20) {
        consumer.poll(Duration::from_millis(100));
    }
    let producer: BaseProducer = config(bootstrap).set("linger.ms", "0").create()?;
    let mut sent: std::collections::BTreeMap<u64, Instant> = std::collections::BTreeMap::new();
    let mut latencies: Vec<f64> = Vec::new();
    let mut next_send = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(samples * 2 / 10 + 30);
    while (latencies.len() as u64) < samples && Instant::now() < deadline {
        if (sent.len() as u64) < samples && Instant::now() >= next_send {
            let user = PROBE_USER_BASE + sent.len() as u64;
            let value = user.to_string();
            producer.send(BaseRecord::<str, str>::to(events).payload(&value)).map_err(|(e, _)| e)?;
            producer.flush(Duration::from_secs(10))?;
            sent.insert(user, Instant::now());
            next_send += Duration::from_millis(100);
        }
        if let Some(message) = consumer.poll(Duration::from_millis(5)) {
            let message = message?;
            let text = String::from_utf8_lossy(message.payload().unwrap_or_default()).to_string();
            if let Some((user, "1")) = text.split_once('\t')
                && let Ok(user) = user.parse::<u64>()
                && let Some(at) = sent.get(&user)
            {
                latencies.push(at.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
    println!(
        "produce -> read_committed visibility, {} samples: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        latencies.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}
