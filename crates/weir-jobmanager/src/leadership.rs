//! A JobManager with high availability: it campaigns for leadership, stands by (its REST
//! API forwarding to the leader) until it wins, then leads one term: it accepts TaskManagers
//! with its epoch, records every submitted job in the HA store before acknowledging it, and
//! recovers the jobs a former leader left (`recovery`: RECONCILING, then RUNNING without
//! restarting their tasks). When it loses its leadership it stops acting at once, and stands
//! by again.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use weir_config::Configuration;
use weir_ha::{HaServices, HaSettings, LeaderInfo, Leadership};
use weir_rest::responses::HaOverview;
use weir_rest::{LeaderLookup, LeaderRoute};
use weir_runtime::cluster::ClusterResources;
use weir_runtime::security::WireSecurity;
use weir_types::{JobId, Lifecycle as _};

use crate::error::JobManagerError as Error;
use crate::server::{Jobs, OpenTerm, STOP_POLL, Term, cannot_listen, lock, term_settings};
use crate::settings;

/// How often a standby looks up where the leader is (for its REST forwarding).
const LEADER_LOOKUP_INTERVAL: Duration = Duration::from_millis(200);
/// How long a JobManager that lost its leadership keeps trying to revoke its lease while
/// etcd does not answer.
const LOST_LEASE_REVOKE_MAX: Duration = Duration::from_secs(30);
/// How long a JobManager that lost its leadership waits for its jobs to suspend.
const SUSPEND_WAIT_MAX: Duration = Duration::from_secs(10);

/// This JobManager's part in the election: its id, its TaskManager port (kept across terms),
/// and where its REST API forwards while it does not lead.
pub(crate) struct Campaign {
    ha: Arc<HaServices>,
    id: String,
    cluster_id: String,
    store: String,
    listener: TcpListener,
    rpc_address: String,
    heartbeat_timeout: Duration,
    security: WireSecurity,
    route: Arc<Mutex<LeaderRoute>>,
    /// The current term's jobs are recovered: until then this leader's REST answers 503 (as
    /// Flink's does during leader election), so nobody reads an empty job list from it.
    recovered: Arc<AtomicBool>,
}

impl Campaign {
    /// Connects to the HA store and opens the TaskManager port.
    pub(crate) fn open(config: &Configuration, ha_settings: HaSettings) -> Result<Campaign, Error> {
        let cluster_id = ha_settings.cluster_id.clone();
        let ha = Arc::new(settings::connect_ha(ha_settings)?);
        let store = ha.client().describe();
        let id = JobId::generate().to_string();
        let (rpc_bind, rpc_host, rpc_port) = settings::jobmanager_rpc_hosts(config)?;
        let listener = TcpListener::bind((rpc_bind.as_str(), rpc_port))
            .map_err(|e| cannot_listen(&settings::host_port(&rpc_bind, rpc_port), e))?;
        let bound = listener.local_addr().map_err(|e| Error::runtime(e.to_string()))?;
        // What TaskManagers are told (in the leader record): the advertised host, never the
        // bind address (0.0.0.0 reaches nobody).
        let rpc_address = settings::host_port(&rpc_host, bound.port());
        let (heartbeat_timeout, security) = term_settings(config)?;
        let route = Arc::new(Mutex::new(LeaderRoute::Unknown));
        let recovered = Arc::new(AtomicBool::new(false));
        Ok(Campaign { ha, id, cluster_id, store, listener, rpc_address, heartbeat_timeout, security, route, recovered })
    }

    /// Where TaskManagers connect while this JobManager leads.
    pub(crate) fn rpc_address(&self) -> &str {
        &self.rpc_address
    }

    /// Where the REST API's requests go.
    pub(crate) fn leader_lookup(&self) -> LeaderLookup {
        let route = Arc::clone(&self.route);
        Arc::new(move || lock(&route).clone())
    }

    /// This leader's leadership for `/overview` and `/metrics`, while it leads.
    pub(crate) fn overview(
        &self,
        jobs: &Arc<Jobs>,
        own_rest: &Arc<OnceLock<String>>,
    ) -> Arc<dyn Fn() -> Option<HaOverview> + Send + Sync> {
        let (jobs, own_rest, leader_id) = (Arc::clone(jobs), Arc::clone(own_rest), self.id.clone());
        Arc::new(move || {
            let term = lock(&jobs.term);
            let term = term.as_ref()?;
            Some(HaOverview {
                kind: "etcd".into(),
                leader_id: leader_id.clone(),
                epoch: term.store.as_ref()?.guard().epoch(),
                leader_since: term.since_ms,
                leader_address: own_rest.get().map(|a| format!("http://{a}")).unwrap_or_default(),
                leader_pid: std::process::id(),
            })
        })
    }

    /// Starts following the leader for the REST forwarding; the name this JobManager goes by
    /// and what it says it does until elected.
    pub(crate) fn stand_by(&self, jobs: &Arc<Jobs>) -> (String, String) {
        let leader = (Arc::clone(&self.route), Arc::clone(&self.recovered));
        follow_leader(Arc::clone(&self.ha), self.id.clone(), Arc::clone(jobs), leader);
        let standing_by = format!(
            "; high availability on {} (cluster-id '{}'): standing by until elected",
            self.store, self.cluster_id
        );
        (format!("JobManager {}", self.id), standing_by)
    }

