//! Who may talk to a JobManager's TaskManager port (the control plane) and to a
//! TaskManager's data port (the data plane); see docs/security.md for the trust model.
//!
//! Every connection on either port starts with a handshake before its protocol does:
//!
//! 1. With `security.ssl.internal.enabled`, mutual TLS (rustls): each side presents the
//!    certificate of its keystore and accepts only a peer whose certificate chains to its
//!    truststore (host names are not checked, as in Flink's internal SSL: trust is the
//!    truststore). The connection's bytes are then tunnelled through a loopback socket pair
//!    (see [`tunnel`]), so the protocols above see a plain `TcpStream`; with TLS off nothing
//!    of this runs and the data path is untouched.
//! 2. Always, a challenge-response over the shared secret (`security.internal.secret`),
//!    both ways: each side sends a fresh random nonce, the connecting side proves it knows
//!    the secret with HMAC-SHA256 over both nonces, and the accepting side answers with its
//!    verdict and its own proof. The secret never travels; a proof is good for one pair of
//!    nonces only, so an observer can replay nothing. Without a secret on either side the
//!    handshake only checks that both speak weir's protocol.
//!
//! Wire format of the challenge-response (fixed sizes: nothing to parse):
//! - connecting side: `WEIRAUTH`, version, flags (bit 0: has a secret), 32-byte nonce;
//! - accepting side: `WEIRAUTH`, version, flags, 32-byte nonce;
//! - connecting side: its 32-byte proof (zeros without a secret);
//! - accepting side: a verdict byte and its 32-byte proof (zeros without a secret).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// How long a peer has for the whole handshake (TLS and the challenge-response) before the
/// connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest shared secret accepted, in bytes.
pub const SHARED_SECRET_BYTES_MIN: usize = 16;

const HANDSHAKE_MAGIC: &[u8; 8] = b"WEIRAUTH";
const HANDSHAKE_VERSION: u8 = 1;
const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const HELLO_BYTES: usize = HANDSHAKE_MAGIC.len() + 2 + NONCE_BYTES;
const FLAG_HAS_SECRET: u8 = 1;
/// In the accepting side's hello to a peer that did not start TLS: TLS is required.
const FLAG_REQUIRES_TLS: u8 = 2;
/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The accepting side's verdict.
const ACCEPTED: u8 = 0;
const REFUSED_WRONG_SECRET: u8 = 1;
const REFUSED_NO_SECRET: u8 = 2;

/// Bytes a TLS tunnel moves per read.
const TUNNEL_CHUNK_BYTES: usize = 64 * 1024;

/// The secret every JobManager and TaskManager of a cluster shares. Its `Debug` shows no
/// byte of it.
#[derive(Clone)]
pub struct SharedSecret(Arc<[u8]>);

impl SharedSecret {
    /// A secret of these bytes; refused when shorter than [`SHARED_SECRET_BYTES_MIN`].
    pub fn new(bytes: &[u8]) -> Result<SharedSecret, SecurityError> {
        if bytes.len() < SHARED_SECRET_BYTES_MIN {
            return Err(SecurityError::SecretTooShort { bytes: bytes.len() });
        }
        Ok(SharedSecret(Arc::from(bytes)))
    }

    fn key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

impl std::fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedSecret(******)")
    }
}

/// What went wrong setting up the cluster's security from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The secret is too short to resist guessing.
    #[error(
        "the shared secret (security.internal.secret) has {bytes} bytes; use at least {SHARED_SECRET_BYTES_MIN} random ones (e.g. `openssl rand -hex 32`)"
    )]
    SecretTooShort {
        /// Its length.
        bytes: usize,
    },
    /// A PEM file of the TLS settings could not be read.
    #[error("cannot read {what} {path}: {reason}; give a PEM file")]
    Pem {
        /// Which file (the option's name).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The TLS configuration was refused.
    #[error("the internal TLS settings (security.ssl.internal.*) are not usable: {0}")]
    Tls(String),
}

