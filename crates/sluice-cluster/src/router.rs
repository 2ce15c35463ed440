//! The forwarding stage: a worker routes each batch, before the first processor that
//! declares identification keys, to the nodes that own its events.
//!
//! Per batch: one read of the current ring; per event: the key tuple's hash and a ring lookup,
//! nothing else. Events this node owns stay in the batch; each other owner's share is encoded
//! once and handed to that peer's link with its share of the batch's acknowledgement and
//! memory charge. The worker waits only for room in a link's window (`hold`), or at most
//! `request_timeout` (`local`, after which the events stay here).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sluice_core::{AckSet, Event, KeySpec, MemoryCharge};
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::link::{Piece, Refusal};

/// What routing did to one batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RouteReport {
    pub local: u64,
    pub forwarded: u64,
    /// Kept here because their owner was down (`on_peer_failure: local`).
    pub local_fallback: u64,
    pub missing_keys: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("routing was aborted by the drain timeout")]
pub struct RouteError;

#[derive(Clone)]
pub struct Router {
    shared: Arc<Shared>,
    pipeline: Arc<str>,
    keys: KeySpec,
}

/// How many times events given back by a link that just left the ring are routed again
/// before they are processed here.
const ROUTE_ATTEMPTS: usize = 3;

impl Router {
    pub(crate) fn new(shared: Arc<Shared>, pipeline: Arc<str>, keys: KeySpec) -> Router {
        Router { shared, pipeline, keys }
    }

    pub fn keys(&self) -> &KeySpec {
        &self.keys
    }

    /// Routes `events`: those owned elsewhere leave it for their owners' links, with their
    /// share of `acks` (which must be one acker's, see [`crate::join_acks`]) and of `memory`.
    /// Returns `Err` only when `abort` fires while waiting for room; the events not yet
    /// placed are then still in `events`.
    pub async fn route(
        &self,
        events: &mut Vec<Event>,
        acks: &mut AckSet,
        memory: &mut MemoryCharge,
        abort: &CancellationToken,
    ) -> Result<RouteReport, RouteError> {
        let mut report = RouteReport::default();
        let m = &self.shared.metrics;
        let mut keep: Vec<Event> = Vec::new();
        let mut attempt = 0;
        while !events.is_empty() {
            attempt += 1;
            let topo = self.shared.topology();
            let n = events.len();
            if topo.ring.len() <= 1 || attempt > ROUTE_ATTEMPTS {
                report.local += n as u64;
                keep.append(events);
                break;
            }
            let mut scratch = Vec::with_capacity(64);
            let mut owners: Vec<u32> = Vec::with_capacity(n);
            let mut counts = vec![0usize; topo.ring.len()];
            for e in events.iter() {
                let h = self.keys.hash(e, &mut scratch);
                report.missing_keys += (h.missing > 0) as u64;
                let o = topo.ring.owner(h.hash);
                owners.push(o as u32);
                counts[o] += 1;
            }
            if counts[topo.me] == n {
                report.local += n as u64;
                keep.append(events);
                break;
            }
            let mut by_owner: Vec<Vec<Event>> = counts.iter().map(|&c| Vec::with_capacity(c)).collect();
            for (e, o) in events.drain(..).zip(owners) {
                by_owner[o as usize].push(e);
            }
            report.local += by_owner[topo.me].len() as u64;
            keep.append(&mut by_owner[topo.me]);
            // Acks and memory not yet handed out cover the events not yet placed, which are
            // `remaining` in number: pieces are split off in turn.
            let mut remaining: usize = by_owner.iter().map(Vec::len).sum::<usize>();
            let mut given_back: Vec<Event> = Vec::new();
            for (o, share) in by_owner.into_iter().enumerate() {
                if share.is_empty() || o == topo.me {
                    continue;
                }
                let link = topo.links[o].as_ref().expect("every other member has a link");
                let count = share.len();
                let mut body = Vec::with_capacity(count * 64);
                if let Err(e) = sluice_segment::codec::encode_batch(&share, &mut body) {
                    // An event the codec cannot carry (nested too deep): processed here.
                    tracing::warn!(pipeline = %self.pipeline, peer = %link.name, error = %e,
                        "events cannot be encoded for their owner; processing them on this node");
                    report.local_fallback += count as u64;
                    keep.extend(share);
                    continue;
                }
                let piece_acks = acks.split_front(count);
                let mut piece_memory = memory.split_share(count, remaining.max(count) + keep_len_hint(&keep));
                remaining -= count;
                piece_memory.shrink_to(body.len());
                let piece = Piece {
                    pipeline: self.pipeline.clone(),
                    body,
                    events: count as u32,
                    acks: piece_acks,
                    memory: piece_memory,
                    enqueued: Instant::now(),
                    ring: topo.ring.fingerprint(),
                };
                match link.submit(piece, abort).await {
                    Ok(waited) => {
                        report.forwarded += count as u64;
                        let nanos = waited.as_nanos() as u64;
                        if nanos > 0 {
                            m.worker_wait_nanos.add(nanos);
                            m.worker_wait_max_nanos.fetch_max(nanos, Ordering::Relaxed);
                        }
                    }
                    Err((piece, refusal)) => {
                        acks.append(piece.acks);
                        memory.merge(piece.memory);
                        match refusal {
                            Refusal::Down => {
                                report.local_fallback += count as u64;
                                link.metrics.events_rerouted.add(count as u64);
                                keep.extend(share);
                            }
                            Refusal::Closed => given_back.extend(share),
                            Refusal::Aborted => {
                                given_back.extend(share);
                                events.append(&mut keep);
                                events.append(&mut given_back);
                                return Err(RouteError);
                            }
                        }
                    }
                }
            }
            // Given back by a link that left the ring: routed again with the new ring.
            *events = given_back;
        }
        *events = keep;
        m.events_local.add(report.local);
        m.events_forwarded.add(report.forwarded);
        m.events_local_fallback.add(report.local_fallback);
        m.events_missing_keys.add(report.missing_keys);
        Ok(report)
    }
}

/// The memory charge covers the events kept here too; they are not split off, so the share
/// of a piece is taken against everything the charge still covers.
fn keep_len_hint(keep: &[Event]) -> usize {
    keep.len()
}
