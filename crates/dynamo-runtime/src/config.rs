//! Runtime configuration from the environment (the reference's variable names). Empty
//! values count as unset.
//!
//! This module sits at the bottom of the crate: it holds plain settings types (and the
//! defaults of the settings other layers own, such as the event codec or the canary
//! timing) and imports nothing of the crate but the error type and the wire constants of
//! [`crate::transport`]'s root, which itself imports nothing. Every other module may read
//! it without creating an import circle.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::transport::DEFAULT_MAX_MESSAGE_SIZE;

/// Default capacity of a subscriber's merged queue
/// (`DYN_ZMQ_EVENT_SUBSCRIBER_CHANNEL_CAPACITY`). When the consumer falls behind, readers
/// stop reading, TCP pushes back, and publishers drop (visible as gaps). Re-exported as
/// `events::DEFAULT_SUBSCRIBER_CAPACITY`.
pub const DEFAULT_SUBSCRIBER_CAPACITY: usize = 100_000;

/// Default lease TTL of the file store, matching the reference (and etcd's default lease).
/// Public as `discovery::file::DEFAULT_TTL`; defined here so that the defaults of
/// [`RuntimeConfig`] need nothing from the discovery layer.
pub(crate) const DEFAULT_FILE_KV_TTL: Duration = Duration::from_secs(10);

/// Settings of one `DistributedRuntime` (a plain type: it does not link to the runtime,
/// which imports this module).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Largest request body or response item (`DYN_TCP_MAX_MESSAGE_SIZE`, 32 MiB).
    pub max_message_size: usize,
    /// Host the request-plane listener binds and advertises (`DYN_TCP_RPC_HOST`). The
    /// default is loopback: embedded mode serves the processes of one machine.
    pub tcp_host: String,
    /// Listener port (`DYN_TCP_RPC_PORT`, 0 = OS-assigned).
    pub tcp_port: u16,
    /// Reach a listener of this same process without sockets (`DYN_TCP_IN_PROCESS`, this
    /// project's own; default true, `0`/`false` for loopback TCP): same frames, streams and
    /// errors, no thread hand-over per frame.
    pub tcp_in_process: bool,
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
    /// Event-plane transport (`DYN_EVENT_PLANE`: `zmq` (brokerless TCP) or `nats`); `None`
    /// picks `nats` for etcd discovery when `NATS_SERVER` is set, else brokerless.
    pub event_plane: Option<EventPlane>,
    /// Codec of event envelopes (`DYN_EVENT_PLANE_CODEC`, default msgpack).
    pub event_codec: EventCodec,
    /// Host brokerless publishers bind and advertise (`DYN_EVENT_PLANE_HOST`; default the
    /// request plane's host).
    pub event_host: Option<String>,
    /// Capacity of a subscriber's merged queue
    /// (`DYN_ZMQ_EVENT_SUBSCRIBER_CHANNEL_CAPACITY`, default 100000).
    pub event_subscriber_capacity: usize,
    /// NATS server URL(s) (`NATS_SERVER`, default `nats://localhost:4222`), comma-separated.
    pub nats_server: String,
    /// Whether `NATS_SERVER` was set explicitly.
    pub nats_server_set: bool,
    /// Credentials for the NATS connection (`NATS_AUTH_*`), shared by the request plane
    /// and the event plane.
    pub nats_auth: NatsAuth,
    /// etcd endpoints (`ETCD_ENDPOINTS`, default `http://localhost:2379`), comma-separated.
    pub etcd_endpoints: Vec<String>,
    /// Whether `ETCD_ENDPOINTS` was set explicitly.
    pub etcd_endpoints_set: bool,
    /// Lease TTL of the etcd registration (`ETCD_LEASE_TTL`, seconds, default 10).
    pub etcd_lease_ttl: Duration,
    /// TLS to etcd (`ETCD_AUTH_CA`, `ETCD_AUTH_CLIENT_CERT`, `ETCD_AUTH_CLIENT_KEY`).
    pub etcd_tls: EtcdTls,
    /// System status server port (`DYN_SYSTEM_PORT`: -1 disabled, the default; 0 random).
    pub system_port: i32,
    /// Host the status server binds (`DYN_SYSTEM_HOST`, default `0.0.0.0`).
    pub system_host: String,
    /// `DYN_SYSTEM_STARTING_HEALTH_STATUS` (`ready` or `notready`), when set.
    pub starting_health: Option<bool>,
    /// Health canaries for endpoints with a health-check payload
    /// (`DYN_HEALTH_CHECK_ENABLED`, default false).
    pub health_check_enabled: bool,
    /// Canary timing (`DYN_CANARY_WAIT_TIME`, 10 s; `DYN_HEALTH_CHECK_REQUEST_TIMEOUT`, 3 s).
    pub canary: CanaryConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            tcp_host: "127.0.0.1".into(),
            tcp_port: 0,
            tcp_in_process: true,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            graceful_shutdown_timeout: Duration::from_secs(900),
            inhibited_duration: Duration::from_secs(5),
            file_kv_root: private_file_kv_root(),
            file_kv_ttl: DEFAULT_FILE_KV_TTL,
            event_plane: None,
            event_codec: EventCodec::default(),
            event_host: None,
            event_subscriber_capacity: DEFAULT_SUBSCRIBER_CAPACITY,
            nats_server: "nats://localhost:4222".into(),
            nats_server_set: false,
            nats_auth: NatsAuth::None,
            etcd_endpoints: vec!["http://localhost:2379".into()],
            etcd_endpoints_set: false,
            etcd_lease_ttl: Duration::from_secs(10),
            etcd_tls: EtcdTls::default(),
            system_port: -1,
            system_host: "0.0.0.0".into(),
            starting_health: None,
            health_check_enabled: false,
            canary: CanaryConfig {
                wait: Duration::from_secs(10),
                timeout: Duration::from_secs(3),
            },
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

