//! `weir operator`: the deployment controller, in the foreground or (`-d`) in the
//! background, and `weir operator stop`. It serves `/deployments` and a Web UI page on
//! `operator.rest.port`.

use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir_config::Configuration;
use weir_config::options::{OPERATOR_LEASE_DURATION, OPERATOR_RECONCILE_INTERVAL, OPERATOR_REST_PORT};
use weir_rest::{ClusterInfo, RestServer};

use crate::args::{OperatorAction, OperatorArgs};
use crate::commands::deployment;
use crate::error::CliError;
use crate::settings;
use crate::signals::StopRequest;

/// How long `-d` waits for the background operator to take control.
const DETACH_WAIT_MAX: Duration = Duration::from_secs(15);

pub fn operator(args: OperatorArgs) -> Result<ExitCode, CliError> {
    match args.action {
        Some(OperatorAction::Stop) => stop(),
        None if args.detach => detach(&args),
        None => run(&args),
    }
}

fn operator_dir() -> std::path::PathBuf {
    settings::data_dir().join("operator")
}

fn run(args: &OperatorArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    if args.kubernetes {
        return run_kubernetes(args, config);
    }
    let deployments = deployment::open(&config)?;
    // A second operator on the same data directory is refused before it serves anything.
    let file_lock = match &deployments.etcd {
        None => Some(weir_deploy::lock::lock_file(&deployments.root).map_err(CliError::runtime)?),
        Some(_) => None,
    };
    let rest = start_rest(&config, Arc::clone(&deployments.store))?;
    // SIGTERM / SIGINT: the controller stops at its next step (what it was doing stays
    // recorded in the status, for the next operator to resume), the leadership is released at
    // once, and the deployments' clusters keep running.
    let signal = crate::signals::on_termination("Deployment controller", |_| {})
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    let serving = Serving { deployments: &deployments, rest: &rest, signal: &signal };
    match (&deployments.etcd, file_lock) {
        (None, Some(lock)) => {
            announce(&deployments, &rest);
            // The lock file is held until this process ends: nothing can take over from it.
            let controller = weir_deploy::Controller::new(
                Arc::clone(&deployments.store),
                config,
                deployments.root.clone(),
                weir_deploy::Fence::lock_file(),
            );
            controller.run(&signal.flag());
            drop(lock);
            eprintln!("Deployment controller: stopped; the deployments keep running");
            Ok(ExitCode::SUCCESS)
        }
        (Some((client, cluster_id)), _) => lead_through_etcd(&serving, &config, Arc::clone(client), cluster_id.clone()),
        (None, None) => Err(CliError::runtime("no operator lock was taken")),
    }
}

/// A process-backend operator's deployments, its REST API and its stop request.
struct Serving<'a> {
    deployments: &'a deployment::Deployments,
    rest: &'a RestServer,
    signal: &'a StopRequest,
}

/// How one term as the leader in etcd ended.
enum TermEnd {
    /// A signal stopped the operator; its leadership is released.
    Stopped,
    /// The leadership was lost; the operator stands by again.
    Lost,
}

/// With etcd: lead while the lease holds; a lost lease (frozen, cut off from etcd, etcd
/// restarted) stops the controller at once and the operator stands by and campaigns
/// again, so a hiccup never leaves the deployments without an operator.
fn lead_through_etcd(
    serving: &Serving,
    config: &Configuration,
    client: Arc<weir_ha::EtcdClient>,
    cluster_id: String,
) -> Result<ExitCode, CliError> {
    loop {
        eprintln!(
            "Deployment controller: standing by until it leads the operators of cluster-id '{cluster_id}' in etcd"
        );
        let Some(leadership) =
            weir_deploy::lock::lead(Arc::clone(&client), &cluster_id, &serving.rest.url(), &serving.signal.flag())
                .map_err(CliError::runtime)?
        else {
            eprintln!("Deployment controller: stopped while standing by");
            return Ok(ExitCode::SUCCESS);
        };
        announce(serving.deployments, serving.rest);
        match lead_term(serving, config, leadership)? {
            TermEnd::Stopped => return Ok(ExitCode::SUCCESS),
            TermEnd::Lost => {}
        }
    }
}

