//! A multi-host test bed on one Linux machine: hosts are network namespaces on a private
//! switch, faults are injected from outside, every trace is removed when the bed is dropped.
//!
//! Include it with `#[path = "common/netns.rs"] mod netns;`. It needs root (CAP_NET_ADMIN),
//! `ip` and `tc` (iproute2) and `iptables`; where one is missing a test fails naming the
//! install command, it never passes having tested nothing.
//!
//! **Layout.** [`TestNet::new`] makes a *switch* namespace holding a Linux bridge, and one
//! namespace per host joined to the bridge by a veth pair (`eth0` inside the host, `h<i>` on
//! the switch), with loopback up and the address `10.X.Y.<i + 1>` on a /24 of its own. The
//! root namespace (the test process, the *harness*) is one more port on the switch, with the
//! address `10.X.Y.254` on the veth named after the bed. The bridge lives in its own
//! namespace so the machine's firewall never sees the bed's traffic (with `br_netfilter`
//! loaded, bridged packets cross the bridge namespace's FORWARD chain, whose policy is a
//! Docker host's DROP in the root namespace and ACCEPT in a fresh one). Names come from the
//! pid and a per-process counter (`wtb<pid base 36>.<n base 36>`, at most 15 characters);
//! the private /24 is derived from them too, under a lock file shared by all processes, and
//! skips any network the root namespace already routes. Hosts have no default route: they
//! reach each other and the harness, nothing else, over IPv4 only (IPv6 is off in the hosts,
//! so no path bypasses the IPv4 rules of the faults). Only the network is separate: a
//! process on a host sees the same files, users and processes as the test.
//!
//! **Faults.** Partitions, isolation and loss are iptables `DROP` rules in the INPUT chain of
//! the *receiving* host, so a dropped packet is silence on the wire, never a local send error
//! (a DROP in OUTPUT fails the sender's `send` with EPERM). Bandwidth is a `tbf` qdisc on
//! both ends of the host's veth. Latency and jitter come from [`TcpDelayProxy`], a TCP relay
//! in the test process: this kernel has no netem.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The first characters of every namespace and root-namespace link a bed makes.
pub const PREFIX: &str = "wtb";
/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Longest any `ip`, `tc` or `iptables` command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a bed waits for the lock other processes' beds hold while they claim a subnet.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(60);
/// Addresses `.1` to `.250` are hosts, `.254` is the harness.
pub const HOSTS_MAX: usize = 250;
const HARNESS_OCTET: u8 = 254;

const IPROUTE_INSTALL: &str = "apt-get install -y iproute2";
const IPTABLES_INSTALL: &str = "apt-get install -y iptables (or run the tests with .ci/test, which installs it)";

/// A network of `hosts` namespaces; see the module documentation. Dropping it ends every
/// process still inside its hosts and removes its namespaces, links, qdiscs and rules.
pub struct TestNet {
    id: String,
    switch: String,
    subnet: [u8; 3],
    hosts: Vec<Host>,
    tools: &'static Tools,
    faults: Mutex<Faults>,
    /// Whether the root-namespace veth (named `id`) was made, so drop removes it.
    uplink: bool,
}

/// One host of a [`TestNet`]: a network namespace with one address.
pub struct Host {
    index: usize,
    name: String,
    ip: Ipv4Addr,
    ip_tool: PathBuf,
}

/// What the bed injected and must be able to take back.
#[derive(Default)]
struct Faults {
    rules: Vec<Rule>,
    /// Hosts with a `tbf` qdisc on their veth.
    shaped: BTreeSet<usize>,
}

/// The fault an iptables rule belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// Packets from `from` to `to` are dropped (at `to`).
    Drop { from: usize, to: usize },
    /// Nothing reaches the host, and nothing from it reaches another host.
    Isolate(usize),
    /// Random loss on the host's traffic.
    Loss(usize),
}

struct Rule {
    fault: Fault,
    /// The host whose INPUT chain holds the rule.
    host: usize,
    /// The rule after `-A INPUT`.
    spec: Vec<String>,
}

