//! The jobs of a user's own weir binary (`my-weir`, in `main.rs`): `sensor-stats`,
//! `flaky-counter`, and `versioned-counter` in the four versions of [`versions`] that the
//! deployment tests upgrade between (the binaries `my-weir`, `my-weir-v2`, `-v3`, `-v4`).

use std::fmt::Write as _;

use weir_api::catalog::{ArgSpec, JobArgs, JobBuildError, JobDefinition};
use weir_api::prelude::*;
use weir_connectors::{FileSink, PrintSink, TextLineSource};

/// One reading of a sensor, parsed from `sensor,temperature`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Reading {
    sensor: String,
    temperature: f64,
}

fn parse(line: &str) -> Result<Reading, String> {
    let Some((sensor, temperature)) = line.split_once(',') else {
        return Err(format!("line '{line}' is not 'sensor,temperature'"));
    };
    let temperature: f64 = temperature
        .trim()
        .parse()
        .map_err(|_| format!("line '{line}': '{}' is not a temperature", temperature.trim()))?;
    Ok(Reading { sensor: sensor.trim().to_string(), temperature })
}

/// Per sensor: count (value state), maximum (reducing state), distinct readings (map state),
/// the last three readings (list state). Emits one summary line per sensor at the end.
#[derive(Clone)]
struct SensorStats {
    count: ValueState<u64>,
    max: ReducingState<f64>,
    distinct: MapState<u64, u32>,
    recent: ListState<f64>,
}

impl Default for SensorStats {
    fn default() -> Self {
        SensorStats {
            count: ValueState::new("count"),
            max: ReducingState::new("max", f64::max),
            distinct: MapState::new("distinct"),
            recent: ListState::new("recent"),
        }
    }
}

impl KeyedProcessFunction<String, String, String> for SensorStats {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.count.declaration(), self.max.declaration(), self.distinct.declaration(), self.recent.declaration()]
    }

    fn process_element(
        &mut self,
        line: String,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, String>,
    ) -> FnResult {
        // A malformed line fails the job with the line in the error (no silent skipping).
        let reading = parse(&line)?;
        *ctx.value(&self.count)?.get_or_insert_with(|| 0) += 1;
        ctx.reducing(&self.max)?.add(reading.temperature);
        let bits = reading.temperature.to_bits();
        let mut distinct = ctx.map(&self.distinct)?;
        let seen = distinct.get(&bits).copied().unwrap_or(0);
        distinct.put(bits, seen + 1);
        let mut recent = ctx.list(&self.recent)?;
        let mut last: Vec<f64> = recent.get().to_vec();
        last.push(reading.temperature);
        if last.len() > 3 {
            last.remove(0);
        }
        recent.update(last);
        Ok(())
    }

    fn on_end_of_input(
        &mut self,
        ctx: &mut EndOfInputContext<'_, String>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        ctx.for_each_value(&self.count, |sensor, count| out.collect(format!("{sensor}\t{count}")))?;
        Ok(())
    }
}

/// `sensor-stats`.
pub struct SensorStatsJob;

impl JobDefinition for SensorStatsJob {
    fn name(&self) -> &'static str {
        "sensor-stats"
    }

    fn description(&self) -> &'static str {
        "readings 'sensor,temperature' from a file -> readings per sensor; a malformed line fails the job"
    }

    fn args(&self) -> Vec<ArgSpec> {
        vec![
            ArgSpec::required("input", "PATH", "CSV file of sensor,temperature lines"),
            ArgSpec::required("output", "DIR|-", "part files in DIR or '-'"),
        ]
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let input: std::path::PathBuf = args.required("input")?;
        if !input.is_file() {
            return Err(args.invalid(format!("--input {} is not a readable file", input.display())));
        }
        let output: String = args.required("output")?;
        let stats = env
            .from_source(TextLineSource::new(input))
            .uid("readings")
            .filter(|line: &String| !line.trim().is_empty())
            .key_by(|line: &String| line.split(',').next().unwrap_or_default().trim().to_string())
            .process(SensorStats::default())
            .uid("sensor-stats")
            .name("sensor-stats");
        fn format(line: &String, out: &mut String) {
            let _ = write!(out, "{line}");
        }
        if output == "-" {
            stats.sink_to(PrintSink::new(format)).uid("sink");
        } else {
            stats.sink_to(FileSink::new(output, format)).uid("sink");
        }
        Ok(())
    }
}

