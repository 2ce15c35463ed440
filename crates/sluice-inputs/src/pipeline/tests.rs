//! Unit tests of the `pipeline` input's settings and links.

use super::*;
use crate::tcp::tests::spec;

#[test]
fn it_serves_its_address() {
    let s = spec("{type: pipeline, address: audit}");
    assert_eq!(config::read(&s).unwrap().address, "audit");
    assert_eq!(links(&s), vec![Link::Serves { address: "audit".into(), key: "address" }]);
}

#[test]
fn an_empty_or_missing_address_is_refused() {
    let e = config::read(&spec("{type: pipeline, address: ''}")).unwrap_err();
    assert!(e.path.ends_with(".address") && e.message == "must not be empty", "{e}");
    assert!(config::read(&spec("{type: pipeline}")).is_err());
    assert!(links(&spec("{type: pipeline}")).is_empty(), "an unreadable section links nothing");
}