/// Which port a connection reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    /// A TaskManager connecting to the JobManager's TaskManager port.
    Control,
    /// A TaskManager connecting to another TaskManager's data port.
    Data,
}

impl Plane {
    fn byte(self) -> u8 {
        match self {
            Plane::Control => 1,
            Plane::Data => 2,
        }
    }

    /// What the connecting side is called in messages.
    fn client(self) -> &'static str {
        match self {
            Plane::Control => "TaskManager",
            Plane::Data => "TaskManager's data connection",
        }
    }

    /// What the accepting side is called in messages.
    fn server(self) -> &'static str {
        match self {
            Plane::Control => "JobManager",
            Plane::Data => "TaskManager's data port",
        }
    }
}

/// Why a handshake failed, in words for the log of the side that saw it.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The accepting side refused our proof.
    #[error(
        "the {server} refused this {client}: the shared secret (security.internal.secret) does not match; give every JobManager and TaskManager the same secret"
    )]
    RefusedWrongSecret {
        /// The accepting side.
        server: &'static str,
        /// The connecting side.
        client: &'static str,
    },
    /// The accepting side requires a secret and we have none.
    #[error(
        "the {server} refused this {client}: it requires the shared secret (security.internal.secret or security.internal.secret-file) and none is configured here"
    )]
    RefusedNoSecret {
        /// The accepting side.
        server: &'static str,
        /// The connecting side.
        client: &'static str,
    },
    /// The peer's proof of the secret is wrong (accepting side: the connecting peer's).
    #[error("refused a {peer}: the shared secret (security.internal.secret) does not match")]
    WrongSecret {
        /// The peer.
        peer: &'static str,
    },
    /// A connecting peer without a secret, where one is required.
    #[error("refused a {peer}: it has no shared secret (security.internal.secret) configured")]
    MissingSecret {
        /// The peer.
        peer: &'static str,
    },
    /// The accepting side requires TLS and we do not use it.
    #[error(
        "the {server} refused this {client}: it requires TLS (security.ssl.internal.enabled) and this process does not use it"
    )]
    RefusedTlsRequired {
        /// The accepting side.
        server: &'static str,
        /// The connecting side.
        client: &'static str,
    },
    /// A connecting peer without TLS, where TLS is required.
    #[error("refused a {peer} that did not start TLS (security.ssl.internal.enabled is on here)")]
    PlainPeer {
        /// The peer.
        peer: &'static str,
    },
    /// We have a secret and the accepting side does not: it cannot prove who it is.
    #[error(
        "the {server} has no shared secret configured and this {client} has one (security.internal.secret): it cannot prove it belongs to this cluster; configure the same secret on both"
    )]
    ServerWithoutSecret {
        /// The accepting side.
        server: &'static str,
        /// The connecting side.
        client: &'static str,
    },
    /// The peer does not speak weir's handshake, or another version of it.
    #[error("the peer is not a weir {peer} of this version ({detail}); run the same weir version everywhere")]
    NotWeir {
        /// What the peer should have been.
        peer: &'static str,
        /// What was seen.
        detail: String,
    },
    /// TLS failed (a certificate not trusted, no certificate, not TLS at all).
    #[error("the TLS handshake with the {peer} failed: {reason} (check security.ssl.internal.* on both sides)")]
    Tls {
        /// The peer.
        peer: &'static str,
        /// Why.
        reason: String,
    },
    /// The connection failed or timed out during the handshake.
    #[error("the handshake with the {peer} did not complete within {HANDSHAKE_TIMEOUT:?}: {source}")]
    Io {
        /// The peer.
        peer: &'static str,
        /// The failure.
        source: std::io::Error,
    },
}

impl HandshakeError {
    /// True when the other side made a decision (a refusal, a wrong proof, another
    /// configuration) that retrying will not change.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, HandshakeError::Io { .. })
    }
}

/// Mutual TLS settings: this process's certificate and key, and the certificates its peers'
/// must chain to.
pub struct TlsIdentity {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity")
    }
}

