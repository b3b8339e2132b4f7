//! Channels between processes: a local bounded channel bridged over TCP, with credit-based
//! flow control, carrying exactly the elements of a local channel (records, barriers, end of
//! partition) so tasks cannot tell a remote input from a local one.
//!
//! Wire protocol, one TCP connection per producer/consumer pair:
//! - every frame is a little-endian `u32` length and that many bytes;
//! - producer -> consumer: postcard-encoded [`WireElement`]s;
//! - consumer -> producer: `u32` credits, each allowing one more element. The consumer
//!   starts with [`CHANNEL_BATCHES_MAX`] credits and returns one for every element it has
//!   handed to the local channel, so no more than that many elements are ever in flight or
//!   buffered: a slow consumer blocks its producer (backpressure) without unbounded buffers.
//!
//! A broken connection ends the bridge; the local end then disconnects, which a task treats
//! like a vanished peer (it waits for the job master to cancel it, see `InputBody`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::Data;
use crate::exchange::{CHANNEL_BATCHES_MAX, ChannelReceiver, ChannelSender, StreamElement};
use crate::operator::TaskMetrics;
use crate::snapshot::Barrier;

/// Frames larger than this are refused (a corrupt length prefix, not a real batch).
pub const FRAME_BYTES_MAX: usize = 256 << 20;

/// The size of a credit frame (a little-endian `u32`); a longer one ends the bridge.
const CREDIT_FRAME_BYTES: usize = 4;

/// A [`StreamElement`] as it travels on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub enum WireElement<T> {
    /// Records.
    Records(Vec<T>),
    /// Records of a key-partitioned edge with their key hashes.
    KeyedRecords(Vec<T>, Vec<u32>),
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// The producer ended.
    EndOfPartition,
    /// Records with event timestamps (and key hashes, or none).
    TimestampedRecords(Vec<T>, Vec<i64>, Vec<u32>),
    /// A watermark.
    Watermark(i64),
    /// The producer went idle (`true`) or active.
    WatermarkStatus(bool),
    /// An unaligned barrier's notice, ahead of the elements the sending bridge had not sent
    /// yet: the receiving bridge posts it ahead of its local channel's queue.
    Priority(Barrier, u64),
}

impl<T> From<StreamElement<T>> for WireElement<T> {
    fn from(element: StreamElement<T>) -> Self {
        match element {
            StreamElement::Records(records) => WireElement::Records(records),
            StreamElement::KeyedRecords { records, hashes } => WireElement::KeyedRecords(records, hashes),
            StreamElement::Barrier(barrier) => WireElement::Barrier(barrier),
            StreamElement::EndOfPartition => WireElement::EndOfPartition,
            StreamElement::TimestampedRecords { records, timestamps, hashes } => {
                WireElement::TimestampedRecords(records, timestamps, hashes)
            }
            StreamElement::Watermark(watermark) => WireElement::Watermark(watermark),
            StreamElement::WatermarkStatus(idle) => WireElement::WatermarkStatus(idle),
        }
    }
}

impl<T> From<WireElement<T>> for StreamElement<T> {
    fn from(element: WireElement<T>) -> Self {
        match element {
            WireElement::Records(records) => StreamElement::Records(records),
            WireElement::KeyedRecords(records, hashes) => StreamElement::KeyedRecords { records, hashes },
            WireElement::Barrier(barrier) => StreamElement::Barrier(barrier),
            WireElement::EndOfPartition => StreamElement::EndOfPartition,
            WireElement::TimestampedRecords(records, timestamps, hashes) => {
                StreamElement::TimestampedRecords { records, timestamps, hashes }
            }
            WireElement::Watermark(watermark) => StreamElement::Watermark(watermark),
            WireElement::WatermarkStatus(idle) => StreamElement::WatermarkStatus(idle),
            // Bridges handle notices themselves; one here would be a bug, read as its barrier.
            WireElement::Priority(barrier, _) => StreamElement::Barrier(barrier),
        }
    }
}

