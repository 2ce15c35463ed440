//! Unit tests of the `stdin` input's settings and links.

use super::*;
use crate::codec::Codec;
use crate::tcp::tests::spec;

#[test]
fn defaults_are_text_lines_cut_at_one_mebibyte() {
    let c = config::read(&spec("{type: stdin}")).unwrap();
    assert_eq!(c.codec, Codec::default());
    assert_eq!(c.max_line_bytes.0, 1 << 20);
    let c = config::read(&spec("{type: stdin, codec: json_lines, max_line_bytes: 4KiB}")).unwrap();
    assert_eq!(c.codec, Codec::JsonLines);
    assert_eq!(c.max_line_bytes.0, 4 << 10);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let e = config::read(&spec("{type: stdin, max_line: 10}")).unwrap_err();
    assert!(e.to_string().contains("max_line"), "{e}");
}

#[test]
fn it_takes_the_process_standard_input() {
    assert_eq!(links(&spec("{type: stdin}")), vec![Link::TakesStdin]);
}
