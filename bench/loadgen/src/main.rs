//! Sends newline-delimited JSON log lines of a fixed size to a TCP address, as fast as the
//! receiver takes them, and reports the rate. The lines vary (host, status, path, trace id) so
//! that nothing downstream can profit from repetition, and are made before the clock starts.

use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// host:port to send to.
    #[arg(long)]
    address: String,
    /// Lines to send.
    #[arg(long, default_value_t = 1_000_000)]
    lines: u64,
    /// Bytes per line, newline included.
    #[arg(long, default_value_t = 250)]
    line_bytes: usize,
}

/// One JSON line of exactly `size` bytes (newline included), padded in its `msg` field.
pub fn json_line(i: u64, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"ts":"2026-11-21T07:{:02}:{:02}.{:03}Z","level":"{}","host":"web-{}","service":"checkout","trace_id":"{:016x}","status":{},"method":"GET","path":"/api/v1/items/{}","latency_ms":{},"msg":""#,
        (i / 60) % 60,
        i % 60,
        i % 1000,
        ["info", "warn", "error", "debug"][(i % 4) as usize],
        i % 16,
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        [200, 201, 404, 500, 503][(i % 5) as usize],
        i % 10_000,
        i % 300
    );
    let mut line = head.into_bytes();
    let tail = b"\"}\n";
    let pad = size.saturating_sub(line.len() + tail.len());
    line.extend(std::iter::repeat_n(b'x', pad));
    line.extend_from_slice(tail);
    line
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // A 4 MiB block of distinct lines, sent over and over.
    let mut block = Vec::with_capacity(4 << 20);
    let mut per_block = 0u64;
    while block.len() + args.line_bytes < 4 << 20 {
        block.extend_from_slice(&json_line(per_block, args.line_bytes));
        per_block += 1;
    }
    let mut stream = TcpStream::connect(&args.address).with_context(|| format!("connecting to {}", args.address))?;
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < args.lines {
        let n = per_block.min(args.lines - sent);
        let bytes = if n == per_block { &block[..] } else { &block[..(n as usize * args.line_bytes)] };
        stream.write_all(bytes).context("sending")?;
        sent += n;
    }
    stream.flush()?;
    drop(stream);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "sent {sent} lines ({:.1} MiB) in {secs:.3}s: {:.0} lines/s",
        (sent * args.line_bytes as u64) as f64 / (1 << 20) as f64,
        sent as f64 / secs
    );
    Ok(())
}