/// A yes/no environment value: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off` (any
/// case, surrounding blanks ignored); `None` for anything else.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn flag(name: &str) -> Result<Option<bool>> {
    var(name)
        .map(|v| {
            parse_bool(&v).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "invalid value {v:?} for {name} (expected 1/true/yes/on or 0/false/no/off)"
                ))
            })
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
        if let Some(v) = flag("DYN_TCP_IN_PROCESS")? {
            c.tcp_in_process = v;
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
        if let Some(v) = var("DYN_EVENT_PLANE") {
            c.event_plane = Some(EventPlane::parse(&v)?);
        }
        if let Some(v) = var("DYN_EVENT_PLANE_CODEC") {
            c.event_codec = EventCodec::parse(&v)?;
        }
        c.event_host = var("DYN_EVENT_PLANE_HOST");
        if let Some(v) = parse::<usize>("DYN_ZMQ_EVENT_SUBSCRIBER_CHANNEL_CAPACITY")? {
            c.event_subscriber_capacity = v.max(1);
        }
        if let Some(v) = var("NATS_SERVER") {
            c.nats_server = v;
            c.nats_server_set = true;
        }
        c.nats_auth = NatsAuth::from_env()?;
        if let Some(v) = var("ETCD_ENDPOINTS") {
            c.etcd_endpoints = v
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            c.etcd_endpoints_set = true;
        }
        c.etcd_tls = EtcdTls {
            ca: var("ETCD_AUTH_CA").map(PathBuf::from),
            client_cert: var("ETCD_AUTH_CLIENT_CERT").map(PathBuf::from),
            client_key: var("ETCD_AUTH_CLIENT_KEY").map(PathBuf::from),
        };
        if let Some(v) = secs("ETCD_LEASE_TTL")? {
            c.etcd_lease_ttl = v.max(Duration::from_secs(1));
        }
        if let Some(v) = parse::<i32>("DYN_SYSTEM_PORT")? {
            c.system_port = v;
        }
        if let Some(v) = var("DYN_SYSTEM_HOST") {
            c.system_host = v;
        }
        if let Some(v) = var("DYN_SYSTEM_STARTING_HEALTH_STATUS") {
            c.starting_health = Some(match v.trim().to_ascii_lowercase().as_str() {
                "ready" => true,
                "notready" => false,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "invalid DYN_SYSTEM_STARTING_HEALTH_STATUS {v:?}: expected 'ready' or 'notready'"
                    )));
                }
            });
        }
        if let Some(v) = var("DYN_HEALTH_CHECK_ENABLED") {
            c.health_check_enabled = matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            );
        }
        if let Some(v) = secs("DYN_CANARY_WAIT_TIME")? {
            c.canary.wait = v.max(Duration::from_millis(10));
        }
        if let Some(v) = secs("DYN_HEALTH_CHECK_REQUEST_TIMEOUT")? {
            c.canary.timeout = v;
        }
        c.file_kv_root = file_kv_root_from_env();
        c.file_kv_ttl = file_kv_ttl_from_env();
        Ok(c)
    }
}

