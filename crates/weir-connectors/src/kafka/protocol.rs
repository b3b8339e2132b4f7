//! The three Kafka requests that finish a transaction another process opened: FindCoordinator,
//! DescribeTransactions (KIP-664) and EndTxn, spoken directly over TCP.
//!
//! Why by hand: a restored exactly-once sink must commit the transactions its snapshot names
//! as pre-committed, which a producer of the crashed process opened. Flink's Java sink does it
//! by setting the producer id and epoch inside its Kafka client through reflection; librdkafka
//! has no such door (its `init_transactions` on the same id aborts the transaction instead).
//! The broker only wants `EndTxn(id, producer id, epoch, commit)`, and DescribeTransactions
//! gives the id and epoch, so these few requests are all a restore needs. Everything else
//! goes through rdkafka.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const API_FIND_COORDINATOR: i16 = 10;
const API_END_TXN: i16 = 26;
const API_DESCRIBE_TRANSACTIONS: i16 = 65;
const COORDINATOR_TRANSACTION: i8 = 1;
const CLIENT_ID: &str = "weir-kafka-sink";
/// The largest response accepted (a describe of one id is a few hundred bytes).
const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// Kafka's error codes this module acts on.
pub(crate) const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;
const CONCURRENT_TRANSACTIONS: i16 = 51;

/// What the transaction coordinator knows of one transactional id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransactionDescription {
    /// `Empty`, `Ongoing`, `PrepareCommit`, `PrepareAbort`, `CompleteCommit`, `CompleteAbort`,
    /// `Dead`, `PrepareEpochFence`.
    pub state: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// A connection to the transaction coordinator of one transactional id.
pub(crate) struct TransactionAdmin {
    bootstrap: String,
    timeout: Duration,
}

fn io_error(what: &str, address: &str, e: impl std::fmt::Display) -> String {
    format!("{what} ({address}): {e}")
}

struct Connection {
    stream: TcpStream,
    address: String,
    correlation: i32,
}

impl Connection {
    fn open(address: &str, timeout: Duration) -> Result<Connection, String> {
        let addresses: Vec<_> =
            address.to_socket_addrs().map_err(|e| io_error("cannot resolve the broker", address, e))?.collect();
        let mut last = format!("no address for {address}");
        for socket in addresses {
            match TcpStream::connect_timeout(&socket, timeout) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(timeout)).map_err(|e| io_error("socket", address, e))?;
                    stream.set_write_timeout(Some(timeout)).map_err(|e| io_error("socket", address, e))?;
                    let _ = stream.set_nodelay(true);
                    return Ok(Connection { stream, address: address.to_string(), correlation: 0 });
                }
                Err(e) => last = io_error("cannot connect to the broker", address, e),
            }
        }
        Err(last)
    }

    /// Sends one request (`flexible`: header v2) and returns the response body after the
    /// correlation id (and, when `flexible`, the header's tagged fields).
    fn call(&mut self, api_key: i16, api_version: i16, flexible: bool, body: &[u8]) -> Result<Vec<u8>, String> {
        self.correlation += 1;
        let mut request = Vec::with_capacity(body.len() + 32);
        request.extend_from_slice(&api_key.to_be_bytes());
        request.extend_from_slice(&api_version.to_be_bytes());
        request.extend_from_slice(&self.correlation.to_be_bytes());
        put_string(&mut request, CLIENT_ID);
        if flexible {
            request.push(0); // no tagged fields
        }
        request.extend_from_slice(body);
        let mut framed = Vec::with_capacity(request.len() + 4);
        framed.extend_from_slice(&(request.len() as i32).to_be_bytes());
        framed.extend_from_slice(&request);
        self.stream.write_all(&framed).map_err(|e| io_error("sending a request to the broker", &self.address, e))?;
        let mut length = [0u8; 4];
        self.stream.read_exact(&mut length).map_err(|e| io_error("reading the broker's answer", &self.address, e))?;
        let length = i32::from_be_bytes(length);
        if length < 4 || length as usize > RESPONSE_BYTES_MAX {
            return Err(format!("the broker {} answered with a frame of {length} bytes", self.address));
        }
        let mut response = vec![0u8; length as usize];
        self.stream.read_exact(&mut response).map_err(|e| io_error("reading the broker's answer", &self.address, e))?;
        let mut reader = Reader { bytes: &response, pos: 0, address: &self.address };
        let correlation = reader.i32()?;
        if correlation != self.correlation {
            return Err(format!(
                "the broker {} answered request {} to request {}",
                self.address, correlation, self.correlation
            ));
        }
        if flexible {
            reader.skip_tagged_fields()?;
        }
        Ok(response[reader.pos..].to_vec())
    }
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as i16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_compact_string(out: &mut Vec<u8>, text: &str) {
    put_uvarint(out, text.len() as u64 + 1);
    out.extend_from_slice(text.as_bytes());
}

