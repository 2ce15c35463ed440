//! Where each component stands in its life: starting, running, stopped, or failed with the
//! reason.
//!
//! The engine waits on it at start (an input that binds an address is running only once it
//! has bound it, so a taken port stops the start instead of leaving a node that cannot hear),
//! and the monitoring API reads it for `/health`. A component fails once: the first reason is
//! kept, later ones are not (the first is the one an operator needs).

use parking_lot::Mutex;
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    Starting,
    Running,
    /// Ended without being asked to: the reason.
    Failed(String),
    /// Ended: asked to, or its input ran out (a generator's count, stdin's end).
    Stopped,
}

impl Lifecycle {
    pub fn as_str(&self) -> &'static str {
        match self {
            Lifecycle::Starting => "starting",
            Lifecycle::Running => "running",
            Lifecycle::Failed(_) => "failed",
            Lifecycle::Stopped => "stopped",
        }
    }
}

/// One component's [`Lifecycle`], set by whoever runs it and awaited by whoever starts it.
#[derive(Debug)]
pub struct Health {
    state: watch::Sender<Lifecycle>,
    /// Serialises changes, so that a failure is never overwritten by a late "running".
    change: Mutex<()>,
}

impl Default for Health {
    fn default() -> Health {
        Health { state: watch::Sender::new(Lifecycle::Starting), change: Mutex::new(()) }
    }
}

impl Health {
    pub fn get(&self) -> Lifecycle {
        self.state.borrow().clone()
    }

    /// Started (bound its address, opened what it reads); ignored once failed or stopped.
    pub fn running(&self) {
        let _one = self.change.lock();
        self.state.send_if_modified(|s| {
            let starting = *s == Lifecycle::Starting;
            if starting {
                *s = Lifecycle::Running;
            }
            starting
        });
    }

    /// Ended with `reason`; the first failure is the one kept.
    pub fn failed(&self, reason: impl Into<String>) {
        let _one = self.change.lock();
        self.state.send_if_modified(|s| {
            let first = !matches!(s, Lifecycle::Failed(_));
            if first {
                *s = Lifecycle::Failed(reason.into());
            }
            first
        });
    }

    /// Ended as asked, or ran out; a failure stays a failure.
    pub fn stopped(&self) {
        let _one = self.change.lock();
        self.state.send_if_modified(|s| {
            let change = matches!(s, Lifecycle::Starting | Lifecycle::Running);
            if change {
                *s = Lifecycle::Stopped;
            }
            change
        });
    }

    /// Waits until the component is no longer starting, and returns where it went.
    pub async fn settled(&self) -> Lifecycle {
        let mut rx = self.state.subscribe();
        match rx.wait_for(|s| *s != Lifecycle::Starting).await {
            Ok(s) => s.clone(),
            // The sender is `self`, alive for as long as this borrow.
            Err(_) => self.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_is_kept_whatever_comes_after_it() {
        let h = Health::default();
        h.failed("cannot listen on 127.0.0.1:1: Address already in use");
        h.running();
        h.stopped();
        h.failed("a later reason");
        assert_eq!(h.get(), Lifecycle::Failed("cannot listen on 127.0.0.1:1: Address already in use".into()));
        assert_eq!(h.settled().await, h.get());
    }

    #[tokio::test]
    async fn settled_waits_for_the_component_to_leave_starting() {
        let h = std::sync::Arc::new(Health::default());
        let waiter = tokio::spawn({
            let h = h.clone();
            async move { h.settled().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "settled returned while still starting");
        h.running();
        assert_eq!(waiter.await.unwrap(), Lifecycle::Running);
        h.stopped();
        assert_eq!(h.get(), Lifecycle::Stopped);
        h.running();
        assert_eq!(h.get(), Lifecycle::Stopped, "a stopped component came back to life");
    }
}
