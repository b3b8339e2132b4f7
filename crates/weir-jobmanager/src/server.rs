//! The JobManager server, composed once for both modes: the TaskManagers' RPC endpoint
//! (`ClusterResources`), the `Dispatcher`, and the REST API whose `ClusterInfo` submits jobs,
//! lists TaskManagers and, with high availability, says who leads. What runs the jobs is a
//! term: without high availability one term begins at start and ends only when the process
//! stops (its jobs are cancelled, as no other JobManager takes them over); with it, each
//! leadership is a term (`leadership`), and between terms the process stands by.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use weir_api::catalog::JobCatalog;
use weir_config::Configuration;
use weir_config::options::{HEARTBEAT_TIMEOUT, HIGH_AVAILABILITY_RECONCILE_TIMEOUT, REST_PORT};
use weir_ha::{HaStore, RecoverableJob};
use weir_kubernetes::native::TaskManagerPods;
use weir_rest::{ClusterInfo, RestServer, SubmittedJob};
use weir_runtime::Dispatcher;
use weir_runtime::cluster::{ClusterResources, JobSubmission, RemoteExecutor};
use weir_runtime::job_settings::JobHa;
use weir_runtime::security::WireSecurity;
use weir_types::{JobId, Lifecycle as _};

use crate::error::JobManagerError as Error;
use crate::leadership::Campaign;
use crate::prepare::{PreparedJob, job_config, prepare};
use crate::settings;

/// How often a JobManager looks whether it was asked to stop.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(50);
/// How long a stopping JobManager waits for its cancelled jobs to end.
const SHUTDOWN_JOBS_WAIT_MAX: Duration = Duration::from_secs(15);

/// A JobManager process: started with [`JobManager::start`] (its endpoints listen, it says
/// where on stderr), then [`JobManager::run`] until asked to stop.
pub struct JobManager {
    jobs: Arc<Jobs>,
    mode: Mode,
    rest: RestServer,
    rest_address: String,
}

enum Mode {
    /// Without high availability: the one term, begun at start.
    Standalone(OpenTerm),
    /// With high availability: terms while elected.
    Ha(Campaign),
}

impl Mode {
    fn campaign(&self) -> Option<&Campaign> {
        match self {
            Mode::Ha(campaign) => Some(campaign),
            Mode::Standalone(_) => None,
        }
    }
}

/// What submissions and recoveries share: the cluster's configuration and catalog, the
/// dispatcher, and the term under way, if any.
pub(crate) struct Jobs {
    pub(crate) config: Configuration,
    pub(crate) catalog: Arc<JobCatalog>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) term: Mutex<Option<Term>>,
}

/// One term of this JobManager: the TaskManagers it accepts and, with high availability, the
/// store every write of the term is conditioned on.
#[derive(Clone)]
pub(crate) struct Term {
    pub(crate) resources: Arc<ClusterResources>,
    pub(crate) store: Option<HaStore>,
    /// When this term began, epoch ms.
    pub(crate) since_ms: u64,
}

/// A term while it lasts, with the TaskManager pods started for it.
pub(crate) struct OpenTerm {
    pub(crate) term: Term,
    pub(crate) pods: Option<TaskManagerPods>,
}

