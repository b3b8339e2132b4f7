//! The command line's grammar (clap), with an example in every verb's help.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "weir",
    version,
    about = "weir: stateful stream processing with Apache Flink's operational model, in Rust",
    after_help = "Examples:\n  weir jobs\n  weir run -p 2 counter --users 1000 --events 1000000 --output none\n  weir list\n  weir cancel <JOBID>",
    propagate_version = true
)]
pub struct Cli {
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// Where the configuration comes from (shared by every verb that reads it).
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// YAML configuration file with Flink's option names (default: $WEIR_CONF_DIR/config.yaml if present)
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override one configuration option (repeatable), e.g. -D rest.port=0
    #[arg(short = 'D', value_name = "key=value")]
    pub dynamic: Vec<String>,
}

/// The verbs.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a job from the catalog (embedded cluster inside this process)
    #[command(
        after_help = "Examples:\n  weir run counter --users 1000 --events 1000000 --output none\n  weir run -p 4 wordcount --input book.txt --output out/\n  weir run -D rest.port=0 counter --users 10 --rate 100\n  weir run --dry-run -s /tmp/savepoints/savepoint-4f1c2e-0123456789ab -p 8 counter --users 1000 --output out/"
    )]
    Run(RunArgs),
    /// List the jobs of a cluster
    #[command(after_help = "Examples:\n  weir list\n  weir list -m 127.0.0.1:8081 --json")]
    List(ListArgs),
    /// Cancel a running job
    #[command(after_help = "Example:\n  weir cancel 4f1c2e0d9a8b7c6d5e4f3a2b1c0d9e8f")]
    Cancel(CancelArgs),
    /// Stop a job with a final savepoint (the job ends FINISHED, its state reusable)
    #[command(after_help = "Example:\n  weir stop --savepoint-path /tmp/savepoints 4f1c2e0d9a8b7c6d5e4f3a2b1c0d9e8f")]
    Stop(StopArgs),
    /// Take a savepoint of a running job; or --dispose one; or `inspect` one; or `rewrite` one
    /// to another max parallelism
    #[command(
        after_help = "Examples:\n  weir savepoint 4f1c2e0d9a8b7c6d5e4f3a2b1c0d9e8f /tmp/savepoints\n  weir savepoint inspect /tmp/savepoints/savepoint-4f1c2e-0123456789ab\n  weir savepoint inspect --json /tmp/savepoints/savepoint-4f1c2e-0123456789ab\n  weir savepoint rewrite --max-parallelism 1024 /tmp/savepoints/savepoint-4f1c2e-0123456789ab /tmp/rewritten\n  weir savepoint --dispose /tmp/savepoints/savepoint-4f1c2e-0123456789ab"
    )]
    Savepoint(SavepointArgs),
    /// Show the job catalog with each job's arguments
    #[command(after_help = "Example:\n  weir jobs")]
    Jobs,
    /// Run a JobManager (REST on rest.port, TaskManagers connect on jobmanager.rpc.port)
    #[command(after_help = "Example:\n  weir jobmanager -D rest.port=8081 -D jobmanager.rpc.port=6123")]
    Jobmanager(ConfigOnly),
    /// Run a TaskManager offering taskmanager.numberOfTaskSlots slots to a JobManager
    #[command(
        after_help = "Example:\n  weir taskmanager --jobmanager 127.0.0.1:6123 -D taskmanager.numberOfTaskSlots=2"
    )]
    Taskmanager(TaskmanagerArgs),
    /// Start or stop a local standalone cluster (background processes, logs in the data dir)
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Declare, show and delete deployments (specs the operator keeps running, as the Flink
    /// Kubernetes Operator's FlinkDeployment)
    #[command(subcommand)]
    Deployment(DeploymentCommand),
    /// Run the deployment controller: it moves each deployment's job to its applied spec
    #[command(
        after_help = "Examples:\n  weir operator                  # in the foreground\n  weir operator -d               # in the background, log in the data directory\n  weir operator stop"
    )]
    Operator(OperatorArgs),
    /// Kafka topics around a job: create and list them, produce records, read one back
    #[command(subcommand)]
    Kafka(KafkaCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(
        after_help = "Examples:\n  weir completions bash > ~/.local/share/bash-completion/completions/weir\n  weir completions zsh > ~/.zfunc/_weir"
    )]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
}