/// The bytes of a frame's length prefix.
const LENGTH_BYTES: usize = 4;

/// Writes one length-prefixed frame, in one write: on a socket with `TCP_NODELAY` (every data
/// connection) the length written on its own would go out as a segment of 4 bytes before
/// the payload's.
pub fn write_frame(stream: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(LENGTH_BYTES + payload.len());
    frame.extend_from_slice(&[0; LENGTH_BYTES]);
    frame.extend_from_slice(payload);
    write_prefixed_frame(stream, &mut frame)
}

/// Writes `frame` as one length-prefixed frame in one write: its first [`LENGTH_BYTES`] bytes
/// are room for the prefix, which this fills in; the payload follows them. Saves the copy
/// [`write_frame`] makes.
fn write_prefixed_frame(stream: &mut impl Write, frame: &mut [u8]) -> std::io::Result<()> {
    let too_large = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame too large");
    let payload = frame.len().checked_sub(LENGTH_BYTES).ok_or_else(too_large)?;
    let length = u32::try_from(payload).map_err(|_| too_large())?;
    frame[..LENGTH_BYTES].copy_from_slice(&length.to_le_bytes());
    stream.write_all(frame)
}

/// Reads one length-prefixed frame into `buffer`; `Ok(false)` at a clean end of stream.
pub fn read_frame(stream: &mut impl Read, buffer: &mut Vec<u8>) -> std::io::Result<bool> {
    read_frame_of_at_most(stream, buffer, FRAME_BYTES_MAX)
}

/// Bytes a frame's buffer grows by while its payload arrives, past the buffer's capacity.
const FRAME_READ_STEP: usize = 64 * 1024;

/// [`read_frame`] for frames of at most `max` bytes. The buffer grows with the bytes that
/// arrive, not to the length the peer claims: a peer that claims 256 MiB and sends nothing
/// makes no 256 MiB allocation.
pub fn read_frame_of_at_most(stream: &mut impl Read, buffer: &mut Vec<u8>, max: usize) -> std::io::Result<bool> {
    let mut length = [0u8; 4];
    match stream.read_exact(&mut length) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {length} bytes exceeds {max}"),
        ));
    }
    if length <= buffer.capacity() {
        // Memory the connection already holds: read it at once (the hot path).
        buffer.resize(length, 0);
        return stream.read_exact(buffer).map(|()| true);
    }
    buffer.clear();
    while buffer.len() < length {
        let start = buffer.len();
        // Doubles what arrived so far: at most twice the bytes received, plus one step.
        buffer.resize(length.min((start * 2).max(FRAME_READ_STEP)), 0);
        stream.read_exact(&mut buffer[start..])?;
    }
    Ok(true)
}

/// Credits the consumer granted and the producer has not used yet.
struct Credits {
    available: Mutex<Option<u32>>,
    changed: Condvar,
}

impl Credits {
    /// Takes one credit, waiting for it; `false` once the connection is gone.
    fn take(&self) -> bool {
        let mut available = match self.available.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        loop {
            match *available {
                None => return false,
                Some(0) => {
                    available = match self.changed.wait(available) {
                        Ok(guard) => guard,
                        Err(poisoned) => poisoned.into_inner(),
                    }
                }
                Some(n) => {
                    *available = Some(n - 1);
                    return true;
                }
            }
        }
    }

    fn grant(&self, n: u32) {
        if let Ok(mut available) = self.available.lock()
            && let Some(current) = *available
        {
            *available = Some(current.saturating_add(n));
        }
        self.changed.notify_all();
    }

    fn close(&self) {
        if let Ok(mut available) = self.available.lock() {
            *available = None;
        }
        self.changed.notify_all();
    }
}

