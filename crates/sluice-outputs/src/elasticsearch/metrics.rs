//! The output's own figures, at `/metrics` as `sluice_component_<name>` and in `/stats` under
//! the component's `state`: documents indexed, refused and sent again (both by status and error
//! type, so that a write block shows as what it is); bulk requests, their latency and how many are in flight; bytes before and after
//! compression.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_core::metrics::{ComponentState, Histogram, LabelledFigure, StateFigure, StateHistogram};

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

impl ComponentState for Figures {
    fn figures(&self) -> Vec<StateFigure> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counter = |name, help, value| StateFigure { name, help, counter: true, value };
        vec![
            counter("documents_indexed_total", "Documents the engine accepted (2xx).", get(&self.indexed)),
            counter("bulk_requests_total", "Bulk requests sent, answered or not.", get(&self.requests)),
            StateFigure {
                name: "bulk_requests_in_flight",
                help: "Bulk requests waiting for their answer now.",
                counter: false,
                value: get(&self.requests_in_flight),
            },
            counter(
                "bulk_bytes_encoded_total",
                "Bytes of bulk request bodies before compression.",
                get(&self.bytes_encoded),
            ),
            counter(
                "bulk_bytes_sent_total",
                "Bytes of bulk request bodies sent (after compression).",
                get(&self.bytes_sent),
            ),
        ]
    }

    fn labelled_figures(&self) -> Vec<LabelledFigure> {
        let rows = |figures: &BTreeMap<(u16, String), u64>, name, help| {
            figures
                .iter()
                .map(|((status, error_type), n)| LabelledFigure {
                    figure: StateFigure { name, help, counter: true, value: *n },
                    labels: vec![("status", status.to_string()), ("error_type", error_type.clone())],
                })
                .collect::<Vec<_>>()
        };
        let mut out = rows(
            &self.refused.lock(),
            "documents_refused_total",
            "Documents refused for good, by the engine's status and error type (status 0: not sent, a field the index or id template names is missing).",
        );
        out.extend(rows(
            &self.retried.lock(),
            "documents_retried_total",
            "Documents the engine refused for a reason not their own (429, 5xx, 401, 403, a write block), sent again on their own, by status and error type.",
        ));
        out
    }

    fn histograms(&self) -> Vec<StateHistogram<'_>> {
        vec![StateHistogram {
            name: "bulk_request_duration_seconds",
            help: "Time from sending a bulk request to its whole answer.",
            histogram: &self.latency,
        }]
    }
}
