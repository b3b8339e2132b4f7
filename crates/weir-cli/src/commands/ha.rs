//! `weir jobmanager` with `high-availability.type: etcd`: a JobManager that campaigns for
//! leadership, stands by (its REST API forwarding to the leader) until it wins, then leads
//! one term: it accepts TaskManagers with its epoch, records every submitted job in the HA
//! store before acknowledging it, and recovers the jobs a former leader left (RECONCILING,
//! then RUNNING without restarting their tasks). When it loses its leadership it stops
//! acting at once, and stands by again.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use weir_api::catalog::JobCatalog;
use weir_config::Configuration;
use weir_config::options::{HEARTBEAT_TIMEOUT, HIGH_AVAILABILITY_RECONCILE_TIMEOUT, REST_PORT};
use weir_ha::{HaServices, HaSettings, HaStore, LeaderInfo};
use weir_rest::{ClusterInfo, LeaderRoute, RestServer, SubmittedJob};
use weir_runtime::cluster::{ClusterResources, JobSubmission, RemoteExecutor};
use weir_runtime::job_settings::JobHa;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::{JobId, JobStatus, Lifecycle};

use crate::commands::run::prepare;
use crate::error::CliError;
use crate::settings;

/// How often a standby looks up where the leader is (for its REST forwarding).
const LEADER_LOOKUP_INTERVAL: Duration = Duration::from_millis(200);
/// How long a JobManager that lost its leadership keeps trying to revoke its lease while
/// etcd does not answer.
const LOST_LEASE_REVOKE_MAX: Duration = Duration::from_secs(30);
/// How long a JobManager that lost its leadership waits for its jobs to suspend.
const SUSPEND_WAIT_MAX: Duration = Duration::from_secs(10);

