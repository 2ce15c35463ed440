//! The full-screen `sluice top` view: a header with the API address and its state, a table of
//! pipelines with their components under each, and cluster peers when there are any.
//!
//! The terminal is put back (raw mode off, main screen, cursor shown) on every way out:
//! a quit key, a signal, an error (a guard's `Drop`) and a panic (a hook).

use std::io::Stdout;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, terminal};
use ratatui::Frame;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};

use super::Api;
use super::stats::{Tracker, fmt_bytes, fmt_clock, fmt_count, fmt_percent, fmt_rate};

enum Update {
    Stats(super::stats::Snapshot),
    Failed(SystemTime, String),
}

pub fn live(
    rt: &tokio::runtime::Runtime,
    api: Api,
    first: super::stats::Snapshot,
    interval: Duration,
) -> anyhow::Result<()> {
    let api = Arc::new(api);
    let (tx, rx) = mpsc::channel();
    rt.spawn(poll(api.clone(), interval, tx));
    let quit = Arc::new(AtomicBool::new(false));
    rt.block_on(watch_signals(quit.clone()))?;

    let mut tracker = Tracker::new(first);
    let _guard = TerminalGuard::enter()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout())).context("opening the terminal")?;
    let mut scroll = 0usize;
    let mut dirty = true;
    while !quit.load(Ordering::Relaxed) {
        while let Ok(update) = rx.try_recv() {
            match update {
                Update::Stats(s) => tracker.update(s),
                Update::Failed(at, e) => tracker.failed(at, e),
            }
            dirty = true;
        }
        if dirty {
            draw_once(&mut terminal, &tracker, &api.address, interval, &mut scroll)?;
            dirty = false;
        }
        // Short, so that updates from the poller and signals show without waiting for a key.
        if !event::poll(Duration::from_millis(100)).context("reading the terminal")? {
            continue;
        }
        match event::read().context("reading the terminal")? {
            Event::Key(key) if key.kind != KeyEventKind::Release => {
                let ctrl_c = key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
                match key.code {
                    KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => break,
                    _ if ctrl_c => break,
                    KeyCode::Down | KeyCode::Char('j') => scroll += 1,
                    KeyCode::Up | KeyCode::Char('k') => scroll = scroll.saturating_sub(1),
                    KeyCode::PageDown => scroll += 10,
                    KeyCode::PageUp => scroll = scroll.saturating_sub(10),
                    KeyCode::Home => scroll = 0,
                    _ => continue,
                }
                dirty = true;
            }
            Event::Resize(..) => dirty = true,
            _ => {}
        }
    }
    Ok(())
}

fn draw_once(
    terminal: &mut Terminal<CrosstermBackend<Stdout>>,
    tracker: &Tracker,
    address: &str,
    interval: Duration,
    scroll: &mut usize,
) -> anyhow::Result<()> {
    terminal.draw(|frame| draw(frame, tracker, address, interval, scroll)).context("drawing")?;
    Ok(())
}

/// Fetches a snapshot every `interval` until the view stops listening.
async fn poll(api: Arc<Api>, interval: Duration, tx: mpsc::Sender<Update>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is now, and the first snapshot is already taken
    loop {
        tick.tick().await;
        let update = match api.snapshot().await {
            Ok(s) => Update::Stats(s),
            Err(e) => Update::Failed(SystemTime::now(), e),
        };
        if tx.send(update).is_err() {
            return;
        }
    }
}

/// SIGTERM, SIGHUP and SIGINT end the view like `q` does, so that the terminal is put back;
/// their default action would leave it in raw mode.
async fn watch_signals(quit: Arc<AtomicBool>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    for kind in [SignalKind::terminate(), SignalKind::hangup(), SignalKind::interrupt()] {
        let mut s = signal(kind).context("installing a signal handler")?;
        let quit = quit.clone();
        tokio::spawn(async move {
            if s.recv().await.is_some() {
                quit.store(true, Ordering::Relaxed);
            }
        });
    }
    Ok(())
}

struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> anyhow::Result<TerminalGuard> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        terminal::enable_raw_mode().context("switching the terminal to raw mode")?;
        // From here on the guard restores, even if entering the alternate screen fails.
        let guard = TerminalGuard;
        execute!(std::io::stdout(), terminal::EnterAlternateScreen, cursor::Hide)
            .context("switching to the alternate screen")?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen, cursor::Show);
}

