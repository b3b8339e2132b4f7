use super::*;

fn secret(text: &str) -> Option<SharedSecret> {
    Some(SharedSecret::new(text.as_bytes()).unwrap())
}

const RIGHT: &str = "the right secret, 32 bytes long!";
const WRONG: &str = "another secret, also long enough";

/// Runs the handshake between a connecting side with `client` and an accepting side with
/// `server` over loopback; returns both outcomes (and the streams on success).
fn handshake(
    client: &WireSecurity,
    server: &WireSecurity,
    plane: Plane,
) -> (Result<TcpStream, HandshakeError>, Result<TcpStream, HandshakeError>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let server = server.clone();
    let accepting = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        server.accept(stream, plane)
    });
    let connected = client.connect(TcpStream::connect(address).unwrap(), plane);
    (connected, accepting.join().unwrap())
}

fn with_secret(text: &str) -> WireSecurity {
    WireSecurity::new(secret(text), None)
}

#[test]
fn the_same_secret_on_both_sides_is_accepted_and_the_protocol_follows() {
    let (client, server) = handshake(&with_secret(RIGHT), &with_secret(RIGHT), Plane::Control);
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    client.write_all(b"register\n").unwrap();
    let mut line = [0u8; 9];
    server.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"register\n");
    // Without any secret the handshake passes too (and only checks the protocol).
    let (client, server) = handshake(&WireSecurity::open(), &WireSecurity::open(), Plane::Data);
    assert!(client.is_ok() && server.is_ok());
}

#[test]
fn a_wrong_or_missing_secret_is_refused_with_a_clear_error_on_both_sides() {
    let (client, server) = handshake(&with_secret(WRONG), &with_secret(RIGHT), Plane::Control);
    let client = client.unwrap_err().to_string();
    assert_eq!(
        client,
        "the JobManager refused this TaskManager: the shared secret (security.internal.secret) does not match; give every JobManager and TaskManager the same secret"
    );
    assert!(server.unwrap_err().to_string().contains("does not match"));

    let (client, server) = handshake(&WireSecurity::open(), &with_secret(RIGHT), Plane::Data);
    let client = client.unwrap_err();
    assert!(matches!(client, HandshakeError::RefusedNoSecret { .. }), "{client}");
    assert!(client.to_string().contains("none is configured here"), "{client}");
    assert!(matches!(server.unwrap_err(), HandshakeError::MissingSecret { .. }));

    // A TaskManager with a secret does not trust a JobManager without one.
    let (client, _server) = handshake(&with_secret(RIGHT), &WireSecurity::open(), Plane::Control);
    let client = client.unwrap_err();
    assert!(matches!(client, HandshakeError::ServerWithoutSecret { .. }), "{client}");
    assert!(client.is_refusal());
}

/// Records what a side wrote.
struct Recording<'a> {
    stream: &'a mut TcpStream,
    written: Vec<u8>,
}

impl Read for Recording<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buffer)
    }
}

impl Write for Recording<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.written.extend_from_slice(bytes);
        self.stream.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// The secret never travels, and what a passive observer saw of one handshake (the
/// TaskManager's hello and proof) does not pass the next one: the JobManager's fresh nonce
/// makes the old proof worthless.
#[test]
fn the_secret_never_travels_and_a_recorded_proof_cannot_be_replayed() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let server = with_secret(RIGHT);
    let accepting = std::thread::spawn(move || {
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let (stream, _) = listener.accept().unwrap();
            outcomes.push(server.accept(stream, Plane::Control).map(|_| ()).map_err(|e| e.to_string()));
        }
        outcomes
    });
    let mut stream = TcpStream::connect(address).unwrap();
    let mut recording = Recording { stream: &mut stream, written: Vec::new() };
    challenge(&mut recording, secret(RIGHT).as_ref(), Plane::Control).unwrap();
    let transcript = recording.written;
    assert_eq!(transcript.len(), HELLO_BYTES + PROOF_BYTES);
    assert!(!transcript.windows(RIGHT.len()).any(|w| w == RIGHT.as_bytes()), "the secret was sent");

    // The replay: the same hello and the same proof on a new connection.
    let mut replay = TcpStream::connect(address).unwrap();
    replay.write_all(&transcript[..HELLO_BYTES]).unwrap();
    let mut server_hello = [0u8; HELLO_BYTES];
    replay.read_exact(&mut server_hello).unwrap();
    replay.write_all(&transcript[HELLO_BYTES..]).unwrap();
    let mut verdict = [0u8; 1 + PROOF_BYTES];
    replay.read_exact(&mut verdict).unwrap();
    assert_eq!(verdict[0], REFUSED_WRONG_SECRET);
    let outcomes = accepting.join().unwrap();
    assert!(outcomes[0].is_ok(), "{outcomes:?}");
    assert!(outcomes[1].as_ref().is_err_and(|e| e.contains("does not match")), "{outcomes:?}");
}

