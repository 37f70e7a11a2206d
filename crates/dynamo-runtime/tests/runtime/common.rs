//! Real `nats-server` and `etcd` processes for the integration tests, on free loopback
//! ports, killed on drop; `stop()`/`restart()` keep the port and the data directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on every wait of the tests (servers starting, events arriving).
pub(crate) const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Whether a plain-HTTP etcd on `port` answers `GET /health` with `"health":"true"`.
fn etcd_healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(1)));
    if tcp
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

/// A server process, killed on drop.
pub(crate) struct Server {
    child: Option<Child>,
    args: Vec<String>,
    program: &'static str,
    pub(crate) port: u16,
    dir: tempfile::TempDir,
}

impl Server {
    fn start(program: &'static str, port: u16, args: Vec<String>, dir: tempfile::TempDir) -> Self {
        let mut s = Self {
            child: None,
            args,
            program,
            port,
            dir,
        };
        s.restart();
        s
    }

    /// The server's scratch directory (configuration, data, certificates).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn restart(&mut self) {
        let child = Command::new(self.program)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (scripts/test.sh installs it): {e}",
                    self.program
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        // A port that accepts is not enough: another process may hold it (our server then
        // exits), and etcd accepts connections before it serves requests (a lease grant
        // right away can be reset under load). Wait for our child to stay up and, for plain
        // etcd, for `/health` to say true.
        let plain_etcd = self.program == "etcd" && !self.args.iter().any(|a| a == "--cert-file");
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("{} exited at start ({status})", self.program);
            }
            let up = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && (!plain_etcd || etcd_healthy(self.port));
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "{} did not start", self.program);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A nats-server with extra command-line arguments.
pub(crate) fn nats_server(extra: &[&str]) -> Server {
    nats_server_in(tempfile::tempdir().expect("tempdir"), extra)
}

/// A nats-server reading `config` (nats-server configuration syntax), e.g.
/// `authorization { token: "s3cret" }`.
pub(crate) fn nats_server_with_config(config: &str) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, config).expect("write nats.conf");
    let conf = conf.to_str().expect("utf-8 path").to_owned();
    nats_server_in(dir, &["-c", &conf])
}

fn nats_server_in(dir: tempfile::TempDir, extra: &[&str]) -> Server {
    let port = free_port();
    let mut args = vec![
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Server::start("nats-server", port, args, dir)
}

/// A single-member etcd on plain HTTP.
pub(crate) fn etcd_server() -> Server {
    etcd_server_in(tempfile::tempdir().expect("tempdir"), None)
}

/// PEM files of a test PKI: a CA, a server certificate for `127.0.0.1` and a client
/// certificate, all signed by the CA.
pub(crate) struct Pki {
    pub(crate) ca: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Generate a self-signed CA and the certificates it signs in `dir` (openssl CLI).
pub(crate) fn make_pki(dir: &Path) -> Pki {
    let days = "2";
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            days,
            "-subj",
            "/CN=dynamo-test-ca",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")
        .expect("write client.ext");
    for (name, cn) in [("server", "127.0.0.1"), ("client", "dynamo-test-client")] {
        let subj = format!("/CN={cn}");
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                &subj,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                days,
                "-extfile",
                &ext,
            ],
        );
    }
    Pki {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    }
}

/// A single-member etcd on HTTPS that requires client certificates signed by the test CA.
pub(crate) fn etcd_server_tls() -> (Server, Pki) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    let server = etcd_server_in(dir, Some(&pki));
    (server, pki)
}

fn etcd_server_in(dir: tempfile::TempDir, tls: Option<&Pki>) -> Server {
    let port = free_port();
    let peer = free_port();
    let data: PathBuf = dir.path().join("data");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client = format!("{scheme}://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{peer}");
    let mut args: Vec<String> = [
        "--name",
        "t",
        "--data-dir",
        data.to_str().expect("utf-8 path"),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("t={peer}"),
        "--log-level",
        "error",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(pki) = tls {
        let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
        args.extend([
            "--cert-file".to_owned(),
            path(&pki.server_cert),
            "--key-file".to_owned(),
            path(&pki.server_key),
            "--trusted-ca-file".to_owned(),
            path(&pki.ca),
            "--client-cert-auth".to_owned(),
        ]);
    }
    Server::start("etcd", port, args, dir)
}