/// `weir kafka`: what kafka-topics.sh, kafka-console-producer.sh and
/// kafka-console-consumer.sh do for a job's topics.
#[derive(Subcommand, Debug)]
pub enum KafkaCommand {
    /// List the broker's topics with their partitions
    #[command(after_help = "Example:\n  weir kafka topics -b 127.0.0.1:9092")]
    Topics {
        /// Bootstrap servers, HOST:PORT[,HOST:PORT]
        #[arg(short = 'b', long = "bootstrap-server", value_name = "HOST:PORT")]
        bootstrap: String,
    },
    /// Create a topic (replication 1)
    #[command(after_help = "Example:\n  weir kafka create -b 127.0.0.1:9092 events --partitions 4")]
    Create {
        /// Bootstrap servers, HOST:PORT[,HOST:PORT]
        #[arg(short = 'b', long = "bootstrap-server", value_name = "HOST:PORT")]
        bootstrap: String,
        /// The topic
        topic: String,
        /// Its partitions
        #[arg(long = "partitions", default_value_t = 1, value_name = "N")]
        partitions: u32,
    },
    /// Produce records: each line of stdin, or --events counter events (user numbers)
    #[command(
        after_help = "Examples:\n  weir kafka produce -b 127.0.0.1:9092 events --events 100000 --users 1000\n  printf '1\\n2\\n' | weir kafka produce -b 127.0.0.1:9092 events"
    )]
    Produce {
        /// Bootstrap servers, HOST:PORT[,HOST:PORT]
        #[arg(short = 'b', long = "bootstrap-server", value_name = "HOST:PORT")]
        bootstrap: String,
        /// The topic
        topic: String,
        /// Produce N counter events instead of stdin's lines: event i is user i mod --users
        #[arg(long = "events", value_name = "N")]
        events: Option<u64>,
        /// Users of the counter events
        #[arg(long = "users", default_value_t = 1000, value_name = "U")]
        users: u64,
    },
    /// Read a topic from its beginning, as a read_committed consumer (what a transactional
    /// sink committed), one value per line
    #[command(after_help = "Example:\n  weir kafka consume -b 127.0.0.1:9092 counts --max-messages 10")]
    Consume {
        /// Bootstrap servers, HOST:PORT[,HOST:PORT]
        #[arg(short = 'b', long = "bootstrap-server", value_name = "HOST:PORT")]
        bootstrap: String,
        /// The topic
        topic: String,
        /// Stop after N records
        #[arg(long = "max-messages", value_name = "N")]
        max: Option<u64>,
        /// Stop after this long without a record, e.g. 5s
        #[arg(long = "timeout", default_value = "5s", value_name = "DURATION")]
        timeout: String,
        /// Print only how many records were read
        #[arg(long = "count")]
        count: bool,
    },
}

/// `weir deployment`.
#[derive(Subcommand, Debug)]
pub enum DeploymentCommand {
    /// Record a deployment's desired spec (a WeirDeployment YAML file); the operator acts on it
    #[command(after_help = "Example:\n  weir deployment apply -f orders.yaml")]
    Apply(DeploymentApplyArgs),
    /// Show deployments, or one with its status
    #[command(
        after_help = "Examples:\n  weir deployment get\n  weir deployment get orders\n  weir deployment get orders -o yaml"
    )]
    Get(DeploymentGetArgs),
    /// Show a deployment's savepoint history
    #[command(after_help = "Example:\n  weir deployment history orders")]
    History(DeploymentNameArgs),
    /// Show what the operator did with a deployment and why: its steps, refusals, rollbacks
    #[command(after_help = "Examples:\n  weir deployment events orders\n  weir deployment events orders -o json")]
    Events(DeploymentEventsArgs),
    /// Delete a deployment: the operator cancels its job, stops its cluster and removes it
    #[command(after_help = "Example:\n  weir deployment delete orders")]
    Delete(DeploymentNameArgs),
}

