//! Cluster mode, the owner's side: where events forwarded by peers enter a pipeline.
//!
//! They go into a queue of their own, of the pipeline's queue kind and settings (persisted
//! beside it, in `<path>.forwarded`), so they are taken exactly as the pipeline's own inputs'
//! events are: the peer hears "taken" once they are durable there (persisted) or delivered
//! (memory). The pipeline's workers for that queue start right after the forwarding stage and
//! never forward again. Events take their room in the node's memory budget like an input's,
//! but never wait for it (see `take`).

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
        // Taken over the budget rather than waited for: what peers forward is already bounded
        // by their windows (`max_in_flight`) and by this queue's limits, and waiting here could
        // deadlock — two nodes whose budgets are full of what they forward to each other would
        // each wait for the other's answer. The overdraft makes this node's inputs wait instead.
        let charge = self.memory.try_charge(size).unwrap_or_else(|| self.memory.force(size));
        self.queue
            .push(Batch::new(events, acks, size).with_memory(charge))
            .await
            .map_err(|e| format!("the pipeline's forwarded-events queue: {e}"))?;
        self.metrics.received.add(n as u64);
        Ok(())
    }
}
