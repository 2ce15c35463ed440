//! The engine's nodes (`hosts:`), taken in turn. A host whose request fails at the transport
//! level (refused, reset, timed out) or answers 5xx as a whole is set aside: for 1 s, doubling
//! up to 60 s while it keeps failing. Once its time is up, one request is let through to it as
//! a probe; a success takes it back, a failure sets it aside for longer. When every host is
//! set aside, the one due back first is used anyway, so the output never waits on its own
//! bookkeeping. Going down and coming back are logged once each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reqwest::Url;

const FIRST_PAUSE: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

pub struct Hosts {
    hosts: Vec<Host>,
    next: AtomicUsize,
}

struct Host {
    /// The `_bulk` endpoint.
    bulk: Url,
    /// As configured, for messages.
    name: String,
    state: Mutex<HostState>,
}

#[derive(Default)]
struct HostState {
    /// Set aside until then.
    down_until: Option<Instant>,
    /// Failures in a row.
    failures: u32,
    /// A probe is out.
    probing: bool,
}

impl Hosts {
    /// `urls`: base URLs (`http://es-1:9200`, possibly with a path prefix).
    pub fn new(urls: &[Url]) -> Hosts {
        let hosts = urls
            .iter()
            .map(|u| {
                let mut base = u.clone();
                if !base.path().ends_with('/') {
                    base.set_path(&format!("{}/", base.path()));
                }
                let name = u.as_str().trim_end_matches('/').to_string();
                Host {
                    bulk: base.join("_bulk").expect("a base URL joins a relative path"),
                    name,
                    state: Mutex::default(),
                }
            })
            .collect();
        Hosts { hosts, next: AtomicUsize::new(0) }
    }

    /// The host for the next request.
    pub fn pick(&self) -> usize {
        let n = self.hosts.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut soonest: Option<(Instant, usize)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let mut s = self.hosts[i].state.lock();
            match s.down_until {
                None => return i,
                Some(until) if until <= now && !s.probing => {
                    s.probing = true;
                    return i;
                }
                Some(until) => {
                    if soonest.is_none_or(|(t, _)| until < t) {
                        soonest = Some((until, i));
                    }
                }
            }
        }
        soonest.map_or(start % n, |(_, i)| i)
    }

    pub fn bulk_url(&self, i: usize) -> &Url {
        &self.hosts[i].bulk
    }

    pub fn name(&self, i: usize) -> &str {
        &self.hosts[i].name
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Hosts not set aside now.
    pub fn up(&self) -> usize {
        self.hosts.iter().filter(|h| h.state.lock().down_until.is_none()).count()
    }

    /// A request to host `i` failed in a way that is the host's (transport, 5xx): it is set
    /// aside. True when it just went down (worth a log line).
    pub fn failed(&self, i: usize) -> bool {
        let mut s = self.hosts[i].state.lock();
        let was_up = s.down_until.is_none();
        s.failures = s.failures.saturating_add(1);
        let pause = FIRST_PAUSE.saturating_mul(1 << (s.failures - 1).min(6)).min(LONGEST_PAUSE);
        s.down_until = Some(Instant::now() + pause);
        s.probing = false;
        was_up && self.hosts.len() > 1
    }

    /// A request to host `i` got an answer. True when it was set aside (worth a log line).
    pub fn succeeded(&self, i: usize) -> bool {
        let mut s = self.hosts[i].state.lock();
        let was_down = s.down_until.is_some();
        *s = HostState::default();
        was_down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Hosts {
        let urls: Vec<Url> = (0..n).map(|i| Url::parse(&format!("http://es-{i}:9200")).unwrap()).collect();
        Hosts::new(&urls)
    }

    #[test]
    fn round_robin_and_bulk_urls() {
        let h = hosts(3);
        let picks: Vec<usize> = (0..6).map(|_| h.pick()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert_eq!(h.bulk_url(1).as_str(), "http://es-1:9200/_bulk");
        let prefixed = Hosts::new(&[Url::parse("https://proxy:443/search").unwrap()]);
        assert_eq!(prefixed.bulk_url(0).as_str(), "https://proxy/search/_bulk");
        assert_eq!(prefixed.name(0), "https://proxy/search");
    }

    #[test]
    fn a_failed_host_is_set_aside_then_probed_once() {
        let h = hosts(2);
        assert!(h.failed(1), "went down");
        assert!(!h.failed(1), "already down");
        assert_eq!(h.up(), 1);
        assert!((0..5).all(|_| h.pick() == 0), "the failed host is skipped");
        // Its time is up: one probe goes to it, the others still avoid it.
        h.hosts[1].state.lock().down_until = Some(Instant::now() - Duration::from_millis(1));
        let picks: Vec<usize> = (0..4).map(|_| h.pick()).collect();
        assert_eq!(picks.iter().filter(|&&i| i == 1).count(), 1, "{picks:?}");
        assert!(h.succeeded(1), "it came back");
        assert_eq!(h.up(), 2);
    }

    #[test]
    fn with_every_host_down_the_one_due_first_is_used() {
        let h = hosts(2);
        h.failed(0);
        h.failed(0);
        h.failed(1);
        assert_eq!(h.pick(), 1, "host 1 is due back first");
        let h1 = hosts(1);
        assert!(!h1.failed(0), "a lone host going down is the request's failure to log, not the pool's");
        assert_eq!(h1.pick(), 0);
    }

    #[test]
    fn pauses_double_up_to_a_minute() {
        let h = hosts(1);
        for _ in 0..10 {
            h.failed(0);
        }
        let until = h.hosts[0].state.lock().down_until.unwrap();
        let pause = until - Instant::now();
        assert!(pause > Duration::from_secs(59) && pause <= LONGEST_PAUSE, "{pause:?}");
    }
}
