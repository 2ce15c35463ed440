//! Unit tests of the `drop` processor.

use crate::{Verdict, build, spec_from_yaml};
use sluice_core::Event;

#[test]
fn every_event_is_dropped() {
    let p = build(&spec_from_yaml("type: drop").unwrap()).unwrap();
    let mut e = Event::from_message_at("x", 0);
    assert_eq!(p.process(&mut e), Verdict::Drop);
}

#[test]
fn a_key_of_its_own_is_refused() {
    let e = build(&spec_from_yaml("type: drop\nreason: noise").unwrap()).err().expect("refused");
    assert!(e.to_string().contains("reason"), "{e}");
}
