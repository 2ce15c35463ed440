//! Cluster mode, the owner's side: where events forwarded by peers enter a pipeline.
//!
//! They go into a queue of their own, of the pipeline's queue kind and settings (persisted
//! beside it, in `<path>.forwarded`), so they are taken exactly as the pipeline's own inputs'
//! events are: the peer hears "taken" once they are durable there (persisted) or delivered
//! (memory). The pipeline's workers for that queue start right after the forwarding stage and
//! never forward again. Events take their room in the node's memory budget like an input's.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::metrics::PipelineMetrics;
use sluice_core::{AckSet, Batch, Event, MemoryBudget, Queue};

pub struct InboundQueue {
    pub queue: Arc<dyn Queue>,
    pub memory: Arc<MemoryBudget>,
    pub metrics: Arc<PipelineMetrics>,
}

#[async_trait]
impl sluice_cluster::Inbound for InboundQueue {
    async fn take(&self, events: Vec<Event>, acks: AckSet) -> Result<(), String> {
        let n = events.len();
        let size: usize = events.iter().map(Event::memory_size).sum();
        // A batch larger than the whole budget is taken over it rather than never: the peer
        // made it from events this node's peers took within their own budgets.
        let charge = match self.memory.charge(size, None).await {
            Ok(c) => c,
            Err(_) => self.memory.force(size),
        };
        self.queue
            .push(Batch::new(events, acks, size).with_memory(charge))
            .await
            .map_err(|e| format!("the pipeline's forwarded-events queue: {e}"))?;
        self.metrics.received.add(n as u64);
        Ok(())
    }
}