impl TlsIdentity {
    /// Reads `keystore` (a PEM file with this process's certificate chain and its private
    /// key) and `truststore` (a PEM file with the certificates peers must chain to).
    pub fn from_pem_files(keystore: &Path, truststore: &Path) -> Result<TlsIdentity, SecurityError> {
        fn pem_error<'a>(
            what: &'static str,
            path: &'a Path,
        ) -> impl Fn(rustls::pki_types::pem::Error) -> SecurityError + 'a {
            move |e| SecurityError::Pem { what, path: path.to_path_buf(), reason: e.to_string() }
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(keystore)
            .map_err(pem_error("security.ssl.internal.keystore", keystore))?
            .collect::<Result<_, _>>()
            .map_err(pem_error("security.ssl.internal.keystore", keystore))?;
        if chain.is_empty() {
            return Err(SecurityError::Pem {
                what: "security.ssl.internal.keystore",
                path: keystore.to_path_buf(),
                reason: "it holds no certificate".into(),
            });
        }
        let key =
            PrivateKeyDer::from_pem_file(keystore).map_err(pem_error("security.ssl.internal.keystore", keystore))?;
        let trusted: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(truststore)
            .map_err(pem_error("security.ssl.internal.truststore", truststore))?
            .collect::<Result<_, _>>()
            .map_err(pem_error("security.ssl.internal.truststore", truststore))?;
        let mut roots = rustls::RootCertStore::empty();
        for certificate in trusted {
            roots.add(certificate).map_err(|e| SecurityError::Pem {
                what: "security.ssl.internal.truststore",
                path: truststore.to_path_buf(),
                reason: e.to_string(),
            })?;
        }
        if roots.is_empty() {
            return Err(SecurityError::Pem {
                what: "security.ssl.internal.truststore",
                path: truststore.to_path_buf(),
                reason: "it holds no certificate".into(),
            });
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = |e: rustls::Error| SecurityError::Tls(e.to_string());
        let client_verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|e| SecurityError::Tls(e.to_string()))?;
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(tls)?;
        // No resumption: connections are long-lived, and no ticket needs writing later.
        server.send_tls13_tickets = 0;
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|e| SecurityError::Tls(e.to_string()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(TruststoreOnly(server_verifier)))
            .with_client_auth_cert(chain, key)
            .map_err(tls)?;
        Ok(TlsIdentity { server: Arc::new(server), client: Arc::new(client) })
    }
}

/// Verifies a peer's certificate against the truststore and its signatures, but not the
/// name it was reached by: processes reach each other by IP address, and the trust is the
/// truststore's (as in Flink's internal SSL).
#[derive(Debug)]
struct TruststoreOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for TruststoreOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(NotValidForName | NotValidForNameContext { .. })) => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// How this process's connections on both planes are secured.
#[derive(Clone, Debug, Default)]
pub struct WireSecurity {
    secret: Option<SharedSecret>,
    tls: Option<Arc<TlsIdentity>>,
}

impl WireSecurity {
    /// No secret and no TLS: any process that reaches a port may connect.
    pub fn open() -> WireSecurity {
        WireSecurity::default()
    }

    /// With a shared secret and/or mutual TLS.
    pub fn new(secret: Option<SharedSecret>, tls: Option<TlsIdentity>) -> WireSecurity {
        WireSecurity { secret, tls: tls.map(Arc::new) }
    }

    /// True when peers must prove something (a secret or a certificate).
    pub fn authenticates(&self) -> bool {
        self.secret.is_some() || self.tls.is_some()
    }

