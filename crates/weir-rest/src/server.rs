//! Running the REST API: [`serve`] for async callers, [`RestServer`] for synchronous ones.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use weir_runtime::Dispatcher;

use crate::error::{RestError, display_address};
use crate::routes::{ClusterInfo, router};

/// How long requests in flight may take to finish once shutdown is asked.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// How long [`RestServer::shutdown`] waits for its thread before leaving it behind.
const JOIN_BOUND: Duration = Duration::from_secs(6);

/// Serves `router` on `listener` until `shutdown` completes, then lets requests in flight
/// finish (idle connections close at once).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

/// The REST API on its own background thread and single-worker runtime, for synchronous
/// callers. Dropping it (or [`shutdown`](RestServer::shutdown)) stops the server.
pub struct RestServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl RestServer {
    /// Binds `bind_address:port` (port 0: any free port) and serves the REST API over
    /// `dispatcher` until shut down.
    pub fn start(
        bind_address: &str,
        port: u16,
        dispatcher: Arc<Dispatcher>,
        cluster: ClusterInfo,
    ) -> Result<RestServer, RestError> {
        let address = display_address(bind_address, port);
        let bind_error = |error| RestError::Bind { address: address.clone(), error };
        // Bind before starting anything so a taken port is reported to the caller at once.
        let std_listener = std::net::TcpListener::bind((bind_address, port)).map_err(bind_error)?;
        std_listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = std_listener.local_addr().map_err(bind_error)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-rest")
            .enable_io()
            .enable_time()
            .build()
            .map_err(RestError::Start)?;
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(std_listener).map_err(bind_error)?
        };
        let app = router(dispatcher, cluster);
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("weir-rest".to_string())
            .spawn(move || run(runtime, listener, app, stopped))
            .map_err(RestError::Start)?;
        tracing::info!(address = %local_addr, "REST API listening");
        Ok(RestServer { local_addr, stop, thread: Some(thread) })
    }

    /// The address the server listens on (with the actual port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The server's base URL, e.g. `http://127.0.0.1:8081`.
    pub fn url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    /// Stops the server and waits (boundedly) for its thread to end.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for RestServer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + JOIN_BOUND;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !thread.is_finished() {
            tracing::warn!(
                address = %self.local_addr,
                "REST API thread did not stop within {JOIN_BOUND:?}; leaving it behind"
            );
            return;
        }
        if thread.join().is_err() {
            tracing::error!(address = %self.local_addr, "REST API thread panicked");
        }
    }
}

/// The server thread: serves until `stopped` turns true, then drains for a bounded time.
fn run(runtime: Runtime, listener: TcpListener, app: Router, mut stopped: watch::Receiver<bool>) {
    let mut server_stopped = stopped.clone();
    runtime.block_on(async move {
        let shutdown = async move {
            // An error means the RestServer is gone: stop as well.
            let _ = server_stopped.wait_for(|stop| *stop).await;
        };
        let mut server = tokio::spawn(serve(listener, app, shutdown));
        tokio::select! {
            ended = &mut server => {
                report(ended);
                return;
            }
            _ = stopped.wait_for(|stop| *stop) => {}
        }
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(ended) => report(ended),
            Err(_) => {
                tracing::warn!("REST requests still running after {SHUTDOWN_GRACE:?}; dropping them");
                server.abort();
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    tracing::debug!("REST API stopped");
}

fn report(ended: Result<io::Result<()>, tokio::task::JoinError>) {
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, "REST API server ended with an error"),
        Err(error) => tracing::error!(%error, "REST API server task ended abnormally"),
    }
}
