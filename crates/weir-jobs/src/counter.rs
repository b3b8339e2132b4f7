//! `counter`: events of users -> a running count per user (the lessons' example job).
//!
//! Event `i` belongs to user `i mod U`; for every event the job emits `user<TAB>count`, the
//! user's count after that event. Uids: `source`, `enrich` (with `--enrich`), `counter`, `sink`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use weir_api::catalog::{ArgSpec, JobArgs, JobBuildError, JobDefinition};
use weir_api::prelude::*;
use weir_connectors::SequenceSource;
use weir_connectors::kafka::{KafkaRecord, KafkaUrl};

use crate::output::Output;

/// One event of a user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the event sequence.
    pub index: u64,
    /// The user it belongs to.
    pub user: u64,
}

/// Counts events per user in value state.
#[derive(Clone)]
pub struct CountPerUser {
    count: ValueState<u64>,
    /// CPU time spent per event (`--busy-us`): a slow stage, to show backpressure.
    busy: std::time::Duration,
}

impl Default for CountPerUser {
    fn default() -> Self {
        CountPerUser { count: ValueState::new("count"), busy: std::time::Duration::ZERO }
    }
}

impl KeyedProcessFunction<u64, Event, (u64, u64)> for CountPerUser {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.count.declaration()]
    }

    fn process_element(
        &mut self,
        event: Event,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, (u64, u64)>,
    ) -> FnResult {
        if !self.busy.is_zero() {
            busy_wait(self.busy);
        }
        let mut count = ctx.value(&self.count)?;
        let n = count.get_or_insert_with(|| 0);
        *n += 1;
        out.collect((event.user, *n));
        Ok(())
    }
}

/// Spins for `duration`: CPU work, as a real per-event computation would do.
#[cold]
fn busy_wait(duration: std::time::Duration) {
    let until = std::time::Instant::now() + duration;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Remembers per user the first event index seen (the `--enrich` stage).
#[derive(Clone)]
pub struct FirstSeen {
    first_index: ValueState<u64>,
}

impl Default for FirstSeen {
    fn default() -> Self {
        FirstSeen { first_index: ValueState::new("first-index") }
    }
}

impl KeyedProcessFunction<u64, Event, Event> for FirstSeen {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.first_index.declaration()]
    }

    fn process_element(
        &mut self,
        event: Event,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Event>,
    ) -> FnResult {
        let mut first = ctx.value(&self.first_index)?;
        first.get_or_insert_with(|| event.index);
        out.collect(event);
        Ok(())
    }
}

/// The key of a count in Kafka: the user.
pub fn count_key(record: &(u64, u64), key: &mut String) {
    let _ = write!(key, "{}", record.0);
}

/// An event read from Kafka: the value is the user, as decimal text or JSON `{"user": N}`;
/// the offset is its index.
pub fn event_from_kafka(record: &KafkaRecord<'_>) -> Result<Event, String> {
    let bytes = record.payload.unwrap_or_default();
    let text = std::str::from_utf8(bytes).map_err(|_| "the value is not UTF-8".to_string())?.trim();
    let user = match text.parse::<u64>() {
        Ok(user) => user,
        Err(_) => {
            #[derive(Deserialize)]
            struct UserEvent {
                user: u64,
            }
            serde_json::from_str::<UserEvent>(text)
                .map_err(|_| format!("the value '{text}' is neither a user number nor JSON {{\"user\": N}}"))?
                .user
        }
    };
    Ok(Event { index: record.offset.max(0) as u64, user })
}

/// Formats `user<TAB>count`.
pub fn format_count(record: &(u64, u64), line: &mut String) {
    let _ = write!(line, "{}\t{}", record.0, record.1);
}

/// The `counter` job.
pub struct Counter;

impl JobDefinition for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn description(&self) -> &'static str {
        "events of users -> running count per user (value state keyed by user)"
    }

    fn args(&self) -> Vec<ArgSpec> {
        vec![
            ArgSpec::optional("users", "U", "number of users of the generated events; event i belongs to user i mod U"),
            ArgSpec::optional("events", "N", "number of generated events (bounded); unbounded when absent"),
            ArgSpec::optional("rate", "R", "generated events per second overall; unlimited when absent"),
            ArgSpec::optional(
                "input",
                "kafka://HOST:PORT/TOPIC?...",
                "read events from Kafka (each value a user number) instead of generating them",
            ),
            ArgSpec::optional(
                "output",
                "DIR|-|none|kafka://HOST:PORT/TOPIC",
                "part files in DIR, '-' prints, 'none' discards, or a Kafka topic (default '-')",
            ),
            ArgSpec::flag("enrich", "add a stateful stage (uid enrich) remembering each user's first event index"),
            ArgSpec::optional(
                "busy-us",
                "MICROS",
                "CPU time the counter spends per event: a slow stage that backpressures the source (to watch backpressure and unaligned checkpoints)",
            ),
        ]
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let output = Output::from_args(args, Output::Print)?;
        let mut stream = match args.get::<String>("input")? {
            Some(input) => {
                if let Some(error) = crate::kafka::unknown_scheme("--input", &input) {
                    return Err(args.invalid(error));
                }
                if !KafkaUrl::is_kafka(&input) {
                    return Err(args.invalid(format!(
                        "--input {input}: counter reads events from kafka://HOST:PORT/TOPIC, or generates them (--users)"
                    )));
                }
                let url = KafkaUrl::parse(&input).map_err(|e| args.invalid(format!("--input {e}")))?;
                let source = crate::kafka::source(&url, event_from_kafka, false)
                    .map_err(|e| args.invalid(format!("--input {e}")))?;
                env.from_source(source).uid("source").name("source")
            }
            None => self.generated(args, env)?,
        };
        if args.flag("enrich") {
            stream = stream.key_by(|e: &Event| e.user).process(FirstSeen::default()).uid("enrich").name("enrich");
        }
        let busy = std::time::Duration::from_micros(args.get::<u64>("busy-us")?.unwrap_or(0));
        let counter = CountPerUser { busy, ..CountPerUser::default() };
        let counts = stream.key_by(|e: &Event| e.user).process(counter).uid("counter").name("counter");
        output.attach(args, &counts, format_count, count_key)?;
        Ok(())
    }
}

impl Counter {
    /// The generated events of `--users`, `--events` and `--rate`.
    fn generated(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<DataStream<Event>, JobBuildError> {
        let Some(users) = args.get::<u64>("users")? else {
            return Err(args.invalid("give --users U (generated events) or --input kafka://HOST:PORT/TOPIC"));
        };
        if users == 0 {
            return Err(args.invalid("--users must be at least 1"));
        }
        let events: Option<u64> = args.get("events")?;
        let rate: Option<f64> = args.get("rate")?;
        if let Some(rate) = rate
            && !(rate > 0.0 && rate.is_finite())
        {
            return Err(args.invalid(format!("--rate {rate} must be a positive number of events per second")));
        }
        let indices = env.from_source(SequenceSource::new(events, rate, |i| i)).uid("source").name("source");
        Ok(indices.map(move |index: u64| Event { index, user: index % users }).name("to-event"))
    }
}
