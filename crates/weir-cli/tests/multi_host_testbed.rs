//! The multi-host test bed itself (`common/netns.rs`): hosts reach each other, every fault
//! does what it says and is undone, the delay proxy delays, and nothing is left behind.
//! Needs root, iproute2 and iptables (missing, the tests fail naming the install command).

#[path = "common/netns.rs"]
mod netns;

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netns::{TcpDelayProxy, TestNet};

/// A connection expected to form does within this.
const WORKS: Duration = Duration::from_secs(2);
/// A connection expected to be cut off has not formed after this (a SYN is answered within
/// a millisecond on the bridge; the first retransmission comes after a second).
const BLOCKED: Duration = Duration::from_millis(400);

/// From the harness (`None`) or a host.
type Source = Option<usize>;

fn listen(net: &TestNet, host: usize) -> TcpListener {
    let ip = net.host(host).ip();
    net.host(host).run(move || TcpListener::bind((ip, 0))).unwrap_or_else(|e| panic!("listen on host {host}: {e}"))
}

fn addr_of(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().expect("a bound listener has an address")
}

fn connect(net: &TestNet, from: Source, to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    match from {
        Some(host) => net.host(host).run(move || TcpStream::connect_timeout(&to, timeout)),
        None => TcpStream::connect_timeout(&to, timeout),
    }
}

/// Checks, all at once (the blocked ones wait [`BLOCKED`] together), whether each
/// `(from, to, reachable)` holds for the listeners' addresses.
fn assert_reachability(net: &TestNet, listeners: &[TcpListener], cases: &[(Source, usize, bool)]) {
    std::thread::scope(|scope| {
        let checks: Vec<_> = cases
            .iter()
            .map(|&(from, to, reachable)| {
                let target = addr_of(&listeners[to]);
                scope.spawn(move || {
                    let outcome = connect(net, from, target, if reachable { WORKS } else { BLOCKED });
                    match (reachable, outcome) {
                        (true, Ok(_)) => Ok(()),
                        (true, Err(e)) => Err(format!("{from:?} -> host {to}: expected to connect, got {e}")),
                        (false, Ok(_)) => Err(format!("{from:?} -> host {to}: connected, but should be cut off")),
                        (false, Err(e)) if e.kind() == io::ErrorKind::TimedOut => Ok(()),
                        (false, Err(e)) => Err(format!(
                            "{from:?} -> host {to}: expected silence (a timeout), got {e}: packets got through"
                        )),
                    }
                })
            })
            .collect();
        let failures: Vec<String> =
            checks.into_iter().filter_map(|check| check.join().expect("a check").err()).collect();
        assert!(failures.is_empty(), "reachability:\n{}", failures.join("\n"));
    });
}

/// Every ordered pair of hosts (and the harness to each host) connects.
fn all_pairs(hosts: usize) -> Vec<(Source, usize, bool)> {
    let mut cases = Vec::new();
    for to in 0..hosts {
        cases.push((None, to, true));
        for from in (0..hosts).filter(|&from| from != to) {
            cases.push((Some(from), to, true));
        }
    }
    cases
}

/// Waits for one connection on `listener`, for at most `within`.
fn accept_within(listener: &TcpListener, within: Duration) -> TcpStream {
    listener.set_nonblocking(true).expect("nonblocking listener");
    let deadline = Instant::now() + within;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).expect("blocking stream");
                return stream;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("no connection accepted within {within:?}: {e}"),
        }
    }
}

