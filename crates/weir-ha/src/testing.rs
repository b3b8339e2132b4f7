//! A real etcd server for tests: started on free loopback ports with a fresh data directory,
//! stopped (and its data removed) when dropped. A machine without etcd fails the test with
//! the install command; no test passes having tested nothing.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The install command printed when `etcd` is missing.
pub const INSTALL: &str = "apt-get install -y etcd-server (or run the tests with .ci/test, which installs it)";

/// A running etcd.
pub struct EtcdServer {
    child: Option<Child>,
    data_dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_ETCD") {
        return PathBuf::from(path);
    }
    for candidate in ["/usr/bin/etcd", "/usr/local/bin/etcd"] {
        if std::path::Path::new(candidate).is_file() {
            return PathBuf::from(candidate);
        }
    }
    PathBuf::from("etcd")
}

impl EtcdServer {
    /// Starts etcd and waits until it answers.
    ///
    /// # Panics
    ///
    /// When etcd is not installed or does not come up (a test harness, not product code).
    pub fn start() -> EtcdServer {
        let data_dir = tempfile::tempdir().expect("a temporary directory for etcd");
        let mut server = EtcdServer { child: None, data_dir, client_port: free_port(), peer_port: free_port() };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(binary())
            .args(["--name", "weir-test", "--data-dir"])
            .arg(self.data_dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("weir-test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(error) => panic!("cannot start etcd ({error}): this test needs a real etcd; install it with {INSTALL}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let etcd = crate::EtcdClient::new(std::slice::from_ref(&client), Duration::from_millis(500));
        while Instant::now() < deadline {
            if etcd.get("/weir/").is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd at {client} did not come up within 20 s");
    }

    /// The client endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Stops etcd with SIGKILL (its data stays) and starts it again on the same ports.
    pub fn restart(&mut self, down_for: Duration) {
        self.stop();
        std::thread::sleep(down_for);
        self.spawn();
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