impl TestNet {
    /// Builds a bed of `hosts` hosts (1 to [`HOSTS_MAX`]). Removes first what crashed runs
    /// (any process whose pid is gone) left behind. Panics naming what is missing or failed.
    pub fn new(hosts: usize) -> TestNet {
        assert!((1..=HOSTS_MAX).contains(&hosts), "a TestNet has 1 to {HOSTS_MAX} hosts, not {hosts}");
        let tools = tools();
        require_root();
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let id = format!("{PREFIX}{}.{}", base36(u64::from(pid)), base36(u64::from(n)));
        assert!(id.len() <= 15, "interface name {id} is longer than the kernel's 15 characters");

        let lock = SubnetLock::acquire();
        remove_leftovers(&tools.ip);
        let subnet = free_subnet(&tools.ip, pid, n);
        let mut net = TestNet {
            switch: format!("{id}-sw"),
            id,
            subnet,
            hosts: Vec::with_capacity(hosts),
            tools,
            faults: Mutex::new(Faults::default()),
            uplink: false,
        };
        // From here on a panic drops `net`, which removes whatever was made so far.
        let sw = net.switch.clone();
        net.ip(&["netns", "add", &sw]);
        net.ip(&["-n", &sw, "link", "set", "dev", "lo", "up"]);
        net.ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        net.ip(&["-n", &sw, "link", "set", "dev", "br0", "up"]);
        let uplink = net.id.clone();
        net.ip(&["link", "add", &uplink, "type", "veth", "peer", "name", "uplink", "netns", &sw]);
        net.uplink = true;
        net.ip(&["-n", &sw, "link", "set", "dev", "uplink", "master", "br0", "up"]);
        let harness = format!("{}/24", net.harness_ip());
        net.ip(&["addr", "add", &harness, "dev", &uplink]);
        net.ip(&["link", "set", "dev", &uplink, "up"]);
        // The subnet is now visibly taken (the root namespace routes it): others may choose.
        drop(lock);

        for index in 0..hosts {
            let name = format!("{}-h{index}", net.id);
            let ip = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], (index + 1) as u8);
            net.ip(&["netns", "add", &name]);
            net.hosts.push(Host { index, name: name.clone(), ip, ip_tool: tools.ip.clone() });
            // IPv4 only: the faults are IPv4 rules, so no IPv6 path may bypass them. (Under
            // /proc/sys/net a thread sees its own namespace's settings.) Without IPv6 in the
            // kernel there is nothing to turn off.
            net.hosts[index].run(|| {
                for scope in ["all", "default"] {
                    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{scope}/disable_ipv6"), "1");
                }
            });
            let port = format!("h{index}");
            net.ip(&["-n", &name, "link", "set", "dev", "lo", "up"]);
            net.ip(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &name]);
            net.ip(&["-n", &sw, "link", "set", "dev", &port, "master", "br0", "up"]);
            net.ip(&["-n", &name, "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
            net.ip(&["-n", &name, "link", "set", "dev", "eth0", "up"]);
        }
        // Fail now, not at the first fault, when iptables is missing or does not work here.
        iptables(&tools.ip, &net.hosts[0].name);
        net
    }

    pub fn host(&self, index: usize) -> &Host {
        self.hosts.get(index).unwrap_or_else(|| panic!("host {index} of a TestNet of {} hosts", self.hosts.len()))
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The root namespace's address on the switch: where a proxy in the test process listens.
    pub fn harness_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], HARNESS_OCTET)
    }

    /// The bed's network, `10.X.Y.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}.{}.{}.0/24", self.subnet[0], self.subnet[1], self.subnet[2])
    }

    /// The name every namespace and link of this bed starts with.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Every namespace of the bed: the hosts' and the switch's.
    pub fn namespaces(&self) -> Vec<String> {
        let mut all: Vec<String> = self.hosts.iter().map(|host| host.name.clone()).collect();
        all.push(self.switch.clone());
        all
    }

    /// Drops every packet between `a` and `b`, both ways.
    pub fn partition(&self, a: usize, b: usize) {
        self.partition_one_way(a, b);
        self.partition_one_way(b, a);
    }

    /// Drops every packet from `from` to `to`; packets from `to` to `from` still arrive. A
    /// new TCP connection needs both ways, so none forms in either direction; on a connection
    /// made before, what `to` sends still reaches `from`, what `from` sends never arrives.
    pub fn partition_one_way(&self, from: usize, to: usize) {
        assert_ne!(from, to, "a partition is between two different hosts");
        let spec = vec!["-s".to_string(), self.host(from).ip.to_string(), "-j".to_string(), "DROP".to_string()];
        self.add_rules(Fault::Drop { from, to }, vec![(to, spec)]);
    }

    /// Undoes [`partition`](Self::partition) and both one-way partitions between `a` and `b`.
    pub fn heal(&self, a: usize, b: usize) {
        self.remove_rules(
            |fault| matches!(fault, Fault::Drop { from, to } if (from, to) == (a, b) || (from, to) == (b, a)),
        );
    }

    /// Cuts `a` off from every other host, and from the harness except for what `a` sends it
    /// (the harness filters nothing: see [`TcpDelayProxy`] on proxies in the test process).
    pub fn isolate(&self, a: usize) {
        let ip = self.host(a).ip.to_string();
        let mut rules = vec![(a, strings(&["-i", "eth0", "-j", "DROP"]))];
        for other in (0..self.hosts.len()).filter(|&other| other != a) {
            rules.push((other, strings(&["-s", &ip, "-j", "DROP"])));
        }
        self.add_rules(Fault::Isolate(a), rules);
    }

    /// Undoes [`isolate`](Self::isolate).
    pub fn rejoin(&self, a: usize) {
        self.remove_rules(|fault| fault == Fault::Isolate(a));
    }

    /// Undoes every partition and isolation (not loss or bandwidth limits).
    pub fn heal_all(&self) {
        self.remove_rules(|fault| matches!(fault, Fault::Drop { .. } | Fault::Isolate(_)));
    }

    /// Drops each packet `a` receives, and each packet another host receives from `a`, with
    /// `probability` (iptables' statistic match); replaces an earlier loss on `a`. Two hosts
    /// with loss compound. Packets `a` sends to the harness are not dropped.
    pub fn loss(&self, a: usize, probability: f64) {
        assert!((0.0..=1.0).contains(&probability), "a loss probability is within 0..=1, not {probability}");
        self.clear_loss(a);
        let p = format!("{probability}");
        let statistic = ["-m", "statistic", "--mode", "random", "--probability", &p, "-j", "DROP"];
        let ip = self.host(a).ip.to_string();
        let mut rules = vec![(a, strings(&[&["-i", "eth0"][..], &statistic].concat()))];
        for other in (0..self.hosts.len()).filter(|&other| other != a) {
            rules.push((other, strings(&[&["-s", &ip][..], &statistic].concat())));
        }
        self.add_rules(Fault::Loss(a), rules);
    }

    /// Undoes [`loss`](Self::loss).
    pub fn clear_loss(&self, a: usize) {
        self.remove_rules(|fault| fault == Fault::Loss(a));
    }

    /// Limits what `a` sends and what it receives to `bytes_per_second` each way, with a
    /// token bucket (`tc qdisc ... tbf`) on both ends of its veth: bursts of at most 1/20 s
    /// of the rate (and at least 4500 bytes), a queue of at most 100 ms, dropped beyond.
    /// Replaces an earlier limit on `a`.
    pub fn bandwidth(&self, a: usize, bytes_per_second: u64) {
        assert!(bytes_per_second > 0, "a bandwidth limit is above 0 bytes per second");
        let host = self.host(a);
        let rate = format!("{}bit", bytes_per_second.saturating_mul(8));
        let burst = (bytes_per_second / 20).max(4500).to_string();
        let tbf = ["root", "tbf", "rate", &rate, "burst", &burst, "latency", "100ms"];
        let port = format!("h{a}");
        let mut faults = self.faults();
        for (ns, dev) in [(host.name.as_str(), "eth0"), (self.switch.as_str(), port.as_str())] {
            let args = [&["-n", ns, "qdisc", "replace", "dev", dev][..], &tbf].concat();
            run(&self.tools.tc, &args).unwrap_or_else(|error| panic!("cannot limit host {a}'s bandwidth: {error}"));
        }
        faults.shaped.insert(a);
    }

    /// Undoes [`bandwidth`](Self::bandwidth).
    pub fn clear_bandwidth(&self, a: usize) {
        let mut faults = self.faults();
        if faults.shaped.remove(&a) {
            self.unshape(a);
        }
    }

    /// Undoes every fault: partitions, isolations, loss and bandwidth limits.
    pub fn clear_faults(&self) {
        self.remove_rules(|_| true);
        let mut faults = self.faults();
        for a in std::mem::take(&mut faults.shaped) {
            self.unshape(a);
        }
    }

    /// The iptables rules of a host's INPUT chain (`iptables -S INPUT`), for diagnostics.
    pub fn rules(&self, a: usize) -> String {
        let iptables = iptables(&self.tools.ip, &self.hosts[0].name);
        let host = self.host(a);
        let args = [&["netns", "exec", &host.name][..], &[path_str(iptables), "-w", "5", "-S", "INPUT"]].concat();
        run(&self.tools.ip, &args).unwrap_or_else(|error| panic!("cannot list host {a}'s rules: {error}"))
    }

    /// A [`TcpDelayProxy`] in the test process on `harness_ip():port` to host `to`'s
    /// `port` (the same number): a client pointed at the harness address reaches `to` with
    /// `delay` to `delay + jitter` added each way.
    pub fn delay_proxy(&self, to: usize, port: u16, delay: Duration, jitter: Duration) -> io::Result<TcpDelayProxy> {
        let listen = SocketAddr::new(IpAddr::V4(self.harness_ip()), port);
        let target = SocketAddr::new(IpAddr::V4(self.host(to).ip), port);
        TcpDelayProxy::start(None, listen, target, delay, jitter)
    }

    fn unshape(&self, a: usize) {
        let host = self.host(a);
        let port = format!("h{a}");
        for (ns, dev) in [(host.name.as_str(), "eth0"), (self.switch.as_str(), port.as_str())] {
            run(&self.tools.tc, &["-n", ns, "qdisc", "del", "dev", dev, "root"])
                .unwrap_or_else(|error| panic!("cannot lift host {a}'s bandwidth limit: {error}"));
        }
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the rules of `fault` unless it is already in place.
    fn add_rules(&self, fault: Fault, rules: Vec<(usize, Vec<String>)>) {
        let mut faults = self.faults();
        if faults.rules.iter().any(|rule| rule.fault == fault) {
            return;
        }
        for (host, spec) in rules {
            self.iptables(host, "-A", &spec).unwrap_or_else(|error| panic!("cannot inject {fault:?}: {error}"));
            faults.rules.push(Rule { fault, host, spec });
        }
    }

    fn remove_rules(&self, which: impl Fn(Fault) -> bool) {
        let mut faults = self.faults();
        let (gone, kept): (Vec<Rule>, Vec<Rule>) =
            std::mem::take(&mut faults.rules).into_iter().partition(|rule| which(rule.fault));
        faults.rules = kept;
        for rule in gone {
            self.iptables(rule.host, "-D", &rule.spec)
                .unwrap_or_else(|error| panic!("cannot undo {:?}: {error}", rule.fault));
        }
    }

    fn iptables(&self, host: usize, action: &str, spec: &[String]) -> Result<String, String> {
        let iptables = iptables(&self.tools.ip, &self.hosts[0].name);
        let mut args = vec!["netns", "exec", &self.hosts[host].name, path_str(iptables), "-w", "5", action, "INPUT"];
        args.extend(spec.iter().map(String::as_str));
        run(&self.tools.ip, &args)
    }

    /// Runs `ip args...`, panicking with its error (building the bed).
    fn ip(&self, args: &[&str]) {
        if let Err(error) = run(&self.tools.ip, args) {
            panic!("cannot build the multi-host test bed: {error}");
        }
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let mut problems = Vec::new();
        for ns in self.namespaces() {
            kill_processes_in(&self.tools.ip, &ns);
        }
        if self.uplink
            && let Err(error) = run(&self.tools.ip, &["link", "del", "dev", &self.id])
            && link_exists(&self.tools.ip, &self.id)
        {
            problems.push(error);
        }
        for ns in self.namespaces() {
            if netns_exists(&ns)
                && let Err(error) = run(&self.tools.ip, &["netns", "del", &ns])
            {
                problems.push(error);
            }
        }
        if !problems.is_empty() {
            let message = format!(
                "the multi-host test bed {} was not removed completely (the next TestNet::new removes it): {}",
                self.id,
                problems.join("; ")
            );
            if std::thread::panicking() {
                eprintln!("{message}");
            } else {
                panic!("{message}");
            }
        }
    }
}

