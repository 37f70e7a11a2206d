//! Runtime configuration from the environment (the reference's variable names). Empty
//! values count as unset.

use std::path::PathBuf;
use std::time::Duration;

use crate::discovery::file::FileStore;
use crate::error::{Error, Result};
use crate::transport::DEFAULT_MAX_MESSAGE_SIZE;

/// Settings of one [`crate::DistributedRuntime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Largest request body or response item (`DYN_TCP_MAX_MESSAGE_SIZE`, 32 MiB).
    pub max_message_size: usize,
    /// Host the request-plane listener binds and advertises (`DYN_TCP_RPC_HOST`). The
    /// default is loopback: embedded mode serves the processes of one machine.
    pub tcp_host: String,
    /// Listener port (`DYN_TCP_RPC_PORT`, 0 = OS-assigned).
    pub tcp_port: u16,
    /// Dial timeout (`DYN_TCP_CONNECT_TIMEOUT`, seconds, default 5).
    pub connect_timeout: Duration,
    /// Wait for a worker to accept a request (`DYN_TCP_REQUEST_TIMEOUT`, seconds; default
    /// 10, the reference docs' value: generous enough for a busy 2-core worker).
    pub request_timeout: Duration,
    /// Bound on draining in-flight streams at shutdown
    /// (`DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`, default 900).
    pub graceful_shutdown_timeout: Duration,
    /// How long an instance reported down stays excluded from routing
    /// (`DYN_RUNTIME_INHIBITED_DURATION_SECS`, default 5).
    pub inhibited_duration: Duration,
    /// Root of the file store (`DYN_FILE_KV`).
    pub file_kv_root: PathBuf,
    /// Lease TTL of the file store (`DYN_FILE_KV_TTL_SECS`, default 10).
    pub file_kv_ttl: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            tcp_host: "127.0.0.1".into(),
            tcp_port: 0,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            graceful_shutdown_timeout: Duration::from_secs(900),
            inhibited_duration: Duration::from_secs(5),
            file_kv_root: std::env::temp_dir().join("dynamo_store_kv"),
            file_kv_ttl: crate::discovery::file::DEFAULT_TTL,
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    var(name)
        .map(|v| {
            v.trim()
                .parse::<T>()
                .map_err(|_| Error::InvalidArgument(format!("invalid value {v:?} for {name}")))
        })
        .transpose()
}

fn secs(name: &str) -> Result<Option<Duration>> {
    Ok(parse::<f64>(name)?
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64))
}

impl RuntimeConfig {
    /// Defaults overridden by the environment.
    pub fn from_env() -> Result<Self> {
        let mut c = Self::default();
        if let Some(v) = parse::<usize>("DYN_TCP_MAX_MESSAGE_SIZE")? {
            c.max_message_size = v;
        }
        if let Some(v) = var("DYN_TCP_RPC_HOST") {
            c.tcp_host = v;
        }
        if let Some(v) = parse::<u16>("DYN_TCP_RPC_PORT")? {
            c.tcp_port = v;
        }
        if let Some(v) = secs("DYN_TCP_CONNECT_TIMEOUT")? {
            c.connect_timeout = v;
        }
        if let Some(v) = secs("DYN_TCP_REQUEST_TIMEOUT")? {
            c.request_timeout = v;
        }
        if let Some(v) = secs("DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS")? {
            c.graceful_shutdown_timeout = v;
        }
        if let Some(v) = secs("DYN_RUNTIME_INHIBITED_DURATION_SECS")? {
            c.inhibited_duration = v;
        }
        c.file_kv_root = FileStore::default_root();
        c.file_kv_ttl = FileStore::default_ttl();
        Ok(c)
    }
}

/// Where instances are discovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryBackend {
    /// In-process.
    Mem,
    /// A shared directory (processes of one machine).
    File,
    /// etcd (not in this build).
    Etcd,
    /// Kubernetes (not in this build).
    Kubernetes,
}

impl DiscoveryBackend {
    /// Parse `mem`, `file`, `etcd` (also `kv_store`) or `kubernetes` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mem" | "memory" => Ok(Self::Mem),
            "file" => Ok(Self::File),
            "etcd" | "kv_store" => Ok(Self::Etcd),
            "kubernetes" => Ok(Self::Kubernetes),
            _ => Err(Error::InvalidArgument(format!(
                "invalid discovery backend {s:?}: expected one of 'mem', 'file', 'etcd', 'kubernetes'"
            ))),
        }
    }
}

/// How requests reach workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPlane {
    /// Direct TCP.
    Tcp,
    /// NATS request/reply (not in this build).
    Nats,
}

impl RequestPlane {
    /// Parse `tcp` or `nats` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Self::Tcp),
            "nats" => Ok(Self::Nats),
            _ => Err(Error::InvalidArgument(format!(
                "invalid request plane {s:?}: expected 'tcp' or 'nats'"
            ))),
        }
    }
}

/// Parse an `event_plane` argument: `nats`, `zmq`, or empty (derived from discovery).
pub fn parse_event_plane(s: Option<&str>) -> Result<Option<&'static str>> {
    match s.map(|s| s.trim().to_ascii_lowercase()) {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) if s == "nats" => Ok(Some("nats")),
        Some(s) if s == "zmq" => Ok(Some("zmq")),
        Some(s) => Err(Error::InvalidArgument(format!(
            "Invalid event_plane value {s:?}: expected 'nats' or 'zmq'"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_selectors() {
        assert_eq!(
            DiscoveryBackend::parse("FILE").unwrap(),
            DiscoveryBackend::File
        );
        assert!(DiscoveryBackend::parse("zookeeper").is_err());
        assert_eq!(RequestPlane::parse(" tcp ").unwrap(), RequestPlane::Tcp);
        assert!(RequestPlane::parse("http3").is_err());
        assert_eq!(parse_event_plane(Some("")).unwrap(), None);
        assert_eq!(parse_event_plane(Some("zmq")).unwrap(), Some("zmq"));
        assert!(parse_event_plane(Some("kafka")).is_err());
    }
}
