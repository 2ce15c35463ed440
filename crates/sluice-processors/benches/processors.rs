//! Per-event cost of the parsing processors on typical lines. Each iteration gets a fresh event
//! (cloned outside the timed part), as a worker would. `aggregate` is measured per batch, as
//! its worker calls it.

// The allocator the `sluice` binary uses.
sluice_alloc::install!();

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::{AckSet, Acker, Event, Value};
use sluice_processors::{Verdict, build, spec_from_yaml};

/// 12 fields, 250 bytes: what a shipper typically sends.
const JSON_LINE: &str = r#"{"@timestamp":"2026-11-21T07:00:00.123Z","host":"web-01.example.com","service":"checkout","level":"info","status":200,"bytes":5120,"duration_ms":12.5,"method":"GET","path":"/api/v1/cart/items","client":"10.0.100.217","user":"u-1842-euwest","ok":true}"#;

const SSH_LINE: &str = "Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster from 173.234.31.186";
const SSH_PATTERN: &str =
    r"'%{SYSLOGTIMESTAMP:ts} %{HOSTNAME:host} %{DATA:program}(?:\[%{POSINT:pid}\])?: %{GREEDYDATA:msg}'";

const APACHE_LINE: &str = "[Sun Dec 04 04:47:44 2005] [notice] workerEnv.init() ok /etc/httpd/conf/workers2.properties";

fn run(c: &mut Criterion, name: &str, yaml: &str, line: &str) {
    let p = build(&spec_from_yaml(yaml).unwrap()).unwrap();
    let event = Event::from_message_at(line, 0);
    let mut probe = event.clone();
    assert_eq!(p.process(&mut probe), Verdict::Keep, "{name} must match its line");
    c.bench_function(name, |b| {
        b.iter_batched(|| event.clone(), |mut e| black_box(p.process(black_box(&mut e))), BatchSize::SmallInput)
    });
}

/// `aggregate` with `count` over 10,000 distinct users, in batches of 1000 events, each batch
/// with an acker of its own. The groups outlive the run, so this is the steady state: every
/// event folds into an open group and its acknowledgement is held.
fn aggregate_count(c: &mut Criterion) {
    const KEYS: u64 = 10_000;
    const BATCH: usize = 1000;
    let p = build(
        &spec_from_yaml("type: aggregate\nidentification_keys: [/user]\naction: count\ngroup_duration: 1h").unwrap(),
    )
    .unwrap();
    let stateful = p.stateful().expect("aggregate is stateful");
    // Every key once per 10 batches, in a scattered order (7919 is prime to 10,000).
    let batches: Vec<Vec<Event>> = (0..KEYS as usize / BATCH)
        .map(|j| {
            (j * BATCH..(j + 1) * BATCH)
                .map(|i| {
                    let mut e = Event::from_message_at(SSH_LINE, 0);
                    e.fields.insert("user", Value::from(format!("user-{}", i as u64 * 7919 % KEYS)));
                    e
                })
                .collect()
        })
        .collect();
    let mut group = c.benchmark_group("aggregate");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut i = 0;
    group.bench_function("count_10k_keys_batch_1000", |b| {
        b.iter_batched(
            || {
                i += 1;
                let (acker, _) = Acker::with_notify(BATCH);
                (batches[i % batches.len()].clone(), AckSet::of(&acker, BATCH))
            },
            |(mut events, mut acks)| {
                let consumed = stateful.consume(&mut events, &|_| true, &mut acks);
                black_box((consumed, events, acks))
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
    // Checked only when the case ran (a filtered run, `-- date`, skips it).
    let open = stateful.stats().groups_open;
    assert!(open == 0 || open == KEYS, "{open} groups open after the benchmark, expected {KEYS}");
}

fn bench(c: &mut Criterion) {
    assert_eq!(JSON_LINE.len(), 250);
    run(c, "json_250b_12_fields", "type: json", JSON_LINE);
    run(c, "json_250b_12_fields_remove_source", "type: json\nremove_source: true", JSON_LINE);
    run(c, "grok_openssh", &format!("type: grok\nmatch: {{/message: {SSH_PATTERN}}}"), SSH_LINE);
    run(
        c,
        "grok_simple_regex_engine",
        "type: grok\nmatch: {/message: '%{WORD:a} %{WORD:b} %{GREEDYDATA:rest}'}",
        SSH_LINE,
    );
    run(c, "dissect_apache", "type: dissect\nmapping: {/message: '[%{ts}] [%{level}] %{msg}'}", APACHE_LINE);
    run(
        c,
        "date_joda_apache",
        "type: date\nsource: /message\nformats: ['[EEE MMM dd HH:mm:ss yyyy]']",
        &APACHE_LINE[..26],
    );
    run(c, "date_iso8601", "type: date\nsource: /message\nformats: [ISO8601]", "2026-11-21T07:00:00.123+02:00");
    run(
        c,
        "date_iso8601_zone_paris",
        "type: date\nsource: /message\nformats: [ISO8601]\ntimezone: Europe/Paris",
        "2026-11-21T07:00:00.123",
    );
    run(
        c,
        "date_joda_apache_zone_paris",
        "type: date\nsource: /message\nformats: ['[EEE MMM dd HH:mm:ss yyyy]']\ntimezone: Europe/Paris",
        &APACHE_LINE[..26],
    );
    run(
        c,
        "mutate_mixed",
        "type: mutate\nrename: {/message: /msg}\nadd: {/svc: checkout}\nuppercase: [/msg]\nadd_tag: [seen]",
        APACHE_LINE,
    );
}

criterion_group!(benches, bench, aggregate_count);
criterion_main!(benches);