const PIPELINE_HEADER: [&str; 14] = [
    "NAME",
    "KIND",
    "IN/S",
    "OUT/S",
    "FAILED",
    "DROPPED",
    "RETRIES",
    "STATE",
    "QUEUE",
    "FILL",
    "QUEUE BYTES",
    "BLOCKED",
    "DLQ",
    "DLQ BYTES",
];
/// Where [`PIPELINE_HEADER`] has `STATE`.
const STATE_COLUMN: usize = 7;
const PEER_HEADER: [&str; 7] = ["PEER", "STATE", "FORWARDED/S", "FAILURES", "RETRIED", "IN FLIGHT", "LATENCY"];

/// The table's cells: one row per pipeline, followed by its components (indented).
fn pipeline_cells(tracker: &Tracker) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    for p in &tracker.rows.pipelines {
        let q = p.queue.as_ref();
        out.push((
            true,
            vec![
                p.name.clone(),
                "pipeline".to_string(),
                fmt_rate(p.in_rate),
                fmt_rate(p.out_rate),
                fmt_count(p.failed),
                fmt_count(p.dropped),
                fmt_count(p.components.iter().filter_map(|c| c.retries).reduce(|a, b| a + b)),
                if p.components.iter().any(|c| c.state.as_deref() == Some("failed")) { "FAILED" } else { "ok" }
                    .to_string(),
                fmt_count(q.and_then(|q| q.events)),
                fmt_percent(p.queue_fill),
                fmt_bytes(q.and_then(|q| q.bytes)),
                fmt_percent(p.blocked),
                fmt_count(p.dlq.and_then(|d| d.entries)),
                fmt_bytes(p.dlq.and_then(|d| d.bytes)),
            ],
        ));
        for c in &p.components {
            let kind = match (&c.kind, &c.type_name) {
                (Some(k), Some(t)) => format!("{k}/{t}"),
                (Some(x), None) | (None, Some(x)) => x.clone(),
                (None, None) => "-".to_string(),
            };
            let empty = String::new;
            out.push((
                false,
                vec![
                    format!("  {}", c.id),
                    kind,
                    fmt_rate(c.in_rate),
                    fmt_rate(c.out_rate),
                    fmt_count(c.failed),
                    fmt_count(c.dropped),
                    fmt_count(c.retries),
                    match (c.state.as_deref(), c.output_state.as_deref()) {
                        (Some("failed"), _) => "FAILED".to_string(),
                        // An output that cannot deliver says so rather than `running`.
                        (_, Some(output)) if output != "up" => output.to_string(),
                        (Some(state), _) => state.to_string(),
                        (None, _) => "-".to_string(),
                    },
                    empty(),
                    empty(),
                    empty(),
                    empty(),
                    empty(),
                    empty(),
                ],
            ));
        }
    }
    out
}

fn peer_cells(tracker: &Tracker) -> Vec<Vec<String>> {
    tracker
        .rows
        .peers
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.state.clone().unwrap_or_else(|| "-".to_string()),
                fmt_rate(p.forwarded_rate),
                fmt_count(p.failures),
                fmt_count(p.batches_retried),
                fmt_bytes(p.bytes_in_flight),
                p.latency_mean_seconds.map_or_else(|| "-".to_string(), |s| format!("{:.1} ms", s * 1000.0)),
            ]
        })
        .collect()
}

/// A table whose columns are as wide as their widest cell; the first two are text, the
/// rest numbers (right-aligned).
fn table<'a>(header: &[&str], rows: Vec<(Style, Vec<String>)>, title: String) -> Table<'a> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for (_, cells) in &rows {
        for (w, c) in widths.iter_mut().zip(cells) {
            *w = (*w).max(c.chars().count());
        }
    }
    let cell = |i: usize, s: String| {
        let line = Line::from(s);
        Cell::from(if i < 2 { line } else { line.right_aligned() })
    };
    let header_row = Row::new(header.iter().enumerate().map(|(i, h)| cell(i, h.to_string())))
        .style(Style::new().add_modifier(Modifier::BOLD).fg(Color::Cyan));
    let body: Vec<Row> = rows
        .into_iter()
        .map(|(style, cells)| Row::new(cells.into_iter().enumerate().map(|(i, c)| cell(i, c))).style(style))
        .collect();
    Table::new(body, widths.into_iter().map(|w| Constraint::Length(w as u16)))
        .header(header_row)
        .column_spacing(2)
        .block(Block::bordered().title(title))
}

