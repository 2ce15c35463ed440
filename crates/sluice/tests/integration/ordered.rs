//! `ordered:` on a pipeline: with `true`, 50,000 lines through a persisted queue (which has
//! several shards by default) leave in the order they came in; with `auto` and more than one
//! worker the start-up log says events may be reordered.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::Sluice;

fn run(config: &str, lines: usize) -> (Vec<u64>, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, (0..lines).map(|i| format!("{i}\n")).collect::<String>()).unwrap();
    let mut s = Sluice::start_in(dir, config, Stdio::from(std::fs::File::open(&input).unwrap()));
    let (status, log) = s.wait(Duration::from_secs(120));
    assert!(status.success(), "{log}");
    let out = std::fs::read_to_string(s.path("out.log")).unwrap();
    let numbers = out.lines().map(|l| l.parse().unwrap_or_else(|_| panic!("not a number: {l}"))).collect();
    (numbers, log)
}

#[test]
fn ordered_true_keeps_the_order_through_a_persisted_queue() {
    let n = 50_000;
    let (numbers, log) = run(
        "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  main:
    ordered: true
    batch: {size: 100, delay: 1ms}
    queue: {type: persisted}
    inputs: [{type: stdin}]
    outputs: [{type: file, path: '{dir}/out.log', codec: text}]
",
        n,
    );
    assert_eq!(numbers.len(), n);
    let out_of_order = numbers.windows(2).filter(|w| w[1] != w[0] + 1).count();
    assert_eq!(out_of_order, 0, "every line follows the one before it");
    assert!(log.contains("ordered=true"), "{log}");
}

#[test]
fn auto_with_several_workers_says_order_is_not_kept() {
    let (numbers, log) = run(
        "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  main:
    workers: 2
    inputs: [{type: stdin}]
    outputs: [{type: file, path: '{dir}/out.log', codec: text}]
",
        1_000,
    );
    assert_eq!(numbers.len(), 1_000);
    assert!(log.contains("may leave this pipeline in another order"), "{log}");
    assert!(log.contains("ordered=false"), "{log}");
}
