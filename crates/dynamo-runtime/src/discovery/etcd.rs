//! etcd store (`DYN_DISCOVERY_BACKEND=etcd`, `ETCD_ENDPOINTS`).
//!
//! * **One lease per process.** [`EtcdStore::connect`] grants a lease with TTL
//!   `ETCD_LEASE_TTL` (default 10 s); its id is the process's instance id. Every key this
//!   store puts carries the lease, so etcd deletes them within the TTL when the process
//!   dies.
//! * **Keep-alive.** A task renews the lease every TTL/3. When renewals fail (etcd down,
//!   network cut) it keeps retrying every `RETRY`; a brief outage is harmless, because
//!   etcd restores leases with a fresh TTL when it comes back.
//! * **Lease loss.** When etcd answers that the lease is gone (TTL 0: it expired during a
//!   long outage), or when no renewal succeeded for a whole TTL, the store fires
//!   [`EtcdStore::lease_lost`]. The runtime then runs its ordered shutdown (stop accepting,
//!   drain, close): the process's registrations are gone from etcd, so serving on as a
//!   "zombie" nobody can discover would only hide the failure. A supervisor restarts the
//!   process, which registers with a new lease (a new instance id).
//! * **Watch.** One etcd watch over `v1/` bumps the change counter on every event; watchers
//!   re-list. When the watch stream breaks it is re-created from the revision after the
//!   last event it delivered, so etcd replays whatever changed in between, and the counter
//!   is bumped then too (every watcher re-lists: the resync after reconnect). A compacted
//!   revision restarts the watch from the current one, after the same re-list.
//! * **Shutdown** revokes the lease, which deletes every key of the process at once.
//!
//! Auth: `ETCD_AUTH_USERNAME` + `ETCD_AUTH_PASSWORD`, and/or TLS with `https://`
//! endpoints: `ETCD_AUTH_CA` (PEM CA certificate that signed etcd's server certificate;
//! no system roots are trusted) plus, for client-certificate auth, `ETCD_AUTH_CLIENT_CERT`
//! and `ETCD_AUTH_CLIENT_KEY` (PEM). Inconsistent settings (TLS files with `http://`
//! endpoints, `https://` without a CA, a certificate without its key) are rejected with an
//! error naming the variables.

use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions, WatchOptions,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{BoxFuture, KvStore};
use crate::config::{EtcdTls, RuntimeConfig};
use crate::error::{Error, Result};

/// Delay between retries of a failed renewal or watch: short against a TTL of seconds.
const RETRY: Duration = Duration::from_millis(250);

/// Bound on one etcd request, so a dead server cannot stall a put or list for long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The prefix watched for changes (every key of the runtime lives under it).
const WATCH_PREFIX: &str = "v1/";

fn etcd_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Discovery(format!("etcd {what} failed: {e}"))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A connection to etcd with this process's lease.
pub struct EtcdStore {
    client: Client,
    lease_id: i64,
    version: watch::Sender<u64>,
    cancel: CancellationToken,
    lost: CancellationToken,
}

impl EtcdStore {
    /// Connect to `config.etcd_endpoints`, grant the lease and start the keep-alive and
    /// watch tasks.
    pub async fn connect(config: &RuntimeConfig) -> Result<Self> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(REQUEST_TIMEOUT)
            // HTTP/2 pings detect a dead server between requests.
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        if let (Some(user), Some(pass)) = (env("ETCD_AUTH_USERNAME"), env("ETCD_AUTH_PASSWORD")) {
            opts = opts.with_user(user, pass);
        }
        if let Some(tls) = tls_options(&config.etcd_endpoints, &config.etcd_tls)? {
            opts = opts.with_tls(tls);
        }
        let endpoints = &config.etcd_endpoints;
        let mut client = Client::connect(endpoints, Some(opts)).await.map_err(|e| {
            Error::Discovery(format!(
                "cannot connect to etcd at {} (ETCD_ENDPOINTS): {e}",
                endpoints.join(",")
            ))
        })?;
        let ttl = config.etcd_lease_ttl.as_secs().max(1);
        let lease = client
            .lease_grant(i64::try_from(ttl).unwrap_or(i64::MAX), None)
            .await
            .map_err(|e| {
                Error::Discovery(format!(
                    "cannot reach etcd at {} (ETCD_ENDPOINTS): lease grant failed: {e}",
                    endpoints.join(",")
                ))
            })?;
        let store = Self {
            client,
            lease_id: lease.id(),
            version: watch::channel(0).0,
            cancel: CancellationToken::new(),
            lost: CancellationToken::new(),
        };
        tokio::spawn(keep_alive(
            store.client.clone(),
            store.lease_id,
            Duration::from_secs(ttl),
            store.cancel.clone(),
            store.lost.clone(),
        ));
        tokio::spawn(watch_changes(
            store.client.clone(),
            store.version.clone(),
            store.cancel.clone(),
        ));
        tracing::info!(
            lease_id = format!("{:x}", store.lease_id),
            ttl,
            "etcd lease granted"
        );
        Ok(store)
    }

    /// The lease id (the process's instance id).
    pub fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// Fires when the lease is lost (expired, or not renewed for a whole TTL).
    pub fn lease_lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }
}

