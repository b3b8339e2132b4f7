//! `counter`: events of users -> a running count per user (the lessons' example job).
//!
//! Event `i` belongs to user `i mod U`; for every event the job emits `user<TAB>count`, the
//! user's count after that event. Uids: `source`, `enrich` (with `--enrich`), `counter`, `sink`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use weir_api::catalog::{ArgSpec, JobArgs, JobBuildError, JobDefinition};
use weir_api::prelude::*;
use weir_connectors::SequenceSource;

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
}

impl Default for CountPerUser {
    fn default() -> Self {
        CountPerUser { count: ValueState::new("count") }
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
        let mut count = ctx.value(&self.count)?;
        let n = count.get_or_insert_with(|| 0);
        *n += 1;
        out.collect((event.user, *n));
        Ok(())
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
            ArgSpec::required("users", "U", "number of users; event i belongs to user i mod U"),
            ArgSpec::optional("events", "N", "number of events (bounded); unbounded when absent"),
            ArgSpec::optional("rate", "R", "events per second overall; unlimited when absent"),
            ArgSpec::optional("output", "DIR|-|none", "part files in DIR, '-' prints, 'none' discards (default '-')"),
            ArgSpec::flag("enrich", "add a stateful stage (uid enrich) remembering each user's first event index"),
        ]
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let users: u64 = args.required("users")?;
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
        let output = Output::from_args(args, Output::Print, true)?;

        let indices = env.from_source(SequenceSource::new(events, rate, |i| i)).uid("source").name("source");
        let mut stream = indices.map(move |index: u64| Event { index, user: index % users }).name("to-event");
        if args.flag("enrich") {
            stream = stream.key_by(|e: &Event| e.user).process(FirstSeen::default()).uid("enrich").name("enrich");
        }
        let counts = stream.key_by(|e: &Event| e.user).process(CountPerUser::default()).uid("counter").name("counter");
        output.attach(&counts, format_count);
        Ok(())
    }
}
