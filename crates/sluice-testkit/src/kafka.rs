//! A real Apache Kafka 4.3.1 broker for tests (KRaft: one process that is broker and controller),
//! started by `servers/kafka/run` from Maven Central jars (Java 17 and Maven are needed; the jars
//! are fetched once into `target/servers/kafka`, or `$SLUICE_SERVERS_DIR/kafka`).
//!
//! A test that needs the broker fails when it cannot be started: use [`Kafka::start_or_panic`].
//! The broker is a [`crate::server::Server`]: its own directory, a free port on 127.0.0.1,
//! stopped when dropped (or by the `run` script's watchdog when the test process dies without
//! dropping it).
//!
//! Topics are administered, and records produced and read back, by a small Java client on the
//! broker's own jars (`servers/kafka/SluiceKafkaAdmin.java`): no Kafka client in Rust here, and
//! one that is independent of librdkafka. Each call starts a JVM (1 to 2 s).
//!
//! [`Kafka::start_secured`] starts a broker whose client listener (the one [`Kafka::bootstrap`]
//! names) speaks SASL_PLAINTEXT, SSL or SASL_SSL instead ([`Security`]); the broker then keeps
//! a PLAINTEXT listener beside it for the admin client, which needs no credentials.
//!
//! ```no_run
//! use sluice_testkit::kafka::Kafka;
//! let kafka = Kafka::start_or_panic(&[("auto.create.topics.enable", "false")]);
//! kafka.create_topic("logs", 3);
//! // ... a client on kafka.bootstrap() writes 100 records to "logs" ...
//! let records = kafka.consume_all("logs", 100, std::time::Duration::from_secs(30));
//! assert_eq!(records.len(), 100);
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::server::Server;

/// One record read back by [`Kafka::consume_all`]: partition, offset, key (`None` when null),
/// value (empty when null).
pub type Record = (i32, i64, Option<Vec<u8>>, Vec<u8>);

/// One partition of a topic, as [`Kafka::describe_topic`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: i32,
    /// The leader's node id; `None` while the partition has none (the broker is fenced).
    pub leader: Option<i32>,
    /// The offset the next record written to the partition gets.
    pub end_offset: i64,
}

/// How the client listener of [`Kafka::start_secured`] is secured. With SASL, the mechanisms
/// PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 are all enabled, and each user (name, password; letters,
/// digits, `-`, `_`, `.`) is valid for all three.
#[derive(Debug, Clone)]
pub enum Security {
    SaslPlaintext { users: Vec<(String, String)> },
    Ssl(ListenerTls),
    SaslSsl { users: Vec<(String, String)>, tls: ListenerTls },
}

/// The TLS listener's PEM files: its certificate (chain), its PKCS#8 key (as rcgen writes it),
/// and optionally the CA that client certificates must be signed by (then one is required).
#[derive(Debug, Clone)]
pub struct ListenerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl Security {
    /// The `run start` arguments.
    fn args(&self) -> Vec<String> {
        let (mode, users, tls) = match self {
            Security::SaslPlaintext { users } => ("sasl_plaintext", users.as_slice(), None),
            Security::Ssl(tls) => ("ssl", &[][..], Some(tls)),
            Security::SaslSsl { users, tls } => ("sasl_ssl", users.as_slice(), Some(tls)),
        };
        let mut args = vec!["--security".to_string(), mode.to_string()];
        for (name, password) in users {
            args.extend(["--user".to_string(), format!("{name}:{password}")]);
        }
        if let Some(tls) = tls {
            args.extend(["--cert".to_string(), tls.cert.display().to_string()]);
            args.extend(["--key".to_string(), tls.key.display().to_string()]);
            if let Some(ca) = &tls.client_ca {
                args.extend(["--client-ca".to_string(), ca.display().to_string()]);
            }
        }
        args
    }
}

/// A running (or stopped or killed, until [`Kafka::restart`]) Kafka broker.
pub struct Kafka {
    server: Server,
}

impl Kafka {
    /// Starts a broker with `extra_settings` (`server.properties` settings such as
    /// `("auto.create.topics.enable", "false")`, which win over the harness's one-node defaults)
    /// on a free port, and waits until it is ready (at most 60 s, `SLUICE_KAFKA_TIMEOUT`). The
    /// error says why it could not, with the end of the broker's log.
    pub fn start(extra_settings: &[(&str, &str)]) -> Result<Kafka, String> {
        Kafka::start_with(Vec::new(), extra_settings)
    }

