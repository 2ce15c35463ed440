//! `sluice top`: a live view of a running sluice, read from its monitoring API's `/stats`.
//!
//! This module resolves the API address, fetches snapshots and picks the output: the
//! full-screen view (`render`) on a terminal, plain lines (`plain`) otherwise or with `--once`.

mod plain;
mod render;
mod stats;

use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow, bail};
use sluice_config::model::{ApiConfig, load_api_section};

use stats::Snapshot;

#[derive(clap::Args)]
pub struct TopArgs {
    /// The monitoring API to watch: `HOST:PORT` or `http://HOST:PORT`. Default: `api.address`
    /// of the config given with -c, else 127.0.0.1:9600.
    #[arg(long, value_name = "ADDR")]
    api: Option<String>,
    /// The config whose `api.address` to watch (the file `sluice run -c` was given).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Time between refreshes; rates cover one refresh.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Prints one refresh as plain lines (one per pipeline, component and peer) and exits.
    #[arg(long)]
    once: bool,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = sluice_config::HumanDuration::parse(s)?.0;
    // Shorter would mostly measure the API's own sampling jitter, and load the server.
    if d < Duration::from_millis(100) {
        return Err("must be at least 100ms".to_string());
    }
    Ok(d)
}

pub fn run(args: TopArgs) -> ExitCode {
    match top(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn top(args: TopArgs) -> anyhow::Result<()> {
    let address = address(&args)?;
    // A refresh that takes longer than this is shown as the API being unreachable.
    let timeout = args.interval.max(Duration::from_secs(3));
    let api = Api::new(&address, timeout)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("sluice-top")
        .build()
        .context("starting the runtime")?;
    // Before any screen is drawn: a wrong address is a one-line error, not an empty view.
    let first = rt.block_on(api.snapshot()).map_err(|e| anyhow!("{}", api.unreachable(&e)))?;
    if args.once || !std::io::stdout().is_terminal() {
        plain::run(&rt, &api, first, args.interval, args.once)
    } else {
        render::live(&rt, api, first, args.interval)
    }
}

/// The address to connect to: `--api`, else the config's `api.address`, else the default.
fn address(args: &TopArgs) -> anyhow::Result<String> {
    if let Some(a) = &args.api {
        let a = a.trim();
        if a.is_empty() {
            bail!("--api needs an address such as 127.0.0.1:9600");
        }
        return Ok(a.to_string());
    }
    let Some(path) = &args.config else { return Ok(ApiConfig::default().address) };
    // Only the `api` section matters here: a `${VAR}` that `sluice run` had in its environment
    // and this shell lacks, elsewhere in the file, must not stop `top`.
    let api = load_api_section(path).map_err(|e| anyhow!("{e}"))?;
    if !api.enabled {
        bail!("{}: the monitoring API is disabled (api.enabled: false); nothing to watch", path.display());
    }
    connectable(&api.address).with_context(|| format!("{}: api.address `{}`", path.display(), api.address))
}

/// A listening address turned into one to connect to: a wildcard host means this host.
fn connectable(listen: &str) -> anyhow::Result<String> {
    let Ok(addr) = listen.parse::<SocketAddr>() else { return Ok(listen.to_string()) };
    if addr.port() == 0 {
        bail!("port 0 is picked when sluice starts; pass --api with the address it logged");
    }
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, addr.port()).to_string())
}

/// The monitoring API of one sluice.
pub struct Api {
    client: reqwest::Client,
    url: String,
    /// The address as the operator gave it, for messages.
    pub address: String,
}

impl Api {
    fn new(address: &str, timeout: Duration) -> anyhow::Result<Api> {
        let base = if address.contains("://") { address.to_string() } else { format!("http://{address}") };
        let url = format!("{}/stats", base.trim_end_matches('/'));
        reqwest::Url::parse(&url).map_err(|e| anyhow!("--api {address}: not an address ({e})"))?;
        // reqwest is built without a default crypto provider; an https:// address needs one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // The API is plain, unauthenticated HTTP reached directly; a proxy from the
        // environment would turn 127.0.0.1 into the proxy's own host.
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(timeout)
            .timeout(timeout)
            .build()
            .context("building the HTTP client")?;
        Ok(Api { client, url, address: address.to_string() })
    }

    /// The one-line message for a failed fetch.
    pub fn unreachable(&self, error: &str) -> String {
        format!("cannot reach the monitoring API at {}: {error}", self.address)
    }

    /// Fetches `/stats` once.
    pub async fn snapshot(&self) -> Result<Snapshot, String> {
        let response = self.client.get(&self.url).send().await.map_err(|e| describe(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET /stats answered {status}"));
        }
        let body = response.bytes().await.map_err(|e| describe(&e))?;
        let doc: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("the /stats answer is not JSON ({e})"))?;
        Snapshot::parse(&doc, Instant::now(), SystemTime::now())
    }
}

/// A request error as an operator can act on it: reqwest's own message names only the URL,
/// and the cause that matters ("Connection refused") is the innermost one.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "no answer in time".to_string();
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_connect_to_this_host() {
        assert_eq!(connectable("0.0.0.0:9600").unwrap(), "127.0.0.1:9600");
        assert_eq!(connectable("[::]:9600").unwrap(), "[::1]:9600");
        assert_eq!(connectable("10.1.2.3:80").unwrap(), "10.1.2.3:80");
        assert_eq!(connectable("monitor.internal:9600").unwrap(), "monitor.internal:9600");
        assert!(connectable("127.0.0.1:0").is_err());
    }

    #[test]
    fn intervals_below_a_tenth_of_a_second_are_refused() {
        assert!(parse_interval("10ms").is_err());
        assert_eq!(parse_interval("2s").unwrap(), Duration::from_secs(2));
    }
}
