//! The job catalog: named jobs with declared arguments, so one binary (`weir`, or a user's
//! own) can list, validate and build any of them by name — in every process of a cluster.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::datastream::StreamExecutionEnvironment;

/// One argument a job accepts: `--name VALUE`, or a flag `--name`.
#[derive(Clone, Debug)]
pub struct ArgSpec {
    /// The name after `--`.
    pub name: &'static str,
    /// The placeholder shown in help (`PATH`, `N`); `None` makes this a flag.
    pub value_name: Option<&'static str>,
    /// Whether the job cannot run without it.
    pub required: bool,
    /// What it means.
    pub help: &'static str,
}

impl ArgSpec {
    /// A required `--name VALUE`.
    pub const fn required(name: &'static str, value_name: &'static str, help: &'static str) -> ArgSpec {
        ArgSpec { name, value_name: Some(value_name), required: true, help }
    }

    /// An optional `--name VALUE`.
    pub const fn optional(name: &'static str, value_name: &'static str, help: &'static str) -> ArgSpec {
        ArgSpec { name, value_name: Some(value_name), required: false, help }
    }

    /// A flag `--name`.
    pub const fn flag(name: &'static str, help: &'static str) -> ArgSpec {
        ArgSpec { name, value_name: None, required: false, help }
    }

    /// True for a file or directory argument: its value name starts with `PATH`, `DIR` or
    /// `FILE` (`DIR|-` too). A client makes such a relative value absolute before a cluster
    /// runs the job, whose processes have their own working directories.
    pub fn is_path(&self) -> bool {
        self.value_name.is_some_and(|name| ["PATH", "DIR", "FILE"].iter().any(|prefix| name.starts_with(prefix)))
    }

    /// `--name VALUE` or `--name`, as usage shows it.
    pub fn usage(&self) -> String {
        let text = match self.value_name {
            Some(value) => format!("--{} {value}", self.name),
            None => format!("--{}", self.name),
        };
        if self.required { text } else { format!("[{text}]") }
    }
}

/// A job argument problem; the CLI reports it as a usage error.
#[derive(Debug, thiserror::Error)]
#[error("job '{job}': {problem}; usage: {usage}")]
pub struct ArgError {
    /// The job.
    pub job: String,
    /// What was wrong.
    pub problem: String,
    /// The job's usage line.
    pub usage: String,
}

