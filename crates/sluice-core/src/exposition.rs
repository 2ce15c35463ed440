//! The Prometheus text format, written by hand but in one place: `/metrics` and every
//! [`MetricsSection`](crate::metrics::MetricsSection) (the cluster's) write their families with
//! these, so types, label escaping and the no-labels form are the same everywhere.

use std::fmt::Write;

use crate::metrics::{Histogram, LATENCY_BUCKETS};

/// A label value escaped for the text format.
pub fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub fn counter(out: &mut String, name: &str, help: &str, rows: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (labels, v) in rows {
        sample(out, name, labels, v);
    }
}

/// One sample line; a series without labels has no braces.
pub fn sample(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

pub fn gauge(out: &mut String, name: &str, help: &str, rows: &[(String, f64)]) {
    typed(out, name, "gauge", help, rows);
}

/// A counter of seconds (or any other non-integer total).
pub fn counter_f64(out: &mut String, name: &str, help: &str, rows: &[(String, f64)]) {
    typed(out, name, "counter", help, rows);
}

pub fn typed(out: &mut String, name: &str, kind: &str, help: &str, rows: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in rows {
        sample(out, name, labels, v);
    }
}

pub fn histogram(out: &mut String, name: &str, help: &str, rows: &[(String, &Histogram)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (labels, h) in rows {
        let (buckets, sum, count) = h.snapshot();
        let prefix = if labels.is_empty() { String::new() } else { format!("{labels},") };
        for (i, c) in buckets.iter().enumerate() {
            let le = LATENCY_BUCKETS.get(i).map(|b| b.to_string()).unwrap_or_else(|| "+Inf".to_string());
            let _ = writeln!(out, "{name}_bucket{{{prefix}le=\"{le}\"}} {c}");
        }
        sample(out, &format!("{name}_sum"), labels, sum);
        sample(out, &format!("{name}_count"), labels, count);
    }
}

/// One series without labels (no empty braces).
pub fn unlabelled(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_a_series_without_labels_has_no_braces() {
        let mut out = String::new();
        counter(&mut out, "x_total", "X.", &[(format!("peer=\"{}\"", esc("a\"b")), 1), (String::new(), 2)]);
        assert_eq!(out, "# HELP x_total X.\n# TYPE x_total counter\nx_total{peer=\"a\\\"b\"} 1\nx_total 2\n");
        let h = Histogram::default();
        let mut out = String::new();
        histogram(&mut out, "d_seconds", "D.", &[(String::new(), &h)]);
        assert!(out.contains("d_seconds_bucket{le=\"+Inf\"} 0\n") && out.contains("\nd_seconds_count 0\n"), "{out}");
    }
}
