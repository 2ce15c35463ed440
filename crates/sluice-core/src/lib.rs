//! The vocabulary every Sluice component speaks.
//!
//! - [`Value`] and [`Map`]: a JSON-like value with an insertion-ordered object, cheap to build
//!   from a parse and cheap to look up in (events have a dozen fields, so a vector beats a tree).
//! - [`Str`]: the string of values and keys, inline when short, or a slice of a [`SharedText`]
//!   that many events share (the lines of one read).
//! - [`Event`]: one record, a root [`Map`]; `@timestamp` and `@metadata` live in it like in
//!   Logstash, `@metadata` is never written out by outputs.
//! - [`Batch`]: events travel in batches; a batch carries the [`AckSet`] of the input batches its
//!   events came from, so an acknowledgement costs one atomic operation per input batch, never one
//!   per event.
//! - [`KeySpec`]: identification keys, encoded without ambiguity and hashed alike on every node,
//!   for stateful processors' groups and cluster routing.
//! - [`MemoryBudget`]: the node's one budget for events in flight; a batch carries its
//!   [`MemoryCharge`] and gives it back when dropped.
//! - [`Queue`]: the interface between inputs and workers, implemented by the memory queue and the
//!   persisted queue.
//! - [`metrics`]: counters and histograms updated per batch; [`figures`]: how a component
//!   publishes figures of its own; [`snapshot`]: all of them read at once into one typed
//!   value that `/metrics` encodes, `/stats` serializes and `sluice top` reads back.
//!
//! ```
//! use sluice_core::{AckSet, Acker, Batch, Event};
//! let (acker, mut done) = Acker::with_notify(2);
//! let batch = Batch::new(vec![Event::from_message("a"), Event::from_message("b")], AckSet::single(acker, 2), 2);
//! batch.complete();
//! assert!(done.try_recv().is_ok());
//! ```

pub mod ack;
pub mod batch;
pub mod bus;
pub mod event;
pub mod exposition;
pub mod figures;
pub mod health;
pub mod key;
pub mod memory;
pub mod metrics;
pub mod path;
pub mod queue;
pub mod snapshot;
pub mod text;
pub mod value;
pub mod wait;

pub use ack::{AckSet, Acker};
pub use batch::Batch;
pub use event::Event;
pub use key::{KeyHash, KeySpec};
pub use memory::{ChargeError, MemoryBudget, MemoryCharge};
pub use path::{FieldPath, PathError};
pub use queue::{HistogramSnapshot, Queue, QueueClosed, QueueStats, ShardStats};
pub use text::{SharedText, Str, TextPool};
pub use value::{Map, Value};
pub use wait::{WaitGuard, WaitTime};