/// `weir deployment apply`.
#[derive(Args, Debug)]
pub struct DeploymentApplyArgs {
    /// The WeirDeployment YAML file
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
    /// Configuration (where deployments are kept: the data directory, or etcd with HA)
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir deployment get`.
#[derive(Args, Debug)]
pub struct DeploymentGetArgs {
    /// One deployment (all when absent)
    pub name: Option<String>,
    /// Output format: the full object as yaml or json
    #[arg(short = 'o', long = "output", value_name = "yaml|json")]
    pub output: Option<OutputFormat>,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir deployment events`.
#[derive(Args, Debug)]
pub struct DeploymentEventsArgs {
    /// The deployment's metadata.name
    pub name: String,
    /// Output format: the events as yaml or json
    #[arg(short = 'o', long = "output", value_name = "yaml|json")]
    pub output: Option<OutputFormat>,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// Output formats of `get`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// YAML
    Yaml,
    /// JSON
    Json,
}

/// A deployment's name.
#[derive(Args, Debug)]
pub struct DeploymentNameArgs {
    /// The deployment's metadata.name
    pub name: String,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir operator`.
#[derive(Args, Debug)]
pub struct OperatorArgs {
    /// `stop`: end the operator `weir operator -d` started
    #[command(subcommand)]
    pub action: Option<OperatorAction>,
    /// Run in the background (pid file and log under the data directory)
    #[arg(short = 'd', long = "detach")]
    pub detach: bool,
    /// Control the WeirDeployment resources of a Kubernetes namespace (their clusters as
    /// Deployments and pods; replicas elect a leader with a Lease)
    #[arg(long = "kubernetes")]
    pub kubernetes: bool,
    /// The kubeconfig for --kubernetes (default: KUBECONFIG, ~/.kube/config, or the pod's ServiceAccount)
    #[arg(long = "kubeconfig", value_name = "FILE", requires = "kubernetes")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The namespace for --kubernetes (default: the kubeconfig's, or the pod's)
    #[arg(long = "namespace", value_name = "NS", requires = "kubernetes")]
    pub namespace: Option<String>,
    /// Configuration (kubernetes.operator.* defaults, operator.rest.port, HA for the store)
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir operator stop`.
#[derive(Subcommand, Debug)]
pub enum OperatorAction {
    /// Stop the operator started with `weir operator -d` (deployments keep running)
    Stop,
}

/// Verbs that only take configuration.
#[derive(Args, Debug)]
pub struct ConfigOnly {
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir taskmanager`.
#[derive(Args, Debug)]
pub struct TaskmanagerArgs {
    /// RPC address of the JobManager (default: jobmanager.rpc.address:jobmanager.rpc.port)
    #[arg(long = "jobmanager", value_name = "HOST:PORT")]
    pub jobmanager: Option<String>,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir cluster`.
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Start a JobManager and N TaskManagers in the background
    #[command(after_help = "Example:\n  weir cluster start --taskmanagers 3")]
    Start(ClusterStartArgs),
    /// Start one more TaskManager in the background for the running cluster (as Flink's
    /// `taskmanager.sh start`); `weir cluster stop` stops it too
    #[command(
        name = "add-taskmanager",
        after_help = "Example:\n  weir cluster add-taskmanager -D taskmanager.numberOfTaskSlots=4"
    )]
    AddTaskmanager(ConfigArgs),
    /// Stop the processes `weir cluster start` and `weir cluster add-taskmanager` started
    Stop,
}

