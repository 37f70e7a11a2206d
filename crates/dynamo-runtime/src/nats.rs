//! The process's NATS connection (`NATS_SERVER`), shared by the NATS request plane and the
//! NATS event plane.
//!
//! Auth, in the reference's priority order: `NATS_AUTH_USERNAME` + `NATS_AUTH_PASSWORD`,
//! then `NATS_AUTH_TOKEN`. The client reconnects forever after the first successful
//! connection (every 100 ms, backing off to 1 s), re-creating subscriptions; the first
//! connection must succeed within the connect timeout.

use std::time::Duration;

use crate::config::RuntimeConfig;
use crate::error::{Error, Result};

/// Longest wait between reconnection attempts: a restarted server is found again within
/// about a second.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

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
    if let (Some(user), Some(pass)) = (env("NATS_AUTH_USERNAME"), env("NATS_AUTH_PASSWORD")) {
        opts = opts.user_and_password(user, pass);
    } else if let Some(token) = env("NATS_AUTH_TOKEN") {
        opts = opts.token(token);
    }
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
    opts.connect(addrs).await.map_err(|e| {
        Error::Nats(format!(
            "cannot connect to NATS at {} (NATS_SERVER): {e}",
            config.nats_server
        ))
    })
}
