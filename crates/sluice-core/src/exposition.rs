//! Families for `/metrics`, written through prometheus-client's OpenMetrics encoder at scrape
//! time from a snapshot of the atomics in [`metrics`](crate::metrics).
//!
//! The atomics stay the hot path; nothing is registered with prometheus-client. What the
//! encoder owns is the format: the `# TYPE` line, a counter's `_total` suffix, label escaping
//! and the no-labels form. The [`NodeSnapshot`](crate::snapshot::NodeSnapshot), the stores'
//! snapshots and every [`MetricsSection`](crate::metrics::MetricsSection) (the cluster's) write
//! their families with these helpers.

use std::fmt::Result;

use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeCounterValue, EncodeGaugeValue, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::metrics::{Histogram, LATENCY_BUCKETS};
use crate::queue::HistogramSnapshot;

/// A series' labels in order; empty for a series without labels.
pub type Labels = Vec<(&'static str, String)>;

/// The content type of what [`text`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A whole exposition: the families `write` encodes, then `# EOF`.
pub fn text(
    write: impl Fn(&mut DescriptorEncoder<'_>) -> Result + Send + Sync + 'static,
) -> std::result::Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(Box::new(write))));
    let mut out = String::with_capacity(16 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

type Write = Box<dyn Fn(&mut DescriptorEncoder<'_>) -> Result + Send + Sync>;

/// The registry's one collector: it reads the figures when the registry is encoded.
struct Scrape(Write);

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> Result {
        f.write_str("Scrape")
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result {
        (self.0)(&mut encoder)
    }
}

/// A counter family. `name` is the series' name as scraped, ending in `_total`: the family is
/// named without the suffix (OpenMetrics names a counter family so, and the encoder adds the
/// suffix to every sample), so call sites keep the name one finds in a dashboard.
pub fn counter<V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, V)>,
) -> Result {
    let family = name.strip_suffix("_total").unwrap_or(name);
    let mut metric = encoder.encode_descriptor(family, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

pub fn gauge<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, V)>,
) -> Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A histogram family over [`LATENCY_BUCKETS`].
pub fn histogram<'h>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, &'h Histogram)>,
) -> Result {
    histogram_snapshots(encoder, name, help, rows.into_iter().map(|(labels, h)| (labels, h.snapshot_struct())))
}

/// A histogram family from snapshots taken elsewhere (a queue's commit latency).
pub fn histogram_snapshots(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, HistogramSnapshot)>,
) -> Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, s) in rows {
        // The snapshot is cumulative and the encoder adds buckets up itself: it gets each
        // bucket's own count.
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = s
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &cumulative)| {
                let own = cumulative.saturating_sub(below);
                below = below.max(cumulative);
                (LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), own)
            })
            .collect();
        if buckets.is_empty() {
            buckets.push((f64::INFINITY, s.count));
        }
        // The count is read apart from the buckets while observations go on; the +Inf bucket
        // is the count that agrees with them, as the format requires.
        let count = buckets.iter().map(|(_, own)| own).sum();
        metric.encode_family(&labels)?.encode_histogram::<NoLabelSet>(s.sum, count, &buckets, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoder_names_types_and_escapes() {
        let out = text(|encoder| {
            let peer: Labels = vec![("peer", "a\"b\\c\nd".to_string())];
            counter(encoder, "x_total", "X.", [(peer, 1u64), (Labels::new(), 2)])?;
            gauge(encoder, "up_seconds", "Up.", [(Labels::new(), 1.5f64)])?;
            let h = Histogram::default();
            h.observe(std::time::Duration::from_millis(3));
            histogram(encoder, "d_seconds", "D.", [(Labels::new(), &h)])?;
            histogram_snapshots(encoder, "e_seconds", "E.", [(Labels::new(), HistogramSnapshot::default())])
        })
        .unwrap();
        assert!(
            out.starts_with("# HELP x X.\n# TYPE x counter\nx_total{peer=\"a\\\"b\\\\c\\nd\"} 1\nx_total 2\n"),
            "{out}"
        );
        assert!(out.contains("\nup_seconds 1.5\n"), "{out}");
        assert!(out.contains("\nd_seconds_bucket{le=\"0.0025\"} 0\nd_seconds_bucket{le=\"0.005\"} 1\n"), "{out}");
        assert!(out.contains("\nd_seconds_count 1\n") && out.contains("d_seconds_bucket{le=\"+Inf\"} 1\n"), "{out}");
        assert!(out.contains("\ne_seconds_count 0\ne_seconds_bucket{le=\"+Inf\"} 0\n"), "{out}");
        assert!(out.ends_with("# EOF\n") && !out.contains("{}"), "{out}");
    }
}
