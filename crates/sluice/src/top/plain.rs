//! `sluice top` as plain text, when the output is not a terminal or with `--once`: each refresh
//! prints one `key=value` line per pipeline, component and cluster peer, so the output can be
//! piped, logged or parsed. A figure the API did not give is `-`. A component's own figures
//! (those without labels of their own) close its line as `state.<key>=<value>`, by the keys of
//! its `/stats` `state`: they come from the component, and top names none of them.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use anyhow::bail;

use super::Api;
use super::stats::{Rows, Snapshot, Tracker, fmt_count, fmt_rate};

pub fn run(
    rt: &tokio::runtime::Runtime,
    api: &Api,
    first: Snapshot,
    interval: Duration,
    once: bool,
) -> anyhow::Result<()> {
    let mut tracker = Tracker::new(first);
    let mut next = Instant::now() + interval;
    loop {
        // Rates need two snapshots, so even `--once` waits one interval for the second.
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next += interval;
        match rt.block_on(api.snapshot()) {
            Ok(snapshot) => {
                if tracker.unreachable.is_some() {
                    eprintln!("{}: the monitoring API at {} answers again", stamp(snapshot.wall), api.address);
                }
                tracker.update(snapshot);
                let mut out = std::io::stdout().lock();
                match write_rows(&mut out, stamp(tracker.cur.wall), &tracker.rows).and_then(|()| out.flush()) {
                    Ok(()) => {}
                    // A reader that went away (`| head`) ends the command, quietly.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => bail!("writing to stdout: {e}"),
                }
                if once {
                    return Ok(());
                }
            }
            Err(e) => {
                if once {
                    bail!("{}", api.unreachable(&e));
                }
                let now = SystemTime::now();
                if tracker.unreachable.is_none() {
                    eprintln!("{}: API unreachable: {}", stamp(now), api.unreachable(&e));
                }
                tracker.failed(now, e);
            }
        }
    }
}

fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A value as logfmt needs it: quoted when it holds a space, `=` or `"`.
fn v(s: &str) -> String {
    if s.is_empty() || s.contains([' ', '=', '"']) { format!("{s:?}") } else { s.to_string() }
}

fn pct(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{:.1}", s * 100.0))
}

pub fn write_rows(out: &mut impl Write, stamp: String, rows: &Rows) -> std::io::Result<()> {
    let opt = |s: &Option<String>| s.as_deref().map_or_else(|| "-".to_string(), v);
    for p in &rows.pipelines {
        let q = p.queue.as_ref();
        writeln!(
            out,
            "{stamp} pipeline={} in_per_sec={} out_per_sec={} taken_per_sec={} failed={} dropped={} \
             dead_lettered={} queue={} queue_events={} queue_bytes={} queue_fill_pct={} blocked_pct={} \
             dlq_entries={} dlq_bytes={} dlq_max_bytes={} workers={} utilization_pct={}",
            v(&p.name),
            fmt_rate(p.in_rate),
            fmt_rate(p.out_rate),
            fmt_rate(p.taken_rate),
            fmt_count(p.failed),
            fmt_count(p.dropped),
            fmt_count(p.dead_lettered),
            opt(&q.and_then(|q| q.kind.clone())),
            fmt_count(q.and_then(|q| q.events)),
            fmt_count(q.and_then(|q| q.bytes)),
            pct(p.queue_fill),
            pct(p.blocked),
            fmt_count(p.dlq.and_then(|d| d.entries)),
            fmt_count(p.dlq.and_then(|d| d.bytes)),
            fmt_count(p.dlq.and_then(|d| d.max_bytes)),
            fmt_count(p.workers),
            pct(p.utilization),
        )?;
        for c in &p.components {
            writeln!(
                out,
                "{stamp} pipeline={} component={} kind={} type={} state={} in_per_sec={} out_per_sec={} failed={} \
                 dropped={} retries={} refused={}{}{}{}",
                v(&p.name),
                v(&c.id),
                opt(&c.kind),
                opt(&c.type_name),
                opt(&c.state),
                fmt_rate(c.in_rate),
                fmt_rate(c.out_rate),
                fmt_count(c.failed),
                fmt_count(c.dropped),
                fmt_count(c.retries),
                fmt_count(c.refused),
                c.output_state.as_deref().map_or_else(String::new, |s| format!(" output_state={}", v(s))),
                c.reason.as_deref().map_or_else(String::new, |r| format!(" reason={}", v(r))),
                c.own.iter().map(|(key, n)| format!(" state.{key}={n}")).collect::<String>(),
            )?;
        }
    }
    for peer in &rows.peers {
        writeln!(
            out,
            "{stamp} peer={} state={} forwarded_per_sec={} failures={} batches_retried={} bytes_in_flight={} \
             latency_ms={}",
            v(&peer.name),
            opt(&peer.state),
            fmt_rate(peer.forwarded_rate),
            fmt_count(peer.failures),
            fmt_count(peer.batches_retried),
            fmt_count(peer.bytes_in_flight),
            peer.latency_mean_seconds.map_or_else(|| "-".to_string(), |s| format!("{:.2}", s * 1000.0)),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;
    use crate::top::stats::rows;

    #[test]
    fn one_line_per_pipeline_component_and_peer() {
        let doc = json!({
            "pipelines": {"web app": {"events": {"in": 1}, "components": [{"id": "gen", "kind": "input", "type": "generator"}]}},
            "cluster": {"node": "a", "peers": {"b": {"state": "up"}}},
        });
        let snap = Snapshot::parse(&doc, Instant::now(), SystemTime::now()).unwrap();
        let mut out = Vec::new();
        write_rows(&mut out, "T".to_string(), &rows(None, &snap)).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("T pipeline=\"web app\" in_per_sec=- "), "{text}");
        assert!(lines[1].contains(" component=gen kind=input type=generator "), "{text}");
        assert!(lines[2].starts_with("T peer=b state=up "), "{text}");
    }

    #[test]
    fn an_outputs_state_is_on_its_line() {
        let doc = json!({"pipelines": {"p": {"components": [
            {"id": "gen", "kind": "input", "type": "generator", "health": {"state": "running"}},
            {"id": "out", "kind": "output", "type": "http", "health": {"state": "running"}, "output_state": "retrying"},
        ]}}});
        let snap = Snapshot::parse(&doc, Instant::now(), SystemTime::now()).unwrap();
        let mut out = Vec::new();
        write_rows(&mut out, "T".to_string(), &rows(None, &snap)).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(!lines[1].contains("output_state="), "an input has none: {text}");
        assert!(lines[2].contains(" state=running ") && lines[2].contains(" output_state=retrying"), "{text}");
    }
}