/// What one leadership term holds.
#[derive(Clone)]
struct Term {
    resources: Arc<ClusterResources>,
    store: HaStore,
    /// When this term began, epoch ms.
    since_ms: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Builds a submission's job with this cluster's configuration, HA-wired.
fn prepare_job(
    catalog: &JobCatalog,
    config: &Configuration,
    term: &Term,
    submission: &JobSubmission,
    job_id: &str,
    recovered: Option<weir_ha::RecoverableJob>,
) -> Result<(weir_api::graph::StreamGraph, JobSettings, Vec<String>), CliError> {
    let config = crate::commands::cluster::job_config(config, submission)?;
    let mut prepared = prepare(
        catalog,
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
    prepared.settings.ha = Some(JobHa {
        store: term.store.job(job_id),
        recovered,
        reconcile_timeout: config.get(&HIGH_AVAILABILITY_RECONCILE_TIMEOUT).map_err(CliError::usage)?,
    });
    Ok((prepared.graph, prepared.settings, prepared.notes))
}

pub fn jobmanager(
    config: Configuration,
    catalog: Arc<JobCatalog>,
    ha_settings: HaSettings,
) -> Result<ExitCode, CliError> {
    let cluster_id = ha_settings.cluster_id.clone();
    let ha = Arc::new(settings::connect_ha(ha_settings)?);
    let store = ha.client().describe();
    let id = JobId::generate().to_string();
    let (rpc_bind, rpc_host, rpc_port) = settings::jobmanager_rpc_hosts(&config)?;
    let listener = std::net::TcpListener::bind((rpc_bind.as_str(), rpc_port)).map_err(|e| {
        CliError::runtime(format!(
            "cannot listen for TaskManagers on {}: {e}; choose another jobmanager.rpc.port or jobmanager.bind-host",
            settings::host_port(&rpc_bind, rpc_port)
        ))
    })?;
    let bound = listener.local_addr().map_err(|e| CliError::runtime(e.to_string()))?;
    // What TaskManagers are told (in the leader record): the advertised host, never the bind
    // address (0.0.0.0 reaches nobody).
    let rpc_address = settings::host_port(&rpc_host, bound.port());
    let heartbeat_timeout = config.get(&HEARTBEAT_TIMEOUT).map_err(CliError::usage)?;
    let security = crate::settings::wire_security(&config)?;
    let dispatcher = Dispatcher::new("cluster");
    let term: Arc<Mutex<Option<Term>>> = Arc::new(Mutex::new(None));
    let route: Arc<Mutex<LeaderRoute>> = Arc::new(Mutex::new(LeaderRoute::Unknown));

    let submit_term = Arc::clone(&term);
    let submit_dispatcher = Arc::clone(&dispatcher);
    let submit_catalog = Arc::clone(&catalog);
    let submit_config = config.clone();
    let submitter = Arc::new(move |submission: JobSubmission| -> Result<SubmittedJob, (u16, String)> {
        let Some(term) = lock(&submit_term).clone() else {
            return Err((503, "this JobManager does not lead the cluster right now; retry in a few seconds".into()));
        };
        let job_id = JobId::generate();
        let (graph, settings, notes) =
            prepare_job(&submit_catalog, &submit_config, &term, &submission, &job_id.to_string(), None)
                .map_err(|e| (400u16, e.to_string()))?;
        // Recorded before it is acknowledged: a new leader recovers every job a client was
        // told about.
        let bytes = serde_json::to_vec(&submission).map_err(|e| (500u16, e.to_string()))?;
        term.store
            .record_submission(&job_id.to_string(), &bytes)
            .map_err(|e| (503u16, format!("cannot record the job in the HA store, so it was not submitted: {e}")))?;
        weir_runtime::crash::point("submit-after-record");
        let master = submit_dispatcher.submit_as(job_id, graph, settings).map_err(|e| (400u16, e.to_string()))?;
        for note in &notes {
            tracing::info!(job_id = %master.job_id(), "{note}");
        }
        Ok(SubmittedJob { job_id: master.job_id().to_string(), notes })
    });
    let list_term = Arc::clone(&term);
    let lookup_route = Arc::clone(&route);
    let overview_term = Arc::clone(&term);
    let leader_id = id.clone();
    // Known once the REST server listens, before any term begins.
    let own_rest: Arc<std::sync::OnceLock<String>> = Arc::new(std::sync::OnceLock::new());
    let overview_rest = Arc::clone(&own_rest);
    let cluster = ClusterInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        taskmanager_list: Some(Arc::new(move || {
            lock(&list_term).as_ref().map(|term| term.resources.taskmanagers()).unwrap_or_default()
        })),
        submitter: Some(submitter),
        configuration: settings::shown_configuration(&config),
        leader: Some(Arc::new(move || lock(&lookup_route).clone())),
        ha_overview: Some(Arc::new(move || {
            lock(&overview_term).as_ref().map(|term| weir_rest::responses::HaOverview {
                kind: "etcd".into(),
                leader_id: leader_id.clone(),
                epoch: term.store.guard().epoch(),
                leader_since: term.since_ms,
                leader_address: overview_rest.get().map(|a| format!("http://{a}")).unwrap_or_default(),
                leader_pid: std::process::id(),
            })
        })),
        ..ClusterInfo::default()
    };
    let (rest_bind, rest_host) = settings::rest_hosts(&config)?;
    let port = config.get(&REST_PORT).map_err(CliError::usage)?;
    let rest = RestServer::start(&rest_bind, port, Arc::clone(&dispatcher), cluster).map_err(CliError::runtime)?;
    let rest_address = settings::host_port(&rest_host, rest.local_addr().port());
    let _ = own_rest.set(rest_address.clone());
    let info = LeaderInfo { id: id.clone(), rest_address: rest_address.clone(), rpc_address: rpc_address.clone() };
    follow_leader(Arc::clone(&ha), id.clone(), Arc::clone(&term), Arc::clone(&route));
    eprintln!(
        "JobManager {id}: REST API at http://{rest_address}, TaskManagers connect to {rpc_address}; high availability on {store} (cluster-id '{cluster_id}'): standing by until elected"
    );

    // SIGTERM / SIGINT: a standby stops campaigning; the leader steps down at once (its lease
    // revoked, so a standby leads within its campaign poll instead of the lease's TTL) and
    // leaves the tasks running for the next leader.
    let stop = crate::signals::on_termination("JobManager", |_| {})
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    let stop_flag = stop.flag();
    loop {
        let leadership = match ha.election().campaign(&info, &stop_flag) {
            Ok(Some(leadership)) => leadership,
            Ok(None) if stop.requested() => {
                eprintln!("JobManager {id}: stopped while standing by");
                return Ok(ExitCode::SUCCESS);
            }
            Ok(None) => continue,
            Err(error) => return Err(CliError::runtime(error.to_string())),
        };
        let epoch = leadership.epoch();
        let listener = listener.try_clone().map_err(|e| CliError::runtime(e.to_string()))?;
        let resources = ClusterResources::start_term(listener, heartbeat_timeout, epoch, security.clone())
            .map_err(|e| CliError::runtime(format!("cannot accept TaskManagers on {rpc_address}: {e}")))?;
        // Only the leader keeps TaskManager pods; they find it through the HA store.
        let taskmanager_pods = settings::taskmanager_pods(&config, &resources, None)?;
        let store = ha.store(leadership.guard());
        let current =
            Term { resources: Arc::clone(&resources), store: store.clone(), since_ms: weir_types::lifecycle::now_ms() };
        *lock(&term) = Some(current.clone());
        *lock(&route) = LeaderRoute::Here;
        eprintln!("JobManager {id} leads cluster '{cluster_id}' (epoch {epoch})");
        recover_jobs(&catalog, &config, &current, &dispatcher);
        while !leadership.wait_lost(STOP_POLL) {
            if stop.requested() {
                break;
            }
        }
        let stepping_down = stop.requested();
        if stepping_down {
            eprintln!("JobManager {id} steps down (epoch {epoch}): its lease is revoked for a standby to lead");
            leadership.resign();
        } else {
            eprintln!("JobManager {id} lost its leadership (epoch {epoch}); it stops acting and stands by");
            // Its lease may still hold the leader key: etcd was down or frozen and came back
            // with the lease's TTL renewed. Revoked (in the background, retried while etcd does
            // not answer), the next election need not wait the TTL out.
            let _ = std::thread::Builder::new()
                .name("weir-revoke-lost-lease".into())
                .spawn(move || leadership.release_lost(LOST_LEASE_REVOKE_MAX));
        }
        *lock(&term) = None;
        *lock(&route) = LeaderRoute::Unknown;
        drop(taskmanager_pods);
        resources.stop();
        // Its job masters saw the leadership go and suspend themselves; the tasks keep
        // running for the next leader.
        let deadline = std::time::Instant::now() + SUSPEND_WAIT_MAX;
        while std::time::Instant::now() < deadline
            && dispatcher
                .jobs()
                .iter()
                .any(|job| !<weir_types::JobStatus as weir_types::Lifecycle>::is_terminal(job.status()))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        if stepping_down {
            eprintln!("JobManager {id}: stopped; its jobs run on under the next leader");
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// Keeps the REST forwarding pointed at the leader while this process does not lead. The
/// first lookup happens before it returns: a standby that just started answers through the
/// leader rather than with 503 for its first interval.
/// How often a leading JobManager looks whether it was asked to stop.
const STOP_POLL: Duration = Duration::from_millis(50);

fn follow_leader(ha: Arc<HaServices>, id: String, term: Arc<Mutex<Option<Term>>>, route: Arc<Mutex<LeaderRoute>>) {
    let refresh = move || {
        let leading = lock(&term).as_ref().is_some_and(|term| term.store.guard().is_held());
        let next = if leading {
            LeaderRoute::Here
        } else {
            match ha.leader() {
                Ok(Some((leader, _))) if leader.id != id => LeaderRoute::Elsewhere(leader.rest_address),
                Ok(_) => LeaderRoute::Unknown,
                Err(_) => lock(&route).clone(),
            }
        };
        *lock(&route) = next;
    };
    refresh();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(LEADER_LOOKUP_INTERVAL);
            refresh();
        }
    });
}

/// Starts every job the HA store holds and no result ends: each waits RECONCILING for the
/// TaskManagers to report it, and is restarted from its newest checkpoint if they do not.
/// The newest ended jobs a new leader shows (as many as a dispatcher keeps).
const ENDED_JOBS_SHOWN_MAX: usize = 1000;

/// Shows the jobs earlier leaders ended, as the job result store recorded them: a client
/// waiting on a job across a failover (`weir run`, `flink list -a`, a script polling
/// `GET /jobs/{id}`) learns how it ended instead of "no such job".
fn remember_ended_jobs(dispatcher: &Dispatcher, results: &[weir_ha::JobResult]) {
    let mut results: Vec<&weir_ha::JobResult> = results.iter().collect();
    results.sort_by_key(|result| result.end_time_ms);
    let skip = results.len().saturating_sub(ENDED_JOBS_SHOWN_MAX);
    for result in results.into_iter().skip(skip) {
        let status = <JobStatus as Lifecycle>::all().iter().find(|s| s.to_string() == result.state);
        let (Ok(job_id), Some(&status)) = (result.job_id.parse::<JobId>(), status) else {
            tracing::warn!(job_id = %result.job_id, state = %result.state, "skipping an unreadable job result in the HA store");
            continue;
        };
        let name = result.job_name.as_deref().unwrap_or("(ended under an earlier leader)");
        dispatcher.remember_ended(job_id, name, status, result.end_time_ms, result.failure.clone());
    }
}

fn recover_jobs(catalog: &JobCatalog, config: &Configuration, term: &Term, dispatcher: &Arc<Dispatcher>) {
    // Read until it answers, while this term lasts: a leader that went on without the jobs
    // (etcd just restarted, say) would cancel their running attempts as nobody's and leave
    // the jobs to no one until the next failover.
    let (ended, jobs) = loop {
        match term.store.results().and_then(|results| Ok((results, term.store.recoverable_jobs()?))) {
            Ok((results, jobs)) => break (results, jobs),
            Err(error) => {
                if !term.store.guard().is_held() {
                    return;
                }
                tracing::warn!(%error, "cannot read the submitted jobs and results from the HA store; retrying");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    };
    remember_ended_jobs(dispatcher, &ended);
    let ended: Vec<String> = ended.into_iter().map(|r| r.job_id).collect();
    let mut recovered = Vec::new();
    for job in jobs {
        if ended.contains(&job.job_id) {
            continue;
        }
        let job_id = job.job_id.clone();
        let fail = |reason: String| {
            eprintln!("error: cannot recover job {job_id}: {reason}");
            let result = weir_ha::JobResult {
                job_id: job_id.clone(),
                state: "FAILED".into(),
                end_time_ms: weir_types::lifecycle::now_ms(),
                failure: Some(format!("cannot recover the job after a JobManager failover: {reason}")),
                job_name: None,
            };
            if let Err(error) = term.store.job(&job_id).finish(&result) {
                tracing::error!(job_id = %job_id, %error, "cannot record the job's failure");
            }
        };
        let Ok(parsed_id) = job_id.parse::<JobId>() else {
            fail("its id is not a job id".into());
            continue;
        };
        let mut submission: JobSubmission = match serde_json::from_slice(&job.submission) {
            Ok(submission) => submission,
            Err(error) => {
                fail(format!("its recorded submission is unreadable ({error})"));
                continue;
            }
        };
        // A restart after a failed takeover restores the newest checkpoint; the snapshot the
        // job was first started from may be gone by now.
        if let Some((_, latest)) = job.checkpoints.last() {
            submission.savepoint = Some(latest.clone());
            submission.allow_non_restored_state = false;
        }
        let (graph, settings, _) = match prepare_job(catalog, config, term, &submission, &job_id, Some(job.clone())) {
            Ok(prepared) => prepared,
            Err(error) => {
                fail(error.to_string());
                continue;
            }
        };
        match dispatcher.submit_as(parsed_id, graph, settings) {
            Ok(_) => {
                eprintln!(
                    "JobManager recovered job {job_id} ('{}'): RECONCILING with the TaskManagers",
                    submission.job
                );
                recovered.push(job_id.clone());
            }
            Err(error) => fail(error.to_string()),
        }
    }
    // From now on a TaskManager's report of an attempt is kept only for these jobs while
    // they reconcile; any other (a job that ended, a TaskManager back from a freeze) is
    // cancelled on it at once.
    term.resources.recovered(&recovered);
}