    /// [`Kafka::start`] with the client listener secured as `security` says: clients of
    /// [`Kafka::bootstrap`] need the credentials or the CA, the admin calls of this type do not.
    pub fn start_secured(security: &Security, extra_settings: &[(&str, &str)]) -> Result<Kafka, String> {
        Kafka::start_with(security.args(), extra_settings)
    }

    /// [`Kafka::start_secured`], panicking with the reason when the broker cannot be started.
    pub fn start_secured_or_panic(security: &Security, extra_settings: &[(&str, &str)]) -> Kafka {
        match Kafka::start_secured(security, extra_settings) {
            Ok(kafka) => kafka,
            Err(e) => panic!("cannot start a secured Kafka for this test: {e}"),
        }
    }

    fn start_with(security: Vec<String>, extra_settings: &[(&str, &str)]) -> Result<Kafka, String> {
        let mut args: Vec<String> =
            extra_settings.iter().flat_map(|(k, v)| ["--setting".to_string(), format!("{k}={v}")]).collect();
        args.extend(security);
        Ok(Kafka { server: Server::start("kafka", "logs/server.log", args)? })
    }

    /// [`Kafka::start`], panicking with the reason when the broker cannot be started: a test
    /// that needs Kafka fails rather than skips.
    pub fn start_or_panic(extra_settings: &[(&str, &str)]) -> Kafka {
        match Kafka::start(extra_settings) {
            Ok(kafka) => kafka,
            Err(e) => panic!("cannot start Kafka for this test: {e}"),
        }
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`: the client listener, secured when the broker
    /// was started by [`Kafka::start_secured`].
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// The client listener's port on 127.0.0.1 (PLAINTEXT unless started secured).
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `127.0.0.1:PORT` of a PLAINTEXT listener: the client listener, or for a secured broker
    /// the one beside it that the admin calls use.
    pub fn plaintext_bootstrap(&self) -> String {
        match std::fs::read_to_string(self.dir().join("admin-port")) {
            Ok(port) => format!("127.0.0.1:{}", port.trim()),
            Err(_) => self.bootstrap(),
        }
    }

    /// The broker's directory: `server.properties`, `data/`, `logs/server.log`, `console.log`,
    /// `pid`.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// Whether the broker was started and not stopped or killed since.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// SIGKILL, as a crash: returns once the process is gone. The data stay for
    /// [`Kafka::restart`].
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Stops the broker cleanly (SIGTERM, a controlled shutdown; SIGKILL after 30 s). The data
    /// stay for [`Kafka::restart`].
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Starts the broker again on the same port with the same data and settings (stopping it
    /// cleanly first if it still runs), and waits until it is ready.
    pub fn restart(&mut self) -> Result<(), String> {
        self.server.restart()
    }

    /// [`Kafka::restart`], panicking with the reason when the broker does not come back.
    pub fn restart_or_panic(&mut self) {
        if let Err(e) = self.restart() {
            panic!("cannot restart Kafka: {e}");
        }
    }

    /// Creates `name` with `partitions` partitions (replication factor 1), and returns once
    /// every partition has a leader. Panics when it cannot (the topic exists already, ...).
    pub fn create_topic(&self, name: &str, partitions: u32) {
        if let Err(e) = self.try_create_topic(name, partitions, &[]) {
            panic!("cannot create the topic {name}: {e}");
        }
    }

    /// [`Kafka::create_topic`] with topic configs (`("retention.ms", "-1")`, ...), and an error
    /// instead of a panic.
    pub fn try_create_topic(&self, name: &str, partitions: u32, configs: &[(&str, &str)]) -> Result<(), String> {
        let mut args = vec!["create-topic".to_string(), name.to_string(), partitions.to_string()];
        args.extend(configs.iter().map(|(k, v)| format!("{k}={v}")));
        self.admin(&args, None).map(drop)
    }

    /// The partitions of `name` with their leaders and end offsets; `None` when there is no such
    /// topic. Panics when the broker does not answer.
    pub fn describe_topic(&self, name: &str) -> Option<Vec<PartitionState>> {
        let out = match self.admin(&["describe-topic".to_string(), name.to_string()], None) {
            Ok(out) => out,
            Err(e) if e.starts_with("exit status: 3") => return None,
            Err(e) => panic!("cannot describe the topic {name}: {e}"),
        };
        let parse = |line: &str| -> Option<PartitionState> {
            let mut f = line.split(' ');
            let partition = f.next()?.parse().ok()?;
            let leader: i32 = f.next()?.parse().ok()?;
            let end_offset = f.next()?.parse().ok()?;
            Some(PartitionState { partition, leader: (leader >= 0).then_some(leader), end_offset })
        };
        Some(out.lines().map(|l| parse(l).unwrap_or_else(|| panic!("describe-topic printed {l:?}"))).collect())
    }

    /// The names of the topics that are not internal, sorted. Panics when the broker does not
    /// answer.
    pub fn topics(&self) -> Vec<String> {
        let out =
            self.admin(&["list-topics".to_string()], None).unwrap_or_else(|e| panic!("cannot list the topics: {e}"));
        out.lines().map(str::to_string).collect()
    }

    /// Reads `topic` from its beginning (every partition, no consumer group, uncommitted
    /// transactional records included) until `expected` records were read or `timeout` is up,
    /// then on to the end offsets of that moment, so that duplicates show. Returns the records
    /// in the order read (offset order within a partition). Panics when the broker does not
    /// answer or there is no such topic; fewer records than expected are not an error here.
    pub fn consume_all(&self, topic: &str, expected: usize, timeout: Duration) -> Vec<Record> {
        let args = ["consume".to_string(), topic.to_string(), expected.to_string(), timeout.as_millis().to_string()];
        let out = self.admin(&args, None).unwrap_or_else(|e| panic!("cannot read the topic {topic}: {e}"));
        out.lines().map(|l| parse_record(l).unwrap_or_else(|| panic!("consume printed {l:?}"))).collect()
    }

    /// Writes `records` (key, value) to `topic` with acks=all, idempotently, the partition
    /// chosen by the key (by Kafka's default partitioner, as Java clients do), and returns once
    /// all are acknowledged. Panics when they are not.
    pub fn produce(&self, topic: &str, records: &[(Option<&[u8]>, &[u8])]) {
        let mut input = String::new();
        for (key, value) in records {
            input.push_str("- ");
            input.push_str(&key.map_or_else(|| "-".to_string(), hex));
            input.push(' ');
            input.push_str(&hex(value));
            input.push('\n');
        }
        if let Err(e) = self.admin(&["produce".to_string(), topic.to_string()], Some(&input)) {
            panic!("cannot produce to the topic {topic}: {e}");
        }
    }

    /// The last `lines` lines of the broker's log (for a failing test's message).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }

    /// `run admin --dir D ARGS...`: its stdout, or its status and stderr.
    fn admin(&self, args: &[String], stdin: Option<&str>) -> Result<String, String> {
        let mut cmd = self.server.command("admin");
        cmd.args(args);
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("cannot run servers/kafka/run (bash is needed): {e}"))?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("piped");
            let input = input.to_string();
            // Written from a thread: the client may print while it reads.
            std::thread::spawn(move || {
                let _ = pipe.write_all(input.as_bytes());
            });
        }
        let out = child.wait_with_output().map_err(|e| format!("servers/kafka/run admin: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim_end()))
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `-` is null; otherwise lower- or upper-case hex digits in pairs.
fn unhex(text: &str) -> Option<Option<Vec<u8>>> {
    if text == "-" {
        return Some(None);
    }
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()
        .map(Some)
}

/// `<partition> <offset> <key hex or -> <value hex or ->`, as SluiceKafkaAdmin prints a record.
fn parse_record(line: &str) -> Option<Record> {
    let mut f = line.split(' ');
    let partition = f.next()?.parse().ok()?;
    let offset = f.next()?.parse().ok()?;
    let key = unhex(f.next()?)?;
    let value = unhex(f.next()?)?.unwrap_or_default();
    f.next().is_none().then_some((partition, offset, key, value))
}

#[cfg(test)]
mod tests {
    use super::{hex, parse_record, unhex};

    #[test]
    fn records_round_trip_through_hex() {
        assert_eq!(hex(b"\x00k\xff"), "006bff");
        assert_eq!(unhex("006bff"), Some(Some(b"\x00k\xff".to_vec())));
        assert_eq!(unhex("-"), Some(None));
        assert_eq!(unhex(""), Some(Some(Vec::new())));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(parse_record("2 0 6b 68656c6c6f"), Some((2, 0, Some(b"k".to_vec()), b"hello".to_vec())));
        assert_eq!(parse_record("1 7 - "), Some((1, 7, None, Vec::new())));
        assert_eq!(parse_record("1 7 - -"), Some((1, 7, None, Vec::new())));
        assert_eq!(parse_record("1 7 -"), None);
        assert_eq!(parse_record("1 7 - 00 extra"), None);
    }
}