    /// The accepting side of a connection's handshake: TLS (when on), then the secret's
    /// challenge-response. Returns the stream to speak the protocol on (the tunnel's
    /// plain end with TLS), with no timeouts set.
    pub fn accept(&self, stream: TcpStream, plane: Plane) -> Result<TcpStream, HandshakeError> {
        let peer = plane.client();
        let io = |source| HandshakeError::Io { peer, source };
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        let mut stream = match &self.tls {
            Some(tls) => {
                let mut first = [0u8; 1];
                if stream.peek(&mut first).map_err(io)? == 1 && first[0] != TLS_HANDSHAKE_RECORD {
                    // A peer speaking the plain handshake: tell it TLS is required.
                    let mut refusal = hello(false, &[0u8; NONCE_BYTES]);
                    refusal[9] = FLAG_REQUIRES_TLS;
                    let _ = (&stream).write_all(&refusal);
                    return Err(HandshakeError::PlainPeer { peer });
                }
                let connection = rustls::ServerConnection::new(Arc::clone(&tls.server))
                    .map_err(|e| HandshakeError::Tls { peer, reason: e.to_string() })?;
                tls_handshake(rustls::Connection::Server(connection), stream, peer)?
            }
            None => stream,
        };
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        respond(&mut stream, self.secret.as_ref(), plane)?;
        stream.set_read_timeout(None).map_err(io)?;
        stream.set_write_timeout(None).map_err(io)?;
        Ok(stream)
    }

    /// The connecting side of a connection's handshake (see [`WireSecurity::accept`]).
    pub fn connect(&self, stream: TcpStream, plane: Plane) -> Result<TcpStream, HandshakeError> {
        let peer = plane.server();
        let io = |source| HandshakeError::Io { peer, source };
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        let mut stream = match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from("weir-internal")
                    .map_err(|e| HandshakeError::Tls { peer, reason: e.to_string() })?;
                let connection = rustls::ClientConnection::new(Arc::clone(&tls.client), name)
                    .map_err(|e| HandshakeError::Tls { peer, reason: e.to_string() })?;
                tls_handshake(rustls::Connection::Client(connection), stream, peer)?
            }
            None => stream,
        };
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
        challenge(&mut stream, self.secret.as_ref(), plane)?;
        stream.set_read_timeout(None).map_err(io)?;
        stream.set_write_timeout(None).map_err(io)?;
        Ok(stream)
    }
}

fn nonce(peer: &'static str) -> Result<[u8; NONCE_BYTES], HandshakeError> {
    let mut nonce = [0u8; NONCE_BYTES];
    SystemRandom::new().fill(&mut nonce).map_err(|_| HandshakeError::Io {
        peer,
        source: std::io::Error::other("the system's random number generator failed"),
    })?;
    Ok(nonce)
}

/// What a side signs: its role, the plane and both nonces.
fn proof_input(role: &[u8], plane: Plane, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(32 + 2 * NONCE_BYTES);
    input.extend_from_slice(b"weir-auth-v1 ");
    input.extend_from_slice(role);
    input.push(plane.byte());
    input.extend_from_slice(client_nonce);
    input.extend_from_slice(server_nonce);
    input
}

fn prove(secret: Option<&SharedSecret>, role: &[u8], plane: Plane, client: &[u8], server: &[u8]) -> [u8; PROOF_BYTES] {
    let mut proof = [0u8; PROOF_BYTES];
    if let Some(secret) = secret {
        let tag = hmac::sign(&secret.key(), &proof_input(role, plane, client, server));
        proof.copy_from_slice(tag.as_ref());
    }
    proof
}

fn verify(secret: &SharedSecret, role: &[u8], plane: Plane, client: &[u8], server: &[u8], proof: &[u8]) -> bool {
    // Constant time: the comparison says nothing about how much of a guess was right.
    hmac::verify(&secret.key(), &proof_input(role, plane, client, server), proof).is_ok()
}

fn hello(has_secret: bool, nonce: &[u8; NONCE_BYTES]) -> [u8; HELLO_BYTES] {
    let mut hello = [0u8; HELLO_BYTES];
    hello[..8].copy_from_slice(HANDSHAKE_MAGIC);
    hello[8] = HANDSHAKE_VERSION;
    hello[9] = if has_secret { FLAG_HAS_SECRET } else { 0 };
    hello[10..].copy_from_slice(nonce);
    hello
}

