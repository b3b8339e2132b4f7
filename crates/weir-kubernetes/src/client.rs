//! The connection to the Kubernetes API server, used from the controller's (blocking)
//! threads: one small tokio runtime carries every request.

use std::future::Future;
use std::path::Path;

/// Connecting to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No runtime for the client.
    #[error("cannot start the Kubernetes client's runtime: {0}")]
    Runtime(std::io::Error),
    /// The kubeconfig could not be read or used.
    #[error(
        "cannot use the kubeconfig {path}: {reason}; name a readable one with --kubeconfig (or KUBECONFIG), or run in a pod with a ServiceAccount"
    )]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// No configuration was found at all.
    #[error(
        "no Kubernetes configuration found ({0}): pass --kubeconfig FILE, set KUBECONFIG, or run the operator in a pod"
    )]
    Infer(String),
    /// The client could not be built.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(String),
}

/// A Kubernetes client bound to one namespace.
pub struct Kube {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    namespace: String,
    server: String,
}

impl Kube {
    /// Connects with `kubeconfig` (else `KUBECONFIG`, `~/.kube/config`, or the pod's
    /// ServiceAccount), in `namespace` (else the configuration's default namespace).
    pub fn connect(kubeconfig: Option<&Path>, namespace: Option<&str>) -> Result<Kube, ConnectError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-kube")
            .enable_all()
            .build()
            .map_err(ConnectError::Runtime)?;
        let config = runtime.block_on(async {
            match kubeconfig {
                Some(path) => {
                    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| ConnectError::Kubeconfig {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })?;
                    kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                        .await
                        .map_err(|e| ConnectError::Kubeconfig {
                            path: path.display().to_string(),
                            reason: e.to_string(),
                        })
                }
                None => kube::Config::infer().await.map_err(|e| ConnectError::Infer(e.to_string())),
            }
        })?;
        let namespace = namespace.map(str::to_string).unwrap_or_else(|| config.default_namespace.clone());
        let server = config.cluster_url.to_string();
        let client = {
            let _entered = runtime.enter();
            kube::Client::try_from(config).map_err(|e| ConnectError::Client(e.to_string()))?
        };
        Ok(Kube { runtime, client, namespace, server })
    }

    /// Runs one request (or a few) to completion from a blocking thread.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Starts `future` on the client's runtime (callable from any thread, a tokio worker too).
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        self.runtime.spawn(future);
    }

    /// Starts `future` on the client's runtime; the handle aborts it.
    pub fn spawn_task<F: Future<Output = ()> + Send + 'static>(&self, future: F) -> tokio::task::JoinHandle<()> {
        self.runtime.spawn(future)
    }

    /// The client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The namespace everything lives in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The API server's address, for messages.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The namespaced API of `K`.
    pub fn api<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        kube::Api::namespaced(self.client(), &self.namespace)
    }
}

/// Whether `error` is the API server's 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found())
}

/// Whether `error` is the API server's 409 (a write conditioned on a resource version that
/// is no longer current, or a create of an object that exists).
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}
