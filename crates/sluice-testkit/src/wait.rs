//! Bounded waiting for a condition to hold: the one polling loop of the tests, in a thread
//! ([`eventually`], [`wait_until`]) and in a tokio task ([`eventually_async`],
//! [`wait_until_async`], which sleep on tokio's clock, so a test with a paused clock advances).

use std::time::{Duration, Instant};

/// How often the condition is asked again.
const POLL: Duration = Duration::from_millis(20);

/// Asks `f` until it holds or `timeout` is up; whether it held (the caller's assertion says
/// what was expected). `f` is asked once more at the deadline, so a slow last step still counts.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(POLL);
    }
    f()
}

/// [`eventually`], panicking with `what` when `f` never held.
pub fn wait_until(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    assert!(eventually(timeout, f), "timed out after {timeout:?} waiting for {what}");
}

/// Asks `f` until it returns `Some` or `timeout` is up; the value, or `None`.
pub fn eventually_some<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(POLL);
    }
    f()
}

/// [`eventually`] in a tokio task: `f` is asked between `tokio::time::sleep`s, and `timeout`
/// is on tokio's clock.
pub async fn eventually_async(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(ASYNC_POLL).await;
    }
    f()
}

/// [`eventually_async`], panicking with `what` when `f` never held.
pub async fn wait_until_async(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    assert!(eventually_async(timeout, f).await, "timed out after {timeout:?} waiting for {what}");
}

/// How often an async condition is asked again: tasks are cheap to wake.
const ASYNC_POLL: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_once_the_condition_does() {
        let mut n = 0;
        assert!(eventually(Duration::from_secs(5), || {
            n += 1;
            n >= 3
        }));
        assert_eq!(n, 3);
        assert_eq!(eventually_some(Duration::from_secs(5), || Some(4)), Some(4));
    }

    #[test]
    fn gives_up_at_the_deadline() {
        let started = Instant::now();
        assert!(!eventually(Duration::from_millis(100), || false));
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(eventually_some::<u8>(Duration::from_millis(50), || None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_async_wait_runs_on_tokios_clock() {
        let started = tokio::time::Instant::now();
        assert!(!eventually_async(Duration::from_secs(3600), || false).await);
        assert!(started.elapsed() >= Duration::from_secs(3600), "an hour passed on the paused clock");
        let mut n = 0;
        wait_until_async("the third ask", Duration::from_secs(5), || {
            n += 1;
            n == 3
        })
        .await;
    }

    #[test]
    #[should_panic(expected = "waiting for the impossible")]
    fn wait_until_names_what_never_came() {
        wait_until("the impossible", Duration::from_millis(50), || false);
    }
}
