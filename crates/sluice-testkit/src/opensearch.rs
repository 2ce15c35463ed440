//! A real single-node OpenSearch 2.19.6 for tests, started by `servers/opensearch/run` from
//! Maven Central jars (Java 17 and Maven are needed; the jars are fetched once into
//! `target/servers/opensearch`, or `$SLUICE_SERVERS_DIR/opensearch`).
//!
//! A test that needs the server fails when it cannot be started: use
//! [`OpenSearch::start_or_panic`]. The node is a [`crate::server::Server`]: its own home
//! directory, a free HTTP port on 127.0.0.1, stopped when dropped (or by the `run` script's
//! watchdog when the test process dies without dropping it).
//!
//! ```no_run
//! use sluice_testkit::opensearch::OpenSearch;
//! let os = OpenSearch::start_or_panic(&[("thread_pool.write.queue_size", "1")]);
//! let (status, _) = os.request("PUT", "/logs", r#"{"settings":{"number_of_replicas":0}}"#);
//! assert_eq!(status, 200);
//! os.refresh("logs");
//! assert_eq!(os.count("logs"), 0);
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::server::Server;

/// How long one request may take before [`OpenSearch::try_request`] gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A running (or killed, until [`OpenSearch::restart`]) OpenSearch node.
pub struct OpenSearch {
    server: Server,
}

impl OpenSearch {
    /// Starts a node with `extra_settings` (node settings such as
    /// `("thread_pool.write.size", "1")`) on a free port, and waits until its cluster health is
    /// yellow or green (at most 90 s, `SLUICE_OPENSEARCH_TIMEOUT`). The error says why it could
    /// not, with the end of the node's log.
    pub fn start(extra_settings: &[(&str, &str)]) -> Result<OpenSearch, String> {
        let args = extra_settings.iter().flat_map(|(k, v)| ["--setting".to_string(), format!("{k}={v}")]).collect();
        Ok(OpenSearch { server: Server::start("opensearch", "logs/opensearch.log", args)? })
    }

    /// [`OpenSearch::start`], panicking with the reason when the node cannot be started: a test
    /// that needs OpenSearch fails rather than skips.
    pub fn start_or_panic(extra_settings: &[(&str, &str)]) -> OpenSearch {
        match OpenSearch::start(extra_settings) {
            Ok(os) => os,
            Err(e) => panic!("cannot start OpenSearch for this test: {e}"),
        }
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// The HTTP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The node's home: `config/`, `data/`, `logs/opensearch.log`, `console.log`, `pid`.
    pub fn home(&self) -> &Path {
        self.server.dir()
    }

    /// Whether the node was started and not stopped or killed since.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// SIGKILL, as a crash: returns once the process is gone. The data stay for
    /// [`OpenSearch::restart`].
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Stops the node cleanly (SIGTERM; SIGKILL after 30 s). The data stay for
    /// [`OpenSearch::restart`].
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Starts the node again on the same port with the same data and settings (stopping it
    /// cleanly first if it still runs), and waits until it is ready.
    pub fn restart(&mut self) -> Result<(), String> {
        self.server.restart()
    }

    /// [`OpenSearch::restart`], panicking with the reason when the node does not come back.
    pub fn restart_or_panic(&mut self) {
        if let Err(e) = self.restart() {
            panic!("cannot restart OpenSearch: {e}");
        }
    }

    /// One HTTP/1.1 request: `body` is sent as `application/json` (OpenSearch takes NDJSON
    /// bodies for `_bulk` under that type too); an empty `body` sends none. Returns the status
    /// and the body. Panics when there is no answer (use [`OpenSearch::try_request`] for that).
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.try_request(method, path, body).unwrap_or_else(|e| panic!("{method} {path} on OpenSearch: {e}"))
    }

    /// [`OpenSearch::request`], with an error instead of a panic when nothing answers.
    pub fn try_request(&self, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
        http_request(self.port(), method, path, body)
    }

    /// `POST /{index}/_refresh`, asserting that it succeeded.
    pub fn refresh(&self, index: &str) {
        let (status, body) = self.request("POST", &format!("/{index}/_refresh"), "");
        assert_eq!(status, 200, "refresh of {index}: {body}");
    }

    /// The number of documents in `index` (`GET /{index}/_count`), asserting that it answered.
    pub fn count(&self, index: &str) -> u64 {
        let (status, body) = self.request("GET", &format!("/{index}/_count"), "");
        assert_eq!(status, 200, "count of {index}: {body}");
        json_u64(&body, "count").unwrap_or_else(|| panic!("no count in the answer: {body}"))
    }

    /// The last `lines` lines of the node's log (for a failing test's message).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }
}

/// One request on its own connection (`Connection: close`) to 127.0.0.1:`port`.
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("cannot connect to 127.0.0.1:{port}: {e}"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    stream.write_all(&bytes).map_err(|e| format!("sending the request: {e}"))?;

    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| format!("reading the status line: {e}"))?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP status line: {line:?}"))?;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(|e| format!("reading the headers: {e}"))?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if method.eq_ignore_ascii_case("HEAD") {
        // No body, whatever Content-Length says.
    } else if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line).map_err(|e| format!("reading a chunk size: {e}"))?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| format!("not a chunk size: {line:?}"))?;
            if size == 0 {
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..]).map_err(|e| format!("reading a chunk: {e}"))?;
            line.clear();
            reader.read_line(&mut line).map_err(|e| format!("reading a chunk's end: {e}"))?;
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        reader.read_exact(&mut body).map_err(|e| format!("reading the body: {e}"))?;
    } else {
        reader.read_to_end(&mut body).map_err(|e| format!("reading the body: {e}"))?;
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The first unsigned integer value of `"key":` in a JSON text (no JSON parser in this crate).
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let pattern = format!("\"{key}\"");
    let at = json.find(&pattern)? + pattern.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::json_u64;

    #[test]
    fn finds_a_count() {
        let body = r#"{"count":3,"_shards":{"total":1,"successful":1}}"#;
        assert_eq!(json_u64(body, "count"), Some(3));
        assert_eq!(json_u64(r#"{ "count" : 42 }"#, "count"), Some(42));
        assert_eq!(json_u64(r#"{"other":1}"#, "count"), None);
    }
}
