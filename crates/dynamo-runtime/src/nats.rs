//! The process's NATS connection (`NATS_SERVER`), shared by the NATS request plane and the
//! NATS event plane.
//!
//! Auth ([`NatsAuth`], `NATS_AUTH_*`), in the reference's priority order: user and
//! password, token, nkey seed, credentials file. A server that refuses the credentials
//! fails the first connection at once with [`Error::NatsAuth`] naming the variables used
//! (no retries: a wrong password does not fix itself). The client reconnects forever after
//! the first successful connection (every 100 ms, backing off to 1 s), re-creating
//! subscriptions; the first connection must succeed within the connect timeout.
//!
//! [`NatsLink`] records the connection's history for the request plane: a disconnection
//! ends the caller's in-flight NATS streams at once (frames may have been lost with the
//! broker, and the frames carry no sequence numbers to resume from), and for a while after
//! a reconnection a request that found no subscriber is retried on the same worker (its
//! client may not have re-subscribed yet).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{NatsAuth, RuntimeConfig};
use crate::error::{Error, Result};

/// Longest wait between reconnection attempts: a restarted server is found again within
/// about a second.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// How long after a reconnection a worker subject without subscriber is presumed to be a
/// worker that has not re-subscribed yet rather than a dead one: the workers' clients
/// retry at most every [`MAX_RECONNECT_DELAY`] and re-subscribe as soon as connected.
pub(crate) const SETTLE_WINDOW: Duration = Duration::from_secs(3);

/// The history of the process's NATS connection, fed by the client's events.
pub(crate) struct NatsLink {
    /// Bumped at every disconnection.
    lost: watch::Sender<u64>,
    /// `(connected now, when it last came back after a loss)`.
    state: Mutex<(bool, Option<Instant>)>,
}

impl Default for NatsLink {
    fn default() -> Self {
        Self {
            lost: watch::channel(0).0,
            state: Mutex::new((true, None)),
        }
    }
}

impl NatsLink {
    /// A receiver that changes at every disconnection.
    pub(crate) fn losses(&self) -> watch::Receiver<u64> {
        self.lost.subscribe()
    }

    /// Whether the connection is down, or came back after a loss less than
    /// [`SETTLE_WINDOW`] ago, so that peers may still be re-subscribing.
    pub(crate) fn unsettled(&self) -> bool {
        let (up, back) = *crate::context::lock(&self.state);
        !up || back.is_some_and(|t| t.elapsed() < SETTLE_WINDOW)
    }

    fn disconnected(&self) {
        crate::context::lock(&self.state).0 = false;
        self.lost.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn connected(&self) {
        let mut state = crate::context::lock(&self.state);
        // The first connection is not a comeback: nothing can be re-subscribing yet.
        let back = (*self.lost.borrow() > 0).then(Instant::now);
        *state = (true, back);
    }
}

/// Connect to `config.nats_server`, reporting connection events to `link`.
pub(crate) async fn connect(
    config: &RuntimeConfig,
    link: std::sync::Arc<NatsLink>,
) -> Result<async_nats::Client> {
    let mut opts = async_nats::ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            (Duration::from_millis(100) * u32::try_from(attempts).unwrap_or(u32::MAX))
                .min(MAX_RECONNECT_DELAY)
        })
        .event_callback(move |event| {
            let link = std::sync::Arc::clone(&link);
            async move {
                match event {
                    async_nats::Event::Connected => {
                        link.connected();
                        tracing::info!("NATS connected");
                    }
                    async_nats::Event::Disconnected => {
                        link.disconnected();
                        tracing::warn!("NATS disconnected; reconnecting");
                    }
                    other => tracing::debug!(event = %other, "NATS connection event"),
                }
            }
        });
    let auth = &config.nats_auth;
    opts = match auth {
        NatsAuth::None => opts,
        NatsAuth::UserPassword { user, password } => {
            opts.user_and_password(user.clone(), password.clone())
        }
        NatsAuth::Token(token) => opts.token(token.clone()),
        NatsAuth::Nkey(seed) => opts.nkey(seed.clone()),
        NatsAuth::CredentialsFile(path) => opts.credentials_file(path).await.map_err(|e| {
            Error::NatsAuth(format!(
                "cannot use the NATS credentials file {} (NATS_AUTH_CREDENTIALS_FILE): {e}",
                path.display()
            ))
        })?,
    };
    let servers: Vec<&str> = config
        .nats_server
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let addrs: Vec<async_nats::ServerAddr> = servers
        .iter()
        .map(|s| {
            s.parse().map_err(|e| {
                Error::InvalidArgument(format!("invalid NATS_SERVER address {s:?}: {e}"))
            })
        })
        .collect::<Result<_>>()?;
    opts.connect(addrs).await.map_err(|e| match e.kind() {
        async_nats::ConnectErrorKind::AuthorizationViolation
        | async_nats::ConnectErrorKind::Authentication => Error::NatsAuth(format!(
            "the NATS server at {} (NATS_SERVER) refused the connection: {e} (credentials \
             from {})",
            config.nats_server,
            auth.source()
        )),
        _ => Error::Nats(format!(
            "cannot connect to NATS at {} (NATS_SERVER): {e}",
            config.nats_server
        )),
    })
}