/// Why a job could not be built from its arguments (reported as a usage error).
#[derive(Debug, thiserror::Error)]
pub enum JobBuildError {
    /// An argument was missing or malformed.
    #[error(transparent)]
    Args(#[from] ArgError),
    /// The arguments are well-formed but unusable (a missing input file ...).
    #[error("job '{job}': {message}")]
    Invalid {
        /// The job.
        job: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// Parsed arguments of one job.
#[derive(Clone, Debug)]
pub struct JobArgs {
    job: String,
    usage: String,
    values: BTreeMap<String, String>,
    flags: Vec<String>,
    raw: Vec<String>,
}

impl JobArgs {
    /// Parses `argv` against `specs`.
    pub fn parse(job: &str, specs: &[ArgSpec], argv: &[String]) -> Result<JobArgs, ArgError> {
        let usage = usage_line(job, specs);
        let error = |problem: String| ArgError { job: job.to_string(), problem, usage: usage.clone() };
        let mut values = BTreeMap::new();
        let mut flags = Vec::new();
        let mut index = 0;
        while index < argv.len() {
            let word = &argv[index];
            let Some(stripped) = word.strip_prefix("--") else {
                if word.starts_with('-') {
                    return Err(error(format!(
                        "unexpected argument '{word}' (weir's own options such as -p, -D and -c go before the job name: weir run {word} ... {job} ...)"
                    )));
                }
                return Err(error(format!("unexpected argument '{word}'")));
            };
            let (name, inline_value) = match stripped.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (stripped, None),
            };
            let Some(spec) = specs.iter().find(|s| s.name == name) else {
                return Err(error(format!("unknown argument '--{name}'")));
            };
            match spec.value_name {
                None => {
                    if inline_value.is_some() {
                        return Err(error(format!("'--{name}' is a flag and takes no value")));
                    }
                    flags.push(name.to_string());
                }
                Some(value_name) => {
                    let value = match inline_value {
                        Some(value) => value,
                        None => {
                            index += 1;
                            match argv.get(index) {
                                Some(value) => value.clone(),
                                None => {
                                    return Err(error(format!("'--{name}' needs a value ({value_name})")));
                                }
                            }
                        }
                    };
                    if values.insert(name.to_string(), value).is_some() {
                        return Err(error(format!("'--{name}' is given more than once")));
                    }
                }
            }
            index += 1;
        }
        for spec in specs {
            if spec.required && !values.contains_key(spec.name) {
                return Err(error(format!("missing required argument {}", spec.usage())));
            }
        }
        Ok(JobArgs { job: job.to_string(), usage, values, flags, raw: argv.to_vec() })
    }

    /// The value of `--name`, parsed; `None` when absent.
    pub fn get<T: FromStr>(&self, name: &str) -> Result<Option<T>, ArgError>
    where
        T::Err: std::fmt::Display,
    {
        let Some(text) = self.values.get(name) else {
            return Ok(None);
        };
        match text.parse::<T>() {
            Ok(value) => Ok(Some(value)),
            Err(e) => Err(ArgError {
                job: self.job.clone(),
                problem: format!("bad value '{text}' for --{name}: {e}"),
                usage: self.usage.clone(),
            }),
        }
    }

    /// The value of a required `--name`, parsed.
    pub fn required<T: FromStr>(&self, name: &str) -> Result<T, ArgError>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(name)? {
            Some(value) => Ok(value),
            None => Err(ArgError {
                job: self.job.clone(),
                problem: format!("missing required argument --{name}"),
                usage: self.usage.clone(),
            }),
        }
    }

    /// True when the flag `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    /// The arguments exactly as given (forwarded to other processes of a cluster).
    pub fn raw(&self) -> &[String] {
        &self.raw
    }

    /// An [`JobBuildError::Invalid`] for this job.
    pub fn invalid(&self, message: impl Into<String>) -> JobBuildError {
        JobBuildError::Invalid { job: self.job.clone(), message: message.into() }
    }
}

/// `argv` with the value of every path argument of `specs` ([`ArgSpec::is_path`]) made absolute
/// against `cwd`: the values `-` and `none` and absolute paths stay as they are, and so does
/// anything that is not a well-formed `--name VALUE` (parsing reports it later).
pub fn absolute_path_args(specs: &[ArgSpec], argv: &[String], cwd: &std::path::Path) -> Vec<String> {
    let absolute = |value: &str| {
        if value == "-" || value == "none" || value.contains("://") || std::path::Path::new(value).is_absolute() {
            value.to_string()
        } else {
            cwd.join(value).display().to_string()
        }
    };
    let is_path = |name: &str| specs.iter().any(|spec| spec.name == name && spec.is_path());
    let mut out = Vec::with_capacity(argv.len());
    let mut index = 0;
    while index < argv.len() {
        let word = &argv[index];
        index += 1;
        let Some(stripped) = word.strip_prefix("--") else {
            out.push(word.clone());
            continue;
        };
        match stripped.split_once('=') {
            Some((name, value)) if is_path(name) => out.push(format!("--{name}={}", absolute(value))),
            Some(_) => out.push(word.clone()),
            None if is_path(stripped) && index < argv.len() => {
                out.push(word.clone());
                out.push(absolute(&argv[index]));
                index += 1;
            }
            None => out.push(word.clone()),
        }
    }
    out
}

fn usage_line(job: &str, specs: &[ArgSpec]) -> String {
    let mut line = job.to_string();
    for spec in specs {
        line.push(' ');
        line.push_str(&spec.usage());
    }
    line
}

/// A job the catalog can build by name.
pub trait JobDefinition: Send + Sync {
    /// The name users type (`weir run NAME`).
    fn name(&self) -> &'static str;
    /// One line on what it does.
    fn description(&self) -> &'static str;
    /// The arguments it accepts.
    fn args(&self) -> Vec<ArgSpec>;
    /// Adds the job's sources, operators and sinks to `env`.
    fn build(&self, args: &JobArgs, env: &StreamExecutionEnvironment) -> Result<(), JobBuildError>;
}

/// The jobs a binary can run.
#[derive(Default)]
pub struct JobCatalog {
    jobs: Vec<Box<dyn JobDefinition>>,
}

impl JobCatalog {
    /// An empty catalog.
    pub fn new() -> JobCatalog {
        JobCatalog::default()
    }

