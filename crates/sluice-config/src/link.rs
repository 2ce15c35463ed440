//! What a component's settings make of other pipelines and of the process: the links the
//! topology checks across pipelines (an address served once, every target served, no loop, a dead
//! letter queue where its reader looks, one reader of stdin).
//!
//! Each component says its links from its own typed settings (a table of component kinds
//! lists, per kind, the function that does); the topology never reads a component's keys. A
//! link names the key it comes from, so an error about it points there.

use crate::model::ComponentSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Serves a pipeline address that `pipeline` outputs send to (the `pipeline` input).
    Serves { address: String, key: &'static str },
    /// Sends to a pipeline address (the `pipeline` output).
    SendsTo { address: String, key: &'static str },
    /// Reads pipeline `pipeline`'s dead letter queue from that pipeline's default directory.
    ReadsDeadLetterQueueOf { pipeline: String, key: &'static str },
    /// Hands failed events to its own pipeline's dead letter queue, which must be enabled.
    WritesDeadLetterQueue { key: &'static str },
    /// Reads the process's one standard input.
    TakesStdin,
}

/// The links of a component that makes none.
pub fn no_links(_: &ComponentSpec) -> Vec<Link> {
    Vec::new()
}