/// A peer's hello: its flags, and its nonce.
fn read_hello(stream: &mut impl Read, peer: &'static str) -> Result<(u8, [u8; NONCE_BYTES]), HandshakeError> {
    let mut hello = [0u8; HELLO_BYTES];
    // The magic first: a peer speaking anything else is dropped without waiting for more.
    stream.read_exact(&mut hello[..HANDSHAKE_MAGIC.len()]).map_err(|source| HandshakeError::Io { peer, source })?;
    if hello[0] == TLS_HANDSHAKE_RECORD {
        return Err(HandshakeError::NotWeir {
            peer,
            detail: "it started TLS (security.ssl.internal.enabled), which this process does not use".into(),
        });
    }
    if &hello[..HANDSHAKE_MAGIC.len()] != HANDSHAKE_MAGIC {
        return Err(HandshakeError::NotWeir { peer, detail: "it did not start with weir's handshake".into() });
    }
    stream.read_exact(&mut hello[HANDSHAKE_MAGIC.len()..]).map_err(|source| HandshakeError::Io { peer, source })?;
    if hello[8] != HANDSHAKE_VERSION {
        return Err(HandshakeError::NotWeir {
            peer,
            detail: format!("handshake version {}, this process speaks {HANDSHAKE_VERSION}", hello[8]),
        });
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&hello[10..]);
    Ok((hello[9], nonce))
}

const CLIENT_ROLE: &[u8] = b"client";
const SERVER_ROLE: &[u8] = b"server";

/// The connecting side of the challenge-response.
fn challenge(
    stream: &mut (impl Read + Write),
    secret: Option<&SharedSecret>,
    plane: Plane,
) -> Result<(), HandshakeError> {
    let (server, client) = (plane.server(), plane.client());
    let io = |source| HandshakeError::Io { peer: server, source };
    let client_nonce = nonce(server)?;
    stream.write_all(&hello(secret.is_some(), &client_nonce)).map_err(io)?;
    stream.flush().map_err(io)?;
    let (server_flags, server_nonce) = read_hello(stream, server)?;
    if server_flags & FLAG_REQUIRES_TLS != 0 {
        return Err(HandshakeError::RefusedTlsRequired { server, client });
    }
    let server_has_secret = server_flags & FLAG_HAS_SECRET != 0;
    let proof = prove(secret, CLIENT_ROLE, plane, &client_nonce, &server_nonce);
    stream.write_all(&proof).map_err(io)?;
    stream.flush().map_err(io)?;
    let mut verdict = [0u8; 1 + PROOF_BYTES];
    stream.read_exact(&mut verdict).map_err(io)?;
    match verdict[0] {
        ACCEPTED => {}
        REFUSED_WRONG_SECRET => return Err(HandshakeError::RefusedWrongSecret { server, client }),
        REFUSED_NO_SECRET => return Err(HandshakeError::RefusedNoSecret { server, client }),
        other => {
            return Err(HandshakeError::NotWeir { peer: server, detail: format!("an unknown verdict {other}") });
        }
    }
    if let Some(secret) = secret {
        if !server_has_secret {
            return Err(HandshakeError::ServerWithoutSecret { server, client });
        }
        if !verify(secret, SERVER_ROLE, plane, &client_nonce, &server_nonce, &verdict[1..]) {
            // It accepted our proof without knowing the secret: not this cluster's.
            return Err(HandshakeError::WrongSecret { peer: server });
        }
    }
    Ok(())
}