/// The file store's root: `$DYN_FILE_KV`, else [`private_file_kv_root`] (see
/// `FileStore::default_root`, which returns this).
pub(crate) fn file_kv_root_from_env() -> PathBuf {
    match std::env::var_os("DYN_FILE_KV") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => private_file_kv_root(),
    }
}

/// The file store's lease TTL from `DYN_FILE_KV_TTL_SECS` (seconds, may be fractional),
/// else [`DEFAULT_FILE_KV_TTL`] (see `FileStore::default_ttl`, which returns this).
pub(crate) fn file_kv_ttl_from_env() -> Duration {
    std::env::var("DYN_FILE_KV_TTL_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_FILE_KV_TTL)
}

/// The per-user default directory of the file store: `$XDG_RUNTIME_DIR/dynamo_store_kv`
/// when that is set, else `$TMPDIR/dynamo_store_kv-<uid>` (a shared, world-writable
/// `/tmp/dynamo_store_kv` would let any local user plant or read discovery entries).
pub(crate) fn private_file_kv_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && dir.is_absolute()
        && dir.is_dir()
    {
        return dir.join("dynamo_store_kv");
    }
    // The owner of `/proc/self` is this process's effective uid (no `unsafe` getuid).
    let uid =
        std::fs::metadata("/proc/self").map_or_else(|_| "user".to_owned(), |m| m.uid().to_string());
    std::env::temp_dir().join(format!("dynamo_store_kv-{uid}"))
}

/// PEM files for TLS to etcd (all `None`: plain `http://`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA certificate that signed etcd's server certificate (`ETCD_AUTH_CA`).
    pub ca: Option<PathBuf>,
    /// Client certificate for mutual TLS (`ETCD_AUTH_CLIENT_CERT`).
    pub client_cert: Option<PathBuf>,
    /// Its private key (`ETCD_AUTH_CLIENT_KEY`).
    pub client_key: Option<PathBuf>,
}

/// How the process authenticates to NATS: the reference's variables, in its priority
/// order (the first one configured wins): `NATS_AUTH_USERNAME` + `NATS_AUTH_PASSWORD`,
/// `NATS_AUTH_TOKEN`, `NATS_AUTH_NKEY` (an nkey seed, `SU...`), `NATS_AUTH_CREDENTIALS_FILE`
/// (a `.creds` file with a user JWT and seed). `Debug` never prints a secret.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsAuth {
    /// No credentials (a server without authorization).
    #[default]
    None,
    /// User and password.
    UserPassword {
        /// `NATS_AUTH_USERNAME`.
        user: String,
        /// `NATS_AUTH_PASSWORD`.
        password: String,
    },
    /// A token (`NATS_AUTH_TOKEN`).
    Token(String),
    /// An nkey seed (`NATS_AUTH_NKEY`): the client signs the server's nonce with it.
    Nkey(String),
    /// A credentials file (`NATS_AUTH_CREDENTIALS_FILE`).
    CredentialsFile(PathBuf),
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword { user, .. } => write!(f, "UserPassword({user:?}, ***)"),
            Self::Token(_) => f.write_str("Token(***)"),
            Self::Nkey(_) => f.write_str("Nkey(***)"),
            Self::CredentialsFile(p) => write!(f, "CredentialsFile({p:?})"),
        }
    }
}