/// One term as the leader: the controller runs on a thread of its own until the leadership
/// is lost or a signal asks the operator to stop.
fn lead_term(serving: &Serving, config: &Configuration, leadership: weir_ha::Leadership) -> Result<TermEnd, CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    let fence = weir_deploy::Fence::etcd(&leadership);
    let controller = weir_deploy::Controller::new(
        Arc::clone(&serving.deployments.store),
        config.clone(),
        serving.deployments.root.clone(),
        fence.clone(),
    );
    let loop_stop = Arc::clone(&stop);
    let worker = std::thread::Builder::new()
        .name("weir-operator".into())
        .spawn(move || controller.run(&loop_stop))
        .map_err(|e| CliError::runtime(format!("cannot start the controller: {e}")))?;
    while !leadership.wait_lost(Duration::from_millis(50)) {
        if serving.signal.requested() {
            // Any step under way stops at its next check of the fence.
            fence.mark_lost();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    if serving.signal.requested() {
        leadership.resign();
        eprintln!("Deployment controller: stopped and released its leadership; the deployments keep running");
        return Ok(TermEnd::Stopped);
    }
    drop(leadership);
    tracing::warn!(
        "this operator lost its leadership in etcd (another took over, or etcd was unreachable past the lease); it stands by"
    );
    eprintln!("Deployment controller: lost the leadership in etcd; it made no further change");
    Ok(TermEnd::Lost)
}

/// `weir operator --kubernetes`: the same controller over the WeirDeployment resources of a
/// namespace, their clusters as Kubernetes objects; replicas elect a leader with a Lease.
fn run_kubernetes(args: &OperatorArgs, config: weir_config::Configuration) -> Result<ExitCode, CliError> {
    let kube = Arc::new(
        weir_kubernetes::Kube::connect(args.kubeconfig.as_deref(), args.namespace.as_deref())
            .map_err(CliError::runtime)?,
    );
    let lease_duration = config.get(&OPERATOR_LEASE_DURATION).map_err(CliError::runtime)?;
    let resync = config.get(&OPERATOR_RECONCILE_INTERVAL).map_err(CliError::usage)?;
    // Every replica serves the deployments (read from the API server, so a standby shows
    // what the leader wrote), as a process-backend operator does.
    let rest = start_rest(&config, Arc::new(weir_kubernetes::KubernetesStore::new(Arc::clone(&kube))))?;
    eprintln!("Deployment controller: REST API and Web UI at {}", rest.url());
    let signal = crate::signals::on_termination("Deployment controller", |_| {})
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    // The deployments' default state directories; the pods see them through a volume of
    // the pod template, or the specs name their own.
    let root = settings::data_dir().join("deployments");
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "weir-operator".into());
    let identity = format!("{host}-{}", std::process::id());
    loop {
        eprintln!(
            "Deployment controller: standing by until it holds the Lease {} in namespace {} of {}",
            weir_kubernetes::lease::LEASE_NAME,
            kube.namespace(),
            kube.server()
        );
        let leadership = weir_kubernetes::lease::lead(Arc::clone(&kube), &identity, lease_duration, &signal.flag())
            .map_err(|e| CliError::runtime(format!("cannot campaign for the operator Lease: {e}")))?;
        let Some(leadership) = leadership else {
            eprintln!("Deployment controller: stopped while standing by");
            return Ok(ExitCode::SUCCESS);
        };
        let store = Arc::new(weir_kubernetes::KubernetesStore::new(Arc::clone(&kube)));
        let backend = Arc::new(weir_kubernetes::KubernetesClusters::new(Arc::clone(&kube), root.clone()));
        eprintln!(
            "Deployment controller: WeirDeployments in namespace {} of {}; default state directories under {}",
            kube.namespace(),
            kube.server(),
            root.display()
        );
        let fence = leadership.fence();
        let stop = Arc::new(AtomicBool::new(false));
        let controller =
            weir_deploy::Controller::with_backend(store, config.clone(), root.clone(), fence.clone(), backend);
        let loop_stop = Arc::clone(&stop);
        let wake = Arc::new(weir_deploy::Wake::new());
        let watches = weir_kubernetes::watch::wake_on_changes(&kube, Arc::clone(&wake));
        let loop_wake = Arc::clone(&wake);
        let worker = std::thread::Builder::new()
            .name("weir-operator".into())
            .spawn(move || controller.run_woken(&loop_stop, &loop_wake, resync))
            .map_err(|e| CliError::runtime(format!("cannot start the controller: {e}")))?;
        while fence.is_held() {
            if signal.requested() {
                fence.mark_lost();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        wake.notify();
        let _ = worker.join();
        drop(watches);
        if signal.requested() {
            leadership.resign();
            eprintln!("Deployment controller: stopped and released its Lease; the deployments keep running");
            return Ok(ExitCode::SUCCESS);
        }
        drop(leadership);
        eprintln!("Deployment controller: lost the Lease; it made no further change and stands by");
    }
}

fn announce(deployments: &deployment::Deployments, rest: &RestServer) {
    eprintln!(
        "Deployment controller: deployments in {}, their processes under {}; REST API and Web UI at {}",
        deployments.store.describe(),
        deployments.root.display(),
        rest.url()
    );
}

fn start_rest(
    config: &weir_config::Configuration,
    store: Arc<dyn weir_deploy::DeploymentStore>,
) -> Result<RestServer, CliError> {
    let (host, _) = weir_jobmanager::settings::rest_hosts(config)?;
    let port = config.get(&OPERATOR_REST_PORT).map_err(CliError::usage)?;
    let info = move || ClusterInfo {
        taskmanagers: 0,
        version: env!("CARGO_PKG_VERSION").to_string(),
        deployments: Some({
            let store = Arc::clone(&store);
            Arc::new(move || {
                let all = store.list().map_err(|e| e.to_string())?;
                // Each with its events (none where the store keeps them elsewhere).
                Ok(all
                    .iter()
                    .map(|stored| {
                        let mut value = stored.to_json();
                        let name = &stored.deployment.metadata.name;
                        value["events"] = serde_json::json!(store.events(name).unwrap_or_default());
                        value
                    })
                    .collect())
            })
        }),
        ..ClusterInfo::default()
    };
    let dispatcher = weir_runtime::Dispatcher::new("operator");
    match RestServer::start(&host, port, Arc::clone(&dispatcher), info()) {
        Ok(server) => Ok(server),
        Err(error) if config.contains(&OPERATOR_REST_PORT) => Err(CliError::runtime(error)),
        Err(error) => {
            eprintln!("warning: {error}; using a free port instead (set operator.rest.port)");
            RestServer::start(&host, 0, dispatcher, info()).map_err(CliError::runtime)
        }
    }
}

fn detach(args: &OperatorArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let deployments = deployment::open(&config)?;
    if deployments.operator_running() {
        return Err(CliError::runtime(format!(
            "an operator already controls the deployments in {}; `weir operator stop` ends one started with -d",
            deployments.store.describe()
        )));
    }
    let dir = operator_dir();
    std::fs::create_dir_all(&dir).map_err(|e| CliError::runtime(format!("cannot create {}: {e}", dir.display())))?;
    let log_path = dir.join("operator.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| CliError::runtime(format!("cannot create {}: {e}", log_path.display())))?;
    let err = log.try_clone().map_err(CliError::runtime)?;
    let exe = std::env::current_exe().map_err(|e| CliError::runtime(format!("cannot find the weir binary: {e}")))?;
    let mut command = Command::new(exe);
    command.arg("operator");
    if let Some(file) = &args.config.config {
        command.arg("-c").arg(file);
    }
    for entry in &args.config.dynamic {
        command.arg("-D").arg(entry);
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::runtime(format!("cannot start the operator: {e}")))?;
    let pid_file = dir.join("operator.pid");
    std::fs::write(&pid_file, format!("{}\n", child.id()))
        .map_err(|e| CliError::runtime(format!("cannot write {}: {e}", pid_file.display())))?;
    let started = Instant::now();
    while !deployments.operator_running() {
        if let Ok(Some(status)) = child.try_wait() {
            let _ = std::fs::remove_file(&pid_file);
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
            return Err(CliError::runtime(format!("the operator exited at once ({status}): {last}")));
        }
        if started.elapsed() > DETACH_WAIT_MAX {
            return Err(CliError::runtime(format!(
                "the operator (pid {}) did not take control within {DETACH_WAIT_MAX:?}; see {}",
                child.id(),
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("Operator started (pid {}); log in {}", child.id(), log_path.display());
    Ok(ExitCode::SUCCESS)
}

fn stop() -> Result<ExitCode, CliError> {
    let pid_file = operator_dir().join("operator.pid");
    let text = std::fs::read_to_string(&pid_file).map_err(|_| {
        CliError::runtime(format!(
            "no operator started with `weir operator -d` from this data directory ({} does not exist)",
            pid_file.display()
        ))
    })?;
    let pid: u32 =
        text.trim().parse().map_err(|_| CliError::runtime(format!("{} does not hold a pid", pid_file.display())))?;
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
    if alive(pid) {
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let started = Instant::now();
        while alive(pid) && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(pid) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
    let _ = std::fs::remove_file(&pid_file);
    println!("Stopped the operator (pid {pid}); the deployments keep running.");
    Ok(ExitCode::SUCCESS)
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