impl Host {
    pub fn index(&self) -> usize {
        self.index
    }

    /// The host's namespace name (`ip netns exec <name> ...`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// A command running `program` on this host (`ip netns exec <name> program`); add its
    /// arguments. `ip netns exec` execs `program` in place, so the child's pid is the
    /// program's (kill -9 and SIGSTOP reach it). Its files and environment are the test's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(&self.ip_tool);
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Runs `f` on a new thread inside this host's network namespace: sockets it opens (a
    /// listener, a connection) belong to the host, and stay so when handed to other threads.
    pub fn spawn<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        let netns = open_netns(&self.name).unwrap_or_else(|error| panic!("cannot enter host {}: {error}", self.name));
        let name = self.name.clone();
        std::thread::spawn(move || {
            enter_netns(&netns).unwrap_or_else(|error| panic!("cannot enter the namespace of host {name}: {error}"));
            drop(netns);
            f()
        })
    }

    /// As [`spawn`](Self::spawn), waiting for `f`'s result (a panic in `f` is passed on).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let netns = open_netns(&self.name).unwrap_or_else(|error| panic!("cannot enter host {}: {error}", self.name));
        std::thread::scope(|scope| {
            let handle = scope.spawn(|| {
                enter_netns(&netns)
                    .unwrap_or_else(|error| panic!("cannot enter the namespace of host {}: {error}", self.name));
                f()
            });
            handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

/// The programs the bed runs, found on `PATH` or in the sbin directories.
struct Tools {
    ip: PathBuf,
    tc: PathBuf,
}

fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Tools> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let find = |name: &str, install: &str| {
            find_program(name)
                .unwrap_or_else(|| panic!("the multi-host test bed needs `{name}`, which is not installed: {install}"))
        };
        Tools { ip: find("ip", IPROUTE_INSTALL), tc: find("tc", IPROUTE_INSTALL) }
    })
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "the multi-host test bed makes network namespaces, which needs root (CAP_NET_ADMIN); run the test as root, as CI does"
    );
}

