//! Tests of the `beats` input: the frame decoder, the ACK bookkeeping, and whole connections
//! against a queue the test completes by hand (so that it decides when events reach the ack
//! point).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use sluice_core::ack::AckOutcome;
use sluice_core::{Batch, Event, FieldPath, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::protocol::{Frame, Inflated, Inflater, Limits, ProtocolError, encode, expand_compressed, next_frame};
use super::window::State;
use super::*;
use crate::codec::TAG_JSON_FAILURE;
use crate::tcp::tests::{context, spec};

const LIMITS: Limits = Limits { max_frame: 1 << 20, max_window: 1000 };

fn frames(bytes: &[u8]) -> Result<Vec<Frame>, ProtocolError> {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(f) = next_frame(&mut buf, &LIMITS)? {
        out.push(f);
    }
    assert!(buf.is_empty(), "{} bytes left over", buf.len());
    Ok(out)
}

/// A data frame's sequence number and document.
type Doc = (u32, Vec<u8>);

/// The documents a compressed frame's payload holds, and how much it inflated to.
fn expand(payload: &[u8]) -> Result<(Vec<Doc>, usize), ProtocolError> {
    let (mut blocks, mut docs) = (Vec::new(), Vec::new());
    let inflated = expand_compressed(payload, &LIMITS, &mut blocks, &mut docs)?;
    Ok((docs.iter().map(|d| (d.seq, d.bytes(&[], &blocks).to_vec())).collect(), inflated))
}

fn doc(n: u32) -> Vec<u8> {
    format!("{{\"n\":{n},\"message\":\"event {n}\"}}").into_bytes()
}

#[test]
fn window_json_and_compressed_frames_decode() {
    let mut wire = encode::window(3);
    wire.extend(encode::json(1, &doc(1)));
    let mut inner = encode::json(2, &doc(2));
    inner.extend(encode::json(3, &doc(3)));
    wire.extend(encode::compressed(&inner));
    let got = frames(&wire).unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], Frame::Window(3));
    assert!(matches!(&got[1], Frame::Json { seq: 1, payload } if payload[..] == doc(1)[..]));
    let Frame::Compressed(block) = &got[2] else { panic!("{:?}", got[2]) };
    let (events, inflated) = expand(block).unwrap();
    assert_eq!(inflated, inner.len());
    assert_eq!(events.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(events[1].1[..], doc(3)[..]);
}

#[test]
fn nested_compression_expands_in_place_up_to_a_depth() {
    // C( J1, C( J2, C( J3 ) ), J4 )
    let deepest = encode::compressed(&encode::json(3, &doc(3)));
    let mut middle = encode::json(2, &doc(2));
    middle.extend(deepest);
    let mut outer = encode::json(1, &doc(1));
    outer.extend(encode::compressed(&middle));
    outer.extend(encode::json(4, &doc(4)));
    let block = encode::compressed(&outer);
    let Frame::Compressed(payload) = frames(&block).unwrap().remove(0) else { panic!() };
    let (events, _) = expand(&payload).unwrap();
    assert_eq!(events.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3, 4]);

    // Five levels is one too many.
    let mut nested = encode::json(1, &doc(1));
    for _ in 0..5 {
        nested = encode::compressed(&nested);
    }
    let Frame::Compressed(payload) = frames(&nested).unwrap().remove(0) else { panic!() };
    assert_eq!(expand(&payload).map(|_| ()), Err(ProtocolError::TooDeep));
}

#[test]
fn truncated_frames_wait_for_more_and_take_nothing() {
    let mut wire = encode::window(2);
    wire.extend(encode::json(1, &doc(1)));
    wire.extend(encode::compressed(&encode::json(2, &doc(2))));
    // Every prefix of the stream yields the frames complete in it, and keeps the rest.
    for cut in 0..wire.len() {
        let mut buf = BytesMut::from(&wire[..cut]);
        let mut n = 0;
        while next_frame(&mut buf, &LIMITS).unwrap().is_some() {
            n += 1;
        }
        buf.extend_from_slice(&wire[cut..]);
        while next_frame(&mut buf, &LIMITS).unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 3, "cut at {cut}");
    }
    // A compressed block whose frames stop in the middle of one.
    let inner = encode::json(1, &doc(1));
    let block = encode::compressed(&inner[..inner.len() - 3]);
    let Frame::Compressed(payload) = frames(&block).unwrap().remove(0) else { panic!() };
    assert_eq!(expand(&payload).map(|_| ()), Err(ProtocolError::TruncatedInner));
    // A block that is not zlib.
    let mut junk = vec![b'2', b'C', 0, 0, 0, 4];
    junk.extend_from_slice(b"junk");
    let Frame::Compressed(payload) = frames(&junk).unwrap().remove(0) else { panic!() };
    assert!(matches!(expand(&payload).map(|_| ()), Err(ProtocolError::Inflate(_))));
}