/// The accepting side of the challenge-response.
fn respond(
    stream: &mut (impl Read + Write),
    secret: Option<&SharedSecret>,
    plane: Plane,
) -> Result<(), HandshakeError> {
    let client = plane.client();
    let io = |source| HandshakeError::Io { peer: client, source };
    let (client_flags, client_nonce) = match read_hello(stream, client) {
        Ok(hello) => hello,
        Err(error) => {
            // A peer that started TLS gets an answer that ends its handshake at once.
            let _ = stream.write_all(&hello(false, &[0u8; NONCE_BYTES])).and_then(|()| stream.flush());
            return Err(error);
        }
    };
    let client_has_secret = client_flags & FLAG_HAS_SECRET != 0;
    let server_nonce = nonce(client)?;
    stream.write_all(&hello(secret.is_some(), &server_nonce)).map_err(io)?;
    stream.flush().map_err(io)?;
    let mut client_proof = [0u8; PROOF_BYTES];
    stream.read_exact(&mut client_proof).map_err(io)?;
    let refusal = match secret {
        None => None,
        Some(_) if !client_has_secret => Some((REFUSED_NO_SECRET, HandshakeError::MissingSecret { peer: client })),
        Some(secret) if !verify(secret, CLIENT_ROLE, plane, &client_nonce, &server_nonce, &client_proof) => {
            Some((REFUSED_WRONG_SECRET, HandshakeError::WrongSecret { peer: client }))
        }
        Some(_) => None,
    };
    let mut verdict = [0u8; 1 + PROOF_BYTES];
    match refusal {
        Some((code, error)) => {
            verdict[0] = code;
            // The refused peer learns why; it gets no proof of ours.
            let _ = stream.write_all(&verdict).and_then(|()| stream.flush());
            return Err(error);
        }
        None => {
            verdict[0] = ACCEPTED;
            verdict[1..].copy_from_slice(&prove(secret, SERVER_ROLE, plane, &client_nonce, &server_nonce));
        }
    }
    stream.write_all(&verdict).map_err(io)?;
    stream.flush().map_err(io)
}

/// Runs the TLS handshake on `socket` (within its timeouts), then tunnels the session.
fn tls_handshake(
    mut connection: rustls::Connection,
    mut socket: TcpStream,
    peer: &'static str,
) -> Result<TcpStream, HandshakeError> {
    while connection.is_handshaking() {
        connection.complete_io(&mut socket).map_err(|e| HandshakeError::Tls { peer, reason: e.to_string() })?;
    }
    let _ = socket.set_read_timeout(None);
    let _ = socket.set_write_timeout(None);
    tunnel(connection, socket).map_err(|source| HandshakeError::Io { peer, source })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A connected pair of loopback sockets: one end for the caller, one for the tunnel. The
/// accepted end is checked to be the one this function connected (no other local process
/// can slip in).
fn loopback_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let connected = TcpStream::connect(listener.local_addr()?)?;
    let ours = connected.local_addr()?;
    loop {
        let (accepted, from) = listener.accept()?;
        if from == ours {
            let _ = accepted.set_nodelay(true);
            let _ = connected.set_nodelay(true);
            return Ok((accepted, connected));
        }
    }
}