    /// Adds a job (a later job with the same name replaces the earlier one).
    pub fn register(&mut self, job: impl JobDefinition + 'static) -> &mut Self {
        self.jobs.retain(|j| j.name() != job.name());
        self.jobs.push(Box::new(job));
        self
    }

    /// The job called `name`.
    pub fn get(&self, name: &str) -> Option<&dyn JobDefinition> {
        self.jobs.iter().find(|j| j.name() == name).map(|j| j.as_ref())
    }

    /// Every job, sorted by name.
    pub fn jobs(&self) -> Vec<&dyn JobDefinition> {
        let mut jobs: Vec<&dyn JobDefinition> = self.jobs.iter().map(|j| j.as_ref()).collect();
        jobs.sort_by_key(|j| j.name());
        jobs
    }

    /// The usage line of a job.
    pub fn usage(job: &dyn JobDefinition) -> String {
        usage_line(job.name(), &job.args())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_arguments_are_made_absolute_against_the_client_s_directory() {
        let specs = vec![
            ArgSpec::required("input", "PATH", "in"),
            ArgSpec::required("output", "DIR|-|none", "out"),
            ArgSpec::required("users", "U", "n"),
        ];
        let argv: Vec<String> =
            ["--input", "data/in.txt", "--output=out", "--users", "5"].iter().map(|s| s.to_string()).collect();
        let made = absolute_path_args(&specs, &argv, std::path::Path::new("/home/me"));
        assert_eq!(made, ["--input", "/home/me/data/in.txt", "--output=/home/me/out", "--users", "5"]);
        for kept in ["-", "none", "/abs/dir", "s3://bucket/x"] {
            let argv = vec!["--output".to_string(), kept.to_string()];
            assert_eq!(absolute_path_args(&specs, &argv, std::path::Path::new("/home/me"))[1], kept);
        }
    }

    fn specs() -> Vec<ArgSpec> {
        vec![
            ArgSpec::required("users", "U", "number of users"),
            ArgSpec::optional("events", "N", "events"),
            ArgSpec::flag("enrich", "add a stage"),
        ]
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn parses_values_inline_values_and_flags() {
        let args = JobArgs::parse("counter", &specs(), &argv(&["--users", "10", "--events=5", "--enrich"])).unwrap();
        assert_eq!(args.required::<u64>("users").unwrap(), 10);
        assert_eq!(args.get::<u64>("events").unwrap(), Some(5));
        assert!(args.flag("enrich"));
    }

    #[test]
    fn errors_name_the_job_the_argument_and_the_usage() {
        let err = JobArgs::parse("counter", &specs(), &argv(&["--events", "5"])).unwrap_err().to_string();
        assert!(
            err.contains("missing required argument --users U") && err.contains("usage: counter --users U"),
            "{err}"
        );
        let err = JobArgs::parse("counter", &specs(), &argv(&["--users", "1", "--bogus"])).unwrap_err().to_string();
        assert!(err.contains("unknown argument '--bogus'"), "{err}");
        let args = JobArgs::parse("counter", &specs(), &argv(&["--users", "ten"])).unwrap();
        let err = args.required::<u64>("users").unwrap_err().to_string();
        assert!(err.contains("bad value 'ten' for --users"), "{err}");
        let err = JobArgs::parse("counter", &specs(), &argv(&["--users"])).unwrap_err().to_string();
        assert!(err.contains("needs a value"), "{err}");
    }
}
