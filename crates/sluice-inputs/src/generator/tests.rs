//! Unit tests of the `generator` input's settings.

use super::*;
use crate::tcp::tests::spec;

#[test]
fn defaults_make_numbered_events_forever_in_batches_of_a_thousand() {
    let c = config::read(&spec("{type: generator}")).unwrap();
    assert_eq!((c.count, c.rate, c.batch_size, c.sequence), (0, 0, 1000, true));
    assert!(c.message.is_none() && c.lines.is_none() && c.file.is_none());
}

#[test]
fn one_source_of_lines_at_most() {
    let e = config::read(&spec("{type: generator, message: a, lines: [b]}")).unwrap_err();
    assert!(e.message.contains("not several"), "{e}");
    let e = config::read(&spec("{type: generator, lines: []}")).unwrap_err();
    assert!(e.path.ends_with(".lines") && e.message.contains("at least one line"), "{e}");
}

#[test]
fn an_unreadable_file_and_an_empty_batch_are_refused_by_key() {
    let e = config::read(&spec("{type: generator, file: /nonexistent/lines.txt}")).unwrap_err();
    assert!(e.path.ends_with(".file") && e.message.contains("cannot read /nonexistent/lines.txt"), "{e}");
    let e = config::read(&spec("{type: generator, batch_size: 0}")).unwrap_err();
    assert!(e.path.ends_with(".batch_size"), "{e}");
}