#[test]
fn oversized_windows_and_frames_are_refused_from_their_header() {
    // The header alone is enough: nothing of the announced size is waited for or allocated.
    let err = frames(&encode::window(1 << 31)).unwrap_err();
    assert_eq!(err, ProtocolError::WindowTooLarge { size: 1 << 31, max: 1000 });
    assert!(err.to_string().contains("max_window_size"), "{err}");
    let mut huge = vec![b'2', b'J', 0, 0, 0, 1];
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    let err = frames(&huge).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { len: u32::MAX, .. }), "{err}");
    assert!(err.to_string().contains("max_frame_bytes"), "{err}");
    let mut huge = vec![b'2', b'C'];
    huge.extend_from_slice(&(2u32 << 20).to_be_bytes());
    assert!(matches!(frames(&huge).unwrap_err(), ProtocolError::FrameTooLarge { kind: "compressed", .. }));
    // A small block that inflates past the limit (a zlib bomb of valid frames).
    let bomb = encode::compressed(&encode::json(1, b"{}").repeat((2 << 20) / 12));
    assert!(bomb.len() < 10_000);
    let Frame::Compressed(payload) = frames(&bomb).unwrap().remove(0) else { panic!() };
    assert_eq!(expand(&payload).map(|_| ()), Err(ProtocolError::InflatedTooLarge(LIMITS.max_frame)));
}

#[test]
fn an_inflater_holds_a_step_or_one_frame_not_the_whole_block() {
    let limits = Limits { max_frame: 64 << 20, max_window: 100_000 };
    let step = 64 << 10;
    // 40,000 documents of about 300 bytes (12 MB), with one of 1 MB among them.
    let mut inner = Vec::new();
    for seq in 1..=40_000u32 {
        let pad = if seq == 20_000 { 1 << 20 } else { 280 };
        inner.extend(encode::json(seq, format!("{{\"n\":{seq},\"p\":\"{}\"}}", "x".repeat(pad)).as_bytes()));
    }
    let frame = encode::compressed(&inner);
    let Frame::Compressed(payload) = frames(&frame).unwrap().remove(0) else { panic!() };
    let mut inflater = Inflater::new(&limits);
    let (mut docs, mut seqs, mut most) = (Vec::new(), Vec::new(), 0);
    loop {
        let before = inflater.held();
        let bound = inflater.next_needs(step);
        let r = inflater.next(&payload, step, &mut docs, 0).unwrap();
        let handed = match &r {
            Inflated::Block(b) => b.len(),
            _ => 0,
        };
        assert!(inflater.held() + handed <= before + bound, "took more than it said it would");
        most = most.max(inflater.held() + handed);
        match r {
            Inflated::Done => break,
            Inflated::More => {}
            Inflated::Block(b) => {
                for d in docs.drain(..) {
                    let text = std::str::from_utf8(d.bytes(&[], std::slice::from_ref(&b))).unwrap();
                    assert!(text.starts_with(&format!("{{\"n\":{}", d.seq)), "{}", &text[..20]);
                    seqs.push(d.seq);
                }
            }
        }
    }
    assert!(seqs.iter().copied().eq(1..=40_000), "every document, in order");
    assert!(most < (1 << 20) + 2 * step, "held {most} bytes at most of a block of {}", inner.len());
}

#[test]
fn bad_versions_and_frame_types_are_named() {
    let legacy = frames(b"1W\0\0\0\x01").unwrap_err();
    assert_eq!(legacy, ProtocolError::Version1('W'));
    assert!(legacy.to_string().contains("version 1"), "{legacy}");
    assert_eq!(frames(b"1D").unwrap_err(), ProtocolError::Version1('D'));
    // Known from the first byte alone.
    assert_eq!(frames(b"1").unwrap_err(), ProtocolError::Version1('?'));
    assert_eq!(frames(b"GET / HTTP/1.1\r\n").unwrap_err(), ProtocolError::Version(b'G'));
    assert_eq!(frames(b"2X").unwrap_err(), ProtocolError::FrameType(b'X'));
    // A window inside a compressed block.
    let block = encode::compressed(&encode::window(1));
    let Frame::Compressed(payload) = frames(&block).unwrap().remove(0) else { panic!() };
    assert_eq!(expand(&payload).map(|_| ()), Err(ProtocolError::WindowInCompressed));
}

#[test]
fn mangled_streams_never_panic() {
    let mut valid = window_of(0, 20, false);
    valid.extend(window_of(20, 20, true));
    let nested = encode::compressed(&encode::compressed(&encode::json(1, &doc(1))));
    valid.extend(encode::window(1));
    valid.extend(nested);
    assert_eq!(decode_for_fuzzing(&valid), (41, false));
    let mut rng = sluice_testkit::Rng::from_env();
    let mut next = move || rng.next_u64();
    for _ in 0..3000 {
        let mut bytes = valid.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % bytes.len() as u64) as usize;
            match next() % 3 {
                0 => bytes[at] = next() as u8,
                1 => bytes.truncate(at),
                _ => bytes.insert(at, next() as u8),
            }
            if bytes.is_empty() {
                break;
            }
        }
        let _ = decode_for_fuzzing(&bytes);
    }
}

#[test]
fn acks_go_in_window_order_whatever_order_parts_finish_in() {
    let mut s = State::default();
    let a = s.open(3);
    let b = s.open(2);
    let a0 = s.add_part(a, 2, 2, true);
    let a1 = s.add_part(a, 1, 3, true);
    let b0 = s.add_part(b, 2, 2, true);
    // The second window's part first: nothing is due, nor for the first's second part.
    s.settle(b, b0, AckOutcome::Handled);
    s.settle(a, a1, AckOutcome::Handled);
    assert!(s.due().acks.is_empty());
    assert_eq!(s.keepalive(), Some(0));
    // The first part of the first window: the whole first window, then the second.
    s.settle(a, a0, AckOutcome::Handled);
    let due = s.due();
    assert_eq!((due.acks, due.windows_done), (vec![3, 2], 2));
    assert_eq!((s.open_windows(), s.keepalive()), (0, None));
}