/// The iptables that works in a network namespace here: the nf_tables backend, else the
/// legacy one, else whatever `iptables` is. Decided once per process, by adding and deleting
/// a rule with the statistic match in `probe_ns`.
fn iptables(ip: &Path, probe_ns: &str) -> &'static Path {
    static IPTABLES: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let chosen = IPTABLES.get_or_init(|| {
        let mut tried = Vec::new();
        for name in ["iptables-nft", "iptables-legacy", "iptables"] {
            let Some(program) = find_program(name) else { continue };
            let rule = ["-s", "192.0.2.1", "-m", "statistic", "--mode", "random", "--probability", "0.5", "-j", "DROP"];
            let probe = |action: &str| {
                let args = [&["netns", "exec", probe_ns, path_str(&program), "-w", "5", action, "INPUT"][..], &rule].concat();
                run(ip, &args)
            };
            match probe("-A").and_then(|_| probe("-D")) {
                Ok(_) => return Ok(program),
                Err(error) => tried.push(error),
            }
        }
        if tried.is_empty() {
            Err(format!("the multi-host test bed needs iptables, which is not installed: {IPTABLES_INSTALL}"))
        } else {
            Err(format!(
                "no iptables works in a network namespace here ({}); the test bed needs one with the statistic match: {IPTABLES_INSTALL}",
                tried.join("; ")
            ))
        }
    });
    match chosen {
        Ok(program) => program,
        Err(message) => panic!("{message}"),
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap_or_else(|| panic!("program path {} is not UTF-8", path.display()))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| item.to_string()).collect()
}