/// `flaky-counter`: the built-in counter with one injected crash, to watch a restart from the
/// latest checkpoint keep the output exactly once. The crash happens at event `--fail-at`
/// unless the file `--marker` exists (the crash creates it), so it happens exactly once.
/// `flaky-counter`.
pub struct FlakyCounterJob;

impl JobDefinition for FlakyCounterJob {
    fn name(&self) -> &'static str {
        "flaky-counter"
    }

    fn description(&self) -> &'static str {
        "counter that crashes once at event --fail-at (run it with checkpoints and a restart strategy)"
    }

    fn args(&self) -> Vec<ArgSpec> {
        vec![
            ArgSpec::required("users", "U", "number of users"),
            ArgSpec::required("events", "N", "number of events"),
            ArgSpec::optional("rate", "R", "events per second"),
            ArgSpec::required("fail-at", "I", "the event index that crashes the job once"),
            ArgSpec::required("marker", "PATH", "file created by the crash; while it exists there is no crash"),
            ArgSpec::required("output", "DIR", "part files in DIR"),
            ArgSpec::optional(
                "steady-output",
                "DIR",
                "also run an unconnected counter that never crashes, writing to DIR (its own pipelined region)",
            ),
        ]
    }

    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError> {
        let users: u64 = args.required("users")?;
        let events: u64 = args.required("events")?;
        let rate: Option<f64> = args.get("rate")?;
        let fail_at: u64 = args.required("fail-at")?;
        let marker: std::path::PathBuf = args.required("marker")?;
        let output: String = args.required("output")?;
        let steady_output: Option<String> = args.get("steady-output")?;
        if users == 0 {
            return Err(args.invalid("--users must be at least 1"));
        }
        let counts = env
            .from_source(weir_connectors::SequenceSource::new(Some(events), rate, |i| i))
            .uid("source")
            .map(move |index: u64| {
                if index == fail_at && !marker.exists() {
                    let _ = std::fs::write(&marker, b"crashed once");
                    panic!("injected crash at event {index}");
                }
                weir_jobs::counter::Event { index, user: index % users }
            })
            .key_by(|e: &weir_jobs::counter::Event| e.user)
            .process(weir_jobs::counter::CountPerUser::default())
            .uid("counter");
        counts.sink_to(FileSink::new(output, weir_jobs::counter::format_count)).uid("sink");
        if let Some(steady_output) = steady_output {
            env.from_source(weir_connectors::SequenceSource::new(Some(events), rate, |i| i))
                .uid("steady-source")
                .map(move |index: u64| weir_jobs::counter::Event { index, user: index % users })
                .key_by(|e: &weir_jobs::counter::Event| e.user)
                .process(weir_jobs::counter::CountPerUser::default())
                .uid("steady-counter")
                .sink_to(FileSink::new(steady_output, weir_jobs::counter::format_count))
                .uid("steady-sink");
        }
        Ok(())
    }
}

pub mod versions;

/// The catalog of version `version` of this binary: the built-in jobs, `sensor-stats`,
/// `flaky-counter`, and that version of `versioned-counter`.
pub fn catalog(version: versions::Version) -> weir_api::catalog::JobCatalog {
    let mut catalog = weir_jobs::builtin_catalog();
    catalog.register(SensorStatsJob);
    catalog.register(FlakyCounterJob);
    catalog.register(versions::VersionedCounter(version));
    catalog
}
