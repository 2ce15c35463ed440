//! The launcher of the real servers under `servers/<name>/run` (Java 17 and Maven fetch their
//! jars once into `target/servers/<name>`, or `$SLUICE_SERVERS_DIR/<name>`), shared by
//! [`crate::opensearch`] and [`crate::kafka`] and the next server alike.
//!
//! Every `run` script takes the same commands: `start --dir D --port P --owner-pid PID ARGS...`
//! (returns once the server is ready, or fails with the end of its log; says "is busy" when the
//! port was taken), `stop --dir D` (SIGTERM, SIGKILL after a grace period), `kill --dir D`
//! (SIGKILL). A [`Server`] has its own directory (removed when dropped), a port on 127.0.0.1
//! from [`free_port`], and is stopped when dropped, or by the script's watchdog when the test
//! process dies without dropping it. A test that panics gets the end of the server's log.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A port for a server a test starts. Never handed out twice in one process, and below the
/// kernel's ephemeral range (32768 and up by default): a port the kernel picked with `bind(0)`
/// and let go can be picked again for another test's server, or as the local port of an outgoing
/// connection, before the server meant for it binds it.
///
/// # Panics
/// When no port in the range is free.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 10_000;
    const PORTS: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Processes started side by side begin at different places.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % PORTS,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..PORTS {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % PORTS) as u16;
        let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + PORTS)
}

/// A server started by `servers/<name>/run` (running, or stopped or killed until
/// [`Server::restart`]).
pub struct Server {
    name: &'static str,
    dir: Option<tempfile::TempDir>,
    port: u16,
    /// The arguments of `start` after the directory, port and owner.
    args: Vec<String>,
    /// The server's own log, relative to its directory (for [`Server::log_tail`]).
    log: &'static str,
    running: bool,
}

impl Server {
    /// Starts `servers/<name>/run start ... args` in a new directory on a free port (another
    /// one, up to three times, when the port was taken meanwhile). `log` is the server's log
    /// file within its directory. The error says why it could not start.
    pub fn start(name: &'static str, log: &'static str, args: Vec<String>) -> Result<Server, String> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("sluice-{name}-"))
            .tempdir()
            .map_err(|e| format!("cannot create a directory for {name}: {e}"))?;
        let mut server = Server { name, dir: Some(dir), port: 0, args, log, running: false };
        let mut last = String::new();
        for _ in 0..3 {
            server.port = free_port();
            match server.run_start() {
                Ok(()) => return Ok(server),
                Err(e) if e.contains("is busy") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// The port on 127.0.0.1 it was started on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory (config, data, logs, `pid`), removed when dropped.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("present until dropped").path()
    }

    /// Whether it was started and not stopped or killed since.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// SIGKILL, as a crash: returns once the process is gone. The data stay for
    /// [`Server::restart`].
    pub fn kill(&mut self) {
        self.run_stop("kill");
    }

    /// Stops it cleanly (the script's `stop`). The data stay for [`Server::restart`].
    pub fn stop(&mut self) {
        self.run_stop("stop");
    }

    /// Starts it again on the same port with the same data and arguments (stopping it cleanly
    /// first if it still runs), and waits until it is ready.
    pub fn restart(&mut self) -> Result<(), String> {
        if self.running {
            self.stop();
        }
        self.run_start()
    }

    /// `bash servers/<name>/run COMMAND --dir D`, for the script's other commands.
    pub fn command(&self, command: &str) -> Command {
        let mut cmd = run_script(self.name);
        cmd.arg(command).arg("--dir").arg(self.dir());
        cmd
    }

    /// The last `lines` lines of the server's log (for a failing test's message).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir().join(self.log)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn run_start(&mut self) -> Result<(), String> {
        let name = self.name;
        let mut cmd = run_script(name);
        cmd.arg("start")
            .arg("--dir")
            .arg(self.dir())
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--owner-pid")
            .arg(std::process::id().to_string())
            .args(&self.args);
        let out = cmd.output().map_err(|e| format!("cannot run servers/{name}/run (bash is needed): {e}"))?;
        if out.status.success() {
            self.running = true;
            Ok(())
        } else {
            Err(format!(
                "servers/{name}/run start failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ))
        }
    }

    fn run_stop(&mut self, how: &str) {
        let name = self.name;
        let out = self.command(how).output();
        self.running = false;
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                eprintln!(
                    "{name}: run {how} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim_end()
                )
            }
            Err(e) => eprintln!("{name}: cannot run servers/{name}/run {how}: {e}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{}: the test panicked; last lines of its log ({}):\n{}",
                self.name,
                self.dir().join(self.log).display(),
                self.log_tail(40)
            );
        }
        if self.running {
            self.stop();
        }
        drop(self.dir.take());
    }
}

fn run_script(name: &str) -> Command {
    let script: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "..", "servers", name, "run"].iter().collect();
    let mut cmd = Command::new("bash");
    cmd.arg(script);
    cmd
}
