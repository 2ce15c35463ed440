//! Unit tests of the `blackhole` output.

use super::*;
use crate::test_support::{context, spec};

#[tokio::test]
async fn it_takes_everything_and_counts_it() {
    let out = Blackhole {
        ctx: context("p", "blackhole"),
        print_interval: None,
        total: AtomicU64::new(0),
        last_print: Mutex::new((Instant::now(), 0)),
    };
    let events = [Event::from_message_at("a", 0), Event::from_message_at("b", 0)];
    let refs: Vec<&Event> = events.iter().collect();
    assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    assert!(out.send(&refs[..1]).await.unwrap().rejected.is_empty());
    assert_eq!(out.total.load(Ordering::Relaxed), 3);
}

#[test]
fn print_interval_is_read_and_an_unknown_key_refused() {
    let c = config::read(&spec("{type: blackhole, print_interval: 5s}")).unwrap();
    assert_eq!(c.print_interval.map(|d| d.0), Some(Duration::from_secs(5)));
    assert!(config::read(&spec("{type: blackhole}")).unwrap().print_interval.is_none());
    let e = config::read(&spec("{type: blackhole, interval: 5s}")).unwrap_err();
    assert!(e.to_string().contains("interval"), "{e}");
}