fn draw(frame: &mut Frame, tracker: &Tracker, address: &str, interval: Duration, scroll: &mut usize) {
    let peers = peer_cells(tracker);
    let peer_height = if peers.is_empty() { 0 } else { (peers.len() as u16).saturating_add(3).min(12) };
    let [head, status, main, peer_area, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(peer_height),
        Constraint::Length(1),
    ])
    .areas(frame.area());

    let cur = &tracker.cur;
    let mut title = vec![
        Span::styled("sluice top", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!("  {address}  every {}", humantime::format_duration(interval))),
    ];
    if let Some(node) = &cur.node {
        title.push(Span::raw(format!("  node {node}")));
    }
    if let Some(up) = cur.uptime_seconds {
        title.push(Span::raw(format!("  up {}", humantime::format_duration(Duration::from_secs(up as u64)))));
    }
    if let Some(m) = cur.memory {
        title.push(Span::raw(format!("  memory {} / {}", fmt_bytes(m.used_bytes), fmt_bytes(m.budget_bytes))));
    }
    frame.render_widget(Paragraph::new(Line::from(title)), head);

    let status_line = match &tracker.unreachable {
        Some((since, error)) => Line::styled(
            format!("API unreachable since {} ({error}); showing the last figures", fmt_clock(*since)),
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
        None if !tracker.has_rates() => {
            Line::styled("connected; rates show after the next refresh", Style::new().fg(Color::Yellow))
        }
        None => Line::styled(format!("updated {}", fmt_clock(cur.wall)), Style::new().fg(Color::Green)),
    };
    frame.render_widget(Paragraph::new(status_line), status);

    let rows = pipeline_cells(tracker);
    // Keep the last rows reachable, and no further.
    let visible = main.height.saturating_sub(3) as usize;
    *scroll = (*scroll).min(rows.len().saturating_sub(visible.max(1)));
    let styled: Vec<(Style, Vec<String>)> = rows
        .into_iter()
        .skip(*scroll)
        .map(|(pipeline, cells)| {
            let style = if pipeline { Style::new().add_modifier(Modifier::BOLD) } else { Style::new() };
            // A failed component stands out: it is why the node answers 503 at /health.
            let style = match cells.get(STATE_COLUMN).map(String::as_str) {
                Some("FAILED" | "down") => style.fg(Color::Red),
                Some("retrying") => style.fg(Color::Yellow),
                _ => style,
            };
            (style, cells)
        })
        .collect();
    let title = format!(" pipelines ({}) ", tracker.rows.pipelines.len());
    frame.render_widget(table(&PIPELINE_HEADER, styled, title), main);

    if !peers.is_empty() {
        let styled = peers
            .into_iter()
            .map(|cells| {
                let style = match cells[1].as_str() {
                    "up" => Style::new(),
                    _ => Style::new().fg(Color::Red),
                };
                (style, cells)
            })
            .collect();
        frame.render_widget(table(&PEER_HEADER, styled, " cluster peers ".to_string()), peer_area);
    }

    frame.render_widget(
        Paragraph::new(Line::styled(
            "q, Esc or Ctrl-C: quit   ↑ ↓ PgUp PgDn Home: scroll",
            Style::new().fg(Color::DarkGray),
        )),
        foot,
    );
    let _: Rect = foot;
}

#[cfg(test)]
mod tests {
    use std::time::{Instant, SystemTime};

    use serde_json::json;

    use super::*;
    use crate::top::stats::Snapshot;

    /// The STATE column: an output that cannot deliver shows that rather than `running`; a
    /// failed component still shows FAILED.
    #[test]
    fn the_state_column_shows_an_outputs_trouble() {
        let doc = json!({"pipelines": {"p": {"components": [
            {"id": "ok", "kind": "output", "type": "http", "health": {"state": "running"}, "output_state": "up"},
            {"id": "slow", "kind": "output", "type": "http", "health": {"state": "running"}, "output_state": "retrying"},
            {"id": "gone", "kind": "output", "type": "http", "health": {"state": "failed"}, "output_state": "down"},
        ]}}});
        let tracker = Tracker::new(Snapshot::parse(&doc, Instant::now(), SystemTime::now()).unwrap());
        let states: Vec<String> =
            pipeline_cells(&tracker).into_iter().skip(1).map(|(_, cells)| cells[STATE_COLUMN].clone()).collect();
        assert_eq!(states, ["running", "retrying", "FAILED"]);
    }
}