async fn keep_alive(
    client: Client,
    lease_id: i64,
    ttl: Duration,
    cancel: CancellationToken,
    lost: CancellationToken,
) {
    let every = (ttl / 3).max(Duration::from_millis(300));
    let mut last_ok = Instant::now();
    'outer: loop {
        if last_ok.elapsed() >= ttl {
            tracing::error!(
                lease_id = format!("{lease_id:x}"),
                "etcd lease not renewed for a whole TTL; treating it as lost"
            );
            break;
        }
        let mut c = client.clone();
        let opened = tokio::select! {
            r = c.lease_keep_alive(lease_id) => r,
            () = cancel.cancelled() => return,
        };
        let (mut keeper, mut stream) = match opened {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "etcd keep-alive: cannot open the stream; retrying");
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => continue,
                    () = cancel.cancelled() => return,
                }
            }
        };
        loop {
            let renewed = tokio::select! {
                r = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                } => r,
                () = cancel.cancelled() => return,
            };
            match renewed {
                Ok(Some(resp)) if resp.ttl() > 0 => last_ok = Instant::now(),
                Ok(Some(_)) => {
                    tracing::error!(lease_id = format!("{lease_id:x}"), "etcd lease expired");
                    break 'outer;
                }
                Ok(None) | Err(_) => {
                    tracing::warn!("etcd keep-alive stream broke; reconnecting");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY) => continue 'outer,
                        () = cancel.cancelled() => return,
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = cancel.cancelled() => return,
            }
        }
    }
    lost.cancel();
}

/// The store's current revision (`None` when etcd cannot be reached).
async fn current_revision(client: &Client) -> Option<i64> {
    let mut c = client.clone();
    let opts = GetOptions::new().with_prefix().with_count_only();
    let resp = c.get(WATCH_PREFIX, Some(opts)).await.ok()?;
    resp.header().map(|h| h.revision())
}

