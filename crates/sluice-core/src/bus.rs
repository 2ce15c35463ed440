//! The pipeline bus: where a `pipeline` output finds the `pipeline` input it feeds.
//!
//! A `pipeline` input registers its address with its pipeline's queue when the pipeline starts
//! and removes it when it stops. Outputs look the address up per batch, so a downstream
//! pipeline that is restarted by a reload is found again without restarting its senders.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::metrics::ComponentMetrics;
use crate::queue::Queue;

#[derive(Clone)]
pub struct BusTarget {
    pub pipeline: String,
    pub queue: Arc<dyn Queue>,
    pub metrics: Arc<ComponentMetrics>,
}

#[derive(Default)]
pub struct PipelineBus {
    targets: RwLock<HashMap<String, BusTarget>>,
}

#[derive(Debug, thiserror::Error)]
#[error("pipeline address `{address}` is already served by pipeline `{owner}`")]
pub struct AddressTaken {
    pub address: String,
    pub owner: String,
}

impl PipelineBus {
    pub fn register(&self, address: &str, target: BusTarget) -> Result<(), AddressTaken> {
        let mut targets = self.targets.write();
        if let Some(existing) = targets.get(address)
            && existing.pipeline != target.pipeline
        {
            return Err(AddressTaken { address: address.to_string(), owner: existing.pipeline.clone() });
        }
        targets.insert(address.to_string(), target);
        Ok(())
    }

    /// Removes the address if `pipeline` still owns it.
    pub fn unregister(&self, address: &str, pipeline: &str) {
        let mut targets = self.targets.write();
        if targets.get(address).is_some_and(|t| t.pipeline == pipeline) {
            targets.remove(address);
        }
    }

    pub fn get(&self, address: &str) -> Option<BusTarget> {
        self.targets.read().get(address).cloned()
    }
}
