use sluice_core::{Event, Map, SharedText, Value};

use super::encode::put_map;
use super::*;
use proptest::prelude::*;

/// Equality that compares floats by bit pattern, so NaN equals itself.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => same_map(x, y),
        _ => a == b,
    }
}

fn same_map(x: &Map, y: &Map) -> bool {
    x.len() == y.len() && x.iter().zip(y.iter()).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
}

fn map_of(entries: Vec<(String, Value)>) -> Map {
    let mut m = Map::with_capacity(entries.len());
    for (k, v) in entries {
        m.insert(k, v);
    }
    m
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<f64>().prop_map(Value::Float),
        any::<u64>().prop_map(|bits| Value::Float(f64::from_bits(bits))),
        Just(Value::Float(f64::NAN)),
        "\\PC{0,60}".prop_map(Value::from),
        "[a-z]{0,40}".prop_map(Value::from),
        any::<i64>().prop_map(Value::Timestamp),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(("\\PC{0,16}", inner), 0..8).prop_map(|kv| Value::Object(map_of(kv))),
        ]
    })
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop::collection::vec(("[@a-z_]{1,12}|.{0,30}", arb_value()), 0..16).prop_map(|kv| Event::new(map_of(kv)))
}

fn sample_event() -> Event {
    let mut inner = Map::new();
    inner.insert("code", Value::Int(-7));
    inner.insert("tags", Value::Array(vec![Value::from("a"), Value::Null, Value::Bool(true)]));
    let mut e = Event::from_message_at("GET /index.html 200 — ünïcødé", 1_700_000_000_123_456_789);
    e.fields.insert("bytes", Value::Int(i64::MAX));
    e.fields.insert("min", Value::Int(i64::MIN));
    e.fields.insert("ratio", Value::Float(-0.0));
    e.fields.insert("nan", Value::Float(f64::NAN));
    e.fields.insert("off", Value::Bool(false));
    e.fields.insert("before_epoch", Value::Timestamp(-1));
    e.fields.insert("detail", Value::Object(inner));
    e.fields.insert("long", Value::from("x".repeat(300)));
    e
}

#[test]
fn exact_bytes_of_a_small_event() {
    let mut m = Map::new();
    m.push_unchecked("a", Value::Int(-1));
    m.push_unchecked("b", Value::Array(vec![Value::Null, Value::Bool(true), Value::from("hi")]));
    m.push_unchecked("t", Value::Timestamp(64));
    let mut out = Vec::new();
    encode_event(&Event::new(m), &mut out).unwrap();
    assert_eq!(
        out,
        [
            3,
            1,
            b'a',
            TAG_INT,
            1,
            1,
            b'b',
            TAG_ARRAY,
            3,
            TAG_NULL,
            TAG_TRUE,
            TAG_STRING,
            2,
            b'h',
            b'i',
            1,
            b't',
            TAG_TIMESTAMP,
            0x80,
            1
        ]
    );
}

#[test]
fn round_trips_a_sample_event() {
    let e = sample_event();
    let mut out = Vec::new();
    encode_event(&e, &mut out).unwrap();
    let back = decode_event_body(&out).unwrap();
    assert!(same_map(&e.fields, &back.fields));
    let mut with_tail = out.clone();
    with_tail.push(0);
    assert_eq!(decode_event_body(&with_tail), Err(CodecError::TrailingBytes(1)));
    let mut input = &with_tail[..];
    assert!(decode_event(&mut input).is_ok());
    assert_eq!(input, [0]);
}

#[test]
fn batches_round_trip_and_append() {
    let events = vec![sample_event(), Event::from_message_at("b", 2), Event::new(Map::new())];
    let mut body = Vec::new();
    encode_batch(&events, &mut body).unwrap();
    let refs: Vec<&Event> = events.iter().collect();
    let mut body2 = Vec::new();
    encode_batch(refs.iter().copied(), &mut body2).unwrap();
    assert_eq!(body, body2);
    let back = decode_batch_body(&body).unwrap();
    assert_eq!(back.len(), 3);
    for (a, b) in events.iter().zip(&back) {
        assert!(same_map(&a.fields, &b.fields));
    }
    let mut out = vec![Event::from_message_at("already", 0)];
    let mut input = &body[..];
    assert_eq!(decode_batch_into(&mut input, &mut out), Ok(3));
    assert_eq!(out.len(), 4);
    assert!(input.is_empty());
    // A failed batch leaves `out` and the input as they were.
    let mut input = &body[..body.len() - 1];
    assert!(decode_batch_into(&mut input, &mut out).is_err());
    assert_eq!(out.len(), 4);
    assert_eq!(input.len(), body.len() - 1);
}