pub fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `program args...` to its end within [`COMMAND_TIMEOUT`]: its stdout, or an error
/// naming the command, its exit status and its stderr.
fn run(program: &Path, args: &[&str]) -> Result<String, String> {
    let shown = format!("`{} {}`", program.display(), args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("{shown} did not start: {error}"))?;
    let read_all = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut bytes);
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = read_all(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let stderr = read_all(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not finish within {COMMAND_TIMEOUT:?}"));
            }
            Err(error) => return Err(format!("{shown}: {error}")),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if status.success() { Ok(stdout) } else { Err(format!("{shown} failed ({status}): {}", stderr.trim())) }
}

fn netns_exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

fn link_exists(ip: &Path, name: &str) -> bool {
    run(ip, &["link", "show", "dev", name]).is_ok()
}

fn open_netns(name: &str) -> io::Result<File> {
    let path = Path::new(NETNS_DIR).join(name);
    File::open(&path)
        .map_err(|error| io::Error::new(error.kind(), format!("network namespace {}: {error}", path.display())))
}

/// Moves the calling thread (only it) into the network namespace `netns` refers to.
fn enter_netns(netns: &File) -> io::Result<()> {
    // SAFETY: setns reads the descriptor, which `netns` keeps open during the call, and
    // changes the network namespace of the calling thread alone.
    let rc = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Kills (SIGKILL) every process inside the namespace: each was started by a test on a host.
fn kill_processes_in(ip: &Path, ns: &str) {
    let Ok(pids) = run(ip, &["netns", "pids", ns]) else { return };
    let own = std::process::id();
    for pid in pids.lines().filter_map(|line| line.trim().parse::<i32>().ok()) {
        if pid > 0 && pid as u32 != own {
            // SAFETY: kill has no memory preconditions; a pid that just exited makes it fail.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The pid a bed's name carries, if it is one of a bed's names.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, _) = rest.split_once('.')?;
    u32::from_str_radix(pid, 36).ok()
}

fn pid_alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the namespaces and root-namespace links of beds whose process is gone.
fn remove_leftovers(ip: &Path) {
    let stale = |name: &str| owner_pid(name).is_some_and(|pid| !pid_alive(pid));
    if let Ok(links) = run(ip, &["-o", "link", "show"]) {
        for line in links.lines() {
            // "7: wtb1a2.0@if3: <BROADCAST,..."
            let Some(name) = line.split(':').nth(1).map(|field| field.trim().split('@').next().unwrap_or("")) else {
                continue;
            };
            if stale(name)
                && let Err(error) = run(ip, &["link", "del", "dev", name])
                && link_exists(ip, name)
            {
                eprintln!("cannot remove the leftover link {name}: {error}");
            }
        }
    }
    let names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
        .collect();
    for name in names.iter().filter(|name| stale(name)) {
        kill_processes_in(ip, name);
        if let Err(error) = run(ip, &["netns", "del", name])
            && netns_exists(name)
        {
            eprintln!("cannot remove the leftover namespace {name}: {error}");
        }
    }
}

/// An exclusive lock on a file every process's beds share, held while a bed chooses its
/// subnet and claims it (by routing it in the root namespace).
struct SubnetLock(File);

impl SubnetLock {
    fn acquire() -> SubnetLock {
        let dir = if Path::new("/run").is_dir() { "/run" } else { "/tmp" };
        let path = format!("{dir}/weir-netns-testbed.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|error| panic!("cannot open the test bed's lock file {path}: {error}"));
        let deadline = Instant::now() + LOCK_WAIT_MAX;
        loop {
            match file.try_lock() {
                Ok(()) => return SubnetLock(file),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    panic!("another process held the test bed's lock {path} for over {LOCK_WAIT_MAX:?}")
                }
                Err(std::fs::TryLockError::Error(error)) => panic!("cannot lock {path}: {error}"),
            }
        }
    }
}

/// A private /24 (in 10.128.0.0/9, else 172.16.0.0/12, else 192.168.0.0/16) that nothing in
/// the root namespace routes or addresses, searched from one derived from the pid and the
/// counter.
fn free_subnet(ip: &Path, pid: u32, n: u32) -> [u8; 3] {
    let mut taken: Vec<(u32, u32)> = Vec::new();
    for args in [&["-4", "route", "show", "table", "all"][..], &["-4", "-o", "addr", "show"]] {
        let listing =
            run(ip, args).unwrap_or_else(|error| panic!("cannot list the root namespace's networks: {error}"));
        for token in listing.split_whitespace() {
            if let Some(network) = parse_network(token) {
                taken.push(network);
            }
        }
    }
    // (first /24, number of /24s)
    const RANGES: [(Ipv4Addr, u32); 3] = [
        (Ipv4Addr::new(10, 128, 0, 0), 1 << 15),
        (Ipv4Addr::new(172, 16, 0, 0), 1 << 12),
        (Ipv4Addr::new(192, 168, 0, 0), 1 << 8),
    ];
    let space: u32 = RANGES.iter().map(|&(_, count)| count).sum();
    let start = (pid.wrapping_mul(2_654_435_761) ^ n.wrapping_mul(40_503)) % space;
    for step in 0..space {
        let mut index = (start + step) % space;
        let mut base = 0;
        for &(first, count) in &RANGES {
            if index < count {
                base = u32::from(first) + (index << 8);
                break;
            }
            index -= count;
        }
        let overlaps = taken.iter().any(|&(network, len)| {
            let mask = if len.min(24) == 0 { 0 } else { u32::MAX << (32 - len.min(24)) };
            (network ^ base) & mask == 0
        });
        if !overlaps {
            let [a, b, c, _] = base.to_be_bytes();
            return [a, b, c];
        }
    }
    panic!("no free private /24 left for a multi-host test bed: the machine routes them all");
}

/// `a.b.c.d/len` or `a.b.c.d` (a /32) as (address, prefix length); `default` and
/// 0.0.0.0/0 are not networks that collide.
fn parse_network(token: &str) -> Option<(u32, u32)> {
    let (address, len) = match token.split_once('/') {
        Some((address, len)) => (address, len.parse::<u32>().ok()?),
        None => (token, 32),
    };
    let address: Ipv4Addr = address.parse().ok()?;
    (len > 0 && len <= 32).then_some((u32::from(address), len))
}

/// A TCP relay adding latency and jitter, since this kernel has no netem.
///
/// It accepts on `listen` and, for each connection, connects to `target` and forwards both
/// ways: each chunk it reads is written `delay` plus a uniform `0..=jitter` later, never
/// before the chunk read before it (order is kept; the end of a stream is delayed alike). A
/// round trip through it so takes at least `2 * delay` more. Its sockets live in the
/// namespace it was started in:
/// - `None`: the test process's (root) namespace, e.g. on [`TestNet::harness_ip`], to a
///   host. A client on any host pointed at the proxy reaches the target late. The target
///   sees the harness address as its peer, so partitions between hosts do not cut this path
///   (isolating or adding loss to the target does, for packets to it).
/// - `Some(host)`: that host's namespace, e.g. on `127.0.0.1` there: the relayed connection
///   leaves from the host's address, so every fault of that host applies to it as to any of
///   its processes (a per-pair latency: a proxy on host a to host b delays a -> b only).
///
/// A process that must be reached through the proxy advertises the proxy's address (with
/// weir's `taskmanager.host` and a fixed `taskmanager.data.port` the proxy listens on the
/// harness address with the same port, see [`TestNet::delay_proxy`]). Dropping it ends
/// every relayed connection.
pub struct TcpDelayProxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    acceptor: Option<JoinHandle<()>>,
}

struct ProxyShared {
    target: SocketAddr,
    /// (delay, jitter) of chunks read from now on.
    timing: Mutex<(Duration, Duration)>,
    random: Mutex<u64>,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// The two sockets of each live connection, to end them at drop.
    live: Mutex<BTreeMap<u64, (TcpStream, TcpStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// How long the relay waits for the target to accept a connection.
const PROXY_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Chunks in flight per direction (of at most 64 KiB each) before the relay stops reading.
const PROXY_CHUNKS_MAX: usize = 256;

enum Chunk {
    Data(Instant, Vec<u8>),
    End(Instant),
}

impl TcpDelayProxy {
    /// Starts a proxy listening on `listen` (port 0: any) inside `on`'s namespace, or the
    /// test process's with `None`, relaying to `target`. Fails when it cannot listen there.
    pub fn start(
        on: Option<&Host>,
        listen: SocketAddr,
        target: SocketAddr,
        delay: Duration,
        jitter: Duration,
    ) -> io::Result<TcpDelayProxy> {
        let netns = on.map(|host| open_netns(&host.name)).transpose()?;
        let shared = Arc::new(ProxyShared {
            target,
            timing: Mutex::new((delay, jitter)),
            random: Mutex::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(listen.port())),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            live: Mutex::new(BTreeMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let (bound_tx, bound_rx) = mpsc::channel::<io::Result<SocketAddr>>();
        let acceptor_shared = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new().name("delay-proxy".to_string()).spawn(move || {
            let listener = (|| {
                if let Some(netns) = &netns {
                    enter_netns(netns)?;
                }
                let listener = TcpListener::bind(listen)?;
                listener.set_nonblocking(true)?;
                Ok(listener)
            })();
            let listener = match listener {
                Ok(listener) => listener,
                Err(error) => {
                    let _ = bound_tx.send(Err(error));
                    return;
                }
            };
            let _ = bound_tx.send(listener.local_addr());
            accept_loop(&listener, &acceptor_shared);
        })?;
        match bound_rx.recv() {
            Ok(Ok(addr)) => Ok(TcpDelayProxy { addr, shared, acceptor: Some(acceptor) }),
            Ok(Err(error)) => {
                let _ = acceptor.join();
                Err(io::Error::new(error.kind(), format!("the delay proxy cannot listen on {listen}: {error}")))
            }
            Err(_) => Err(io::Error::other("the delay proxy's thread ended before listening")),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// Changes the delay and jitter of what the proxy reads from now on.
    pub fn set_delay(&self, delay: Duration, jitter: Duration) {
        *self.shared.timing.lock().unwrap_or_else(PoisonError::into_inner) = (delay, jitter);
    }

    /// Connections relayed so far (ended ones included).
    pub fn connections(&self) -> u64 {
        self.shared.next_id.load(Ordering::Relaxed)
    }
}

impl Drop for TcpDelayProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for (client, server) in
            std::mem::take(&mut *self.shared.live.lock().unwrap_or_else(PoisonError::into_inner)).values()
        {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
        // Each ends within the longest delay: its sockets are shut down.
        let threads = std::mem::take(&mut *self.shared.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl ProxyShared {
    /// When a chunk read now is due: now + delay + uniform(0..=jitter).
    fn due(&self) -> Instant {
        let (delay, jitter) = *self.timing.lock().unwrap_or_else(PoisonError::into_inner);
        let fraction = {
            let mut state = self.random.lock().unwrap_or_else(PoisonError::into_inner);
            // xorshift64*: deterministic per proxy, good enough for jitter.
            *state ^= *state >> 12;
            *state ^= *state << 25;
            *state ^= *state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
        };
        Instant::now() + delay + jitter.mul_f64(fraction)
    }

    fn keep_thread(&self, thread: JoinHandle<()>) {
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        threads.retain(|thread| !thread.is_finished());
        threads.push(thread);
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<ProxyShared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                let connection_shared = Arc::clone(shared);
                // Threads inherit the acceptor's namespace: the relay connects from there.
                let spawned = std::thread::Builder::new()
                    .name("delay-proxy-conn".to_string())
                    .spawn(move || relay(&connection_shared, id, client));
                match spawned {
                    Ok(thread) => shared.keep_thread(thread),
                    Err(error) => eprintln!("delay proxy: cannot start a connection thread: {error}"),
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Relays one connection both ways until both directions ended.
fn relay(shared: &Arc<ProxyShared>, id: u64, client: TcpStream) {
    let _ = client.set_nonblocking(false);
    let Ok(server) = TcpStream::connect_timeout(&shared.target, PROXY_CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clones = || Some((client.try_clone().ok()?, server.try_clone().ok()?));
    let (Some((client_out, server_in)), Some(registered)) = (clones(), clones()) else {
        return;
    };
    {
        // Checked under the lock: the proxy's drop either finds this connection or sees it
        // never started.
        let mut live = shared.live.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        live.insert(id, registered);
    }
    let upstream_shared = Arc::clone(shared);
    let upstream = std::thread::Builder::new()
        .name("delay-proxy-up".to_string())
        .spawn(move || pump(&upstream_shared, client, server_in));
    pump(shared, server, client_out);
    if let Ok(upstream) = upstream {
        let _ = upstream.join();
    }
    shared.live.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
}

/// Reads `from` and has a writer thread deliver each chunk to `to` when due.
fn pump(shared: &ProxyShared, mut from: TcpStream, to: TcpStream) {
    let (chunks, due_chunks) = mpsc::sync_channel::<Chunk>(PROXY_CHUNKS_MAX);
    let Ok(from_for_abort) = from.try_clone() else { return };
    let writer = std::thread::Builder::new()
        .name("delay-proxy-out".to_string())
        .spawn(move || deliver(&due_chunks, to, &from_for_abort));
    let mut buffer = vec![0u8; 64 * 1024];
    let mut last = Instant::now();
    loop {
        match from.read(&mut buffer) {
            Ok(0) => {
                let _ = chunks.send(Chunk::End(shared.due().max(last)));
                break;
            }
            Ok(n) => {
                last = shared.due().max(last);
                if chunks.send(Chunk::Data(last, buffer[..n].to_vec())).is_err() {
                    break;
                }
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // Reset: end both sides now.
                let _ = from.shutdown(Shutdown::Both);
                drop(chunks);
                break;
            }
        }
    }
    if let Ok(writer) = writer {
        let _ = writer.join();
    }
}

fn deliver(chunks: &mpsc::Receiver<Chunk>, mut to: TcpStream, from: &TcpStream) {
    let wait_until = |due: Instant| {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    };
    while let Ok(chunk) = chunks.recv() {
        match chunk {
            Chunk::Data(due, bytes) => {
                wait_until(due);
                if to.write_all(&bytes).is_err() {
                    // The receiver is gone: stop reading its peer too.
                    let _ = from.shutdown(Shutdown::Both);
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
            }
            Chunk::End(due) => {
                wait_until(due);
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
    // The reader failed (a reset): pass it on.
    let _ = to.shutdown(Shutdown::Both);
}