#[test]
fn partial_acks_only_for_increasing_sequences_and_keepalives_repeat_them() {
    let mut s = State::default();
    let w = s.open(4);
    let p0 = s.add_part(w, 2, 2, true);
    s.settle(w, p0, AckOutcome::Handled);
    // Half the window handled, the rest not yet received: a partial ACK, then keep-alives repeat it.
    assert_eq!(s.due().acks, vec![2]);
    assert!(s.due().acks.is_empty());
    assert_eq!(s.keepalive(), Some(2));
    assert_eq!(s.owed(), 0);
    let p1 = s.add_part(w, 2, 4, true);
    assert_eq!(s.owed(), 1);
    s.settle(w, p1, AckOutcome::Handled);
    assert_eq!(s.due().acks, vec![4]);

    // Numbers that go backwards: only the whole window is ACKed, with its highest number.
    let w = s.open(3);
    let p0 = s.add_part(w, 1, 5, true);
    let p1 = s.add_part(w, 1, 5, false);
    s.settle(w, p0, AckOutcome::Handled);
    assert_eq!(s.due().acks, vec![5], "the first part was increasing");
    s.settle(w, p1, AckOutcome::Handled);
    assert!(s.due().acks.is_empty());
    let p2 = s.add_part(w, 1, 9, false);
    s.settle(w, p2, AckOutcome::Handled);
    assert_eq!(s.due().acks, vec![9]);
}

#[test]
fn an_abandoned_part_stops_every_ack_and_an_empty_window_is_acked_in_turn() {
    let mut s = State::default();
    let a = s.open(1);
    let empty = s.open(0);
    assert!(s.due().acks.is_empty(), "the empty window waits for the one before it");
    let p = s.add_part(a, 1, 1, true);
    s.settle(a, p, AckOutcome::Handled);
    assert_eq!(s.due().acks, vec![1, 0]);
    let _ = empty;
    let b = s.open(2);
    let b0 = s.add_part(b, 1, 1, true);
    let b1 = s.add_part(b, 1, 2, true);
    s.settle(b, b1, AckOutcome::Handled);
    s.settle(b, b0, AckOutcome::Abandoned);
    assert!(s.due().acks.is_empty());
    assert!(s.abandoned());
    assert_eq!(s.keepalive(), None);
}