/// Moves a TLS session's bytes between `socket` and a plain loopback connection whose other
/// end is returned: two threads, one per direction. Only connections with TLS pay for it.
///
/// Ciphertext is produced under the session's lock and written under the socket writer's
/// lock taken before the session's is released, so records go out in sequence; neither
/// direction holds the session's lock while it blocks on a socket.
fn tunnel(connection: rustls::Connection, socket: TcpStream) -> std::io::Result<TcpStream> {
    let (plain, caller) = loopback_pair()?;
    let _ = socket.set_nodelay(true);
    let session = Arc::new(Mutex::new(connection));
    let writer = Arc::new(Mutex::new(socket.try_clone()?));
    let close_all: Arc<dyn Fn() + Send + Sync> = {
        let (socket, plain) = (socket.try_clone()?, plain.try_clone()?);
        Arc::new(move || {
            let _ = socket.shutdown(Shutdown::Both);
            let _ = plain.shutdown(Shutdown::Both);
        })
    };
    // Outbound: plaintext from the caller, encrypted to the peer.
    {
        let (session, writer, close_all) = (Arc::clone(&session), Arc::clone(&writer), Arc::clone(&close_all));
        let mut plain = plain.try_clone()?;
        std::thread::Builder::new().name("weir-tls-out".into()).spawn(move || {
            let mut buffer = vec![0u8; TUNNEL_CHUNK_BYTES];
            loop {
                let read = match plain.read(&mut buffer) {
                    Ok(0) | Err(_) => {
                        // The caller closed its end: close the session in order.
                        let mut guard = lock(&session);
                        guard.send_close_notify();
                        let mut out = Vec::new();
                        while guard.wants_write() && guard.write_tls(&mut out).is_ok() {}
                        let mut socket = lock(&writer);
                        drop(guard);
                        let _ = socket.write_all(&out);
                        let _ = socket.shutdown(Shutdown::Write);
                        return;
                    }
                    Ok(read) => read,
                };
                let mut guard = lock(&session);
                let mut out = Vec::with_capacity(read + 256);
                let mut remaining = &buffer[..read];
                // The session takes plaintext as its outgoing buffer has room: encrypt what
                // it took, then offer the rest.
                while !remaining.is_empty() {
                    let taken = guard.writer().write(remaining).unwrap_or(0);
                    remaining = &remaining[taken..];
                    let before = out.len();
                    while guard.wants_write() {
                        if guard.write_tls(&mut out).is_err() {
                            break;
                        }
                    }
                    if taken == 0 && out.len() == before {
                        drop(guard);
                        close_all();
                        return;
                    }
                }
                let mut socket = lock(&writer);
                drop(guard);
                if socket.write_all(&out).is_err() {
                    drop(socket);
                    close_all();
                    return;
                }
            }
        })?;
    }
    // Inbound: ciphertext from the peer, decrypted to the caller.
    {
        let mut socket = socket;
        let mut plain = plain;
        std::thread::Builder::new().name("weir-tls-in".into()).spawn(move || {
            let mut buffer = vec![0u8; TUNNEL_CHUNK_BYTES];
            let mut decrypted = vec![0u8; TUNNEL_CHUNK_BYTES];
            // The handshake's last read may have brought the peer's first data along.
            let mut early = Vec::new();
            {
                let mut guard = lock(&session);
                while let Ok(n @ 1..) = guard.reader().read(&mut decrypted) {
                    early.extend_from_slice(&decrypted[..n]);
                }
            }
            if plain.write_all(&early).is_err() {
                close_all();
                return;
            }
            loop {
                let read = match socket.read(&mut buffer) {
                    Ok(0) | Err(_) => {
                        let _ = plain.shutdown(Shutdown::Write);
                        return;
                    }
                    Ok(read) => read,
                };
                let mut guard = lock(&session);
                let mut input = &buffer[..read];
                let (mut clear, mut failed, mut ended) = (Vec::new(), false, false);
                // The session takes ciphertext as its plaintext buffer has room: decrypt,
                // take the plaintext out, then offer the rest.
                while !input.is_empty() && !failed && !ended {
                    if guard.read_tls(&mut input).is_err() || guard.process_new_packets().is_err() {
                        failed = true;
                    }
                    loop {
                        match guard.reader().read(&mut decrypted) {
                            Ok(0) => {
                                ended = true;
                                break;
                            }
                            Ok(n) => clear.extend_from_slice(&decrypted[..n]),
                            // No more plaintext for now.
                            Err(_) => break,
                        }
                    }
                }
                let mut out = Vec::new();
                while guard.wants_write() {
                    if guard.write_tls(&mut out).is_err() {
                        break;
                    }
                }
                let pending = (!out.is_empty()).then(|| lock(&writer));
                drop(guard);
                if let Some(mut socket) = pending {
                    let _ = socket.write_all(&out);
                }
                if plain.write_all(&clear).is_err() || failed {
                    close_all();
                    return;
                }
                if ended {
                    let _ = plain.shutdown(Shutdown::Write);
                    return;
                }
            }
        })?;
    }
    Ok(caller)
}

#[cfg(test)]
mod tests;
