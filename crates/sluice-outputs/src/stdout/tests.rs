//! Unit tests of the `stdout` output.

use std::io::ErrorKind;
use std::pin::Pin;
use std::task::{Context, Poll};

use parking_lot::Mutex;

use super::*;

/// A sink that fails its first writes with the given errors, then keeps what it is given.
struct Flaky {
    failures: Vec<ErrorKind>,
    kept: Arc<Mutex<Vec<u8>>>,
}

impl AsyncWrite for Flaky {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if !self.failures.is_empty() {
            return Poll::Ready(Err(self.failures.remove(0).into()));
        }
        self.kept.lock().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn output(yaml: &str, failures: Vec<ErrorKind>) -> (Stdout, Arc<Mutex<Vec<u8>>>) {
    let spec = crate::test_support::spec(yaml);
    let ctx = crate::test_support::context("test", "stdout");
    let kept = Arc::new(Mutex::new(Vec::new()));
    let sink = Box::new(Flaky { failures, kept: kept.clone() });
    (build_with(&spec, ctx, sink).unwrap_or_else(|e| panic!("{e}")), kept)
}

fn events() -> Vec<Event> {
    (0..2).map(|i| Event::from_message_at(format!("line {i}"), 0)).collect()
}

#[tokio::test]
async fn a_full_disk_under_a_redirected_stdout_is_retried_until_it_clears() {
    let (out, kept) = output(
        "{type: stdout, codec: text, retry: {initial_backoff: 1ms, max_backoff: 1ms}}",
        vec![ErrorKind::StorageFull, ErrorKind::StorageFull],
    );
    let events = events();
    let d = out.send(&events.iter().collect::<Vec<_>>()).await.unwrap();
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert_eq!(String::from_utf8(kept.lock().clone()).unwrap(), "line 0\nline 1\n");
    assert_eq!(out.ctx.metrics.retries.get(), 2);
    assert_eq!(out.ctx.metrics.bytes_out.get(), 14, "the batch once, not its failed attempts");
}

#[tokio::test]
async fn a_reader_gone_gives_the_batch_up_at_once() {
    let (out, kept) = output("{type: stdout}", vec![ErrorKind::BrokenPipe]);
    let events = events();
    let d = out.send(&events.iter().collect::<Vec<_>>()).await.unwrap();
    assert_eq!(d.rejected.len(), 2);
    assert!(d.rejected.iter().all(|r| !r.permanent && r.attempts == 1), "{:?}", d.rejected);
    assert!(kept.lock().is_empty());
    assert_eq!(out.ctx.metrics.retries.get(), 0);
    assert_eq!(out.ctx.metrics.bytes_out.get(), 0);
}

#[tokio::test]
async fn max_retries_bounds_the_wait() {
    let (out, _) = output(
        "{type: stdout, retry: {max_retries: 1, initial_backoff: 1ms}}",
        vec![ErrorKind::StorageFull, ErrorKind::Other, ErrorKind::StorageFull],
    );
    let events = events();
    let d = out.send(&events.iter().collect::<Vec<_>>()).await.unwrap();
    assert_eq!(d.rejected.len(), 2);
    assert!(d.rejected.iter().all(|r| !r.permanent && r.attempts == 2), "{:?}", d.rejected);
    assert_eq!(out.ctx.metrics.retries.get(), 1);
}