#[test]
fn events_keep_their_fields_and_bad_documents_are_tagged() {
    let peer = PeerMetadata::new(Some("10.0.0.7"), None);
    let beat = br#"{"@timestamp":"2026-11-26T07:16:16.123Z","@metadata":{"beat":"filebeat","type":"_doc","version":"8.15.0"},"host":{"name":"web-1"},"agent":{"type":"filebeat"},"log":{"file":{"path":"/var/log/app.log"},"offset":42},"message":"hello"}"#;
    let (e, d) = decode_event(beat, 7, &peer);
    assert_eq!(d, Decoded::Ok);
    let get = |e: &Event, p: &str| e.get(&FieldPath::parse(p).unwrap()).cloned();
    assert_eq!(e.timestamp_nanos(), Some(1_795_677_376_123_000_000));
    assert_eq!(get(&e, "/@metadata/beat"), Some(Value::from("filebeat")));
    assert_eq!(get(&e, "/@metadata/ip_address"), Some(Value::from("10.0.0.7")));
    assert_eq!(get(&e, "/log/offset"), Some(Value::Int(42)));
    assert_eq!(get(&e, "/host/name"), Some(Value::from("web-1")));
    assert_eq!(e.message(), Some("hello"));
    // Written out, the timestamp is the one sent, and @metadata stays inside.
    let json = e.to_json_string();
    assert!(
        json.contains(r#""@timestamp":"2026-11-26T07:16:16.123Z""#) && !json.contains("filebeat\",\"type\":\"_doc"),
        "{json}"
    );

    let (e, d) = decode_event(b"{\"message\":\"no time\"}", 7, &peer);
    assert_eq!((d, e.timestamp_nanos()), (Decoded::Ok, Some(7)));
    let (e, _) = decode_event(b"{\"@timestamp\":\"yesterday\"}", 7, &peer);
    assert_eq!(e.timestamp_nanos(), Some(7));
    assert!(e.has_tag(TAG_TIMESTAMP_FAILURE));
    assert_eq!(e.fields.get("_@timestamp"), Some(&Value::from("yesterday")));

    // Without @metadata of its own, an event gets the connection's; changing one event's
    // does not change another's.
    let (mut a, _) = decode_event(b"{\"message\":\"a\"}", 7, &peer);
    let (b, _) = decode_event(b"{\"message\":\"b\",\"@metadata\":\"not an object\"}", 7, &peer);
    a.metadata_mut().insert("ip_address", Value::from("changed"));
    assert_eq!(get(&a, "/@metadata/ip_address"), Some(Value::from("changed")));
    assert_eq!(get(&b, "/@metadata/ip_address"), Some(Value::from("10.0.0.7")));
    // A client's own @metadata.ip_address is kept.
    let (e, _) = decode_event(br#"{"@metadata":{"ip_address":"192.0.2.1"}}"#, 7, &peer);
    assert_eq!(get(&e, "/@metadata/ip_address"), Some(Value::from("192.0.2.1")));
    let with_subject = PeerMetadata::new(Some("10.0.0.7"), Some("CN=client"));
    let (e, _) = decode_event(b"{}", 7, &with_subject);
    assert_eq!(get(&e, "/@metadata/tls_peer/subject"), Some(Value::from("CN=client")));
    // Added to a Beat's own @metadata as well, and the same through a reshared copy.
    let (e, _) = decode_event(beat, 7, &with_subject.reshared());
    assert_eq!(get(&e, "/@metadata/tls_peer/subject"), Some(Value::from("CN=client")));
    assert_eq!(get(&e, "/@metadata/beat"), Some(Value::from("filebeat")));

    let (e, d) = decode_event(b"{\"broken\":", 7, &peer);
    assert_eq!(d, Decoded::Failed);
    assert_eq!(e.message(), Some("{\"broken\":"));
    assert!(e.has_tag(TAG_JSON_FAILURE));
    assert_eq!(e.timestamp_nanos(), Some(7));
    assert_eq!(get(&e, "/@metadata/ip_address"), Some(Value::from("10.0.0.7")));
}

#[test]
fn config_is_checked() {
    assert!(build(&spec("{type: beats, address: '127.0.0.1:5044'}")).is_ok());
    let (l, c) = config::read(&spec("{type: beats, address: 'h:1'}")).unwrap();
    assert_eq!((c.max_frame_bytes.0, c.max_window_size, l.max_connections), (64 << 20, 65_536, 1024));
    assert_eq!((l.idle_timeout.as_secs(), c.keepalive_interval.0.as_secs(), c.write_timeout.0.as_secs()), (60, 5, 30));
    for bad in [
        "max_window_size: 0",
        "max_connections: 0",
        "keepalive_interval: 0s",
        "max_frame_bytes: 10",
        "write_timeout: 0s",
    ] {
        let e = build(&spec(&format!("{{type: beats, address: 'h:1', {bad}}}"))).err().unwrap().to_string();
        assert!(e.contains(bad.split(':').next().unwrap()), "{e}");
    }
    let e = build(&spec("{type: beats, address: 'h:1', tls: {cert: nowhere.crt, key: nowhere.key}}")).err().unwrap();
    assert!(e.to_string().contains("nowhere.crt"), "{e}");
    assert!(format!("{e:?}").contains("tls.cert"), "{e:?}");
    assert!(build(&spec("{type: beats, address: 'h:1', tls: {enabled: false}}")).is_ok());
    assert!(build(&spec("{type: beats, address: 'h:1', windows: 3}")).is_err());
}

/// A running input on a loopback port, and the batches it sends.
struct Running {
    addr: SocketAddr,
    ctx: InputContext,
    rx: mpsc::UnboundedReceiver<Batch>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(yaml: &str) -> Running {
    start_with_budget(yaml, 64 << 20).await
}

async fn start_with_budget(yaml: &str, budget: usize) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (mut ctx, rx) = context();
    ctx.memory = sluice_core::MemoryBudget::new(budget);
    let (keys, config) = config::read(&spec(yaml)).unwrap();
    let c = ctx.clone();
    let task = tokio::spawn(async move { serve(keys, config, None, listener, c).await.unwrap() });
    Running { addr, ctx, rx, task }
}

impl Running {
    async fn batch(&mut self) -> Batch {
        tokio::time::timeout(Duration::from_secs(5), self.rx.recv()).await.expect("a batch in time").unwrap()
    }

    /// Batches until they hold `n` events.
    async fn events(&mut self, n: usize) -> Vec<Batch> {
        let mut got = Vec::new();
        while got.iter().map(Batch::len).sum::<usize>() < n {
            got.push(self.batch().await);
        }
        assert_eq!(got.iter().map(Batch::len).sum::<usize>(), n);
        got
    }

    fn figures(&self) -> Vec<(String, u64)> {
        self.ctx.metrics.state.get().unwrap().figures().into_iter().map(|f| (f.name.to_string(), f.count())).collect()
    }

    fn figure(&self, name: &str) -> u64 {
        self.figures().into_iter().find(|(n, _)| *n == name).unwrap().1
    }

    async fn stop(self) {
        self.ctx.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task).await.unwrap().unwrap();
    }
}

fn window_of(first: u32, n: u32, compressed: bool) -> Vec<u8> {
    let mut data = Vec::new();
    for seq in 1..=n {
        data.extend(encode::json(seq, &doc(first + seq - 1)));
    }
    let mut wire = encode::window(n);
    wire.extend(if compressed { encode::compressed(&data) } else { data });
    wire
}

/// The next ACK frame's sequence number, or `None` if none came within `within`.
async fn ack_within(s: &mut TcpStream, within: Duration) -> Option<u32> {
    let mut frame = [0u8; 6];
    match tokio::time::timeout(within, s.read_exact(&mut frame)).await {
        Ok(Ok(_)) => {
            assert_eq!(&frame[..2], b"2A", "{frame:?}");
            Some(u32::from_be_bytes([frame[2], frame[3], frame[4], frame[5]]))
        }
        _ => None,
    }
}

async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut rest = Vec::new();
    matches!(tokio::time::timeout(within, s.read_to_end(&mut rest)).await, Ok(Ok(_)) | Ok(Err(_)))
}