#[test]
fn a_reused_decoder_follows_changing_keys() {
    let long = "k".repeat(40);
    let shapes: [&[&str]; 5] = [
        &["message", "@timestamp", "host"],
        &["message", "@timestamp", "host"],
        &["message", "host", "@timestamp", "extra"],
        &["", long.as_str(), "messagf"],
        &["", long.as_str(), "message", "@timestamp"],
    ];
    let mut dec = EventDecoder::new();
    for (i, keys) in shapes.iter().cycle().take(20).enumerate() {
        let mut m = Map::new();
        for (j, k) in keys.iter().enumerate() {
            m.push_unchecked(*k, Value::Int((i * 10 + j) as i64));
        }
        let e = Event::new(m);
        let mut body = Vec::new();
        encode_event(&e, &mut body).unwrap();
        assert_eq!(dec.decode_event_body(&body).unwrap(), e);
        // A cached key must never stand in for bytes that are not valid UTF-8.
        let mut bad = body.clone();
        if let Some(at) = bad.windows(7).position(|w| w == b"message") {
            bad[at + 1] = 0xff;
            assert_eq!(dec.decode_event_body(&bad), Err(CodecError::InvalidUtf8));
        }
    }
    let mut batch = Vec::new();
    let events: Vec<Event> = (0..40).map(|i| Event::from_message_at(format!("m{i}"), i)).collect();
    encode_batch(&events, &mut batch).unwrap();
    let mut out = Vec::new();
    assert_eq!(dec.decode_batch_into(&mut &batch[..], &mut out), Ok(40));
    assert_eq!(out, events);
}

#[test]
fn varints_at_the_edges() {
    for v in [0, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        let mut input = &out[..];
        assert_eq!(get_varint(&mut input), Ok(v));
        assert!(input.is_empty());
    }
    for n in [0, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
        assert_eq!(unzigzag(zigzag(n)), n);
    }
    let mut input = &[0xff; 10][..];
    assert_eq!(get_varint(&mut input), Err(CodecError::VarintOverflow));
    let mut input = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..];
    assert_eq!(get_varint(&mut input), Err(CodecError::VarintOverflow));
    let mut input = &[0x80, 0x80][..];
    assert_eq!(get_varint(&mut input), Err(CodecError::UnexpectedEnd));
}

#[test]
fn hostile_input_is_an_error_not_an_allocation() {
    // A count of 2^63 entries, a string of 2^40 bytes, an array of 10^12 values.
    let mut huge_map = Vec::new();
    put_varint(&mut huge_map, 1 << 63);
    assert_eq!(decode_event(&mut &huge_map[..]), Err(CodecError::LengthOutOfBounds(1 << 63)));
    let mut huge_str = vec![1, 1, b'k', TAG_STRING];
    put_varint(&mut huge_str, 1 << 40);
    assert_eq!(decode_event(&mut &huge_str[..]), Err(CodecError::LengthOutOfBounds(1 << 40)));
    let mut huge_array = vec![TAG_ARRAY];
    put_varint(&mut huge_array, 1_000_000_000_000);
    assert_eq!(decode_value(&mut &huge_array[..]), Err(CodecError::LengthOutOfBounds(1_000_000_000_000)));
    assert_eq!(decode_value(&mut &[0x09][..]), Err(CodecError::UnknownTag(9)));
    assert_eq!(decode_value(&mut &[TAG_STRING, 2, 0xc3, 0x28][..]), Err(CodecError::InvalidUtf8));
    assert_eq!(decode_event(&mut &[1, 2, 0xff, 0xfe, TAG_NULL][..]), Err(CodecError::InvalidUtf8));
    assert_eq!(decode_batch_body(&[5, 0]), Err(CodecError::LengthOutOfBounds(5)));
}

#[test]
fn nesting_is_limited_both_ways() {
    fn nested(levels: usize) -> Value {
        let mut v = Value::Int(1);
        for i in 0..levels {
            v = if i % 2 == 0 { Value::Array(vec![v]) } else { Value::Object(map_of(vec![("k".into(), v)])) };
        }
        v
    }
    let mut out = Vec::new();
    let ok = Event::new(map_of(vec![("deep".into(), nested(MAX_DEPTH))]));
    encode_event(&ok, &mut out).unwrap();
    assert!(same_map(&decode_event_body(&out).unwrap().fields, &ok.fields));
    let too_deep = Event::new(map_of(vec![("deep".into(), nested(MAX_DEPTH + 1))]));
    let mut out = b"keep".to_vec();
    assert_eq!(encode_event(&too_deep, &mut out), Err(CodecError::TooDeep));
    assert_eq!(out, b"keep");
    // Hand-made bytes: one level too many, then a million levels (no stack overflow).
    for levels in [MAX_DEPTH + 1, 1_000_000] {
        let mut bytes = vec![1, 1, b'k'];
        bytes.extend(std::iter::repeat_n([TAG_ARRAY, 1], levels).flatten());
        bytes.push(TAG_NULL);
        assert_eq!(decode_event(&mut &bytes[..]), Err(CodecError::TooDeep));
    }
}