impl OpenTerm {
    /// Ends the term: its pods go, and its TaskManager connections close.
    pub(crate) fn close(self) {
        drop(self.pods);
        self.term.resources.stop();
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long TaskManagers may stay silent, and how they authenticate.
pub(crate) fn term_settings(config: &Configuration) -> Result<(Duration, WireSecurity), Error> {
    let heartbeat_timeout = config.get(&HEARTBEAT_TIMEOUT).map_err(Error::usage)?;
    Ok((heartbeat_timeout, settings::wire_security(config)?))
}

/// The TaskManager port `listen` is not to be had.
pub(crate) fn cannot_listen(listen: &str, error: std::io::Error) -> Error {
    Error::runtime(format!(
        "cannot listen for TaskManagers on {listen}: {error}; choose another jobmanager.rpc.port or jobmanager.bind-host"
    ))
}

impl JobManager {
    /// Starts a JobManager for `config` and `catalog`: with high availability
    /// (`high-availability.type`) connected to its store and standing by, else with its
    /// TaskManager port open; its REST API listens either way.
    pub fn start(config: Configuration, catalog: Arc<JobCatalog>) -> Result<JobManager, Error> {
        let (mode, rpc_address) = match settings::ha_settings(&config)? {
            None => {
                let (term, rpc_address) = standalone_term(&config)?;
                (Mode::Standalone(term), rpc_address)
            }
            Some(ha) => {
                let campaign = Campaign::open(&config, ha)?;
                let rpc_address = campaign.rpc_address().to_string();
                (Mode::Ha(campaign), rpc_address)
            }
        };
        let term = match &mode {
            Mode::Standalone(open) => Some(open.term.clone()),
            Mode::Ha(_) => None,
        };
        let dispatcher = Dispatcher::new("cluster");
        let jobs = Arc::new(Jobs { config, catalog, dispatcher, term: Mutex::new(term) });
        // Known once the REST server listens, before any term begins.
        let own_rest: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
        let campaign = mode.campaign();
        let cluster = cluster_info(&jobs, campaign, &own_rest);
        let (rest_bind, rest_host) = settings::rest_hosts(&jobs.config)?;
        let port = jobs.config.get(&REST_PORT).map_err(Error::usage)?;
        let rest =
            RestServer::start(&rest_bind, port, Arc::clone(&jobs.dispatcher), cluster).map_err(Error::runtime)?;
        let rest_address = settings::host_port(&rest_host, rest.local_addr().port());
        let _ = own_rest.set(rest_address.clone());
        let (who, standing_by) = match campaign {
            Some(campaign) => campaign.stand_by(&jobs),
            None => ("JobManager".to_string(), String::new()),
        };
        eprintln!("{who}: REST API at http://{rest_address}, TaskManagers connect to {rpc_address}{standing_by}");
        Ok(JobManager { jobs, mode, rest, rest_address })
    }

    /// Runs until `stop` is set. Without high availability the jobs are then cancelled
    /// (sinks abort what they staged, TaskManagers stop the subtasks); with it a standby stops
    /// campaigning, and the leader steps down at once, leaving the tasks running for the next
    /// leader. An error is a term that could not begin, or the HA store failing a campaign.
    pub fn run(self, stop: &AtomicBool) -> Result<(), Error> {
        let JobManager { jobs, mode, rest, rest_address } = self;
        match mode {
            Mode::Standalone(term) => {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(STOP_POLL);
                }
                cancel_jobs_for_shutdown(&jobs.dispatcher);
                term.close();
                drop(rest);
                Ok(())
            }
            Mode::Ha(campaign) => {
                let ended = campaign.run(&jobs, &rest_address, stop);
                drop(rest);
                ended
            }
        }
    }
}

/// The one term of a JobManager without high availability, and the address TaskManagers
/// are told to connect to.
fn standalone_term(config: &Configuration) -> Result<(OpenTerm, String), Error> {
    let (rpc_bind, rpc_host, rpc_port) = settings::jobmanager_rpc_hosts(config)?;
    let (heartbeat_timeout, security) = term_settings(config)?;
    let listen = settings::host_port(&rpc_bind, rpc_port);
    let (resources, bound) =
        ClusterResources::start(&listen, heartbeat_timeout, security).map_err(|e| cannot_listen(&listen, e))?;
    let rpc_address = settings::host_port(&rpc_host, bound.port());
    let pods = settings::taskmanager_pods(config, &resources, Some(rpc_address.clone()))?;
    let term = Term { resources, store: None, since_ms: weir_types::lifecycle::now_ms() };
    Ok((OpenTerm { term, pods }, rpc_address))
}

/// What the REST API asks the JobManager: the submitter, the TaskManagers of the term under
/// way, the configuration, and with high availability who leads.
fn cluster_info(jobs: &Arc<Jobs>, campaign: Option<&Campaign>, own_rest: &Arc<OnceLock<String>>) -> ClusterInfo {
    let submitting = Arc::clone(jobs);
    let listing = Arc::clone(jobs);
    ClusterInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        taskmanager_list: Some(Arc::new(move || {
            lock(&listing.term).as_ref().map(|term| term.resources.taskmanagers()).unwrap_or_default()
        })),
        submitter: Some(Arc::new(move |submission| submitting.submit(submission))),
        configuration: settings::shown_configuration(&jobs.config),
        leader: campaign.map(Campaign::leader_lookup),
        ha_overview: campaign.map(|campaign| campaign.overview(jobs, own_rest)),
        ..ClusterInfo::default()
    }
}

