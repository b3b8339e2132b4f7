//! `nexmark`: the Nexmark benchmark's auction-site stream (people, auctions and bids with
//! event times, in a parallel, restorable, rate-limitable source) and its queries q0, q1,
//! q2, q3, q4, q5, q7, q8 and q11 as weir pipelines.
//!
//! Uids: `source`, `watermarks`, one per query stage (`q4-winning-bids`, `q5-bids-per-auction`,
//! `q7-highest-per-auction`), the query's last operator (`q0` .. `q11`) and `sink`.

pub mod model;
pub mod queries;

use std::time::Duration;

use weir_api::catalog::{ArgSpec, JobArgs, JobBuildError, JobDefinition};
use weir_api::prelude::*;
use weir_connectors::SequenceSource;

use crate::output::Output;
pub use model::{Auction, Bid, Event, Person, generate};

/// The `nexmark` job.
pub struct Nexmark;

impl JobDefinition for Nexmark {
    fn name(&self) -> &'static str {
        "nexmark"
    }

    fn description(&self) -> &'static str {
        "the Nexmark benchmark: generated people, auctions and bids in event time, and one of its queries"
    }

    fn args(&self) -> Vec<ArgSpec> {
        vec![
            ArgSpec::optional("query", "q0|q1|q2|q3|q4|q5|q7|q8|q11", "the query to run (default q0)"),
            ArgSpec::optional("events", "N", "number of generated events (bounded); unbounded when absent"),
            ArgSpec::optional("rate", "R", "generated events per second overall; unlimited when absent"),
            ArgSpec::optional(
                "output",
                "DIR|-|none|kafka://HOST:PORT/TOPIC",
                "part files in DIR, '-' prints, 'none' discards, or a Kafka topic (default '-')",
            ),
        ]
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let query = args.get::<String>("query")?.unwrap_or_else(|| "q0".to_string());
        if !queries::QUERIES.contains(&query.as_str()) {
            return Err(args.invalid(format!(
                "--query {query} is not a Nexmark query weir runs; choose one of {}",
                queries::QUERIES.join(", ")
            )));
        }
        let events: Option<u64> = args.get("events")?;
        let rate: Option<f64> = args.get("rate")?;
        if let Some(rate) = rate
            && !(rate > 0.0 && rate.is_finite())
        {
            return Err(args.invalid(format!("--rate {rate} must be a positive number of events per second")));
        }
        let output = Output::from_args(args, Output::Print)?;
        // Event times grow with the event number, and each subtask reads its numbers in
        // order: monotonous timestamps per subtask, so no event is ever late.
        let strategy =
            WatermarkStrategy::for_monotonous_timestamps().with_timestamp_assigner(|e: &Event, _| e.date_time());
        let stream = env
            .from_source(SequenceSource::new(events, rate, generate).in_index_order())
            .uid("source")
            .name("source")
            .assign_timestamps_and_watermarks(strategy.with_idleness(Duration::from_secs(1)))
            .uid("watermarks");
        match queries::build(&query, &stream, &output, args) {
            Some(built) => built,
            None => Err(args.invalid(format!("--query {query}: unknown"))),
        }
    }
}