/// Feed the change counter from one etcd watch over [`WATCH_PREFIX`], resumed after the
/// last revision it delivered whenever it has to be re-created (etcd restarted, network
/// cut, server-side cancel), so no put or delete between two watches goes unnoticed:
/// etcd replays them on the new watch. If that revision was compacted meanwhile, the
/// watch restarts from the current revision; the counter is bumped on every (re)start
/// anyway, so watchers re-list and catch up either way.
async fn watch_changes(client: Client, version: watch::Sender<u64>, cancel: CancellationToken) {
    let bump = || version.send_modify(|v| *v = v.wrapping_add(1));
    // Every change up to `seen` has been signalled; 0: not known yet.
    let mut seen: i64 = 0;
    loop {
        if seen == 0 {
            let rev = tokio::select! {
                r = current_revision(&client) => r,
                () = cancel.cancelled() => return,
            };
            if let Some(rev) = rev {
                seen = rev;
            }
        }
        let opened = if seen == 0 {
            None
        } else {
            let mut c = client.clone();
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(seen + 1);
            tokio::select! {
                r = c.watch(WATCH_PREFIX, Some(opts)) => Some(r),
                () = cancel.cancelled() => return,
            }
        };
        match opened {
            Some(Ok(mut stream)) => {
                tracing::debug!(from = seen + 1, "etcd watch open");
                // Watchers that listed while no watch was open re-list.
                bump();
                loop {
                    let msg = tokio::select! {
                        m = stream.message() => m,
                        () = cancel.cancelled() => return,
                    };
                    match msg {
                        Ok(Some(resp)) => {
                            if resp.compact_revision() > 0 {
                                tracing::warn!(
                                    compacted = resp.compact_revision(),
                                    "etcd watch: revision compacted; restarting from now"
                                );
                                seen = 0;
                                break;
                            }
                            if resp.canceled() {
                                break;
                            }
                            let events = resp.events();
                            if let Some(rev) = events
                                .iter()
                                .filter_map(|e| e.kv())
                                .map(|kv| kv.mod_revision())
                                .max()
                            {
                                seen = seen.max(rev);
                            }
                            if !events.is_empty() {
                                bump();
                            }
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                tracing::warn!(resume_after = seen, "etcd watch broke; re-creating it");
            }
            Some(Err(e)) => tracing::warn!(error = %e, "etcd watch: cannot open; retrying"),
            None => tracing::debug!("etcd watch: etcd unreachable; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = cancel.cancelled() => return,
        }
    }
}

fn read_pem(var: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::InvalidArgument(format!("cannot read {var} file {}: {e}", path.display()))
    })
}

/// TLS settings from `ETCD_AUTH_CA` (the CA that signed etcd's certificate) and, for
/// client-certificate auth, `ETCD_AUTH_CLIENT_CERT` + `ETCD_AUTH_CLIENT_KEY` (PEM files).
/// `None` when none is set. TLS needs `https://` endpoints, and a CA: this build trusts no
/// system roots, so the CA is what makes the server's certificate verifiable.
fn tls_options(endpoints: &[String], files: &EtcdTls) -> Result<Option<TlsOptions>> {
    let EtcdTls {
        ca,
        client_cert: cert,
        client_key: key,
    } = files;
    if ca.is_none() && cert.is_none() && key.is_none() {
        if let Some(e) = endpoints.iter().find(|e| e.starts_with("https://")) {
            return Err(Error::InvalidArgument(format!(
                "etcd endpoint {e} uses https but ETCD_AUTH_CA is not set (the CA certificate \
                 that signed the server's certificate)"
            )));
        }
        return Ok(None);
    }
    if let Some(e) = endpoints.iter().find(|e| !e.starts_with("https://")) {
        return Err(Error::InvalidArgument(format!(
            "ETCD_AUTH_CA/ETCD_AUTH_CLIENT_CERT/ETCD_AUTH_CLIENT_KEY are set, but etcd \
             endpoint {e} is not https:// (ETCD_ENDPOINTS)"
        )));
    }
    let Some(ca) = ca else {
        return Err(Error::InvalidArgument(
            "ETCD_AUTH_CLIENT_CERT/ETCD_AUTH_CLIENT_KEY need ETCD_AUTH_CA (the CA certificate \
             that signed the server's certificate)"
                .into(),
        ));
    };
    let mut tls =
        TlsOptions::new().ca_certificate(Certificate::from_pem(read_pem("ETCD_AUTH_CA", ca)?));
    match (cert, key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read_pem("ETCD_AUTH_CLIENT_CERT", cert)?,
                read_pem("ETCD_AUTH_CLIENT_KEY", key)?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::InvalidArgument(
                "ETCD_AUTH_CLIENT_CERT and ETCD_AUTH_CLIENT_KEY must be set together".into(),
            ));
        }
    }
    Ok(Some(tls))
}

impl KvStore for EtcdStore {
    fn put(&self, key: &str, value: &str) -> BoxFuture<'_, Result<()>> {
        let key = key.to_owned();
        let value = value.to_owned();
        Box::pin(async move {
            let mut c = self.client.clone();
            let opts = PutOptions::new().with_lease(self.lease_id);
            c.put(key, value, Some(opts))
                .await
                .map_err(|e| etcd_err("put", e))?;
            self.bump();
            Ok(())
        })
    }

    fn delete(&self, key: &str) -> BoxFuture<'_, Result<()>> {
        let key = key.to_owned();
        Box::pin(async move {
            if self.lost.is_cancelled() {
                // The lease (and every key on it) is gone already.
                return Ok(());
            }
            let mut c = self.client.clone();
            c.delete(key, None)
                .await
                .map_err(|e| etcd_err("delete", e))?;
            self.bump();
            Ok(())
        })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        let prefix = prefix.to_owned();
        Box::pin(async move {
            let mut c = self.client.clone();
            let resp = c
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| etcd_err("get", e))?;
            let mut out: Vec<(String, String)> = resp
                .kvs()
                .iter()
                .filter_map(|kv| {
                    Some((
                        kv.key_str().ok()?.to_owned(),
                        kv.value_str().ok()?.to_owned(),
                    ))
                })
                .collect();
            out.sort();
            Ok(out)
        })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.cancel.cancel();
            if self.lost.is_cancelled() {
                self.bump();
                return;
            }
            let mut c = self.client.clone();
            // Revoking deletes every key of the lease at once.
            match tokio::time::timeout(REQUEST_TIMEOUT, c.lease_revoke(self.lease_id)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "etcd lease revoke failed"),
                Err(_) => tracing::warn!("etcd lease revoke timed out"),
            }
            self.bump();
        })
    }
}
