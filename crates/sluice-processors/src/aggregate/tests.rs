use super::*;
use crate::common::{build_err, get};
use sluice_core::ack::AckOutcome;
use sluice_core::{Acker, Map, Value};

fn agg(yaml: &str) -> Aggregate {
    let spec = crate::spec_from_yaml(yaml).unwrap_or_else(|e| panic!("bad test config: {e}"));
    Aggregate::from_spec(&spec).unwrap_or_else(|e| panic!("build failed: {e}"))
}

fn ev(json: &str) -> Event {
    match Value::from_json_slice(json.as_bytes()).unwrap() {
        Value::Object(m) => Event::new(m),
        other => panic!("not an object: {other:?}"),
    }
}

fn batch(jsons: &[&str]) -> Vec<Event> {
    jsons.iter().map(|j| ev(j)).collect()
}

fn all(_: &Event) -> bool {
    true
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Consumes a batch at `now` with acknowledgements of its own; returns what stayed.
fn feed(a: &Aggregate, now: Instant, jsons: &[&str]) -> (Vec<Event>, Consumed) {
    let mut events = batch(jsons);
    let mut acks = AckSet::none();
    let c = a.consume_at(now, &mut events, &all, &mut acks);
    (events, c)
}

fn int(e: &Event, path: &str) -> i64 {
    match get(e, path) {
        Some(Value::Int(i)) => *i,
        other => panic!("{path} is not an integer: {other:?} in {}", e.to_json_string()),
    }
}

fn text(e: &Event, path: &str) -> String {
    get(e, path).map(|v| v.to_text()).unwrap_or_default()
}

/// The emitted events by the text of a field, for order-free checks.
fn by(events: &[Event], path: &str) -> std::collections::BTreeMap<String, Event> {
    events.iter().map(|e| (text(e, path), e.clone())).collect()
}

#[test]
fn config_errors_name_their_key() {
    let base = "type: aggregate\nidentification_keys: [/user]\n";
    let e = build_err(&format!("{base}action: counter"));
    assert!(e.contains("action") && e.contains("unknown action `counter`"), "{e}");
    for known in actions::ACTIONS {
        assert!(e.contains(&format!("`{known}`")), "{e}");
    }
    let e = build_err(&format!("{base}action: {{frobnicate: {{}}}}"));
    assert!(e.contains("unknown action `frobnicate`"), "{e}");
    let e = build_err("type: aggregate\naction: count");
    assert!(e.contains("identification_keys"), "{e}");
    let e = build_err("type: aggregate\nidentification_keys: []\naction: count");
    assert!(e.contains("identification_keys") && e.contains("at least one"), "{e}");
    let e = build_err(&format!("{base}action: {{histogram: {{key: /t, buckets: [1, 0.5]}}}}"));
    assert!(e.contains("action") && e.contains("ascending"), "{e}");
    let e = build_err(&format!("{base}action: {{histogram: {{key: /t, buckets: []}}}}"));
    assert!(e.contains("at least one upper bound"), "{e}");
    let e = build_err(&format!("{base}action: {{histogram: {{key: /t}}}}"));
    assert!(e.contains("buckets"), "{e}");
    let e = build_err(&format!("{base}action: count\ngroup_by: [/x]"));
    assert!(e.contains("group_by"), "{e}");
    let e = build_err(&format!("{base}action: {{count: {{count_field: /n}}}}"));
    assert!(e.contains("count_field") && e.contains("action"), "{e}");
    let e = build_err(&format!("{base}action: sum"));
    assert!(e.contains("`sum` needs options"), "{e}");
    let e = build_err(&format!("{base}action: {{sum: {{key: /a}}, count: {{}}}}"));
    assert!(e.contains("give one action"), "{e}");
    let e = build_err(&format!("{base}action: {{percent_sampler: {{percent: 0}}}}"));
    assert!(e.contains("percent"), "{e}");
    let e = build_err(&format!("{base}action: {{percent_sampler: {{percent: 101}}}}"));
    assert!(e.contains("at most 100"), "{e}");
    let e = build_err(&format!("{base}action: {{rate_limiter: {{events_per_second: 0}}}}"));
    assert!(e.contains("events_per_second"), "{e}");
    let e = build_err(&format!("{base}action: {{rate_limiter: {{events_per_second: 5, when_exceeds: block}}}}"));
    assert!(e.contains("when_exceeds"), "{e}");
    let e = build_err(&format!("{base}action: {{rate_limiter: {{events_per_second: 5}}}}\ngroup_duration: 100ms"));
    assert!(e.contains("group_duration") && e.contains("at least 1s"), "{e}");
    let e = build_err(&format!("{base}action: count\ngroup_duration: 0"));
    assert!(e.contains("group_duration"), "{e}");
    let e = build_err(&format!("{base}action: count\ngroup_duration: 400d"));
    assert!(e.contains("group_duration") && e.contains("365 days"), "{e}");
    let e = build_err(&format!("{base}action: count\nmax_groups: 0"));
    assert!(e.contains("max_groups"), "{e}");
    let e = build_err(&format!("{base}action: count\naggregate_when: '/a =='"));
    assert!(e.contains("aggregate_when"), "{e}");
}

#[test]
fn registered_as_a_stateful_processor() {
    let p = crate::common::build_yaml("type: aggregate\nidentification_keys: [/user]\naction: count");
    let mut e = ev(r#"{"user":"a"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    let s = p.stateful().expect("aggregate is stateful");
    assert_eq!(s.identification_keys().paths()[0].as_str(), "/user");
    assert_eq!(s.tick(), Duration::from_secs(1));
    let short = agg("type: aggregate\nidentification_keys: [/u]\naction: count\ngroup_duration: 40ms");
    assert_eq!(short.tick(), Duration::from_millis(10));
    assert!(crate::KINDS.iter().any(|k| k.name == "aggregate"));
}

#[test]
fn count_emits_one_event_per_group_when_its_time_is_up() {
    let a = agg("type: aggregate\nidentification_keys: [/user, /host]\naction: count\ngroup_duration: 10s");
    let t0 = Instant::now();
    let (left, c) =
        feed(&a, t0, &[r#"{"user":"a","host":"h"}"#, r#"{"user":"a","host":"h"}"#, r#"{"user":"b","host":"h","x":1}"#]);
    assert!(left.is_empty());
    assert_eq!(c, Consumed { consumed: 3, dropped: 0, missing_keys: 0 });
    assert!(a.conclude(t0 + secs(9.9), false).events.is_empty());
    let out = a.conclude(t0 + secs(10.0), false);
    assert_eq!(out.events.len(), 2);
    let g = by(&out.events, "/user");
    assert_eq!(int(&g["a"], "/count"), 2);
    assert_eq!(int(&g["b"], "/count"), 1);
    assert_eq!(text(&g["b"], "/host"), "h");
    assert!(get(&g["b"], "/x").is_none(), "only the keys and the counts");
    let (Some(Value::Timestamp(start)), Some(Value::Timestamp(end)), Some(Value::Timestamp(at))) =
        (get(&g["a"], "/start_time"), get(&g["a"], "/end_time"), get(&g["a"], "/@timestamp"))
    else {
        panic!("times are timestamps: {}", g["a"].to_json_string())
    };
    assert!(start <= end && end == at);
    let s = a.stats();
    assert_eq!((s.groups_open, s.groups_concluded, s.events_consumed, s.events_emitted), (0, 2, 3, 2));
}

#[test]
fn count_output_names_can_be_changed() {
    let a = agg(
        "type: aggregate\nidentification_keys: [/user]\naction: {count: {count_key: /n, start_time_key: /from, end_time_key: /stats/to}}",
    );
    let t0 = Instant::now();
    feed(&a, t0, &[r#"{"user":"a"}"#]);
    let out = a.conclude(t0, true);
    let e = &out.events[0];
    assert_eq!(int(e, "/n"), 1);
    assert!(matches!(get(e, "/from"), Some(Value::Timestamp(_))));
    assert!(matches!(get(e, "/stats/to"), Some(Value::Timestamp(_))));
    assert!(get(e, "/count").is_none() && get(e, "/start_time").is_none());
}

#[test]
fn sum_keeps_integers_until_a_float_and_skips_non_numbers() {
    let a = agg("type: aggregate\nidentification_keys: [/h]\naction: {sum: {key: /bytes, sum_key: /total}}");
    let t0 = Instant::now();
    feed(
        &a,
        t0,
        &[
            r#"{"h":"ints","bytes":5}"#,
            r#"{"h":"ints","bytes":7}"#,
            r#"{"h":"mixed","bytes":1}"#,
            r#"{"h":"mixed","bytes":0.5}"#,
            r#"{"h":"mixed","bytes":"12"}"#,
            r#"{"h":"mixed"}"#,
        ],
    );
    let out = a.conclude(t0, true);
    let g = by(&out.events, "/h");
    assert_eq!(get(&g["ints"], "/total"), Some(&Value::Int(12)));
    assert_eq!(int(&g["ints"], "/count"), 2);
    assert_eq!(get(&g["mixed"], "/total"), Some(&Value::Float(1.5)));
    assert_eq!(int(&g["mixed"], "/count"), 4);
    assert_eq!(a.values_skipped(), 2);
}

#[test]
fn put_all_merges_the_groups_events_later_values_winning() {
    let a = agg("type: aggregate\nidentification_keys: [/id]\naction: put_all");
    let t0 = Instant::now();
    feed(&a, t0, &[r#"{"id":1,"a":"first","b":2}"#, r#"{"id":2,"a":"other"}"#, r#"{"id":1,"a":"second","c":true}"#]);
    let out = a.conclude(t0, true);
    let g = by(&out.events, "/id");
    let one = &g["1"];
    assert_eq!((text(one, "/a"), int(one, "/b"), get(one, "/c")), ("second".into(), 2, Some(&Value::Bool(true))));
    assert!(matches!(get(one, "/@timestamp"), Some(Value::Timestamp(_))));
    assert_eq!(text(&g["2"], "/a"), "other");
}

#[test]
fn histogram_reports_cumulative_buckets() {
    let a = agg(
        "type: aggregate\nidentification_keys: [/svc]\naction: {histogram: {key: /latency, buckets: [0.1, 0.5, 1]}}",
    );
    let t0 = Instant::now();
    let lines: Vec<String> =
        [0.05, 0.1, 0.3, 0.7, 2.0].iter().map(|l| format!(r#"{{"svc":"api","latency":{l}}}"#)).collect();
    let mut jsons: Vec<&str> = lines.iter().map(String::as_str).collect();
    jsons.push(r#"{"svc":"api","latency":"slow"}"#);
    let (left, c) = feed(&a, t0, &jsons);
    assert!(left.is_empty());
    assert_eq!(c.consumed, 6);
    let out = a.conclude(t0, true);
    let e = &out.events[0];
    assert_eq!(text(e, "/svc"), "api");
    assert_eq!(int(e, "/count"), 5);
    assert_eq!(get(e, "/min"), Some(&Value::Float(0.05)));
    assert_eq!(get(e, "/max"), Some(&Value::Float(2.0)));
    let Some(Value::Float(sum)) = get(e, "/sum") else { panic!("sum") };
    assert!((sum - 3.15).abs() < 1e-9);
    let buckets: Vec<(String, i64)> =
        (0..3).map(|i| (text(e, &format!("/buckets/{i}/le")), int(e, &format!("/buckets/{i}/count")))).collect();
    assert_eq!(buckets, vec![("0.1".to_string(), 2), ("0.5".to_string(), 3), ("1.0".to_string(), 4)]);
    assert!(get(e, "/buckets/3").is_none());
    assert!(matches!(get(e, "/start_time"), Some(Value::Timestamp(_))));
    assert_eq!(a.values_skipped(), 1);
}

#[test]
fn remove_duplicates_keeps_the_first_of_each_group_in_order() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: remove_duplicates\ngroup_duration: 10s");
    let t0 = Instant::now();
    let (left, c) =
        feed(&a, t0, &[r#"{"k":"a","i":0}"#, r#"{"k":"b","i":1}"#, r#"{"k":"a","i":2}"#, r#"{"k":"c","i":3}"#]);
    assert_eq!(left.iter().map(|e| int(e, "/i")).collect::<Vec<_>>(), vec![0, 1, 3]);
    assert_eq!(c, Consumed { consumed: 0, dropped: 1, missing_keys: 0 });
    let (left, _) = feed(&a, t0 + secs(5.0), &[r#"{"k":"a","i":4}"#, r#"{"k":"d","i":5}"#]);
    assert_eq!(left.iter().map(|e| int(e, "/i")).collect::<Vec<_>>(), vec![5]);
    // The groups of t0 are gone at t0 + 10s: `a` is new again; nothing is emitted.
    let out = a.conclude(t0 + secs(10.0), false);
    assert!(out.events.is_empty() && out.acks.is_empty());
    assert_eq!(a.stats().groups_open, 1);
    let (left, _) = feed(&a, t0 + secs(10.0), &[r#"{"k":"a","i":6}"#, r#"{"k":"d","i":7}"#]);
    assert_eq!(left.iter().map(|e| int(e, "/i")).collect::<Vec<_>>(), vec![6]);
}

#[test]
fn rate_limiter_lets_events_per_second_through_per_group() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: {rate_limiter: {events_per_second: 2}}");
    let t0 = Instant::now();
    let five = [r#"{"k":"a"}"#; 5];
    let (left, c) = feed(&a, t0, &five);
    assert_eq!((left.len(), c.dropped), (2, 3));
    let (left, _) = feed(&a, t0, &[r#"{"k":"b"}"#, r#"{"k":"a"}"#]);
    assert_eq!(left.len(), 1, "b has a bucket of its own, a's is empty");
    let (left, _) = feed(&a, t0 + secs(0.5), &five);
    assert_eq!(left.len(), 1, "half a second refills one token");
    let (left, _) = feed(&a, t0 + secs(10.0), &five);
    assert_eq!(left.len(), 2, "the bucket holds at most one second's worth");
    let slow = agg("type: aggregate\nidentification_keys: [/k]\naction: {rate_limiter: {events_per_second: 0.5}}");
    assert_eq!(feed(&slow, t0, &five).0.len(), 1, "a rate under one still lets the first event through");
    assert_eq!(feed(&slow, t0 + secs(1.0), &five).0.len(), 0);
    assert_eq!(feed(&slow, t0 + secs(2.0), &five).0.len(), 1);
}

#[test]
fn percent_sampler_keeps_its_share_deterministically() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: {percent_sampler: {percent: 25}}");
    let t0 = Instant::now();
    let lines: Vec<String> = (0..8).map(|i| format!(r#"{{"k":"a","i":{i}}}"#)).collect();
    let jsons: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (left, c) = feed(&a, t0, &jsons);
    assert_eq!(left.iter().map(|e| int(e, "/i")).collect::<Vec<_>>(), vec![0, 4]);
    assert_eq!(c.dropped, 6);
    let all_kept = agg("type: aggregate\nidentification_keys: [/k]\naction: {percent_sampler: {percent: 100}}");
    assert_eq!(feed(&all_kept, t0, &jsons).0.len(), 8);
}

#[test]
fn groups_conclude_by_time_oldest_first() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: count\ngroup_duration: 10s");
    let t0 = Instant::now();
    feed(&a, t0, &[r#"{"k":"a"}"#]);
    feed(&a, t0 + secs(5.0), &[r#"{"k":"b"}"#, r#"{"k":"a"}"#]);
    let out = a.conclude(t0 + secs(10.0), false);
    assert_eq!(out.events.len(), 1);
    assert_eq!((text(&out.events[0], "/k"), int(&out.events[0], "/count")), ("a".into(), 2));
    // A new `a` group opens after its old one concluded.
    feed(&a, t0 + secs(11.0), &[r#"{"k":"a"}"#]);
    let out = a.conclude(t0 + secs(15.0), false);
    assert_eq!(out.events.iter().map(|e| text(e, "/k")).collect::<Vec<_>>(), vec!["b"]);
    let out = a.conclude(t0 + secs(21.0), false);
    assert_eq!((text(&out.events[0], "/k"), int(&out.events[0], "/count")), ("a".into(), 1));
    assert_eq!(a.stats().groups_open, 0);
}

#[test]
fn max_groups_concludes_the_oldest_group_early() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: count\nmax_groups: 2\ngroup_duration: 1m");
    let t0 = Instant::now();
    feed(&a, t0, &[r#"{"k":"a"}"#, r#"{"k":"a"}"#]);
    feed(&a, t0 + secs(1.0), &[r#"{"k":"b"}"#]);
    feed(&a, t0 + secs(2.0), &[r#"{"k":"c"}"#, r#"{"k":"b"}"#]);
    let s = a.stats();
    assert_eq!((s.groups_open, s.groups_evicted), (2, 1));
    // The evicted group is emitted by the next conclusion, long before its time.
    let out = a.conclude(t0 + secs(3.0), false);
    assert_eq!(out.events.len(), 1);
    assert_eq!((text(&out.events[0], "/k"), int(&out.events[0], "/count")), ("a".into(), 2));
    let out = a.conclude(t0 + secs(3.0), true);
    let g = by(&out.events, "/k");
    assert_eq!((int(&g["b"], "/count"), int(&g["c"], "/count")), (2, 1));
    let s = a.stats();
    assert_eq!((s.groups_concluded, s.groups_evicted, s.events_consumed, s.events_emitted), (3, 1, 5, 3));
}

#[test]
fn large_tables_are_sharded_and_bounded_exactly() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: count\nmax_groups: 5000\ngroup_duration: 1m");
    assert_eq!(a.table.shard_count(), 4);
    let t0 = Instant::now();
    let lines: Vec<String> = (0..6000).map(|i| format!(r#"{{"k":{i}}}"#)).collect();
    let jsons: Vec<&str> = lines.iter().map(String::as_str).collect();
    feed(&a, t0, &jsons);
    let s = a.stats();
    assert_eq!((s.groups_open, s.groups_evicted), (5000, 1000));
    let total: i64 = a.conclude(t0, true).events.iter().map(|e| int(e, "/count")).sum();
    assert_eq!(total, 6000, "nothing is lost at the bound");
}

#[test]
fn acks_are_held_until_their_groups_are_emitted() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: count\ngroup_duration: 10s");
    let tick = a.tick();
    let t0 = Instant::now();
    let (ack1, mut rx1) = Acker::with_notify(3);
    let mut first = batch(&[r#"{"k":"a"}"#, r#"{"k":"a"}"#, r#"{"k":"b"}"#]);
    let mut acks = AckSet::of(&ack1, 3);
    a.consume_at(t0, &mut first, &all, &mut acks);
    assert!(acks.is_empty() && first.is_empty(), "every event and its ack are taken");
    let (ack2, mut rx2) = Acker::with_notify(2);
    let mut second = batch(&[r#"{"k":"c"}"#, r#"{"skip":true}"#]);
    let mut acks = AckSet::of(&ack2, 2);
    a.consume_at(t0 + secs(6.0), &mut second, &|e: &Event| get(e, "/skip").is_none(), &mut acks);
    assert_eq!((second.len(), acks.covered()), (1, 1));
    acks.complete(); // the worker handles the event that passed
    assert_eq!(ack2.pending(), 1);

    let out = a.conclude(t0 + secs(10.0), false);
    // a and b are emitted, and their acks may come with them or later, never before.
    assert_eq!(out.events.len(), 2);
    out.acks.complete();
    let out = a.conclude(t0 + secs(10.0) + tick, false);
    assert!(out.events.is_empty());
    assert_eq!(out.acks.covered(), 3);
    assert!(rx1.try_recv().is_err(), "held until the emitted events are handled");
    out.acks.complete();
    assert_eq!(rx1.try_recv().ok(), Some(AckOutcome::Handled));
    assert!(rx2.try_recv().is_err(), "c's group is still open");

    // Shutdown: every group concludes and every held ack comes back.
    let out = a.conclude(t0 + secs(11.0), true);
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.acks.covered(), 1);
    out.acks.complete();
    assert_eq!(rx2.try_recv().ok(), Some(AckOutcome::Handled));
    assert_eq!(a.stats().groups_open, 0);
    assert!(a.conclude(t0 + secs(100.0), true).acks.is_empty());
}

/// Random batches, keys, clocks (conclusions that lag the consumers included) and evictions:
/// at every point, the acks released for a batch never outnumber its events already emitted.
#[test]
fn acks_never_come_back_before_their_events_are_emitted() {
    for (max_groups, keys) in [(3, 6), (40, 200), (4096, 9000)] {
        let a = agg(&format!(
            "type: aggregate\nidentification_keys: [/k]\naction: put_all\ngroup_duration: 200ms\nmax_groups: {max_groups}"
        ));
        let mut rng = sluice_testkit::Rng::from_env();
        let mut next = move || rng.next_u64();
        let t0 = Instant::now();
        let mut t = t0;
        let mut batches: Vec<(Acker, usize)> = Vec::new();
        let mut emitted: Vec<usize> = Vec::new();
        let count_emitted = |events: &[Event], emitted: &mut Vec<usize>| {
            for e in events {
                for (name, _) in e.fields.iter() {
                    if let Some(b) = name.strip_prefix('e').and_then(|r| r.split('_').next()) {
                        emitted[b.parse::<usize>().unwrap()] += 1;
                    }
                }
            }
        };
        for step in 0..300 {
            t += Duration::from_millis(next() % 40);
            let id = batches.len();
            let n = 1 + (next() % 50) as usize;
            let mut events: Vec<Event> = (0..n)
                .map(|i| {
                    let mut e = Event::new(Map::new());
                    e.fields.insert("k", Value::Int((next() % keys) as i64));
                    e.fields.insert(format!("e{id}_{i}").as_str(), Value::Bool(true));
                    e
                })
                .collect();
            let (acker, _) = Acker::with_notify(n);
            let mut acks = AckSet::of(&acker, n);
            // Now and then a batch read the clock a while before it got to the table.
            let read = if next() % 5 == 0 { t.checked_sub(Duration::from_millis(next() % 30)).unwrap_or(t) } else { t };
            let c = a.consume_at(read, &mut events, &all, &mut acks);
            assert_eq!(c.consumed as usize, n);
            batches.push((acker, n));
            emitted.push(0);
            if step % 3 == 0 {
                let lag = Duration::from_millis(next() % 60);
                let at = if next() % 4 == 0 { t.checked_sub(lag).unwrap_or(t) } else { t + lag };
                let out = a.conclude(at, false);
                count_emitted(&out.events, &mut emitted);
                out.acks.complete();
                for (b, (acker, n)) in batches.iter().enumerate() {
                    let released = n - acker.pending();
                    assert!(released <= emitted[b], "batch {b}: {released} acks back, {} emitted", emitted[b]);
                }
            }
        }
        let out = a.conclude(t, true);
        count_emitted(&out.events, &mut emitted);
        out.acks.complete();
        for (b, (acker, n)) in batches.iter().enumerate() {
            assert_eq!((acker.pending(), emitted[b]), (0, *n), "batch {b}");
        }
        assert_eq!(a.stats().groups_open, 0);
    }
}

#[test]
fn events_not_matching_aggregate_when_pass_in_order() {
    let a = agg("type: aggregate\nidentification_keys: [/k]\naction: count\naggregate_when: '/level == \"error\"'");
    let t0 = Instant::now();
    let mut events = batch(&[
        r#"{"k":"a","level":"info","i":0}"#,
        r#"{"k":"a","level":"error","i":1}"#,
        r#"{"k":"b","level":"debug","i":2}"#,
        r#"{"k":"a","level":"error","i":3}"#,
        r#"{"k":"c","level":"error","i":4}"#,
        r#"{"k":"c","level":"warn","i":5}"#,
    ]);
    let original = events.clone();
    let (acker, _rx) = Acker::with_notify(6);
    let mut acks = AckSet::of(&acker, 6);
    let c = a.consume_at(t0, &mut events, &|e: &Event| int(e, "/i") != 4, &mut acks);
    assert_eq!(c.consumed, 2);
    assert_eq!(events.iter().map(|e| int(e, "/i")).collect::<Vec<_>>(), vec![0, 2, 4, 5]);
    for e in &events {
        assert_eq!(Some(e), original.iter().find(|o| int(o, "/i") == int(e, "/i")), "untouched");
    }
    assert_eq!(acks.covered(), 4);
}

#[test]
fn events_missing_keys_form_their_own_groups() {
    let a = agg("type: aggregate\nidentification_keys: [/user, /host]\naction: count");
    let t0 = Instant::now();
    let (_, c) = feed(
        &a,
        t0,
        &[
            r#"{"user":"a"}"#,
            r#"{"user":"a","host":null}"#,
            r#"{"user":"a"}"#,
            r#"{"host":"h"}"#,
            r#"{"other":1}"#,
            r#"{"nothing":2}"#,
        ],
    );
    assert_eq!(c.missing_keys, 5);
    assert_eq!(a.stats().events_missing_keys, 5);
    let out = a.conclude(t0, true);
    assert_eq!(out.events.len(), 4);
    let mut shapes: Vec<(Option<String>, Option<String>, i64)> = out
        .events
        .iter()
        .map(|e| (get(e, "/user").map(|v| v.to_text()), get(e, "/host").map(|v| v.to_text()), int(e, "/count")))
        .collect();
    shapes.sort();
    let null = Some(Value::Null.to_text());
    assert_eq!(
        shapes,
        vec![(None, None, 2), (None, Some("h".into()), 1), (Some("a".into()), None, 2), (Some("a".into()), null, 1)]
    );
}

/// Consumers on several threads and a concluding thread at once: every event is counted once
/// and every acknowledgement comes back, the last ones at shutdown.
#[test]
fn concurrent_consumers_and_conclusions_lose_nothing() {
    let a = Arc::new(agg(
        "type: aggregate\nidentification_keys: [/k]\naction: count\ngroup_duration: 20ms\nmax_groups: 3000",
    ));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let concluder = {
        let (a, done) = (a.clone(), done.clone());
        std::thread::spawn(move || {
            let mut emitted = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let out = a.conclude(Instant::now(), false);
                emitted.extend(out.events);
                out.acks.complete();
                std::thread::sleep(Duration::from_millis(2));
            }
            emitted
        })
    };
    let consumers: Vec<_> = (0..4)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut ackers = Vec::new();
                for b in 0..100 {
                    let mut events: Vec<Event> = (0..100)
                        .map(|i| {
                            let mut e = Event::new(Map::new());
                            e.fields.insert("k", Value::Int(((t * 7 + b * 13 + i) % 5000) as i64));
                            e
                        })
                        .collect();
                    let (acker, _) = Acker::with_notify(100);
                    let mut acks = AckSet::of(&acker, 100);
                    a.consume(&mut events, &all, &mut acks);
                    assert!(events.is_empty() && acks.is_empty());
                    ackers.push(acker);
                }
                ackers
            })
        })
        .collect();
    let ackers: Vec<Acker> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
    done.store(true, Ordering::Relaxed);
    let mut emitted = concluder.join().unwrap();
    let out = a.conclude(Instant::now(), true);
    emitted.extend(out.events);
    out.acks.complete();
    assert_eq!(emitted.iter().map(|e| int(e, "/count")).sum::<i64>(), 40_000);
    assert!(ackers.iter().all(|a| a.pending() == 0));
    let s = a.stats();
    assert_eq!((s.groups_open, s.events_consumed, s.events_emitted), (0, 40_000, emitted.len() as u64));
}