#[test]
fn a_peer_that_does_not_speak_the_handshake_is_dropped() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let accepting = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        with_secret(RIGHT).accept(stream, Plane::Control)
    });
    let mut peer = TcpStream::connect(address).unwrap();
    peer.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n--------------").unwrap();
    let error = accepting.join().unwrap().unwrap_err();
    assert!(matches!(error, HandshakeError::NotWeir { .. }), "{error}");
}

#[test]
fn a_short_secret_is_refused() {
    let error = SharedSecret::new(b"hunter2").unwrap_err().to_string();
    assert!(error.contains("7 bytes") && error.contains("at least 16"), "{error}");
    assert_eq!(format!("{:?}", secret(RIGHT).unwrap()), "SharedSecret(******)");
}

/// A PEM keystore (certificate and key) and truststore (the certificate itself: a
/// self-signed certificate trusted only by the processes that hold it, as Flink's internal
/// SSL recommends).
fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let certified = rcgen::generate_simple_self_signed(vec![format!("{name}.weir")]).unwrap();
    let keystore = dir.join(format!("{name}-keystore.pem"));
    let truststore = dir.join(format!("{name}-truststore.pem"));
    std::fs::write(&keystore, format!("{}{}", certified.cert.pem(), certified.signing_key.serialize_pem())).unwrap();
    std::fs::write(&truststore, certified.cert.pem()).unwrap();
    (keystore, truststore)
}

fn tls(keystore: &Path, truststore: &Path, secret_text: Option<&str>) -> WireSecurity {
    WireSecurity::new(secret_text.and_then(secret), Some(TlsIdentity::from_pem_files(keystore, truststore).unwrap()))
}

#[test]
fn mutual_tls_carries_both_directions_and_refuses_an_untrusted_or_plain_peer() {
    let dir = tempfile::tempdir().unwrap();
    let (keystore, truststore) = self_signed(dir.path(), "cluster");
    let cluster = tls(&keystore, &truststore, Some(RIGHT));
    let (client, server) = handshake(&cluster, &cluster, Plane::Data);
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    // Both ways at once, more than one TLS record's worth.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let sent = payload.clone();
    let mut client_writer = client.try_clone().unwrap();
    let writer = std::thread::spawn(move || client_writer.write_all(&sent).unwrap());
    server.write_all(b"credits").unwrap();
    let mut received = vec![0u8; payload.len()];
    server.read_exact(&mut received).unwrap();
    assert!(received == payload, "the payload changed in the tunnel");
    let mut credits = [0u8; 7];
    client.read_exact(&mut credits).unwrap();
    assert_eq!(&credits, b"credits");
    writer.join().unwrap();
    // Closing one end reaches the other as the end of the stream.
    drop(client);
    server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(server.read(&mut [0u8; 1]).unwrap(), 0);

    // A process whose certificate the cluster does not trust (and which does not trust it).
    let (stranger_keystore, stranger_truststore) = self_signed(dir.path(), "stranger");
    let stranger = tls(&stranger_keystore, &stranger_truststore, Some(RIGHT));
    let (client, server) = handshake(&stranger, &cluster, Plane::Control);
    assert!(matches!(client, Err(HandshakeError::Tls { .. })), "{client:?}");
    assert!(matches!(server, Err(HandshakeError::Tls { .. })), "{server:?}");
    // One with the cluster's truststore but its own certificate: the server refuses it.
    let impostor = tls(&stranger_keystore, &truststore, Some(RIGHT));
    let (_, server) = handshake(&impostor, &cluster, Plane::Control);
    assert!(matches!(server, Err(HandshakeError::Tls { .. })), "{server:?}");
    // One without TLS at all is told so, and one with TLS against a plain server fails at
    // once (neither waits for a timeout).
    let (client, server) = handshake(&with_secret(RIGHT), &cluster, Plane::Control);
    assert!(matches!(server, Err(HandshakeError::PlainPeer { .. })), "{server:?}");
    let client = client.unwrap_err();
    assert!(matches!(client, HandshakeError::RefusedTlsRequired { .. }), "{client}");
    assert!(client.to_string().contains("requires TLS (security.ssl.internal.enabled)"), "{client}");
    let (client, server) = handshake(&cluster, &with_secret(RIGHT), Plane::Data);
    assert!(matches!(client, Err(HandshakeError::Tls { .. })), "{client:?}");
    assert!(server.is_err_and(|e| e.to_string().contains("started TLS")));
}

#[test]
fn unreadable_tls_files_name_the_option_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let error = TlsIdentity::from_pem_files(&missing, &missing).unwrap_err().to_string();
    assert!(error.contains("security.ssl.internal.keystore") && error.contains("missing.pem"), "{error}");
    let (keystore, _) = self_signed(dir.path(), "cluster");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let error = TlsIdentity::from_pem_files(&keystore, &empty).unwrap_err().to_string();
    assert!(error.contains("security.ssl.internal.truststore") && error.contains("no certificate"), "{error}");
}