#[tokio::test]
async fn a_window_is_acked_only_once_its_events_are_handled() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 5, false)).await.unwrap();
    let batches = input.events(5).await;
    let n: Vec<_> = batches.iter().flat_map(|b| b.events.iter().map(|e| e.fields.get("n").cloned().unwrap())).collect();
    assert_eq!(n, (0..5).map(Value::Int).collect::<Vec<_>>());
    assert_eq!(ack_within(&mut s, Duration::from_millis(300)).await, None, "ACKed before the ack point");
    for b in batches {
        b.complete();
    }
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(5));
    assert_eq!(input.figure("beats_acks_total"), 1);
    assert_eq!(input.figure("beats_windows_total"), 1);
    assert_eq!(input.figure("beats_connections_open"), 1);
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn pipelined_windows_are_acked_in_order_compressed_or_not() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    // Three windows sent back to back, the middle one compressed.
    let mut wire = window_of(0, 3, false);
    wire.extend(window_of(3, 4, true));
    wire.extend(window_of(7, 2, false));
    s.write_all(&wire).await.unwrap();
    let mut batches = input.events(9).await;
    // Every byte the client sent, the compressed window as sent (smaller than inflated).
    assert_eq!(input.ctx.metrics.bytes_in.get(), wire.len() as u64);
    // Handle the batches last first: nothing may be ACKed until the first window is.
    let first = batches.remove(0);
    for b in batches {
        b.complete();
    }
    assert_eq!(ack_within(&mut s, Duration::from_millis(300)).await, None);
    first.complete();
    let acks = [
        ack_within(&mut s, Duration::from_secs(5)).await,
        ack_within(&mut s, Duration::from_secs(5)).await,
        ack_within(&mut s, Duration::from_secs(5)).await,
    ];
    assert_eq!(acks, [Some(3), Some(4), Some(2)]);
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn the_batch_that_ends_a_window_is_marked_awaited() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    // Half a window: its client sends more before it waits, so the batch may be held for more.
    let whole = window_of(0, 4, false);
    let half = whole.len() - encode::json(3, &doc(2)).len() - encode::json(4, &doc(3)).len();
    s.write_all(&whole[..half]).await.unwrap();
    let first = input.batch().await;
    assert_eq!((first.len(), first.awaited), (2, false));
    // The rest ends the window: the client now waits for its ACK.
    s.write_all(&whole[half..]).await.unwrap();
    let last = input.batch().await;
    assert_eq!((last.len(), last.awaited), (2, true));
    first.complete();
    last.complete();
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(4));
    drop(s);
    input.stop().await;
}

