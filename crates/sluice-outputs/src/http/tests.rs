//! Unit tests of the `http` output.

use super::config::HttpConfig;
use super::*;
use crate::test_support::{context, spec};

#[test]
fn retry_after_reads_seconds_and_dates() {
    assert_eq!(retry_after(" 7 "), Some(Duration::from_secs(7)));
    let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    let d = retry_after(&later).unwrap();
    assert!(d > Duration::from_secs(25) && d <= Duration::from_secs(30), "{d:?}");
    assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "a date past is now");
    assert_eq!(retry_after("soon"), None);
}

fn method(yaml: &str) -> Result<HttpMethod, ConfigError> {
    spec(yaml).settings::<HttpConfig>().map(|c| c.method)
}

#[test]
fn methods_are_read_in_any_case() {
    assert_eq!(method("{type: http, url: 'http://x/'}").unwrap(), HttpMethod::Post);
    for (text, want) in [("put", HttpMethod::Put), ("PUT", HttpMethod::Put), ("Post", HttpMethod::Post)] {
        assert_eq!(method(&format!("{{type: http, url: 'http://x/', method: {text}}}")).unwrap(), want, "{text}");
    }
    let e = method("{type: http, url: 'http://x/', method: PATCH}").unwrap_err().to_string();
    assert!(e.contains("outputs[0].method") && e.contains("PATCH") && e.contains("expected `post` or `put`"), "{e}");
}

#[tokio::test]
async fn an_uppercase_method_builds() {
    let built = build(&spec("{type: http, url: 'http://x/', method: PUT}"), context("p", "http"));
    assert!(built.is_ok(), "{:?}", built.err());
}
