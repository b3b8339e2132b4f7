//! `versioned-counter` in four versions, one per binary, for upgrades with the deployment
//! controller (the lesson's new image):
//!
//! - v1 (`my-weir`): source -> counter (value state `count`: u64) -> file sink.
//! - v2 (`my-weir-v2`): adds a stateful operator (uid `enrich`) before the counter; its state
//!   starts empty, everything else is restored.
//! - v3 (`my-weir-v3`): the counter's `count` becomes an i64: its snapshots cannot be read,
//!   which the pre-flight finds before the old job stops.
//! - v4 (`my-weir-v4`): fails on its first record (a broken release to roll back from); with
//!   `--crash-at-start` its TaskManager process exits (status 70) as soon as the job's source
//!   starts, before any record is counted or any checkpoint taken: a release whose job never
//!   gets ready (its pre-flight, which runs no job, passes).

use weir_api::catalog::{ArgSpec, JobArgs, JobBuildError, JobDefinition};
use weir_api::prelude::*;
use weir_connectors::{FileSink, SequenceSource};
use weir_jobs::counter::{CountPerUser, Event, FirstSeen, format_count};

/// Which version a binary carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// The first release.
    V1,
    /// Adds an operator.
    V2,
    /// Changes a state's value type.
    V3,
    /// Fails on its first record, or (`--crash-at-start`) crashes at start.
    V4,
}

/// `versioned-counter` as version `.0` builds it.
pub struct VersionedCounter(pub Version);

/// v3's counter: the same state name with another value type.
#[derive(Clone)]
struct SignedCount {
    count: ValueState<i64>,
}

impl KeyedProcessFunction<u64, Event, (u64, u64)> for SignedCount {
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
        out.collect((event.user, n.unsigned_abs()));
        Ok(())
    }
}

/// v4's counter: fails on every record.
#[derive(Clone)]
struct Broken {
    count: ValueState<u64>,
}

impl KeyedProcessFunction<u64, Event, (u64, u64)> for Broken {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.count.declaration()]
    }

    fn process_element(
        &mut self,
        event: Event,
        _ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, (u64, u64)>,
    ) -> FnResult {
        Err(format!("versioned-counter v4 cannot count event {} (the broken release)", event.index).into())
    }
}

impl JobDefinition for VersionedCounter {
    fn name(&self) -> &'static str {
        "versioned-counter"
    }

    fn description(&self) -> &'static str {
        match self.0 {
            Version::V1 => "v1: a running count per user into part files",
            Version::V2 => "v2: v1 plus a stateful enrich stage (uid enrich) before the counter",
            Version::V3 => "v3: the counter's state becomes an i64 (incompatible with v1 and v2 snapshots)",
            Version::V4 => {
                "v4: fails on its first record, or with --crash-at-start its process exits as the job starts (a broken release)"
            }
        }
    }

    fn args(&self) -> Vec<ArgSpec> {
        let mut args = vec![
            ArgSpec::required("users", "U", "number of users; event i belongs to user i mod U"),
            ArgSpec::optional("rate", "R", "events per second overall; unlimited when absent"),
            ArgSpec::required("output", "DIR", "part files in DIR"),
        ];
        if self.0 == Version::V4 {
            args.push(ArgSpec::flag(
                "crash-at-start",
                "the process running the job exits with status 70 as its first record comes",
            ));
        }
        args
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let users: u64 = args.required("users")?;
        if users == 0 {
            return Err(args.invalid("--users must be at least 1"));
        }
        let rate: Option<f64> = args.get("rate")?;
        let output: String = args.required("output")?;
        let crash_at_start = self.0 == Version::V4 && args.flag("crash-at-start");
        let events = env.from_source(SequenceSource::new(None, rate, |i| i)).uid("source").map(move |index: u64| {
            if crash_at_start {
                // The broken release: its process dies as soon as the job runs, skipping
                // every destructor as a crash does.
                eprintln!("versioned-counter v4 --crash-at-start: exiting");
                #[allow(clippy::disallowed_methods)]
                std::process::exit(70);
            }
            Event { index, user: index % users }
        });
        let events = match self.0 {
            Version::V2 => events.key_by(|e: &Event| e.user).process(FirstSeen::default()).uid("enrich"),
            _ => events,
        };
        let keyed = events.key_by(|e: &Event| e.user);
        let counts = match self.0 {
            Version::V1 | Version::V2 => keyed.process(CountPerUser::default()),
            Version::V3 => keyed.process(SignedCount { count: ValueState::new("count") }),
            Version::V4 => keyed.process(Broken { count: ValueState::new("count") }),
        };
        counts.uid("counter").name("counter").sink_to(FileSink::new(output, format_count)).uid("sink");
        Ok(())
    }
}