/// An echo server on a listener (in whatever namespace it was bound), ended when dropped.
struct EchoServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl EchoServer {
    fn start(listener: TcpListener) -> EchoServer {
        let addr = addr_of(&listener);
        listener.set_nonblocking(true).expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
                        std::thread::spawn(move || {
                            let mut buffer = [0u8; 16 * 1024];
                            while let Ok(n) = stream.read(&mut buffer) {
                                if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                                    break;
                                }
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        EchoServer { addr, stop, acceptor: Some(acceptor) }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// One byte there and back: how long it took.
fn round_trip(stream: &mut TcpStream) -> io::Result<Duration> {
    let start = Instant::now();
    stream.write_all(b"x")?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte)?;
    Ok(start.elapsed())
}

/// Sends `bytes` from host `from` to host `to` over TCP: the time from connecting until the
/// receiver read the last byte.
fn transfer(net: &TestNet, from: usize, to: usize, bytes: usize) -> Duration {
    let listener = listen(net, to);
    let target = addr_of(&listener);
    let receiver = std::thread::spawn(move || {
        let mut stream = accept_within(&listener, WORKS);
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
        let mut buffer = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => return total,
                Ok(n) => total += n,
                Err(e) => panic!("the receiver failed after {total} bytes: {e}"),
            }
        }
    });
    let start = Instant::now();
    let mut stream = connect(net, Some(from), target, WORKS).expect("the sender connects");
    let chunk = vec![0x5au8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        stream.write_all(&chunk[..n]).expect("the sender writes");
        left -= n;
    }
    stream.shutdown(std::net::Shutdown::Write).expect("the sender ends its stream");
    let received = receiver.join().expect("the receiver");
    let took = start.elapsed();
    assert_eq!(received, bytes, "bytes received");
    took
}

fn udp(net: &TestNet, host: usize) -> UdpSocket {
    let ip = net.host(host).ip();
    let socket = net.host(host).run(move || UdpSocket::bind((ip, 0))).expect("a UDP socket on the host");
    socket.set_read_timeout(Some(Duration::from_millis(500))).expect("read timeout");
    socket
}

fn received(socket: &UdpSocket) -> Option<Vec<u8>> {
    let mut buffer = [0u8; 64];
    socket.recv(&mut buffer).ok().map(|n| buffer[..n].to_vec())
}

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|listed| listed == name)
}

/// The names `ip netns list` shows.
fn netns_list() -> Vec<String> {
    let output = std::process::Command::new("ip").args(["netns", "list"]).output().expect("ip netns list runs");
    let listing = String::from_utf8_lossy(&output.stdout);
    listing.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_string).collect()
}

