//! Runs the real `sluice` binary for integration tests: writes a config, starts the process
//! with stderr captured to a file, finds the monitoring API's port in the log, talks HTTP to it
//! with a plain socket, and stops the process with a signal.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

// The shared helpers: ports never handed out twice in the process, the seeded random generator
// (`SLUICE_TEST_SEED` replays a failing run), the bounded polling loop.
pub use sluice_testkit::{Rng, eventually, free_port, wait_until};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// One of the loghub samples kept in the repository (`tests/data/loghub`).
pub fn loghub(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/loghub").join(name);
    assert!(p.exists(), "sample log {} is missing (the samples are in tests/data/loghub)", p.display());
    p
}

pub struct Sluice {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    stderr: PathBuf,
}

impl Sluice {
    /// Starts `sluice run` on a config; `{dir}` in the text is replaced by a fresh temp dir.
    pub fn start(config: &str) -> Sluice {
        Self::start_with(config, Stdio::null())
    }

    pub fn start_with(config: &str, stdin: Stdio) -> Sluice {
        Self::start_in(tempfile::tempdir().unwrap(), config, stdin)
    }

    /// Starts in a given directory (kept across restarts by handing it back with `into_dir`).
    pub fn start_in(dir: tempfile::TempDir, config: &str, stdin: Stdio) -> Sluice {
        let text = without_default_api(&config.replace("{dir}", dir.path().to_str().unwrap()));
        let path = dir.path().join("sluice.yml");
        std::fs::write(&path, text).unwrap();
        let stderr = dir.path().join("stderr.log");
        let child = Command::new(BIN)
            .args(["run", "-c", path.to_str().unwrap()])
            .env("SLUICE_LOG", std::env::var("TEST_SLUICE_LOG").unwrap_or("info".into()))
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Sluice { child, dir, config: path, stderr }
    }