/// Sends everything of the local channel `local` over `stream`, as credits allow. Returns the
/// bridge's threads (writer, credit reader); both end when the channel or the connection does.
/// Counts the bytes it writes in `metrics`' `bytes_out` (before writing them, so a consumer
/// never sees bytes not yet counted) and takes itself off `metrics`' `bridges_sending` once
/// it sent the end of partition or ended; the caller counted it on before.
pub fn bridge_sender<T: Data>(
    local: ChannelReceiver<T>,
    stream: TcpStream,
    metrics: Arc<TaskMetrics>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let _ = stream.set_nodelay(true);
    let mut credit_stream = stream.try_clone()?;
    let credits = Arc::new(Credits { available: Mutex::new(Some(0)), changed: Condvar::new() });
    let reader_credits = Arc::clone(&credits);
    let credit_reader = std::thread::Builder::new().name("weir-net-credits".into()).spawn(move || {
        let mut buffer = Vec::new();
        while let Ok(true) = read_frame_of_at_most(&mut credit_stream, &mut buffer, CREDIT_FRAME_BYTES) {
            let Ok(bytes) = <[u8; 4]>::try_from(buffer.as_slice()) else { break };
            reader_credits.grant(u32::from_le_bytes(bytes));
        }
        reader_credits.close();
    })?;
    let mut writer_stream = stream;
    let writer = std::thread::Builder::new().name("weir-net-send".into()).spawn(move || {
        // The frame: room for its length prefix, then the element's bytes.
        let mut frame = Vec::new();
        let mut sending = true;
        let done_sending = |sending: &mut bool| {
            if std::mem::replace(sending, false) {
                metrics.bridge_done_sending();
            }
        };
        // Runs until the producer drops its end of the channel: after its end of partition a
        // producer waiting for the job's final checkpoint still sends barriers.
        while let Ok(element) = local.recv() {
            // Notices posted before this element go first (each takes a credit: the
            // receiving bridge returns it once it posted the notice).
            let mut notices = local.take_priority().into_iter();
            let sent_notices = notices.all(|notice| {
                credits.take() && {
                    let wire: WireElement<T> = WireElement::Priority(notice.barrier, notice.records_before);
                    frame.clear();
                    frame.extend_from_slice(&[0; LENGTH_BYTES]);
                    match postcard::to_extend(&wire, std::mem::take(&mut frame)) {
                        Ok(encoded) => {
                            frame = encoded;
                            metrics.bytes_out.fetch_add(frame.len() as u64, Ordering::Relaxed);
                            write_prefixed_frame(&mut writer_stream, &mut frame).is_ok()
                        }
                        Err(_) => false,
                    }
                }
            });
            if !sent_notices || !credits.take() {
                break;
            }
            let ends = matches!(element, StreamElement::EndOfPartition);
            frame.clear();
            frame.extend_from_slice(&[0; LENGTH_BYTES]);
            let wire: WireElement<T> = element.into();
            frame = match postcard::to_extend(&wire, std::mem::take(&mut frame)) {
                Ok(frame) => frame,
                Err(_) => break,
            };
            metrics.bytes_out.fetch_add(frame.len() as u64, Ordering::Relaxed);
            if write_prefixed_frame(&mut writer_stream, &mut frame).is_err() {
                break;
            }
            if ends {
                done_sending(&mut sending);
            }
        }
        done_sending(&mut sending);
        let _ = writer_stream.flush();
        let _ = writer_stream.shutdown(Shutdown::Write);
    })?;
    Ok(vec![writer, credit_reader])
}

