//! The process's NATS connection (`NATS_SERVER`), shared by the NATS request plane and the
//! NATS event plane.
//!
//! Auth ([`NatsAuth`], `NATS_AUTH_*`), in the reference's priority order: user and
//! password, token, nkey seed, credentials file. A server that refuses the credentials
//! fails the first connection at once with [`Error::NatsAuth`] naming the variables used
//! (no retries: a wrong password does not fix itself). The client reconnects forever after
//! the first successful connection (every 100 ms, backing off to 1 s), re-creating
//! subscriptions; the first connection must succeed within the connect timeout.

use std::time::Duration;

use crate::config::{NatsAuth, RuntimeConfig};
use crate::error::{Error, Result};

/// Longest wait between reconnection attempts: a restarted server is found again within
/// about a second.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// Connect to `config.nats_server`.
pub(crate) async fn connect(config: &RuntimeConfig) -> Result<async_nats::Client> {
    let mut opts = async_nats::ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            (Duration::from_millis(100) * u32::try_from(attempts).unwrap_or(u32::MAX))
                .min(MAX_RECONNECT_DELAY)
        })
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("NATS connected"),
                async_nats::Event::Disconnected => {
                    tracing::warn!("NATS disconnected; reconnecting")
                }
                other => tracing::debug!(event = %other, "NATS connection event"),
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