/// `weir cluster start`.
#[derive(Args, Debug)]
pub struct ClusterStartArgs {
    /// Number of TaskManagers
    #[arg(long = "taskmanagers", default_value_t = 1, value_name = "N")]
    pub taskmanagers: u32,
    /// Number of JobManagers: one leader and N-1 standbys (needs high-availability.type: etcd)
    #[arg(long = "jobmanagers", default_value_t = 1, value_name = "N")]
    pub jobmanagers: u32,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir stop`.
#[derive(Args, Debug)]
pub struct StopArgs {
    /// REST address of the cluster (default: rest.address:rest.port, or $WEIR_JOBMANAGER)
    #[arg(short = 'm', long = "jobmanager", value_name = "HOST:PORT")]
    pub jobmanager: Option<String>,
    /// Where the savepoint goes (default: state.savepoints.dir)
    #[arg(short = 'p', long = "savepoint-path", alias = "savepointPath", value_name = "DIR")]
    pub savepoint_path: Option<String>,
    /// The savepoint's format: canonical (portable, the default) or native (the state
    /// backend's own layout: faster, restores only into the same backend)
    #[arg(long = "type", value_name = "canonical|native", default_value = "canonical")]
    pub format: FormatArg,
    /// Emit the final watermark before the savepoint, so every event-time window and timer
    /// fires (Flink's --drain): for ending a job for good; resuming from the savepoint can
    /// repeat window results
    #[arg(short = 'd', long = "drain")]
    pub drain: bool,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The job to stop
    #[arg(value_name = "JOBID")]
    pub job_id: String,
}

/// `--type` of `savepoint` and `stop` (Flink's `formatType`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// Portable: any state backend restores it; `savepoint rewrite` works on it
    Canonical,
    /// The state backend's own layout: faster; only the same backend restores it
    Native,
}

impl FormatArg {
    /// Flink's `formatType` value.
    pub fn rest_name(self) -> &'static str {
        match self {
            FormatArg::Canonical => "CANONICAL",
            FormatArg::Native => "NATIVE",
        }
    }
}

/// `weir savepoint`.
#[derive(Args, Debug)]
pub struct SavepointArgs {
    /// REST address of the cluster (default: rest.address:rest.port, or $WEIR_JOBMANAGER)
    #[arg(short = 'm', long = "jobmanager", value_name = "HOST:PORT")]
    pub jobmanager: Option<String>,
    /// Delete the savepoint at PATH (its _metadata first, then its files)
    #[arg(short = 'd', long = "dispose", value_name = "PATH")]
    pub dispose: Option<String>,
    /// With `inspect`: print JSON
    #[arg(long)]
    pub json: bool,
    /// With `rewrite`: the new max parallelism (number of key groups)
    #[arg(long = "max-parallelism", value_name = "N")]
    pub max_parallelism: Option<u32>,
    /// The savepoint's format: canonical (portable, the default) or native (the state
    /// backend's own layout: faster, restores only into the same backend)
    #[arg(long = "type", value_name = "canonical|native")]
    pub format: Option<FormatArg>,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
    /// JOBID [DIR] to take a savepoint, `inspect PATH`, or `rewrite PATH DIR` (with
    /// --max-parallelism)
    #[arg(value_name = "JOBID [DIR] | inspect PATH | rewrite PATH DIR")]
    pub args: Vec<String>,
}

/// `weir run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// REST address of a standalone cluster to submit to (default: embedded cluster, unless
    /// $WEIR_JOBMANAGER or rest.address in the configuration file names one)
    #[arg(short = 'm', long = "jobmanager", value_name = "HOST:PORT")]
    pub jobmanager: Option<String>,
    /// Where to run, Flink's execution.target: local (an embedded cluster here) or remote
    /// (the cluster -m, rest.address or high availability names)
    #[arg(short = 't', long = "target", value_name = "local|remote")]
    pub target: Option<String>,
    /// Return once the job is submitted (cluster only)
    #[arg(short = 'd', long = "detached")]
    pub detached: bool,
    /// Parallelism of operators without their own (overrides parallelism.default)
    #[arg(short = 'p', long = "parallelism", value_name = "N", value_parser = parse_parallelism)]
    pub parallelism: Option<u32>,
    /// Start from a savepoint or retained checkpoint directory (or its _metadata file)
    #[arg(short = 's', long = "from-savepoint", alias = "fromSavepoint", value_name = "PATH")]
    pub from_savepoint: Option<String>,
    /// Allow state in the snapshot that no operator of the job claims (it is dropped)
    #[arg(short = 'n', long = "allow-non-restored-state", alias = "allowNonRestoredState")]
    pub allow_non_restored_state: bool,
    /// Check everything (job, arguments, configuration, and with -s whether the job can read
    /// the snapshot) and print what would run and what would be restored; start nothing
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The job's name in the catalog (see `weir jobs`)
    #[arg(value_name = "JOB")]
    pub job: String,
    /// The job's own arguments
    #[arg(value_name = "JOB ARGS", trailing_var_arg = true, allow_hyphen_values = true)]
    pub job_args: Vec<String>,
}

/// `weir list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// REST address of the cluster (default: rest.address:rest.port, or $WEIR_JOBMANAGER)
    #[arg(short = 'm', long = "jobmanager", value_name = "HOST:PORT")]
    pub jobmanager: Option<String>,
    /// Print the jobs as JSON
    #[arg(long)]
    pub json: bool,
    /// Show only running (and restarting) jobs, as `flink list -r`
    #[arg(short = 'r', long = "running")]
    pub running: bool,
    /// Show only scheduled jobs (created, not yet running), as `flink list -s`
    #[arg(short = 's', long = "scheduled")]
    pub scheduled: bool,
    /// Show running, scheduled and terminated jobs, as `flink list -a`
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// `weir cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// REST address of the cluster (default: rest.address:rest.port, or $WEIR_JOBMANAGER)
    #[arg(short = 'm', long = "jobmanager", value_name = "HOST:PORT")]
    pub jobmanager: Option<String>,
    /// Configuration
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The job to cancel (32 hex characters)
    #[arg(value_name = "JOBID")]
    pub job_id: String,
}

fn parse_parallelism(text: &str) -> Result<u32, String> {
    let value: u32 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number; the parallelism is a whole number from 1 to 32768"))?;
    if value == 0 || value > 32_768 {
        return Err(format!("{value} is out of range; the parallelism must be between 1 and 32768"));
    }
    Ok(value)
}
