//! The `--output DIR|-|none|kafka://...` convention shared by the built-in jobs.

use weir_api::Data;
use weir_api::catalog::{JobArgs, JobBuildError};
use weir_api::datastream::{DataStream, DataStreamSink};
use weir_connectors::kafka::{KafkaSinkRecord, KafkaUrl};
use weir_connectors::{DiscardSink, FileSink, PrintSink};

/// Where a job's records go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Part files in a directory (`part-*` committed, dot-files in progress).
    Directory(std::path::PathBuf),
    /// Standard output.
    Print,
    /// Nowhere (benchmarks).
    Discard,
    /// A Kafka topic (exactly-once unless the URL's `delivery=` says otherwise).
    Kafka(KafkaUrl),
}

impl Output {
    /// Reads `--output` (every built-in job takes the same forms: `none` discards in each,
    /// rather than naming a directory `none` in one of them).
    pub fn from_args(args: &JobArgs, default: Output) -> Result<Output, JobBuildError> {
        let Some(text) = args.get::<String>("output")? else {
            return Ok(default);
        };
        match text.as_str() {
            "-" => Ok(Output::Print),
            "none" => Ok(Output::Discard),
            "" => {
                Err(args.invalid("--output is empty; give a directory, '-' for stdout, 'none' to discard".to_string()))
            }
            url if KafkaUrl::is_kafka(url) => {
                KafkaUrl::parse(url).map(Output::Kafka).map_err(|e| args.invalid(format!("--output {e}")))
            }
            url if crate::kafka::unknown_scheme("--output", url).is_some() => {
                Err(args.invalid(crate::kafka::unknown_scheme("--output", url).unwrap_or_default()))
            }
            path => {
                let path = std::path::PathBuf::from(path);
                if path.is_file() {
                    return Err(args.invalid(format!(
                        "--output {} is a file; give a directory (part files are written inside it)",
                        path.display()
                    )));
                }
                Ok(Output::Directory(path))
            }
        }
    }

    /// Attaches the matching sink (uid `sink`) to `stream`. A Kafka record's value is the
    /// line `format` writes, its key what `key` writes.
    pub fn attach<T: Data>(
        &self,
        args: &JobArgs,
        stream: &DataStream<T>,
        format: fn(&T, &mut String),
        key: fn(&T, &mut String),
    ) -> Result<DataStreamSink, JobBuildError> {
        let sink = match self {
            Output::Directory(dir) => stream.sink_to(FileSink::new(dir.clone(), format)),
            Output::Print => stream.sink_to(PrintSink::new(format)),
            Output::Discard => stream.sink_to(DiscardSink::new()),
            Output::Kafka(url) => {
                let serializer = move |record: &T| {
                    let (mut value, mut key_text) = (String::new(), String::new());
                    format(record, &mut value);
                    key(record, &mut key_text);
                    KafkaSinkRecord { key: Some(key_text.into_bytes()), value: value.into_bytes(), partition: None }
                };
                let sink = crate::kafka::sink(url, serializer).map_err(|e| args.invalid(format!("--output {e}")))?;
                stream.sink_to(sink)
            }
        };
        Ok(sink.uid("sink").name("sink"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_api::catalog::ArgSpec;

    fn output_of(argv: &[&str]) -> Result<Output, String> {
        let specs = [ArgSpec::optional("output", "DIR|-|none", "where records go")];
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        let args = JobArgs::parse("job", &specs, &argv).map_err(|e| e.to_string())?;
        Output::from_args(&args, Output::Print).map_err(|e| e.to_string())
    }

    #[test]
    fn output_forms_are_a_directory_stdout_nowhere_or_kafka() {
        assert_eq!(output_of(&[]), Ok(Output::Print));
        assert_eq!(output_of(&["--output", "-"]), Ok(Output::Print));
        assert_eq!(output_of(&["--output", "none"]), Ok(Output::Discard));
        assert_eq!(output_of(&["--output", "out/words"]), Ok(Output::Directory("out/words".into())));
        assert!(matches!(output_of(&["--output", "kafka://127.0.0.1:9092/words"]), Ok(Output::Kafka(_))));
        let empty = output_of(&["--output", ""]).unwrap_err();
        assert!(empty.contains("'none' to discard"), "{empty}");
    }
}