#[tokio::test(start_paused = true)]
async fn keepalives_repeat_the_last_ack_while_a_window_waits() {
    let mut input = start("{type: beats, address: 'x:0', keepalive_interval: 2s}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 2, false)).await.unwrap();
    let held = input.events(2).await;
    let started = tokio::time::Instant::now();
    assert_eq!(ack_within(&mut s, Duration::from_secs(10)).await, Some(0));
    let first = started.elapsed();
    assert!(first >= Duration::from_secs(2) && first < Duration::from_secs(3), "{first:?}");
    assert_eq!(ack_within(&mut s, Duration::from_secs(10)).await, Some(0));
    assert!(started.elapsed() >= Duration::from_secs(4));
    held.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(10)).await, Some(2));
    // Nothing open: no keep-alives.
    assert_eq!(ack_within(&mut s, Duration::from_secs(10)).await, None);
    assert!(input.figure("beats_keepalives_total") >= 2);
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn a_document_that_is_not_json_is_tagged_acked_and_the_connection_goes_on() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let mut wire = encode::window(2);
    wire.extend(encode::json(1, b"{not json"));
    wire.extend(encode::json(2, &doc(2)));
    s.write_all(&wire).await.unwrap();
    let batches = input.events(2).await;
    let events: Vec<&Event> = batches.iter().flat_map(|b| b.events.iter()).collect();
    assert_eq!(events[0].message(), Some("{not json"));
    assert!(events[0].has_tag(TAG_JSON_FAILURE));
    assert!(!events[1].has_tag(TAG_JSON_FAILURE));
    assert_eq!(input.ctx.metrics.failed.get(), 1);
    batches.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(2));
    s.write_all(&window_of(10, 1, true)).await.unwrap();
    input.events(1).await.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(1));
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn protocol_errors_close_the_connection_and_the_input_serves_the_next_client() {
    let mut input = start("{type: beats, address: 'x:0', max_window_size: 100, max_frame_bytes: 1KiB}").await;
    // More data frames than the window announced.
    let mut overfull = encode::window(1);
    overfull.extend(encode::json(1, b"{}"));
    overfull.extend(encode::json(2, b"{}"));
    // A small compressed frame that inflates past max_frame_bytes.
    let bomb = encode::compressed(&vec![b'2'; 4096]);
    let hostile: [&[u8]; 7] = [
        &encode::window(1 << 31),
        &[b'2', b'J', 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff],
        b"1W\0\0\0\x05",
        &encode::json(1, b"{}"),
        &[b'2', b'W', 0, 0, 0, 1, b'2', b'W', 0, 0, 0, 1],
        &overfull,
        &bomb,
    ];
    for bytes in hostile {
        let mut s = TcpStream::connect(input.addr).await.unwrap();
        s.write_all(bytes).await.unwrap();
        assert!(closed_within(&mut s, Duration::from_secs(5)).await, "kept open after {bytes:?}");
    }
    assert_eq!(input.figure("beats_protocol_errors_total"), 7);
    assert_eq!(input.ctx.metrics.refused.get(), 3, "the three limits count as refused");
    assert!(input.rx.try_recv().is_err());
    // A well-behaved client next.
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 3, true)).await.unwrap();
    input.events(3).await.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(3));
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn a_large_window_travels_in_parts_and_partial_acks_come_in_order() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let n = 3000;
    let mut wire = encode::window(n);
    for seq in 1..=n {
        wire.extend(encode::json(seq, format!("{{\"n\":{seq},\"pad\":\"{}\"}}", "x".repeat(200)).as_bytes()));
    }
    // Two writes, the second after the first part arrived.
    let half = wire.len() / 2;
    s.write_all(&wire[..half]).await.unwrap();
    let mut first = vec![input.batch().await];
    while let Ok(b) = input.rx.try_recv() {
        first.push(b);
    }
    let first_len: usize = first.iter().map(Batch::len).sum();
    assert!(first_len > 0 && first_len < n as usize);
    first.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(first_len as u32), "a partial ACK");
    s.write_all(&wire[half..]).await.unwrap();
    let rest = input.events(n as usize - first_len).await;
    rest.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(n));
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn shutdown_acks_what_is_handled_in_time_and_abandoned_events_close_without_an_ack() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 2, false)).await.unwrap();
    let held = input.events(2).await;
    input.ctx.shutdown.cancel();
    // The reader stops; the window already in the queue is still ACKed when handled.
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(2));
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    tokio::time::timeout(Duration::from_secs(10), input.task).await.unwrap().unwrap();

    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 2, false)).await.unwrap();
    drop(input.events(2).await);
    assert!(closed_within(&mut s, Duration::from_secs(5)).await, "closed once its events were abandoned");
    let mut rest = [0u8; 6];
    assert!(matches!(s.read(&mut rest).await, Ok(0) | Err(_)), "no ACK for abandoned events");
    input.stop().await;
}

#[tokio::test]
async fn idle_clients_are_closed_but_not_while_they_wait_for_an_ack() {
    let mut input = start("{type: beats, address: 'x:0', idle_timeout: 300ms, keepalive_interval: 100ms}").await;
    let mut idle = TcpStream::connect(input.addr).await.unwrap();
    let mut waiting = TcpStream::connect(input.addr).await.unwrap();
    waiting.write_all(&window_of(0, 1, false)).await.unwrap();
    let held = input.events(1).await;
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    // The waiting one gets keep-alives and outlives the idle timeout by far.
    tokio::time::sleep(Duration::from_millis(900)).await;
    held.into_iter().for_each(Batch::complete);
    let mut acks = Vec::new();
    while let Some(a) = ack_within(&mut waiting, Duration::from_secs(2)).await {
        acks.push(a);
        if a == 1 {
            break;
        }
    }
    assert!(acks.len() >= 3 && acks[..acks.len() - 1].iter().all(|a| *a == 0), "{acks:?}");
    assert_eq!(acks.last(), Some(&1));
    // Once ACKed, it is idle like any other.
    assert!(closed_within(&mut waiting, Duration::from_secs(5)).await);
    input.stop().await;
}

#[tokio::test]
async fn a_client_that_stops_in_the_middle_of_a_window_is_closed_after_idle_timeout() {
    let input = start("{type: beats, address: 'x:0', idle_timeout: 400ms, keepalive_interval: 100ms}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let started = std::time::Instant::now();
    // Two events of the three announced, then nothing: keep-alives flow, but the client owes
    // the server, not the other way round.
    let wire = window_of(0, 3, false);
    let cut = wire.len() - encode::json(3, &doc(2)).len();
    s.write_all(&wire[..cut]).await.unwrap();
    let mut keepalives = 0;
    while let Some(seq) = ack_within(&mut s, Duration::from_secs(5)).await {
        assert_eq!(seq, 0);
        keepalives += 1;
    }
    assert!(started.elapsed() >= Duration::from_millis(350), "{:?}", started.elapsed());
    assert!(keepalives >= 2, "{keepalives}");
    assert!(closed_within(&mut s, Duration::from_secs(1)).await);
    assert_eq!(input.ctx.metrics.refused.get(), 1);
    input.stop().await;
}

#[tokio::test]
async fn a_full_house_closes_the_connection_idle_the_longest_never_one_owed_an_ack() {
    let mut input = start("{type: beats, address: 'x:0', max_connections: 2}").await;
    let mut owed = TcpStream::connect(input.addr).await.unwrap();
    owed.write_all(&window_of(0, 1, false)).await.unwrap();
    let held = input.events(1).await;
    let mut idle = TcpStream::connect(input.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Full: the newcomer is served, and the idle one (not the one owed an ACK) makes room.
    let mut newcomer = TcpStream::connect(input.addr).await.unwrap();
    newcomer.write_all(&window_of(10, 1, true)).await.unwrap();
    input.events(1).await.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut newcomer, Duration::from_secs(5)).await, Some(1));
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    held.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut owed, Duration::from_secs(5)).await, Some(1));
    // Both open ones owed an ACK: a third is closed at once.
    owed.write_all(&window_of(20, 1, false)).await.unwrap();
    newcomer.write_all(&window_of(30, 1, false)).await.unwrap();
    let waiting = input.events(2).await;
    let mut refused = TcpStream::connect(input.addr).await.unwrap();
    assert!(closed_within(&mut refused, Duration::from_secs(5)).await);
    assert_eq!(input.ctx.metrics.refused.get(), 2);
    drop((waiting, owed, newcomer));
    input.stop().await;
}