impl Jobs {
    /// `POST /jobs`: prepares the submission, records it in the HA store before it is
    /// acknowledged (with high availability), and starts it.
    fn submit(&self, submission: JobSubmission) -> Result<SubmittedJob, (u16, String)> {
        let Some(term) = lock(&self.term).clone() else {
            return Err((503, "this JobManager does not lead the cluster right now; retry in a few seconds".into()));
        };
        let overrides =
            weir_config::Configuration::load(None, &submission.config).map_err(|e| (400u16, e.to_string()))?;
        let fixed = crate::prepare::fixed_job_id(&overrides).map_err(|e| (400u16, e.to_string()))?;
        if let Some(id) = fixed
            && self.dispatcher.job(id).is_some()
        {
            // Flink answers a second submission of one id so (DuplicateJobSubmissionException).
            return Err((409, format!("job {id} was submitted already; `weir list -a` shows it")));
        }
        let job_id = fixed.unwrap_or_else(JobId::generate);
        let PreparedJob { graph, settings, notes } =
            self.prepare_job(&term, &submission, &job_id.to_string(), None).map_err(|e| (400u16, e.to_string()))?;
        if let Some(store) = &term.store {
            // Recorded before it is acknowledged: a new leader recovers every job a client
            // was told about.
            let bytes = serde_json::to_vec(&submission).map_err(|e| (500u16, e.to_string()))?;
            store.record_submission(&job_id.to_string(), &bytes).map_err(|e| {
                (503u16, format!("cannot record the job in the HA store, so it was not submitted: {e}"))
            })?;
            weir_runtime::crash::point("submit-after-record");
        }
        let master = self.dispatcher.submit_as(job_id, graph, settings).map_err(|e| (400u16, e.to_string()))?;
        for note in &notes {
            tracing::info!(job_id = %master.job_id(), "{note}");
        }
        Ok(SubmittedJob { job_id: master.job_id().to_string(), notes })
    }

    /// Builds a submission's job with this cluster's configuration, run by `term`'s
    /// TaskManagers (and its HA store's, with `recovered` when a new leader takes it over).
    pub(crate) fn prepare_job(
        &self,
        term: &Term,
        submission: &JobSubmission,
        job_id: &str,
        recovered: Option<RecoverableJob>,
    ) -> Result<PreparedJob, Error> {
        let config = job_config(&self.config, submission)?;
        let mut prepared = prepare(
            &self.catalog,
            &config,
            &submission.job,
            &submission.args,
            submission.savepoint.as_deref(),
            submission.allow_non_restored_state,
        )?;
        prepared.settings.executor = Some(Arc::new(RemoteExecutor {
            resources: Arc::clone(&term.resources),
            submission: submission.clone(),
            default_parallelism: prepared.settings.default_parallelism,
        }));
        if let Some(store) = &term.store {
            prepared.settings.ha = Some(JobHa {
                store: store.job(job_id),
                recovered,
                reconcile_timeout: config.get(&HIGH_AVAILABILITY_RECONCILE_TIMEOUT).map_err(Error::usage)?,
            });
        }
        Ok(prepared)
    }
}

/// Cancels every job not ended yet and waits (bounded) for each to end.
fn cancel_jobs_for_shutdown(dispatcher: &Dispatcher) {
    let running: Vec<_> = dispatcher.jobs().into_iter().filter(|job| !job.status().is_terminal()).collect();
    for job in &running {
        let _ = job.cancel();
    }
    let deadline = Instant::now() + SHUTDOWN_JOBS_WAIT_MAX;
    for job in &running {
        let left = deadline.saturating_duration_since(Instant::now());
        let state = job.wait_terminal(Some(left));
        eprintln!("JobManager: job {} {state:?} (the JobManager is stopping)", job.job_id());
    }
}
