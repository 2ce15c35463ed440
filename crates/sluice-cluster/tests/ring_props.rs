//! Properties of the hash ring and of the key encoding it routes by: every node builds the same
//! ring from the same membership, a membership change moves only the keys it must, and two key
//! tuples share an encoding only if they are the same tuple.

use proptest::prelude::*;
use sluice_cluster::ring::{DEFAULT_VIRTUAL_NODES, Ring};
use sluice_core::{Event, FieldPath, KeySpec, Map, Value};

/// The hashes of `n` key tuples as the `aggregate` processor would see them: a user name and a
/// status code.
fn key_hashes(n: usize) -> Vec<u64> {
    let spec = KeySpec::new(vec![FieldPath::parse("/user").unwrap(), FieldPath::parse("/status").unwrap()]);
    let mut scratch = Vec::new();
    (0..n)
        .map(|i| {
            let mut fields = Map::new();
            fields.insert("user", Value::from(format!("user-{}", i / 5)));
            fields.insert("status", Value::Int([200, 201, 404, 500, 503][i % 5]));
            spec.hash(&Event::new(fields), &mut scratch).hash
        })
        .collect()
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}:7100")).collect()
}

fn owner_name(ring: &Ring, hash: u64) -> &str {
    &ring.members()[ring.owner(hash)]
}

#[test]
fn adding_a_node_moves_about_its_share_and_only_to_it() {
    let hashes = key_hashes(100_000);
    for n in 2..=8 {
        let old = Ring::new(&names(n), DEFAULT_VIRTUAL_NODES);
        let new = Ring::new(&names(n + 1), DEFAULT_VIRTUAL_NODES);
        let joined = format!("node-{n}:7100");
        let mut moved = 0;
        for &h in &hashes {
            let (from, to) = (owner_name(&old, h), owner_name(&new, h));
            if from != to {
                assert_eq!(to, joined, "a key moved between two old nodes");
                moved += 1;
            }
        }
        let moved = moved as f64 / hashes.len() as f64;
        let fair = 1.0 / (n + 1) as f64;
        let share = new.shares()[new.index_of(&joined).unwrap()];
        assert!((moved - fair).abs() < 0.2 * fair, "{n} -> {} nodes: moved {moved:.4}, fair {fair:.4}", n + 1);
        assert!((moved - share).abs() < 0.01, "{n} -> {} nodes: moved {moved:.4}, share {share:.4}", n + 1);
    }
}

#[test]
fn removing_a_node_moves_only_its_keys() {
    let hashes = key_hashes(100_000);
    for n in 3..=9 {
        let all = names(n);
        let old = Ring::new(&all, DEFAULT_VIRTUAL_NODES);
        for gone in [0, n / 2, n - 1] {
            let rest: Vec<&String> = all.iter().filter(|m| **m != all[gone]).collect();
            let new = Ring::new(&rest, DEFAULT_VIRTUAL_NODES);
            let mut moved = 0;
            for &h in &hashes {
                let (from, to) = (owner_name(&old, h), owner_name(&new, h));
                if from == all[gone] {
                    moved += 1;
                } else {
                    assert_eq!(from, to, "a key of a node that stayed moved");
                }
            }
            let moved = moved as f64 / hashes.len() as f64;
            let fair = 1.0 / n as f64;
            assert!((moved - fair).abs() < 0.2 * fair, "{n} -> {} nodes: moved {moved:.4}", n - 1);
        }
    }
}

#[test]
fn shares_are_close_to_fair_at_the_default() {
    for n in 1..=8 {
        let ring = Ring::new(&names(n), DEFAULT_VIRTUAL_NODES);
        let shares = ring.shares();
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        for s in shares {
            assert!((s * n as f64 - 1.0).abs() < 0.15, "{n} nodes: share {s}");
        }
    }
}

fn member_names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::hash_set("[a-z0-9.-]{1,12}:[0-9]{2,5}", 1..8).prop_map(|s| s.into_iter().collect())
}