/// Reads a response body; every read checks the length, so a short or garbled answer is an
/// error naming the broker, never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    address: &'a str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.bytes.len() - self.pos < n {
            return Err(format!("the broker {} sent a truncated answer", self.address));
        }
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }
    fn i8(&mut self) -> Result<i8, String> {
        Ok(self.take(1)?[0] as i8)
    }
    fn i16(&mut self) -> Result<i16, String> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Result<i32, String> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Result<i64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }
    fn uvarint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.i8()? as u8;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("the broker {} sent a malformed varint", self.address))
    }
    fn string(&mut self) -> Result<String, String> {
        let length = self.i16()?;
        if length < 0 {
            return Ok(String::new());
        }
        let bytes = self.take(length as usize)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    fn compact_string(&mut self) -> Result<String, String> {
        let length = self.uvarint()?;
        if length == 0 {
            return Ok(String::new());
        }
        let bytes = self.take(length as usize - 1)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    fn compact_array_len(&mut self) -> Result<usize, String> {
        Ok(self.uvarint()?.saturating_sub(1) as usize)
    }
    fn skip_tagged_fields(&mut self) -> Result<(), String> {
        let fields = self.uvarint()?;
        for _ in 0..fields {
            let _tag = self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.take(size)?;
        }
        Ok(())
    }
}

impl TransactionAdmin {
    /// Talks to the cluster of `bootstrap` (comma-separated `host:port`).
    pub(crate) fn new(bootstrap: &str, timeout: Duration) -> TransactionAdmin {
        TransactionAdmin { bootstrap: bootstrap.to_string(), timeout }
    }

    fn bootstrap_connection(&self) -> Result<Connection, String> {
        let mut last = format!("no bootstrap server in '{}'", self.bootstrap);
        for address in self.bootstrap.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            match Connection::open(address, self.timeout) {
                Ok(connection) => return Ok(connection),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The transaction coordinator of `transactional_id`, connected.
    fn coordinator(&self, transactional_id: &str) -> Result<Connection, String> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let mut connection = self.bootstrap_connection()?;
            let mut body = Vec::new();
            put_string(&mut body, transactional_id);
            body.push(COORDINATOR_TRANSACTION as u8);
            let response = connection.call(API_FIND_COORDINATOR, 1, false, &body)?;
            let mut reader = Reader { bytes: &response, pos: 0, address: &connection.address };
            let _throttle = reader.i32()?;
            let error = reader.i16()?;
            let message = reader.string()?;
            let _node = reader.i32()?;
            let host = reader.string()?;
            let port = reader.i32()?;
            if matches!(error, COORDINATOR_NOT_AVAILABLE | COORDINATOR_LOAD_IN_PROGRESS)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            if error != 0 {
                return Err(format!(
                    "finding the transaction coordinator of '{transactional_id}': Kafka error {error} {message}"
                ));
            }
            let address = format!("{host}:{port}");
            if address == connection.address {
                return Ok(connection);
            }
            return Connection::open(&address, self.timeout);
        }
    }

    /// What the coordinator knows of `transactional_id`; `None` when it never saw it.
    pub(crate) fn describe(&self, transactional_id: &str) -> Result<Option<TransactionDescription>, String> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let mut connection = self.coordinator(transactional_id)?;
            let mut body = Vec::new();
            put_uvarint(&mut body, 2); // one id
            put_compact_string(&mut body, transactional_id);
            body.push(0); // no tagged fields
            let response = connection.call(API_DESCRIBE_TRANSACTIONS, 0, true, &body)?;
            let mut reader = Reader { bytes: &response, pos: 0, address: &connection.address };
            let _throttle = reader.i32()?;
            let states = reader.compact_array_len()?;
            if states != 1 {
                return Err(format!(
                    "describing transaction '{transactional_id}': the broker answered {states} states"
                ));
            }
            let error = reader.i16()?;
            let _id = reader.compact_string()?;
            let state = reader.compact_string()?;
            let _timeout_ms = reader.i32()?;
            let _start_ms = reader.i64()?;
            let producer_id = reader.i64()?;
            let producer_epoch = reader.i16()?;
            match error {
                0 => return Ok(Some(TransactionDescription { state, producer_id, producer_epoch })),
                TRANSACTIONAL_ID_NOT_FOUND => return Ok(None),
                NOT_COORDINATOR | COORDINATOR_NOT_AVAILABLE | COORDINATOR_LOAD_IN_PROGRESS
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => return Err(format!("describing transaction '{transactional_id}': Kafka error {other}")),
            }
        }
    }

    /// Commits (or aborts) the open transaction of `transactional_id` as its producer
    /// (`producer_id`, `producer_epoch`) would.
    pub(crate) fn end(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<(), String> {
        let deadline = std::time::Instant::now() + self.timeout;
        let verb = if commit { "committing" } else { "aborting" };
        loop {
            let mut connection = self.coordinator(transactional_id)?;
            let mut body = Vec::new();
            put_string(&mut body, transactional_id);
            body.extend_from_slice(&producer_id.to_be_bytes());
            body.extend_from_slice(&producer_epoch.to_be_bytes());
            body.push(u8::from(commit));
            let response = connection.call(API_END_TXN, 0, false, &body)?;
            let mut reader = Reader { bytes: &response, pos: 0, address: &connection.address };
            let _throttle = reader.i32()?;
            match reader.i16()? {
                0 => return self.wait_until_complete(transactional_id, commit),
                NOT_COORDINATOR
                | COORDINATOR_NOT_AVAILABLE
                | COORDINATOR_LOAD_IN_PROGRESS
                | CONCURRENT_TRANSACTIONS
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => return Err(format!("{verb} transaction '{transactional_id}': Kafka error {other}")),
            }
        }
    }
}

