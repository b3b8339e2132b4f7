//! The `--output DIR|-|none` convention shared by the built-in jobs.

use weir_api::Data;
use weir_api::catalog::{JobArgs, JobBuildError};
use weir_api::datastream::{DataStream, DataStreamSink};
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
}

impl Output {
    /// Reads `--output`; `allow_none` says whether `none` is accepted.
    pub fn from_args(args: &JobArgs, default: Output, allow_none: bool) -> Result<Output, JobBuildError> {
        let Some(text) = args.get::<String>("output")? else {
            return Ok(default);
        };
        match text.as_str() {
            "-" => Ok(Output::Print),
            "none" if allow_none => Ok(Output::Discard),
            "" => Err(args.invalid("--output is empty; give a directory, '-' for stdout".to_string())),
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

    /// Attaches the matching sink (uid `sink`) to `stream`.
    pub fn attach<T: Data>(&self, stream: &DataStream<T>, format: fn(&T, &mut String)) -> DataStreamSink {
        let sink = match self {
            Output::Directory(dir) => stream.sink_to(FileSink::new(dir.clone(), format)),
            Output::Print => stream.sink_to(PrintSink::new(format)),
            Output::Discard => stream.sink_to(DiscardSink::new()),
        };
        sink.uid("sink").name("sink")
    }
}