#[tokio::test]
async fn a_large_frame_sent_slowly_holds_about_what_was_sent() {
    let mut input = start("{type: beats, address: 'x:0', max_frame_bytes: 8MiB}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let big = format!("{{\"message\":\"{}\"}}", "m".repeat(4 << 20));
    let mut wire = encode::window(1);
    wire.extend(encode::json(1, big.as_bytes()));
    // The header announces 4 MiB; 100 KiB follow, then a pause.
    s.write_all(&wire[..100 << 10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = input.ctx.memory.used();
    assert!(held < 512 << 10, "{held} bytes charged for 100 KiB received");
    for chunk in wire[100 << 10..].chunks(1 << 20) {
        s.write_all(chunk).await.unwrap();
    }
    let batch = input.batch().await;
    assert_eq!(batch.events[0].message().map(str::len), Some(4 << 20));
    batch.complete();
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(1));
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn decoding_waits_for_the_memory_budget_and_batches_carry_their_charge() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let held = input.ctx.memory.charge(input.ctx.memory.limit(), None).await.unwrap();
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 100, true)).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), input.rx.recv()).await.is_err(), "decoded on no budget");
    drop(held);
    let batches = input.events(100).await;
    let charged: usize = batches.iter().map(|b| b.memory.bytes()).sum();
    let measured: usize = batches.iter().map(|b| crate::admission::measure_each(&b.events, 0)).sum();
    assert!(charged >= measured, "{charged} < {measured}");
    batches.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(100));
    drop(s);
    let ctx = input.ctx.clone();
    input.stop().await;
    assert_eq!(ctx.memory.used(), 0, "every charge given back");
}

#[tokio::test]
async fn a_compressed_window_larger_than_the_budget_arrives_in_slices_within_it() {
    // One window of 20,000 events in one compressed frame that inflates to about 8 MB, twice
    // a budget of 4 MiB: decoded a slice at a time, each slice sent before the next is made.
    let budget = 4 << 20;
    let mut input = start_with_budget("{type: beats, address: 'x:0'}", budget).await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let n = 20_000u32;
    let mut data = Vec::new();
    for seq in 1..=n {
        data.extend(encode::json(seq, format!("{{\"n\":{seq},\"pad\":\"{}\"}}", "x".repeat(400)).as_bytes()));
    }
    assert!(data.len() > 2 * budget);
    let mut wire = encode::window(n);
    wire.extend(encode::compressed(&data));
    s.write_all(&wire).await.unwrap();
    let (mut got, mut batches, mut most_used) = (Vec::new(), 0, 0);
    while got.len() < n as usize {
        let b = input.batch().await;
        most_used = most_used.max(input.ctx.memory.used());
        assert!(b.memory.bytes() <= budget / 2, "a batch of {} events charged {:?}", b.len(), b.memory);
        got.extend(b.events.iter().map(|e| e.fields.get("n").cloned().unwrap()));
        batches += 1;
        b.complete();
    }
    assert!(got.into_iter().eq((1..=i64::from(n)).map(Value::Int)), "every event, in order");
    assert!(batches > 2, "{batches} batches");
    assert!(most_used <= budget, "{most_used} bytes used of a budget of {budget}");
    let mut last = 0;
    while last != n {
        last = ack_within(&mut s, Duration::from_secs(5)).await.expect("the window's ACK");
    }
    drop(s);
    let ctx = input.ctx.clone();
    input.stop().await;
    assert_eq!(ctx.memory.used(), 0, "every charge given back");
}