impl TransactionAdmin {
    /// Waits until the coordinator has written the markers of an ended transaction (its state
    /// is `CompleteCommit` or `CompleteAbort`), so readers are no longer held back by it.
    fn wait_until_complete(&self, transactional_id: &str, commit: bool) -> Result<(), String> {
        let wanted = if commit { "CompleteCommit" } else { "CompleteAbort" };
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let state = self.describe(transactional_id)?.map(|d| d.state);
            if state.as_deref() == Some(wanted) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "transaction '{transactional_id}' is still {} after {:?}, not {wanted}",
                    state.as_deref().unwrap_or("unknown"),
                    self.timeout
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_answer_is_an_error_not_a_panic() {
        let bytes = [0u8, 0, 1];
        let mut reader = Reader { bytes: &bytes, pos: 0, address: "b:9092" };
        assert!(reader.i32().unwrap_err().contains("b:9092"));
        let bytes = [0x05u8, b'a'];
        let mut reader = Reader { bytes: &bytes, pos: 0, address: "b:9092" };
        assert!(reader.compact_string().is_err());
    }

    #[test]
    fn varints_and_compact_strings_round_trip() {
        for value in [0u64, 1, 127, 128, 300, 16_384, u64::from(u32::MAX)] {
            let mut out = Vec::new();
            put_uvarint(&mut out, value);
            let mut reader = Reader { bytes: &out, pos: 0, address: "x" };
            assert_eq!(reader.uvarint().unwrap(), value);
        }
        let mut out = Vec::new();
        put_compact_string(&mut out, "weir-sink-0-7");
        let mut reader = Reader { bytes: &out, pos: 0, address: "x" };
        assert_eq!(reader.compact_string().unwrap(), "weir-sink-0-7");
    }
}