    /// Kills the process with SIGKILL and returns the directory for the next start.
    pub fn kill_into_dir(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    /// Waits for a clean exit (after `stop`) and returns the directory.
    pub fn into_dir(mut self) -> tempfile::TempDir {
        let _ = self.child.wait();
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; panics with the log after `timeout`.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if self.log().contains(needle) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sluice exited ({status}) before logging `{needle}`:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("sluice did not log `{needle}` within {timeout:?}:\n{}", self.log());
    }

    /// Waits until something listens on a local port (an input coming up).
    pub fn wait_port(&mut self, port: u16) {
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sluice exited ({status}) at start:\n{}", self.log());
            }
            assert!(started.elapsed() < Duration::from_secs(30), "port {port} did not come up:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The monitoring API's address, read from the log.
    pub fn api(&mut self) -> String {
        self.wait_log("monitoring API listening", Duration::from_secs(20));
        let log = self.log();
        let line = log.lines().find(|l| l.contains("monitoring API listening")).unwrap();
        let at = line.find("address=").expect("address in the log line") + "address=".len();
        line[at..].split_whitespace().next().unwrap().to_string()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args(["-s", sig, &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill -s {sig} failed");
    }

    /// Waits for the process to exit on its own; returns its status and log.
    pub fn wait(&mut self, timeout: Duration) -> (ExitStatus, String) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, self.log());
            }
            if started.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("sluice did not exit within {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then wait for the drain to finish.
    pub fn stop(&mut self) -> (ExitStatus, String) {
        self.signal("TERM");
        self.wait(Duration::from_secs(60))
    }

    pub fn stdout(&mut self) -> String {
        let mut s = String::new();
        self.child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
        s
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config that says nothing of `api` gets it disabled: the default address is one port for
/// every test running at once, and a node whose API cannot listen does not start.
fn without_default_api(config: &str) -> String {
    if config.lines().any(|l| l.starts_with("api:")) {
        config.to_string()
    } else {
        format!("api: {{enabled: false}}\n{config}")
    }
}

/// Runs `sluice run` on `config` (`{dir}` is a fresh temp dir) with `stdin` fed from a file
/// until it exits by itself; whether it succeeded, and its log.
#[allow(dead_code)]
/// `sluice dlq show` of `pipeline`'s dead letter queue under `data_dir`: its entries as JSON.
pub fn dlq_show(data_dir: &Path, pipeline: &str) -> Vec<serde_json::Value> {
    let out = Command::new(BIN)
        .args(["dlq", "show", "--data-dir", data_dir.to_str().unwrap(), "--pipeline", pipeline])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "dlq show failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

pub fn run_to_end(config: &str, stdin: &Path) -> (bool, String) {
    let mut s = Sluice::start_with(config, Stdio::from(std::fs::File::open(stdin).unwrap()));
    let (status, log) = s.wait(Duration::from_secs(300));
    (status.success(), log)
}

/// A summary line's numbers: `pipeline web: in=1 out=1 dropped=0 failed=0 unfinished=0 seconds=0.1`.
pub fn summary(log: &str, pipeline: &str) -> std::collections::HashMap<String, u64> {
    let prefix = format!("pipeline {pipeline}: ");
    let line = log
        .lines()
        .rev()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no summary line for pipeline {pipeline} in:\n{log}"));
    line[prefix.len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse::<f64>().ok()? as u64)))
        .collect()
}

/// A plain HTTP/1.1 request; returns (status, body).
pub fn http(address: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    try_http(address, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path} to {address}: {e}"))
}

/// The same, with connection errors returned (for servers that may be killed mid-request).
pub fn try_http(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(address)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = match text.split_once("\r\n\r\n") {
        Some((head, b)) if head.to_ascii_lowercase().contains("transfer-encoding: chunked") => dechunk(b),
        Some((_, b)) => b.to_string(),
        None => String::new(),
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn get_json(api: &str, path: &str) -> serde_json::Value {
    let (status, body) = http(api, "GET", path, &[], b"");
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// A metric's value from Prometheus text, by exact name-and-labels prefix.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no series `{series}` in:\n{text}"))
}

pub fn validate(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("check.yml");
    std::fs::write(&path, config.replace("{dir}", dir.path().to_str().unwrap())).unwrap();
    let out = Command::new(BIN).args(["validate", "-c", path.to_str().unwrap()]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text.replace(path.to_str().unwrap(), "check.yml"))
}

/// A tiny HTTP/1.1 server on a free loopback port, for outputs to send to: each request on a
/// connection (kept alive) is read whole, its body sized by Content-Length, and answered with the
/// full response text `respond` returns for that body. Returns the server's address.
pub fn serve_http(respond: impl Fn(&[u8]) -> String + Send + Sync + 'static) -> String {
    serve_http_on(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), respond)
}

/// [`serve_http`] on a listener of the caller's (a port chosen before the server appears).
pub fn serve_http_on(
    listener: std::net::TcpListener,
    respond: impl Fn(&[u8]) -> String + Send + Sync + 'static,
) -> String {
    use std::io::{BufRead, BufReader};
    let addr = listener.local_addr().unwrap().to_string();
    let respond = std::sync::Arc::new(respond);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let respond = respond.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut len = 0usize;
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    if conn.write_all(respond(&body).as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// How many times crash tests kill the process: `SLUICE_CRASH_CYCLES`, 30 by default.
pub fn crash_cycles() -> usize {
    std::env::var("SLUICE_CRASH_CYCLES").ok().and_then(|c| c.parse().ok()).unwrap_or(30)
}

/// Every number that follows `marker` in the file at `path`, with how often it appears.
pub fn numbers_after(path: &Path, marker: &str) -> std::collections::BTreeMap<u64, u32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = std::collections::BTreeMap::new();
    for piece in text.split(marker).skip(1) {
        let digits: String = piece.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            *seen.entry(n).or_insert(0) += 1;
        }
    }
    seen
}

impl Sluice {
    /// Starts `sluice run` under a wrapper command that execs the binary (such as
    /// `ip netns exec NAME`), so that signals sent to the child reach `sluice` itself.
    pub fn start_wrapped(dir: tempfile::TempDir, config: &str, wrapper: &[&str]) -> Sluice {
        let text = without_default_api(&config.replace("{dir}", dir.path().to_str().unwrap()));
        let path = dir.path().join("sluice.yml");
        std::fs::write(&path, text).unwrap();
        let stderr = dir.path().join("stderr.log");
        let (program, args) = wrapper.split_first().expect("a wrapper command");
        let child = Command::new(program)
            .args(args)
            .args([BIN, "run", "-c", path.to_str().unwrap()])
            .env("SLUICE_LOG", std::env::var("TEST_SLUICE_LOG").unwrap_or("info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Sluice { child, dir, config: path, stderr }
    }
}

/// `count` per `user` in an `aggregate` output file (JSON lines), summed over its lines. Read
/// while the node runs, too: a last line not finished yet (no newline) is left for the next read.
pub fn aggregate_counts(path: &Path) -> std::collections::BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    let mut out = std::collections::BTreeMap::new();
    for line in complete.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", path.display()));
        let user = v["user"].as_str().unwrap_or_else(|| panic!("{}: no /user in {line}", path.display()));
        let count = v["count"].as_u64().unwrap_or_else(|| panic!("{}: no /count in {line}", path.display()));
        *out.entry(user.to_string()).or_insert(0) += count;
    }
    out
}

/// Every user's aggregates are in exactly one of the `(node, output file)`s, and all `users`
/// appear; returns the sum of all counts.
pub fn each_user_on_one_node(outputs: &[(String, PathBuf)], users: u64) -> u64 {
    use std::collections::{BTreeMap, BTreeSet};
    let mut owners: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut sum = 0;
    for (node, output) in outputs {
        for (user, c) in aggregate_counts(output) {
            owners.entry(user).or_default().insert(node);
            sum += c;
        }
    }
    let split: Vec<_> = owners.iter().filter(|(_, o)| o.len() != 1).collect();
    assert!(split.is_empty(), "users aggregated on more than one node: {split:?}");
    let per_node: BTreeMap<&str, usize> =
        outputs.iter().map(|(n, _)| (n.as_str(), owners.values().filter(|o| o.contains(n.as_str())).count())).collect();
    eprintln!("users per node: {per_node:?}");
    assert_eq!(owners.len() as u64, users, "every user appears in some node's output");
    sum
}

/// The `cluster` object of a node's `/stats`.
pub fn cluster_stats(api: &str) -> serde_json::Value {
    get_json(api, "/stats")["cluster"].clone()
}

/// The component of `pipeline` whose `key` is `value` (`"id"`, `"bus"`; `"type"`, `"beats"`)
/// in a `/stats` body; `Null` when there is none (yet).
pub fn component(stats: &serde_json::Value, pipeline: &str, key: &str, value: &str) -> serde_json::Value {
    stats["pipelines"][pipeline]["components"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c[key] == value))
        .cloned()
        .unwrap_or_default()
}

/// Events the inputs of `pipeline` accepted, from `/stats`.
pub fn accepted(api: &str, pipeline: &str) -> u64 {
    let stats = get_json(api, "/stats");
    let components = stats["pipelines"][pipeline]["components"].as_array().cloned().unwrap_or_default();
    components.iter().filter(|c| c["kind"] == "input").map(|c| c["events"]["out"].as_u64().unwrap_or(0)).sum()
}

/// How a node sees `peer` (`connecting`, `up`, `down`, `probing`), from `/stats`.
pub fn peer_state(api: &str, peer: &str) -> String {
    cluster_stats(api)["peers"][peer]["state"].as_str().unwrap_or("?").to_string()
}
