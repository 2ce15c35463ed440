//! The output's own figures, at `/metrics` as `sluice_component_<name>` and in `/stats` under
//! the component's `state`: documents indexed, refused and sent again (both by status and error
//! type, so that a write block shows as what it is); bulk requests, their latency and how many are in flight; bytes before and after
//! compression.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_core::figures::{Figure, Publish, Spec, Unit};
use sluice_core::metrics::Histogram;

#[derive(Default)]
pub struct Figures {
    pub indexed: AtomicU64,
    pub requests: AtomicU64,
    pub requests_in_flight: AtomicU64,
    pub bytes_encoded: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub latency: Histogram,
    /// Refused documents by (status, error type); status 0 is a document not sent at all.
    refused: Mutex<BTreeMap<(u16, String), u64>>,
    /// Documents sent again on their own, by (status, error type).
    retried: Mutex<BTreeMap<(u16, String), u64>>,
}

impl Figures {
    pub fn refused(&self, status: u16, error_type: &str) {
        *self.refused.lock().entry((status, error_type.to_string())).or_default() += 1;
    }

    pub fn retried(&self, status: u16, error_type: &str) {
        *self.retried.lock().entry((status, error_type.to_string())).or_default() += 1;
    }

    #[cfg(test)]
    pub fn refused_count(&self) -> u64 {
        self.refused.lock().values().sum()
    }

    #[cfg(test)]
    pub fn retried_count(&self) -> u64 {
        self.retried.lock().values().sum()
    }
}

const INDEXED: Spec = Spec::counter("documents_indexed_total", "Documents the engine accepted (2xx).");
const REQUESTS: Spec = Spec::counter("bulk_requests_total", "Bulk requests sent, answered or not.");
const IN_FLIGHT: Spec = Spec::gauge("bulk_requests_in_flight", "Bulk requests waiting for their answer now.");
const BYTES_ENCODED: Spec =
    Spec::counter("bulk_bytes_encoded_total", "Bytes of bulk request bodies before compression.").in_unit(Unit::Bytes);
const BYTES_SENT: Spec =
    Spec::counter("bulk_bytes_sent_total", "Bytes of bulk request bodies sent (after compression).")
        .in_unit(Unit::Bytes);
const REFUSED: Spec = Spec::counter(
    "documents_refused_total",
    "Documents refused for good, by the engine's status and error type (status 0: not sent, a field the index or id template names is missing).",
);
const RETRIED: Spec = Spec::counter(
    "documents_retried_total",
    "Documents the engine refused for a reason not their own (429, 5xx, 401, 403, a write block), sent again on their own, by status and error type.",
);
const LATENCY: Spec =
    Spec::histogram("bulk_request_duration_seconds", "Time from sending a bulk request to its whole answer.");

impl Publish for Figures {
    fn figures(&self) -> Vec<Figure> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = vec![
            INDEXED.value(get(&self.indexed)),
            REQUESTS.value(get(&self.requests)),
            IN_FLIGHT.value(get(&self.requests_in_flight)),
            BYTES_ENCODED.value(get(&self.bytes_encoded)),
            BYTES_SENT.value(get(&self.bytes_sent)),
        ];
        let by_reason = |spec: Spec, figures: &BTreeMap<(u16, String), u64>| {
            let series = figures.iter().map(move |((status, error_type), n)| {
                spec.labelled(vec![("status", status.to_string()), ("error_type", error_type.clone())], *n)
            });
            series.collect::<Vec<_>>()
        };
        out.extend(by_reason(REFUSED, &self.refused.lock()));
        out.extend(by_reason(RETRIED, &self.retried.lock()));
        out.push(LATENCY.observed(&self.latency));
        out
    }
}