#[test]
fn truncated_and_garbled_bodies_never_panic() {
    let events = vec![sample_event(), Event::from_message_at("short", 5), sample_event()];
    let mut body = Vec::new();
    encode_batch(&events, &mut body).unwrap();
    for cut in 0..body.len() {
        assert!(decode_batch_body(&body[..cut]).is_err(), "prefix of {cut} bytes decoded");
    }
    let mut single = Vec::new();
    encode_event(&events[0], &mut single).unwrap();
    for cut in 0..single.len() {
        assert!(decode_event(&mut &single[..cut]).is_err(), "prefix of {cut} bytes decoded");
    }
    let mut rng = sluice_testkit::Rng::from_env();
    let mut rand = move || rng.next_u64();
    for _ in 0..20_000 {
        let mut bad = body.clone();
        for _ in 0..1 + rand() % 3 {
            let at = (rand() % bad.len() as u64) as usize;
            bad[at] = rand() as u8;
        }
        let _ = decode_batch_body(&bad);
        let _ = decode_event(&mut &bad[1..]);
        let _ = decode_value(&mut &bad[..]);
    }
    for _ in 0..20_000 {
        let len = (rand() % 64) as usize;
        let junk: Vec<u8> = (0..len).map(|_| (rand() % 12) as u8).collect();
        let _ = decode_batch_body(&junk);
        let _ = decode_event(&mut &junk[..]);
        let _ = decode_value(&mut &junk[..]);
    }
}

/// One event decoded from `body`, with strings pointing into `text` where they can.
fn decode_in(dec: &mut EventDecoder, body: &[u8], text: &SharedText) -> Result<Event, CodecError> {
    let mut out = Vec::with_capacity(1);
    dec.decode_event_body_into(body, Some(text), &mut out)?;
    Ok(out.pop().expect("one event pushed"))
}

#[test]
fn long_strings_decoded_in_a_shared_buffer_point_into_it() {
    let long = "GET /index.html HTTP/1.1 200 2326 Mozilla/5.0 (X11; Linux x86_64)";
    let mut e = Event::from_message_at(long, 7);
    e.fields.insert("level", Value::from("info"));
    let mut bytes = vec![0xFF, 0xFE]; // not text: the buffer is checked per string
    encode_event(&e, &mut bytes).unwrap();
    let text = SharedText::new(bytes);
    let back = decode_in(&mut EventDecoder::new(), &text.as_bytes()[2..], &text).unwrap();
    assert!(same_map(&e.fields, &back.fields));
    let Some(Value::String(message)) = back.fields.get("message") else { panic!("no message") };
    assert!(message.is_shared(), "a long string is a slice of the buffer");
    let Some(Value::String(level)) = back.fields.get("level") else { panic!("no level") };
    assert!(!level.is_shared(), "a short string is inline");

    // The same body elsewhere decodes by copying.
    let copy = text.as_bytes()[2..].to_vec();
    let back = decode_in(&mut EventDecoder::new(), &copy, &text).unwrap();
    let Some(Value::String(message)) = back.fields.get("message") else { panic!("no message") };
    assert!(!message.is_shared());
}

#[test]
fn decoding_into_a_vector_pushes_whole_events_only() {
    let mut body = Vec::new();
    encode_event(&Event::from_message_at("a message long enough not to be stored inline", 3), &mut body).unwrap();
    let mut dec = EventDecoder::new();
    let mut out = Vec::new();
    dec.decode_event_body_into(&body, None, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    let mut trailing = body.clone();
    trailing.push(0);
    let err = dec.decode_event_body_into(&trailing, None, &mut out).unwrap_err();
    assert!(matches!(err, CodecError::TrailingBytes(1)), "{err:?}");
    let err = dec.decode_event_body_into(&body[..body.len() - 5], None, &mut out).unwrap_err();
    assert!(matches!(err, CodecError::UnexpectedEnd | CodecError::LengthOutOfBounds(_)), "{err:?}");
    assert_eq!(out.len(), 1, "a refused body pushes nothing");
    assert!(same_map(&out[0].fields, &decode_event_body(&body).unwrap().fields));
}

#[test]
fn invalid_utf8_in_a_shared_buffer_is_refused() {
    let long = "a message long enough not to be inline, with a byte to spoil";
    let mut bytes = Vec::new();
    encode_event(&Event::from_message_at(long, 1), &mut bytes).unwrap();
    let at = bytes.windows(5).position(|w| w == b"spoil").unwrap();
    bytes[at] = 0xC3; // a lead byte followed by ASCII
    let text = SharedText::new(bytes);
    let err = decode_in(&mut EventDecoder::new(), text.as_bytes(), &text).unwrap_err();
    assert!(matches!(err, CodecError::InvalidUtf8), "{err:?}");
}

fn arb_flat_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<u64>().prop_map(|bits| Value::Float(f64::from_bits(bits))),
        "\\PC{0,40}".prop_map(Value::from),
        "[a-z]{0,300}".prop_map(Value::from),
        any::<i64>().prop_map(Value::Timestamp),
    ]
}