impl NatsAuth {
    /// Read `NATS_AUTH_*`. A user without a password (or the reverse) is an error rather
    /// than a silent fall-through to the next method.
    pub fn from_env() -> Result<Self> {
        match (var("NATS_AUTH_USERNAME"), var("NATS_AUTH_PASSWORD")) {
            (Some(user), Some(password)) => {
                return Ok(Self::UserPassword { user, password });
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::InvalidArgument(
                    "NATS_AUTH_USERNAME and NATS_AUTH_PASSWORD must be set together".into(),
                ));
            }
            (None, None) => {}
        }
        if let Some(token) = var("NATS_AUTH_TOKEN") {
            return Ok(Self::Token(token));
        }
        if let Some(seed) = var("NATS_AUTH_NKEY") {
            return Ok(Self::Nkey(seed.trim().to_owned()));
        }
        if let Some(path) = var("NATS_AUTH_CREDENTIALS_FILE") {
            return Ok(Self::CredentialsFile(PathBuf::from(path)));
        }
        Ok(Self::None)
    }

    /// The variable(s) this method came from, for error messages.
    pub fn source(&self) -> &'static str {
        match self {
            Self::None => "no NATS_AUTH_* variable set",
            Self::UserPassword { .. } => "NATS_AUTH_USERNAME/NATS_AUTH_PASSWORD",
            Self::Token(_) => "NATS_AUTH_TOKEN",
            Self::Nkey(_) => "NATS_AUTH_NKEY",
            Self::CredentialsFile(_) => "NATS_AUTH_CREDENTIALS_FILE",
        }
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
    /// `DYN_DISCOVERY_BACKEND` when set; otherwise etcd when `ETCD_ENDPOINTS` is set, else
    /// file.
    pub fn from_env() -> Result<Self> {
        match var("DYN_DISCOVERY_BACKEND") {
            Some(v) => Self::parse(&v),
            None if var("ETCD_ENDPOINTS").is_some() => Ok(Self::Etcd),
            None => Ok(Self::File),
        }
    }

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

/// How events travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPlane {
    /// Core NATS publish/subscribe.
    Nats,
    /// The runtime's own brokerless TCP pub/sub (selected by `zmq` or `tcp`).
    Tcp,
}

impl EventPlane {
    /// Parse `nats`, `zmq` or `tcp` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nats" => Ok(Self::Nats),
            "zmq" | "tcp" => Ok(Self::Tcp),
            _ => Err(Error::InvalidArgument(format!(
                "Invalid event_plane value {s:?}: expected 'nats' or 'zmq'"
            ))),
        }
    }

    /// The transport when none is configured: NATS for etcd discovery with `NATS_SERVER`
    /// set, else brokerless.
    pub fn default_for(discovery: DiscoveryBackend, config: &RuntimeConfig) -> Self {
        if discovery == DiscoveryBackend::Etcd && config.nats_server_set {
            Self::Nats
        } else {
            Self::Tcp
        }
    }
}

/// Codec of envelopes and typed payloads (`DYN_EVENT_PLANE_CODEC`). Re-exported as
/// `events::EventCodec`; defined here because [`RuntimeConfig`] carries one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventCodec {
    /// JSON (`serde_json`).
    Json,
    /// MessagePack with named fields (`rmp-serde`), the default.
    #[default]
    Msgpack,
}

impl EventCodec {
    /// Parse `json` or `msgpack` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "json" => Ok(Self::Json),
            "msgpack" => Ok(Self::Msgpack),
            _ => Err(Error::InvalidArgument(format!(
                "invalid event plane codec {s:?}: expected 'json' or 'msgpack'"
            ))),
        }
    }

    /// Encode a value.
    pub fn encode<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>> {
        match self {
            Self::Json => serde_json::to_vec(value).map_err(|e| Error::Codec(e.to_string())),
            Self::Msgpack => {
                rmp_serde::to_vec_named(value).map_err(|e| Error::Codec(e.to_string()))
            }
        }
    }

    /// Decode a value.
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T> {
        match self {
            Self::Json => serde_json::from_slice(bytes).map_err(|e| Error::Codec(e.to_string())),
            Self::Msgpack => rmp_serde::from_slice(bytes).map_err(|e| Error::Codec(e.to_string())),
        }
    }
}

/// Health-check settings (`DYN_HEALTH_CHECK_*`, `DYN_CANARY_WAIT_TIME`). Re-exported as
/// `system::CanaryConfig`; defined here because [`RuntimeConfig`] carries one.
#[derive(Debug, Clone, Copy)]
pub struct CanaryConfig {
    /// Idle time before a canary is sent.
    pub wait: Duration,
    /// Bound on the canary's first response item.
    pub timeout: Duration,
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

    #[test]
    fn parses_yes_no_values() {
        for v in ["1", "true", " Yes ", "ON"] {
            assert_eq!(parse_bool(v), Some(true), "{v:?}");
        }
        for v in ["0", "False", "no", " off"] {
            assert_eq!(parse_bool(v), Some(false), "{v:?}");
        }
        for v in ["", "2", "maybe", "tru"] {
            assert_eq!(parse_bool(v), None, "{v:?}");
        }
    }
}
