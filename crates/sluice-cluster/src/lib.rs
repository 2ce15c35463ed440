//! Cluster mode: several `sluice` nodes form a hash ring over the identification keys of
//! stateful processors, and every event with the same key values is processed by the one node
//! that owns them.
//!
//! - [`ring`]: the consistent-hash ring every node computes alike from the same membership.

pub mod ring;