proptest! {
    #[test]
    fn the_flat_path_writes_what_the_general_one_does(
        kv in prop::collection::vec(("[@a-z_]{0,20}|.{0,30}", arb_flat_value()), 0..20),
        prefix in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let e = Event::new(map_of(kv));
        let bound = flat::bound(&e.fields).expect("no containers");
        let mut fast = prefix.clone();
        flat::put_map(&mut fast, &e.fields, bound);
        let mut general = prefix.clone();
        put_map(&mut general, &e.fields, 0).unwrap();
        prop_assert_eq!(&fast, &general);
        prop_assert!(fast.len() - prefix.len() <= bound);
    }

    #[test]
    fn any_event_round_trips(e in arb_event()) {
        let mut out = vec![0xAB];
        encode_event(&e, &mut out).unwrap();
        let back = decode_event_body(&out[1..]).unwrap();
        prop_assert!(same_map(&e.fields, &back.fields), "{:?} != {:?}", e, back);
    }

    #[test]
    fn any_value_round_trips(v in arb_value()) {
        let mut out = Vec::new();
        encode_value(&v, &mut out).unwrap();
        let mut input = &out[..];
        let back = decode_value(&mut input).unwrap();
        prop_assert!(input.is_empty());
        prop_assert!(same(&v, &back), "{:?} != {:?}", v, back);
    }

    #[test]
    fn any_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_batch_body(&bytes);
        let _ = decode_event_body(&bytes);
        let _ = decode_value(&mut &bytes[..]);
    }
}

proptest! {
    // Each case encodes and decodes several events: fewer cases keep the debug build quick.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_batch_round_trips(events in prop::collection::vec(arb_event(), 0..4)) {
        let mut out = Vec::new();
        encode_batch(&events, &mut out).unwrap();
        let back = decode_batch_body(&out).unwrap();
        prop_assert_eq!(back.len(), events.len());
        for (a, b) in events.iter().zip(&back) {
            prop_assert!(same_map(&a.fields, &b.fields));
        }
    }

    #[test]
    fn events_decoded_in_a_shared_buffer_equal_their_copies(events in prop::collection::vec(arb_event(), 1..5)) {
        // Bodies back to back behind a binary header, as frames sit in a segment read back.
        let mut bytes = vec![0xFF, 0x00, 0x80];
        let mut bodies = Vec::new();
        for e in &events {
            let start = bytes.len();
            encode_event(e, &mut bytes).unwrap();
            bodies.push(start..bytes.len());
        }
        let text = SharedText::new(bytes);
        let mut dec = EventDecoder::new();
        let (mut shared, mut copied) = (Vec::new(), Vec::new());
        for (e, range) in events.iter().zip(bodies) {
            let body = &text.as_bytes()[range];
            let back = decode_in(&mut dec, body, &text).unwrap();
            prop_assert!(same_map(&e.fields, &back.fields), "{:?} != {:?}", e, back);
            dec.decode_event_body_into(body, Some(&text), &mut shared).unwrap();
            dec.decode_event_body_into(body, None, &mut copied).unwrap();
        }
        prop_assert_eq!(shared.len(), events.len());
        prop_assert_eq!(copied.len(), events.len());
        for ((e, a), b) in events.iter().zip(&shared).zip(&copied) {
            prop_assert!(same_map(&e.fields, &a.fields) && same_map(&e.fields, &b.fields));
        }
    }

    #[test]
    fn a_reused_decoder_round_trips_any_sequence(events in prop::collection::vec(arb_event(), 1..5)) {
        let mut dec = EventDecoder::new();
        for e in events.iter().chain(events.iter().rev()) {
            let mut out = Vec::new();
            encode_event(e, &mut out).unwrap();
            let back = dec.decode_event_body(&out).unwrap();
            prop_assert!(same_map(&e.fields, &back.fields), "{:?} != {:?}", e, back);
        }
    }
}