    /// Campaigns, leads each term it wins, and stands by between them, until `stop`.
    pub(crate) fn run(&self, jobs: &Arc<Jobs>, rest_address: &str, stop: &AtomicBool) -> Result<(), Error> {
        let id = &self.id;
        let info = LeaderInfo {
            id: id.clone(),
            rest_address: rest_address.to_string(),
            rpc_address: self.rpc_address.clone(),
        };
        loop {
            let leadership = match self.ha.election().campaign(&info, stop) {
                Ok(Some(leadership)) => leadership,
                Ok(None) if stop.load(Ordering::SeqCst) => {
                    eprintln!("JobManager {id}: stopped while standing by");
                    return Ok(());
                }
                Ok(None) => continue,
                Err(error) => return Err(Error::runtime(error.to_string())),
            };
            let term = self.begin_term(jobs, &leadership)?;
            crate::recovery::recover_jobs(jobs, &term.term);
            // Answer REST here only now: before, the job list would be missing the jobs.
            self.recovered.store(true, Ordering::SeqCst);
            *lock(&self.route) = LeaderRoute::Here;
            while !leadership.wait_lost(STOP_POLL) {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
            }
            let stepping_down = stop.load(Ordering::SeqCst);
            self.end_term(jobs, leadership, term, stepping_down);
            if stepping_down {
                eprintln!("JobManager {id}: stopped; its jobs run on under the next leader");
                return Ok(());
            }
        }
    }

    /// The term `leadership` begins: TaskManagers accepted with its epoch, pods, the HA store
    /// conditioned on it, REST requests answered here.
    fn begin_term(&self, jobs: &Jobs, leadership: &Leadership) -> Result<OpenTerm, Error> {
        let epoch = leadership.epoch();
        let listener = self.listener.try_clone().map_err(|e| Error::runtime(e.to_string()))?;
        let resources = ClusterResources::start_term(listener, self.heartbeat_timeout, epoch, self.security.clone())
            .map_err(|e| Error::runtime(format!("cannot accept TaskManagers on {}: {e}", self.rpc_address)))?;
        // Only the leader keeps TaskManager pods; they find it through the HA store.
        let pods = settings::taskmanager_pods(&jobs.config, &resources, None)?;
        let store = self.ha.store(leadership.guard());
        let term = Term { resources, store: Some(store), since_ms: weir_types::lifecycle::now_ms() };
        self.recovered.store(false, Ordering::SeqCst);
        *lock(&jobs.term) = Some(term.clone());
        eprintln!("JobManager {} leads cluster '{}' (epoch {epoch})", self.id, self.cluster_id);
        Ok(OpenTerm { term, pods })
    }

    /// Ends the term of `leadership`: stepping down (asked to stop) revokes the lease so a
    /// standby leads within its campaign poll instead of the lease's TTL; a lost leadership
    /// stops acting at once. Either way the tasks keep running for the next leader.
    fn end_term(&self, jobs: &Jobs, leadership: Leadership, term: OpenTerm, stepping_down: bool) {
        let (id, epoch) = (&self.id, leadership.epoch());
        if stepping_down {
            eprintln!("JobManager {id} steps down (epoch {epoch}): its lease is revoked for a standby to lead");
            leadership.resign();
        } else {
            eprintln!("JobManager {id} lost its leadership (epoch {epoch}); it stops acting and stands by");
            // Its lease may still hold the leader key: etcd was down or frozen and came back
            // with the lease's TTL renewed. Revoked (in the background, retried while etcd
            // does not answer), the next election need not wait the TTL out.
            let _ = std::thread::Builder::new()
                .name("weir-revoke-lost-lease".into())
                .spawn(move || leadership.release_lost(LOST_LEASE_REVOKE_MAX));
        }
        self.recovered.store(false, Ordering::SeqCst);
        *lock(&jobs.term) = None;
        *lock(&self.route) = LeaderRoute::Unknown;
        term.close();
        // Its job masters saw the leadership go and suspend themselves; the tasks keep
        // running for the next leader.
        let deadline = Instant::now() + SUSPEND_WAIT_MAX;
        while Instant::now() < deadline && jobs.dispatcher.jobs().iter().any(|job| !job.status().is_terminal()) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Keeps the REST forwarding pointed at the leader while this process does not lead. The
/// first lookup happens before it returns: a standby that just started answers through the
/// leader rather than with 503 for its first interval.
/// While this process leads but has not recovered its jobs (`recovered` false), the route
/// stays unknown: REST answers 503 and clients try again.
fn follow_leader(
    ha: Arc<HaServices>,
    id: String,
    jobs: Arc<Jobs>,
    (route, recovered): (Arc<Mutex<LeaderRoute>>, Arc<AtomicBool>),
) {
    let refresh = move || {
        let holds =
            lock(&jobs.term).as_ref().and_then(|term| term.store.as_ref()).is_some_and(|store| store.guard().is_held());
        if holds && !recovered.load(Ordering::SeqCst) {
            *lock(&route) = LeaderRoute::Unknown;
            return;
        }
        let next = if holds {
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