/// The names of the root namespace's links (`ip -o link show`, "7: name@peer: <...").
fn link_list() -> Vec<String> {
    let output = std::process::Command::new("ip").args(["-o", "link", "show"]).output().expect("ip link runs");
    let listing = String::from_utf8_lossy(&output.stdout);
    listing
        .lines()
        .filter_map(|line| line.split(':').nth(1))
        .map(|name| name.trim().split('@').next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn hosts_reach_each_other_and_the_harness() {
    let net = TestNet::new(3);
    let listeners: Vec<TcpListener> = (0..3).map(|host| listen(&net, host)).collect();
    assert_reachability(&net, &listeners, &all_pairs(3));

    // Addresses on the bed's own /24, names within the kernel's 15 characters for links.
    let prefix = net.subnet().trim_end_matches("0/24").to_string();
    for host in net.hosts() {
        assert!(host.ip().to_string().starts_with(&prefix), "{} in {}", host.ip(), net.subnet());
        assert!(host.name().starts_with(net.id()));
    }
    assert!(net.id().len() <= 15, "{}", net.id());
    assert!(net.harness_ip().to_string().starts_with(&prefix));

    // A second bed at once: another subnet and other names, and no way between the two.
    let other = TestNet::new(1);
    assert_ne!(other.subnet(), net.subnet());
    assert_ne!(other.id(), net.id());
    let foreign = addr_of(&listen(&other, 0));
    let crossing = connect(&net, Some(0), foreign, BLOCKED);
    assert!(crossing.is_err(), "host 0 of one bed reached a host of another: {crossing:?}");
}

#[test]
fn partition_cuts_two_hosts_apart_until_healed() {
    let net = TestNet::new(3);
    let listeners: Vec<TcpListener> = (0..3).map(|host| listen(&net, host)).collect();

    net.partition(0, 1);
    assert_reachability(
        &net,
        &listeners,
        &[
            (Some(0), 1, false),
            (Some(1), 0, false),
            (Some(0), 2, true),
            (Some(2), 0, true),
            (Some(1), 2, true),
            (Some(2), 1, true),
            (None, 0, true),
            (None, 1, true),
        ],
    );

    net.heal(0, 1);
    assert_reachability(&net, &listeners, &all_pairs(3));

    // heal_all lifts several partitions and an isolation at once.
    net.partition(0, 2);
    net.partition_one_way(1, 2);
    net.isolate(1);
    assert_reachability(&net, &listeners, &[(Some(0), 2, false), (Some(1), 2, false), (Some(0), 1, false)]);
    net.heal_all();
    assert_reachability(&net, &listeners, &all_pairs(3));
}

#[test]
fn one_way_partition_drops_one_direction_only() {
    let net = TestNet::new(2);
    let listener = listen(&net, 1);
    let mut client = connect(&net, Some(0), addr_of(&listener), WORKS).expect("0 connects to 1");
    let mut server = accept_within(&listener, WORKS);
    let a = udp(&net, 0);
    let b = udp(&net, 1);
    let (a_addr, b_addr) = (a.local_addr().expect("udp addr"), b.local_addr().expect("udp addr"));

    net.partition_one_way(0, 1);

    // On the connection made before: 1 -> 0 still arrives, 0 -> 1 does not.
    server.write_all(b"to-0").expect("1 writes");
    client.set_read_timeout(Some(WORKS)).expect("read timeout");
    let mut got = [0u8; 4];
    client.read_exact(&mut got).expect("what host 1 sends reaches host 0");
    assert_eq!(&got, b"to-0");
    client.write_all(b"to-1").expect("0 writes (into its send buffer)");
    server.set_read_timeout(Some(Duration::from_millis(500))).expect("read timeout");
    let lost = server.read(&mut got);
    assert!(lost.is_err(), "what host 0 sends must not reach host 1: {lost:?}");
    // Datagrams: the same, and the sender sees no error (the drop is at the receiver).
    b.send_to(b"b-to-a", a_addr).expect("1 sends");
    assert_eq!(received(&a).as_deref(), Some(&b"b-to-a"[..]), "a datagram from 1 reaches 0");
    a.send_to(b"a-to-b", b_addr).expect("0 sends without an error");
    assert_eq!(received(&b), None, "a datagram from 0 must not reach 1");
    // A new connection needs both ways: the SYN from 0 never arrives.
    let listeners = [listen(&net, 0), listen(&net, 1)];
    assert_reachability(&net, &listeners, &[(Some(0), 1, false)]);

    net.heal(0, 1);
    assert_reachability(&net, &listeners, &[(Some(0), 1, true), (Some(1), 0, true)]);
    // TCP retransmits what was dropped: it arrives once healed.
    server.set_read_timeout(Some(Duration::from_secs(5))).expect("read timeout");
    server.read_exact(&mut got).expect("the dropped bytes arrive after the heal");
    assert_eq!(&got, b"to-1");
}

#[test]
fn isolate_cuts_a_host_off_from_everyone_until_it_rejoins() {
    let net = TestNet::new(3);
    let listeners: Vec<TcpListener> = (0..3).map(|host| listen(&net, host)).collect();

    net.isolate(0);
    assert_reachability(
        &net,
        &listeners,
        &[
            (Some(0), 1, false),
            (Some(0), 2, false),
            (Some(1), 0, false),
            (Some(2), 0, false),
            (None, 0, false),
            (Some(1), 2, true),
            (Some(2), 1, true),
            (None, 1, true),
        ],
    );

    net.rejoin(0);
    assert_reachability(&net, &listeners, &all_pairs(3));
}

#[test]
fn loss_drops_packets_with_the_given_probability() {
    let net = TestNet::new(2);
    let listeners = [listen(&net, 0), listen(&net, 1)];

    net.loss(1, 1.0);
    assert_reachability(&net, &listeners, &[(Some(0), 1, false), (Some(1), 0, false), (None, 1, false)]);
    net.clear_loss(1);
    assert_reachability(&net, &listeners, &all_pairs(2));

    // 30 %: of 1000 datagrams host 1 receives about 700 (10 standard deviations either way).
    net.loss(1, 0.3);
    // iptables keeps the probability as a 32-bit fraction: 0.3 shows as 0.29999999981.
    let rules = net.rules(1);
    let shown = rules.split("--probability ").nth(1).and_then(|rest| rest.split_whitespace().next());
    let probability: f64 = shown.and_then(|p| p.parse().ok()).unwrap_or(f64::NAN);
    assert!((probability - 0.3).abs() < 1e-6, "{rules}");
    let sender = udp(&net, 0);
    let receiver = udp(&net, 1);
    let target = receiver.local_addr().expect("udp addr");
    let counter = std::thread::spawn(move || {
        let mut count = 0;
        while received(&receiver).is_some() {
            count += 1;
        }
        count
    });
    for i in 0..1000u32 {
        sender.send_to(&i.to_be_bytes(), target).expect("send a datagram");
        if i % 20 == 19 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let count = counter.join().expect("the counter");
    assert!((550..=850).contains(&count), "host 1 received {count} of 1000 datagrams at 30 % loss");
    net.clear_loss(1);
    assert!(!net.rules(1).contains("statistic"), "{}", net.rules(1));
}

#[test]
fn bandwidth_limits_a_bulk_transfer() {
    let net = TestNet::new(2);
    const RATE: u64 = 1_000_000;
    const BYTES: usize = 1_500_000;
    let rate = |took: Duration| BYTES as f64 / took.as_secs_f64();

    let unlimited = transfer(&net, 0, 1, BYTES);
    assert!(rate(unlimited) > 4.0 * RATE as f64, "unlimited: {:.0} B/s", rate(unlimited));

    net.bandwidth(1, RATE);
    // Into host 1 (the switch's end of its veth) and out of it (its own end).
    for (from, to) in [(0, 1), (1, 0)] {
        let took = transfer(&net, from, to, BYTES);
        let measured = rate(took);
        assert!(
            (0.4 * RATE as f64..=1.6 * RATE as f64).contains(&measured),
            "{from} -> {to} at a limit of {RATE} B/s: {measured:.0} B/s ({BYTES} bytes in {took:?})"
        );
    }

    net.clear_bandwidth(1);
    let lifted = transfer(&net, 0, 1, BYTES);
    assert!(rate(lifted) > 4.0 * RATE as f64, "limit lifted: {:.0} B/s", rate(lifted));
}

#[test]
fn delay_proxy_in_the_harness_delays_each_way_and_keeps_order() {
    let net = TestNet::new(2);
    let echo = EchoServer::start(listen(&net, 1));
    let delay = Duration::from_millis(40);
    let jitter = Duration::from_millis(10);
    let listen_on = SocketAddr::new(IpAddr::V4(net.harness_ip()), 0);
    let proxy = TcpDelayProxy::start(None, listen_on, echo.addr, delay, jitter).expect("the proxy listens");

    // Direct: well under the delay.
    let mut direct = connect(&net, Some(0), echo.addr, WORKS).expect("0 connects to 1");
    let fastest = (0..5).map(|_| round_trip(&mut direct).expect("a direct round trip")).min().expect("5 trips");
    assert!(fastest < delay / 2, "a direct round trip took {fastest:?}");

    // Through the proxy, from host 0: 2 * delay to 2 * (delay + jitter), plus scheduling.
    let mut proxied = connect(&net, Some(0), proxy.addr(), WORKS).expect("0 connects to the proxy");
    proxied.set_read_timeout(Some(Duration::from_secs(5))).expect("read timeout");
    for _ in 0..5 {
        let took = round_trip(&mut proxied).expect("a round trip through the proxy");
        assert!(took >= 2 * delay, "a round trip through the proxy took {took:?}, less than 2 x {delay:?}");
        assert!(took < 2 * (delay + jitter) + Duration::from_millis(500), "a round trip took {took:?}");
    }
    assert_eq!(proxy.connections(), 1);

    // Order is kept under jitter: 256 KiB of a counting pattern come back as sent.
    let payload: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut writer = proxied.try_clone().expect("clone the stream");
    let sent = payload.clone();
    let sending = std::thread::spawn(move || {
        for chunk in sent.chunks(1000) {
            writer.write_all(chunk).expect("write through the proxy");
        }
    });
    let mut echoed = vec![0u8; payload.len()];
    proxied.read_exact(&mut echoed).expect("the echo comes back");
    sending.join().expect("the sender");
    assert!(echoed == payload, "the proxy reordered or changed bytes");

    // Without delay it relays at once.
    proxy.set_delay(Duration::ZERO, Duration::ZERO);
    let took = round_trip(&mut proxied).expect("a round trip");
    let took = took.min(round_trip(&mut proxied).expect("a round trip"));
    assert!(took < delay, "after set_delay(0): {took:?}");
}

#[test]
fn delay_proxy_on_a_host_is_subject_to_that_hosts_faults() {
    let net = TestNet::new(2);
    let echo = EchoServer::start(listen(&net, 1));
    let delay = Duration::from_millis(30);
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let proxy = TcpDelayProxy::start(Some(net.host(0)), loopback, echo.addr, delay, Duration::ZERO)
        .expect("the proxy listens on host 0's loopback");

    let mut client = connect(&net, Some(0), proxy.addr(), WORKS).expect("host 0 connects to its local proxy");
    client.set_read_timeout(Some(Duration::from_millis(600))).expect("read timeout");
    let took = round_trip(&mut client).expect("a round trip");
    assert!(took >= 2 * delay, "a round trip through the proxy took {took:?}");
    // The harness's loopback is not host 0's: nothing listens there.
    assert!(TcpStream::connect_timeout(&proxy.addr(), BLOCKED).is_err(), "the proxy must listen on host 0 only");

    // The relayed connection leaves from host 0: a partition from host 1 cuts it.
    net.partition(0, 1);
    let cut = round_trip(&mut client);
    assert!(cut.is_err(), "a round trip through a partition: {cut:?}");
    net.heal(0, 1);
    client.set_read_timeout(Some(Duration::from_secs(5))).expect("read timeout");
    let mut late = [0u8; 1];
    client.read_exact(&mut late).expect("the echo arrives once healed (TCP retransmits)");
    round_trip(&mut client).expect("a round trip after the heal");
}

#[test]
fn commands_run_on_their_host_with_the_same_files_and_are_ended_with_the_bed() {
    let net = TestNet::new(2);
    let dir = tempfile::tempdir().expect("a temporary directory");

    let output = net.host(1).command("ip").args(["-4", "-o", "addr", "show"]).output().expect("ip runs on host 1");
    let addresses = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && addresses.contains(&format!("{}/24", net.host(1).ip())), "{addresses}");
    assert!(!addresses.contains(&format!("{}/24", net.host(0).ip())), "{addresses}");
    let output = net.host(1).command("ip").args(["-6", "-o", "addr", "show"]).output().expect("ip runs on host 1");
    assert!(output.stdout.is_empty(), "IPv6 is off on a host: {}", String::from_utf8_lossy(&output.stdout));

    let file = dir.path().join("written-on-host-0");
    let status = net
        .host(0)
        .command("sh")
        .arg("-c")
        .arg("echo hello > \"$1\"")
        .arg("sh")
        .arg(&file)
        .status()
        .expect("sh runs on host 0");
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(&file).expect("the harness reads the host's file"), "hello\n");

    let weir = net.host(1).command(env!("CARGO_BIN_EXE_weir")).arg("--version").output().expect("weir runs on host 1");
    assert!(weir.status.success(), "weir --version on host 1: {weir:?}");

    // A process still running when the bed goes is killed with it.
    let mut sleeper =
        net.host(0).command("sleep").arg("60").stdout(Stdio::null()).spawn().expect("sleep runs on host 0");
    // `ip netns exec` execs in place: the child's pid becomes sleep's, inside host 0, once
    // `ip` has entered the namespace (a moment after spawn returns, so poll).
    let listed_by_deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids =
            std::process::Command::new("ip").args(["netns", "pids", net.host(0).name()]).output().expect("ip runs");
        let pids = String::from_utf8_lossy(&pids.stdout).into_owned();
        if pids.lines().any(|pid| pid.trim() == sleeper.id().to_string()) {
            break;
        }
        assert!(Instant::now() < listed_by_deadline, "pid {} not in host 0 after 5 s: {pids:?}", sleeper.id());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(net);
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = sleeper.try_wait().expect("wait for sleep") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = sleeper.kill();
            let _ = sleeper.wait();
            panic!("a process on a host outlived the bed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.signal(), Some(9), "the bed kills what still runs on its hosts: {status:?}");
}

#[test]
fn drop_removes_every_namespace_and_link_also_after_a_panic() {
    let net = TestNet::new(3);
    let id = net.id().to_string();
    let namespaces = net.namespaces();
    net.partition(0, 1);
    net.loss(2, 0.5);
    net.bandwidth(1, 100_000);
    let proxy = net.delay_proxy(1, 0, Duration::from_millis(1), Duration::ZERO);
    assert!(proxy.is_ok(), "{:?}", proxy.err());
    assert!(has(&netns_list(), &namespaces[0]) && has(&link_list(), &id));
    drop(proxy);
    drop(net);
    let (listed, links) = (netns_list(), link_list());
    for ns in &namespaces {
        assert!(!has(&listed, ns), "namespace {ns} is left: {listed:?}");
    }
    assert!(!has(&links, &id), "link {id} is left: {links:?}");

    let made = std::sync::Mutex::new(Vec::new());
    let panicked = std::panic::catch_unwind(|| {
        let net = TestNet::new(2);
        made.lock().expect("lock").extend(net.namespaces());
        made.lock().expect("lock").push(net.id().to_string());
        panic!("a test fails with its bed up");
    });
    assert!(panicked.is_err());
    let made = made.into_inner().expect("names");
    assert_eq!(made.len(), 4);
    let (listed, links) = (netns_list(), link_list());
    for name in &made {
        assert!(!has(&listed, name) && !has(&links, name), "{name} is left after a panic");
    }
}

#[test]
fn leftovers_of_dead_processes_are_removed_and_live_ones_kept() {
    let dead =
        (2..32768u32).rev().find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()).expect("a free pid");
    // Named after this process too, so concurrent runs of this test do not collide.
    let own = netns::base36(u64::from(std::process::id()));
    let stale = format!("{}{}.{own}", netns::PREFIX, netns::base36(u64::from(dead)));
    // pid 1 is alive: its bed must stay.
    let alive = format!("{}{}.{own}-h0", netns::PREFIX, netns::base36(1));
    let ip = |args: &[&str]| {
        let status = std::process::Command::new("ip").args(args).status().expect("ip runs");
        assert!(status.success(), "ip {args:?}");
    };
    ip(&["netns", "add", &format!("{stale}-h0")]);
    ip(&["netns", "add", &format!("{stale}-sw")]);
    ip(&["link", "add", &stale, "type", "veth", "peer", "name", &format!("{stale}p")]);
    ip(&["netns", "add", &alive]);

    let net = TestNet::new(1);
    let (listed, links) = (netns_list(), link_list());
    let alive_kept = has(&listed, &alive);
    ip(&["netns", "del", &alive]);
    assert!(!listed.iter().any(|name| name.starts_with(&stale)), "a dead process's namespaces are left: {listed:?}");
    assert!(!links.iter().any(|name| name.starts_with(&stale)), "a dead process's links are left: {links:?}");
    assert!(alive_kept, "the bed of a live process was removed");
    drop(net);
}
