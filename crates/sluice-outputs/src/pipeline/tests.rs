//! Unit tests of the `pipeline` output.

use super::*;

#[tokio::test]
async fn a_receiver_not_running_holds_the_batch_counting_a_retry_until_shutdown_aborts() {
    let ctx = crate::test_support::context("up", "pipeline");
    let (metrics, abort) = (ctx.metrics.clone(), ctx.abort.clone());
    let stall = StallLog::for_output(&ctx.metrics);
    let out = PipelineOutput { send_to: vec!["down".into()], stall, ctx };
    let event = Event::from_message_at("x", 0);
    let sending = tokio::spawn(async move { out.send(&[&event]).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while metrics.retries.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the wait was never counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!sending.is_finished(), "it waits for the receiver");
    assert_eq!(metrics.retries.get(), 1, "one wait, counted once");
    assert_eq!(metrics.output.state(), sluice_core::metrics::OutputState::Retrying);
    assert!(metrics.output.last_error().unwrap().message.contains("`down`"));
    abort.cancel();
    assert_eq!(sending.await.unwrap(), Err(Aborted));
}