/// Receives elements from `stream` into the local channel `local`, returning one credit per
/// element handed over. Ends when the producer closed the connection (after its end of
/// partition, when it finished), the connection broke, or the local consumer went away.
/// Counts the bytes it reads in `metrics`' `bytes_in`.
pub fn bridge_receiver<T: Data>(
    local: ChannelSender<T>,
    stream: TcpStream,
    metrics: Arc<TaskMetrics>,
) -> std::io::Result<JoinHandle<()>> {
    let _ = stream.set_nodelay(true);
    let mut credit_stream = stream.try_clone()?;
    let mut read_stream = stream;
    std::thread::Builder::new().name("weir-net-recv".into()).spawn(move || {
        // A producer that already closed its side cannot take credits; what it sent before is
        // still delivered, so credit write failures only stop further credits.
        let mut credits_open = write_frame(&mut credit_stream, &(CHANNEL_BATCHES_MAX as u32).to_le_bytes()).is_ok();
        let mut buffer = Vec::new();
        let peer = read_stream.peer_addr().map_or_else(|_| "an unknown peer".to_string(), |a| a.to_string());
        loop {
            match read_frame(&mut read_stream, &mut buffer) {
                Ok(true) => {}
                Ok(false) => break,
                Err(error) => {
                    // The consumer then fails as for a vanished peer; this says why.
                    tracing::warn!(%peer, %error, "data connection broken");
                    break;
                }
            }
            metrics.bytes_in.fetch_add((LENGTH_BYTES + buffer.len()) as u64, Ordering::Relaxed);
            let wire: WireElement<T> = match postcard::from_bytes(&buffer) {
                Ok(wire) => wire,
                Err(error) => {
                    tracing::warn!(%peer, %error, bytes = buffer.len(), "undecodable frame on a data connection (a producer of another weir version?); the connection is closed");
                    break;
                }
            };
            if let WireElement::Priority(barrier, records_before) = wire {
                local.post_priority(crate::exchange::PriorityBarrier { barrier, records_before });
            } else if local.send(wire.into()).is_err() {
                break;
            }
            if credits_open {
                credits_open = write_frame(&mut credit_stream, &1u32.to_le_bytes()).is_ok();
            }
        }
        // Dropping `local` without an end of partition tells the consumer its peer vanished.
        let _ = read_stream.shutdown(Shutdown::Both);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::{channel, channel_with_capacity};
    use crate::snapshot::BarrierKind;
    use std::net::TcpListener;
    use std::time::Duration;

    fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// A frame goes out in one write, its length prefix with its payload: on a TCP_NODELAY
    /// socket every write is a segment of its own.
    #[test]
    fn a_frame_is_one_write() {
        struct Writes(Vec<Vec<u8>>);
        impl Write for Writes {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.push(buf.to_vec());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut writes = Writes(Vec::new());
        write_frame(&mut writes, b"hello").unwrap();
        write_frame(&mut writes, &1u32.to_le_bytes()).unwrap();
        assert_eq!(writes.0, [b"\x05\0\0\0hello".to_vec(), vec![4, 0, 0, 0, 1, 0, 0, 0]]);
        let mut frame = vec![0xff; LENGTH_BYTES];
        frame.extend_from_slice(b"abc");
        write_prefixed_frame(&mut writes, &mut frame).unwrap();
        assert_eq!(writes.0[2], b"\x03\0\0\0abc");
        assert!(write_prefixed_frame(&mut writes, &mut [0, 0]).is_err(), "a frame shorter than its prefix");
    }

    /// A frame's buffer grows with what arrives: a claimed 200 MiB followed by 10 bytes and
    /// the end is an error, having held about what came; an honest large frame reads whole.
    #[test]
    fn a_claimed_frame_length_is_not_allocated_before_its_bytes_arrive() {
        let mut claimed = (200u32 << 20).to_le_bytes().to_vec();
        claimed.extend_from_slice(&[7; 10]);
        let mut buffer = Vec::new();
        let error = read_frame(&mut claimed.as_slice(), &mut buffer).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(buffer.capacity() <= 4 * FRAME_READ_STEP, "{}", buffer.capacity());

        let payload: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let mut framed = Vec::new();
        write_frame(&mut framed, &payload).unwrap();
        write_frame(&mut framed, b"next").unwrap();
        let mut reader = framed.as_slice();
        assert!(read_frame(&mut reader, &mut buffer).unwrap());
        assert_eq!(buffer, payload);
        assert!(read_frame(&mut reader, &mut buffer).unwrap());
        assert_eq!(buffer, b"next");
        assert!(!read_frame(&mut reader, &mut buffer).unwrap());
        let mut small = (5000u32).to_le_bytes().to_vec();
        small.extend_from_slice(&[0; 5000]);
        let error = read_frame_of_at_most(&mut small.as_slice(), &mut buffer, 4096).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    }

    /// An unaligned barrier's notice crosses as a frame of its own and is posted ahead of
    /// the receiving channel's queue; the records around it arrive whole and in order.
    #[test]
    fn an_unaligned_barriers_notice_crosses_ahead_of_the_queue() {
        let (producer_tx, producer_rx) = channel::<u64>();
        let (consumer_tx, consumer_rx) = channel::<u64>();
        let (client, server) = connected_pair();
        let metrics = Arc::new(TaskMetrics::default());
        metrics.bridges_sending.store(1, Ordering::SeqCst);
        let sender = bridge_sender(producer_rx, client, Arc::clone(&metrics)).unwrap();
        let receiver = bridge_receiver(consumer_tx, server, Arc::clone(&metrics)).unwrap();
        producer_tx.send(StreamElement::Records(vec![1, 2])).unwrap();
        let barrier = Barrier {
            checkpoint_id: 3,
            timestamp_ms: 0,
            kind: BarrierKind::Checkpoint { full: false, unaligned: true },
            location: "memory://network-test/chk-3".into(),
        };
        producer_tx.post_priority(crate::exchange::PriorityBarrier { barrier: barrier.clone(), records_before: 2 });
        producer_tx.send(StreamElement::Records(vec![3])).unwrap();
        producer_tx.send(StreamElement::EndOfPartition).unwrap();
        let mut records = Vec::new();
        loop {
            match consumer_rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                StreamElement::Records(batch) => records.extend(batch),
                StreamElement::EndOfPartition => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(records, vec![1, 2, 3]);
        assert_eq!(consumer_rx.take_priority(), vec![crate::exchange::PriorityBarrier { barrier, records_before: 2 }]);
        drop(producer_tx);
        for handle in sender {
            handle.join().unwrap();
        }
        receiver.join().unwrap();
    }

    #[test]
    fn records_barriers_and_the_end_cross_in_order() {
        let (producer_tx, producer_rx) = channel::<u64>();
        let (consumer_tx, consumer_rx) = channel::<u64>();
        let (client, server) = connected_pair();
        let (sent, received) = (Arc::new(TaskMetrics::default()), Arc::new(TaskMetrics::default()));
        sent.bridges_sending.store(1, Ordering::SeqCst);
        let sender = bridge_sender(producer_rx, client, Arc::clone(&sent)).unwrap();
        let receiver = bridge_receiver(consumer_tx, server, Arc::clone(&received)).unwrap();
        let feeder = std::thread::spawn(move || {
            for batch in 0..200u64 {
                producer_tx.send(StreamElement::Records((batch * 10..batch * 10 + 10).collect())).unwrap();
                if batch % 50 == 0 {
                    let barrier = Barrier {
                        checkpoint_id: batch,
                        timestamp_ms: 0,
                        kind: BarrierKind::Checkpoint { full: false, unaligned: false },
                        location: "memory://network-test/chk".into(),
                    };
                    producer_tx.send(StreamElement::Barrier(barrier)).unwrap();
                }
            }
            producer_tx.send(StreamElement::KeyedRecords { records: vec![7], hashes: vec![42] }).unwrap();
            producer_tx
                .send(StreamElement::TimestampedRecords {
                    records: vec![8, 9],
                    timestamps: vec![-5, 6],
                    hashes: vec![],
                })
                .unwrap();
            producer_tx.send(StreamElement::Watermark(-3)).unwrap();
            producer_tx.send(StreamElement::WatermarkStatus(true)).unwrap();
            producer_tx.send(StreamElement::EndOfPartition).unwrap();
        });
        let mut records = Vec::new();
        let mut barriers = Vec::new();
        let mut keyed = None;
        let mut timed = Vec::new();
        loop {
            match consumer_rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                StreamElement::Records(batch) => records.extend(batch),
                StreamElement::KeyedRecords { records, hashes } => keyed = Some((records, hashes)),
                StreamElement::TimestampedRecords { records, timestamps, .. } => {
                    timed.push(format!("{records:?}@{timestamps:?}"))
                }
                StreamElement::Watermark(watermark) => timed.push(format!("watermark {watermark}")),
                StreamElement::WatermarkStatus(idle) => timed.push(format!("idle {idle}")),
                StreamElement::Barrier(barrier) => {
                    barriers.push((barrier.checkpoint_id, records.len()));
                }
                StreamElement::EndOfPartition => break,
            }
        }
        assert_eq!(timed, ["[8, 9]@[-5, 6]", "watermark -3", "idle true"]);
        feeder.join().unwrap();
        assert_eq!(records, (0..2000).collect::<Vec<u64>>());
        // Each barrier arrived right after the records sent before it.
        assert_eq!(barriers, vec![(0, 10), (50, 510), (100, 1010), (150, 1510)]);
        assert_eq!(keyed, Some((vec![7], vec![42])));
        receiver.join().unwrap();
        for thread in sender {
            thread.join().unwrap();
        }
        // Every byte that crossed is counted on both sides: 2000 records of 1-2 bytes at least.
        let bytes = sent.bytes_out.load(Ordering::Relaxed);
        assert!(bytes > 2000, "{bytes}");
        assert_eq!(sent.bridges_sending.load(Ordering::SeqCst), 0, "the end of partition went out");
        assert_eq!(received.bytes_in.load(Ordering::Relaxed), bytes);
    }

    #[test]
    fn a_slow_consumer_bounds_what_is_in_flight() {
        let (producer_tx, producer_rx) = channel_with_capacity::<u64>(1);
        let (consumer_tx, consumer_rx) = channel_with_capacity::<u64>(1);
        let (client, server) = connected_pair();
        let _sender = bridge_sender(producer_rx, client, Arc::default()).unwrap();
        let _receiver = bridge_receiver(consumer_tx, server, Arc::default()).unwrap();
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        std::thread::spawn(move || {
            for batch in 0..1000u64 {
                if producer_tx.send(StreamElement::Records(vec![batch])).is_err() {
                    return;
                }
                counter.store(batch + 1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        // Nobody reads the consumer: at most the credits, the two local channels and the
        // element being handed over can have left the producer.
        let in_flight = sent.load(std::sync::atomic::Ordering::SeqCst);
        assert!(in_flight <= CHANNEL_BATCHES_MAX as u64 + 4, "{in_flight} elements left a blocked producer");
        assert!(in_flight >= CHANNEL_BATCHES_MAX as u64, "credits were not used: {in_flight}");
        // Reading resumes the flow.
        for expected in 0..100u64 {
            match consumer_rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                StreamElement::Records(batch) => assert_eq!(batch, vec![expected]),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn a_broken_connection_disconnects_the_local_consumer() {
        let (consumer_tx, consumer_rx) = channel::<u64>();
        let (mut client, server) = connected_pair();
        let receiver = bridge_receiver(consumer_tx, server, Arc::default()).unwrap();
        let payload = postcard::to_allocvec(&WireElement::Records(vec![1u64, 2])).unwrap();
        write_frame(&mut client, &payload).unwrap();
        drop(client);
        assert!(matches!(consumer_rx.recv_timeout(Duration::from_secs(5)), Ok(StreamElement::Records(_))));
        // No end of partition came: the channel closes instead.
        assert!(consumer_rx.recv_timeout(Duration::from_secs(5)).is_err());
        receiver.join().unwrap();
    }

    /// What a bridge receiver does with bytes: frames of at most [`FRAME_BYTES_MAX`], each
    /// decoded as a [`WireElement`], until the end, a broken frame or an undecodable one.
    fn decode_stream<T: serde::de::DeserializeOwned>(mut bytes: &[u8]) -> Result<Vec<WireElement<T>>, String> {
        let mut buffer = Vec::new();
        let mut elements = Vec::new();
        loop {
            match read_frame(&mut bytes, &mut buffer) {
                Ok(true) => {}
                Ok(false) => return Ok(elements),
                Err(error) => return Err(error.to_string()),
            }
            elements.push(postcard::from_bytes(&buffer).map_err(|e| e.to_string())?);
        }
    }

    /// A stream of every kind of element, with strings and byte vectors (lengths postcard
    /// reads before their bytes) as records.
    fn sample_stream() -> Vec<u8> {
        type Record = (String, Vec<u8>, u64);
        let record = |i: u64| (format!("key-{i}"), vec![i as u8; (i % 7) as usize], i);
        let elements: Vec<WireElement<Record>> = vec![
            WireElement::Records((0..5).map(record).collect()),
            WireElement::KeyedRecords((5..8).map(record).collect(), vec![1, 2, 3]),
            WireElement::Barrier(Barrier {
                checkpoint_id: 7,
                timestamp_ms: 1_700_000_000_000,
                kind: BarrierKind::Checkpoint { full: true, unaligned: false },
                location: "s3://bucket/job/chk-7".into(),
            }),
            WireElement::TimestampedRecords((8..10).map(record).collect(), vec![-5, 6], vec![]),
            WireElement::Watermark(-3),
            WireElement::WatermarkStatus(true),
            WireElement::EndOfPartition,
        ];
        let mut stream = Vec::new();
        for element in &elements {
            write_frame(&mut stream, &postcard::to_allocvec(element).unwrap()).unwrap();
        }
        stream
    }

    /// Far above what decoding a few hundred bytes needs (serde preallocates at most 1 MiB
    /// for a claimed sequence length), far below any claimed size a mutation writes.
    const ALLOCATION_CAP: usize = 2 << 20;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// A valid stream of frames with flipped, inserted, deleted or truncated bytes, or a
        /// huge varint written in (a frame length or a postcard length or count): elements
        /// or a clean error, never a panic or an allocation of a claimed size.
        #[test]
        fn mutated_data_frames_decode_or_fail_cleanly(
            mutations in proptest::collection::vec(proptest::prelude::any::<weir_types::fuzzing::Mutation>(), 1..8),
        ) {
            let bytes = weir_types::fuzzing::mutate(&sample_stream(), &mutations);
            let decoded = weir_types::fuzzing::with_allocation_cap(ALLOCATION_CAP, || {
                decode_stream::<(String, Vec<u8>, u64)>(&bytes).map(|elements| elements.len())
            });
            proptest::prop_assert!(decoded.is_ok(), "decoding asked for {:?} bytes at once", decoded.err());
        }

        /// Any bytes at all (a length prefix of any size first): the same.
        #[test]
        fn garbage_data_frames_decode_or_fail_cleanly(
            length in proptest::prelude::any::<u32>(),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let mut bytes = length.to_le_bytes().to_vec();
            bytes.extend_from_slice(&tail);
            let decoded = weir_types::fuzzing::with_allocation_cap(ALLOCATION_CAP, || {
                decode_stream::<(String, Vec<u8>, u64)>(&bytes).map(|elements| elements.len())
            });
            proptest::prop_assert!(decoded.is_ok(), "decoding asked for {:?} bytes at once", decoded.err());
        }
    }

    #[test]
    fn the_sample_stream_decodes_whole() {
        let elements = decode_stream::<(String, Vec<u8>, u64)>(&sample_stream()).unwrap();
        assert_eq!(elements.len(), 7);
        assert!(matches!(elements.last(), Some(WireElement::EndOfPartition)));
        // Cut anywhere inside a frame: an error, not a short stream taken as whole.
        let whole = sample_stream();
        assert!(decode_stream::<(String, Vec<u8>, u64)>(&whole[..whole.len() - 1]).is_err());
    }

    #[test]
    fn an_oversized_or_garbled_frame_ends_the_bridge_without_panicking() {
        let (consumer_tx, consumer_rx) = channel::<u64>();
        let (mut client, server) = connected_pair();
        let receiver = bridge_receiver(consumer_tx, server, Arc::default()).unwrap();
        client.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(consumer_rx.recv_timeout(Duration::from_secs(5)).is_err());
        receiver.join().unwrap();
    }
}