#[tokio::test]
async fn connections_waiting_for_memory_hold_none_of_it() {
    // Four connections, each with a window whose decoding needs well over half the budget:
    // had each kept what it held while it waited for the rest, none would ever be served.
    let budget = 4 << 20;
    let mut input = start_with_budget("{type: beats, address: 'x:0'}", budget).await;
    let mut clients = Vec::new();
    for c in 0..4u32 {
        let mut data = Vec::new();
        for seq in 1..=2_000u32 {
            let doc = format!("{{\"c\":{c},\"n\":{seq},\"pad\":\"{}\"}}", "y".repeat(600));
            data.extend(encode::json(seq, doc.as_bytes()));
        }
        let mut wire = encode::window(2_000);
        wire.extend(encode::compressed(&data));
        let mut s = TcpStream::connect(input.addr).await.unwrap();
        s.write_all(&wire).await.unwrap();
        clients.push(s);
    }
    // Batches are completed only once received, as a pipeline would.
    let mut per_client = [0usize; 4];
    while per_client.iter().sum::<usize>() < 8_000 {
        let b = input.batch().await;
        for e in &b.events {
            per_client[e.fields.get("c").and_then(Value::as_f64).unwrap() as usize] += 1;
        }
        b.complete();
    }
    assert_eq!(per_client, [2_000; 4]);
    for s in &mut clients {
        let mut last = 0;
        while last != 2_000 {
            last = ack_within(s, Duration::from_secs(5)).await.expect("the window's ACK");
        }
    }
    drop(clients);
    let ctx = input.ctx.clone();
    input.stop().await;
    assert_eq!(ctx.memory.used(), 0);
}

#[tokio::test]
async fn a_frame_that_needs_more_than_the_whole_budget_is_refused_not_waited_for() {
    let mut input = start_with_budget("{type: beats, address: 'x:0'}", 1 << 20).await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let big = format!("{{\"message\":\"{}\"}}", "m".repeat(700 << 10));
    let mut wire = encode::window(1);
    wire.extend(encode::json(1, big.as_bytes()));
    s.write_all(&wire).await.unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await, "waited for memory that can never be free");
    assert_eq!(input.figure("beats_protocol_errors_total"), 1);
    assert_eq!(input.ctx.metrics.refused.get(), 1);
    assert!(input.rx.try_recv().is_err());
    assert_eq!(input.ctx.memory.used(), 0);
    // The next client is served.
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    s.write_all(&window_of(0, 3, true)).await.unwrap();
    input.events(3).await.into_iter().for_each(Batch::complete);
    assert_eq!(ack_within(&mut s, Duration::from_secs(5)).await, Some(3));
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn a_connection_reads_no_further_while_too_many_windows_await_their_ack() {
    let mut input = start("{type: beats, address: 'x:0'}").await;
    let mut s = TcpStream::connect(input.addr).await.unwrap();
    let windows = 3 * connection::MAX_AWAITING as u32;
    let mut wire = Vec::new();
    for w in 0..windows {
        wire.extend(window_of(w, 1, false));
    }
    s.write_all(&wire).await.unwrap();
    // Nothing is completed: the reader opens MAX_AWAITING windows, then waits.
    let mut held = input.events(connection::MAX_AWAITING).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(input.rx.try_recv().is_err(), "read past {} windows awaiting their ACK", connection::MAX_AWAITING);
    assert_eq!(input.figure("beats_windows_total"), connection::MAX_AWAITING as u64);
    // As ACKs are written, it reads on, until every window is ACKed.
    let mut acked = 0;
    while acked < windows {
        held.drain(..).for_each(Batch::complete);
        while let Ok(b) = input.rx.try_recv() {
            held.push(b);
        }
        if let Some(seq) = ack_within(&mut s, Duration::from_secs(5)).await {
            assert_eq!(seq, 1);
            acked += 1;
        } else {
            panic!("stuck after {acked} ACKs");
        }
    }
    assert_eq!(input.figure("beats_windows_total"), u64::from(windows));
    drop(s);
    input.stop().await;
}

#[tokio::test]
async fn tls_with_client_auth() {
    let dir = tempfile::tempdir().unwrap();
    let certs = sluice_tls::testing::CertSet::generate(dir.path(), &["server", "client"]);
    let rogue = sluice_tls::testing::CertSet::generate_other_ca(dir.path(), &["client"]);
    let server_tls = ServerTls::new(&certs.tls("server"), "beats test").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ctx, mut rx) = context();
    let (keys, config) = config::read(&spec("{type: beats, address: 'x:0'}")).unwrap();
    let c = ctx.clone();
    let task = tokio::spawn(async move { serve(keys, config, Some(server_tls), listener, c).await.unwrap() });

    let connect = |tls: sluice_tls::TlsConfig| async move {
        let client = sluice_tls::ClientTls::new(&tls, "beats test client").unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        client.connect("localhost", tcp).await
    };
    let mut trusted = connect(certs.tls("client")).await.unwrap();
    trusted.write_all(&window_of(0, 2, true)).await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(b.len(), 2);
    let subject = b.events[0].get(&FieldPath::parse("/@metadata/tls_peer/subject").unwrap()).cloned();
    assert!(subject.as_ref().and_then(Value::as_str).is_some_and(|s| s.contains("client")), "{subject:?}");
    b.complete();
    let mut ack = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(5), trusted.read_exact(&mut ack)).await.unwrap().unwrap();
    assert_eq!(ack, *b"2A\0\0\0\x02");

    // A certificate from another CA is refused, and nothing it sends is read.
    let mut other = certs.tls("client");
    other.cert = Some(rogue.cert("client"));
    other.key = Some(rogue.key("client"));
    if let Ok(mut s) = connect(other).await {
        let _ = s.write_all(&window_of(0, 1, false)).await;
        let mut byte = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte)).await.unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
    assert!(tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_err());
    assert!(ctx.metrics.refused.get() >= 1);
    ctx.shutdown.cancel();
    drop(trusted);
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}