fn hashes() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(any::<u64>(), 1..200).prop_map(|mut v| {
        v.extend([0, 1, u64::MAX, u64::MAX - 1, 1 << 63]);
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_node_builds_the_same_ring(
        members in member_names(),
        order in any::<prop::sample::Index>(),
        dups in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        virtual_nodes in 1u32..300,
        hashes in hashes(),
    ) {
        let a = Ring::new(&members, virtual_nodes);
        // Another node learns the members in another order, some of them twice.
        let mut other = members.clone();
        other.rotate_left(order.index(members.len()));
        other.reverse();
        for d in dups {
            other.push(members[d.index(members.len())].clone());
        }
        let b = Ring::new(&other, virtual_nodes);
        prop_assert_eq!(a.members(), b.members());
        prop_assert_eq!(a.len(), members.len());
        for h in hashes {
            prop_assert_eq!(a.owner(h), b.owner(h));
        }
        prop_assert_eq!(a, b);
    }

    #[test]
    fn owner_is_always_a_member(members in member_names(), virtual_nodes in 0u32..600, hashes in hashes()) {
        let ring = Ring::new(&members, virtual_nodes);
        for h in hashes {
            prop_assert!(ring.owner(h) < ring.len());
        }
        let sum: f64 = ring.shares().iter().sum();
        prop_assert!((sum - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_joining_node_only_takes_keys(
        members in member_names(),
        joining in "[a-z0-9.-]{1,12}:[0-9]{2,5}",
        virtual_nodes in 1u32..300,
        hashes in hashes(),
    ) {
        prop_assume!(!members.contains(&joining));
        let old = Ring::new(&members, virtual_nodes);
        let mut more = members.clone();
        more.push(joining.clone());
        let new = Ring::new(&more, virtual_nodes);
        for h in hashes {
            let (from, to) = (owner_name(&old, h), owner_name(&new, h));
            prop_assert!(from == to || to == joining, "{} moved from {} to {}", h, from, to);
        }
    }
}

/// One key of a tuple: a value, or a field the event lacks.
#[derive(Debug, Clone)]
enum Key {
    Missing,
    Present(Value),
}

/// Scalars from small domains, so that equal and confusable tuples come up often: strings of
/// `a`, `b`, `,` and `1` (comma-joined keys confuse them), ints and floats that look alike, every
/// kind of zero and NaN.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-2i64..3).prop_map(Value::Int),
        any::<i64>().prop_map(Value::Int),
        prop::sample::select(vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff8_0000_0000_0001),
            f64::from_bits(0xfff0_0000_dead_beef),
            f64::MIN_POSITIVE,
        ])
        .prop_map(Value::Float),
        any::<f64>().prop_map(Value::Float),
        "[ab,1]{0,4}".prop_map(Value::from),
        ".{0,30}".prop_map(Value::from),
        (-1i64..2).prop_map(Value::Timestamp),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(2, 8, 3, |inner| prop::collection::vec(inner, 0..3).prop_map(Value::Array))
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![1 => Just(Key::Missing), 6 => value().prop_map(Key::Present)]
}

/// The same key, as a key: -0.0 is 0.0 and every NaN is one.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x == y || (x.is_nan() && y.is_nan()),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y)),
        _ => a == b,
    }
}

fn same_tuple(a: &[Key], b: &[Key]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Key::Missing, Key::Missing) => true,
            (Key::Present(x), Key::Present(y)) => same_value(x, y),
            _ => false,
        })
}

/// A tuple that is the same key as `v` written differently: zeros of the other sign, NaNs of
/// another payload.
fn twin(v: &Value) -> Value {
    match v {
        Value::Float(f) if *f == 0.0 => Value::Float(-f),
        Value::Float(f) if f.is_nan() => Value::Float(f64::from_bits(f.to_bits() ^ 0x8000_0000_0000_0003)),
        Value::Array(items) => Value::Array(items.iter().map(twin).collect()),
        v => v.clone(),
    }
}

fn encode(spec: &KeySpec, tuple: &[Key]) -> (Vec<u8>, u32) {
    let mut fields = Map::new();
    // Other fields, as real events have, which the keys must not see.
    fields.insert("message", Value::from("a,b"));
    for (i, k) in tuple.iter().enumerate() {
        if let Key::Present(v) = k {
            fields.insert(format!("k{i}"), v.clone());
        }
    }
    let mut out = Vec::new();
    let missing = spec.encode(&Event::new(fields), &mut out);
    (out, missing)
}

fn tuples() -> impl Strategy<Value = (Vec<Key>, Vec<Key>)> {
    (1usize..4).prop_flat_map(|n| {
        let tuple = move || prop::collection::vec(key(), n);
        prop_oneof![
            // Independent tuples: mostly different, sometimes equal.
            (tuple(), tuple()),
            // The same tuple written differently.
            tuple().prop_map(|a| {
                let b = a
                    .iter()
                    .map(|k| match k {
                        Key::Missing => Key::Missing,
                        Key::Present(v) => Key::Present(twin(v)),
                    })
                    .collect();
                (a, b)
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn key_encodings_are_equal_iff_tuples_are((a, b) in tuples()) {
        let spec = KeySpec::new((0..a.len()).map(|i| FieldPath::parse(&format!("/k{i}")).unwrap()).collect());
        let (ea, missing_a) = encode(&spec, &a);
        let (eb, _) = encode(&spec, &b);
        prop_assert_eq!(ea == eb, same_tuple(&a, &b), "{:?} / {:?}: {:?} / {:?}", a, b, ea, eb);
        prop_assert_eq!(missing_a as usize, a.iter().filter(|k| matches!(k, Key::Missing)).count());
    }
}

#[test]
fn comma_joined_confusions_differ() {
    let spec = KeySpec::new(vec![FieldPath::parse("/k0").unwrap(), FieldPath::parse("/k1").unwrap()]);
    let pairs = [(["a,b", "c"], ["a", "b,c"]), (["a,", ""], ["a", ","]), (["", "a"], ["a", ""])];
    for (x, y) in pairs {
        let x: Vec<Key> = x.iter().map(|s| Key::Present(Value::from(*s))).collect();
        let y: Vec<Key> = y.iter().map(|s| Key::Present(Value::from(*s))).collect();
        assert_ne!(encode(&spec, &x).0, encode(&spec, &y).0);
    }
}
