//! Fetching media URLs (`http://`, `https://`, `data:`), secure by default.
//!
//! Invariants (each refusal is a [`MediaError`] naming its rule):
//! * Only `http`, `https` and `data` URLs (`scheme`).
//! * A URL whose host is an IP literal needs `allow_direct_ip` (`direct_ip`); an explicit
//!   non-default port needs `allow_direct_port` (`direct_port`); with
//!   `allowed_media_domains` set, the host must be one of them or a subdomain
//!   (`allowed_media_domains`).
//! * Addresses are checked **where they are used**: the client's DNS resolver drops every
//!   address of a forbidden class ([`forbidden_class`]: loopback, private, link-local, CGNAT,
//!   unique-local, metadata service, multicast, ...) and refuses the name when none is left
//!   (`private_address`), so a name that resolves to a public address for a check and to
//!   127.0.0.1 for the connection (DNS rebinding) cannot reach the private one. Redirects
//!   re-run the URL checks on every hop (`redirect`), and their names go through the same
//!   resolver. The client uses no proxy, so no proxy can connect on its behalf.
//! * The body is capped at `max_bytes` (`max_bytes`: refused from `Content-Length` before
//!   reading, else when the streamed body passes the cap), the `Content-Type` must be
//!   `image/*`, `application/octet-stream` or absent (`content_type`), a non-2xx status is
//!   refused (`http_status`), and the whole fetch, body included, must end within
//!   `timeout_ms` (`timeout`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect;

use super::{MediaError, MediaFetcherConfig};

/// Default whole-fetch timeout: long enough for a large image from a slow CDN, short
/// enough that a stalled server does not hold a request for minutes.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Default response cap: OpenAI's per-image upload limit (20 MB).
pub const DEFAULT_MAX_BYTES: u64 = 20 * 1024 * 1024;
/// Redirect hops followed at most (each one re-checked).
pub const MAX_REDIRECTS: usize = 5;

/// The class of a forbidden address, or `None` for a public unicast address.
///
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible, NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002::/16`) IPv6 addresses are judged by the IPv4 address they embed.
pub fn forbidden_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        // AWS, GCP, Azure and OpenStack metadata; Alibaba's is in CGNAT below.
        _ if ip == Ipv4Addr::new(169, 254, 169, 254) => "metadata service",
        (0, _, _) => "this-network",
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => "private",
        (127, _, _) => "loopback",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "carrier-grade NAT",
        (192, 0, 0) => "IETF protocol assignment",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    // IPv4-compatible (deprecated) ::a.b.c.d, but not :: and ::1 themselves.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return forbidden_v4(ip.to_ipv4()?);
    }
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    Some(match s[0] {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        0x64 if s[1] == 0xff9b && s[2..6] == [0; 4] => {
            return forbidden_v4(embedded(s[6], s[7]));
        }
        0x2002 => return forbidden_v4(embedded(s[1], s[2])),
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xfc00..=0xfdff => "unique-local",
        0xff00..=0xffff => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        _ => return None,
    })
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The DNS resolver of the fetch client: resolves with the system resolver and keeps only
/// addresses the settings allow (the check happens on the addresses actually connected to).
#[derive(Debug)]
struct FilteringResolver {
    allow_private: bool,
}

impl Resolve for FilteringResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| -> BoxError {
                    // One box around the error itself, so callers can downcast it.
                    MediaError::new("dns", format!("cannot resolve {host:?}: {e}")).into()
                })?
                .collect();
            if allow_private {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let (ok, refused): (Vec<_>, Vec<_>) = addrs
                .into_iter()
                .partition(|a| forbidden_class(a.ip()).is_none());
            if ok.is_empty() {
                let detail = match refused.first() {
                    Some(a) => format!(
                        "{host:?} resolves to {} ({} address); set allow_direct_ip to fetch from it",
                        a.ip(),
                        forbidden_class(a.ip()).unwrap_or("forbidden")
                    ),
                    None => format!("{host:?} resolves to no address"),
                };
                return Err(MediaError::new("private_address", detail).into());
            }
            Ok(Box::new(ok.into_iter()) as Addrs)
        })
    }
}

/// A fetched media payload.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The bytes (file contents).
    pub bytes: Bytes,
    /// The declared content type, if any (`data:` media type or `Content-Type`).
    pub content_type: Option<String>,
}

/// The media fetcher of one model (cheap to clone: one shared HTTP client).
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    config: Arc<MediaFetcherConfig>,
    client: reqwest::Client,
    max_bytes: u64,
    timeout: Duration,
}

/// Checks of one URL that need no network: scheme, IP literal, port, domain allowlist.
fn check_url(config: &MediaFetcherConfig, url: &reqwest::Url) -> Result<(), MediaError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(MediaError::new(
            "scheme",
            format!(
                "{:?} URLs are not fetched (only http, https and data)",
                url.scheme()
            ),
        ));
    }
    let Some(host) = url.host_str() else {
        return Err(MediaError::new("scheme", "the URL has no host"));
    };
    // The URL parser normalises IP literals (hex, octal, short forms) to dotted or
    // bracketed form, so parsing the host string catches every spelling.
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return check_ip(config, ip, url);
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    check_port(config, url)?;
    check_domain(config, &host)
}

fn check_port(config: &MediaFetcherConfig, url: &reqwest::Url) -> Result<(), MediaError> {
    // `Url::port` is `None` for the scheme's default port, even when written out.
    match url.port() {
        Some(p) if !config.allow_direct_port => Err(MediaError::new(
            "direct_port",
            format!("port {p} is not the scheme's default; set allow_direct_port to allow it"),
        )),
        _ => Ok(()),
    }
}

fn check_domain(config: &MediaFetcherConfig, host: &str) -> Result<(), MediaError> {
    let Some(allowed) = &config.allowed_media_domains else {
        return Ok(());
    };
    let ok = allowed.iter().any(|d| {
        let d = d.trim().trim_start_matches("*.").trim_end_matches('.');
        let d = d.to_ascii_lowercase();
        !d.is_empty()
            && (host == d || (host.ends_with(&d) && host[..host.len() - d.len()].ends_with('.')))
    });
    if ok {
        Ok(())
    } else {
        Err(MediaError::new(
            "allowed_media_domains",
            format!("{host:?} is not in allowed_media_domains"),
        ))
    }
}

fn check_ip(config: &MediaFetcherConfig, ip: IpAddr, url: &reqwest::Url) -> Result<(), MediaError> {
    if !config.allow_direct_ip {
        return Err(MediaError::new(
            "direct_ip",
            format!("the URL's host is the IP address {ip}; set allow_direct_ip to allow it"),
        ));
    }
    check_port(config, url)?;
    check_domain(config, &ip.to_string())
}

/// Walk an error's sources for the [`MediaError`] our resolver or redirect policy raised.
fn media_error_in(e: &(dyn std::error::Error + 'static)) -> Option<MediaError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(m) = err.downcast_ref::<MediaError>() {
            return Some(m.clone());
        }
        cur = err.source();
    }
    None
}

impl MediaFetcher {
    /// A fetcher with these settings.
    ///
    /// # Errors
    /// `fetch` when the HTTP client cannot be built (no TLS roots, ...).
    pub fn new(config: MediaFetcherConfig) -> Result<Self, MediaError> {
        let timeout = Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
        let max_bytes = config.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
        let policy_config = config.clone();
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(MediaError::new(
                    "redirect",
                    format!("more than {MAX_REDIRECTS} redirects"),
                ));
            }
            match check_url(&policy_config, attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => {
                    let to = attempt.url().to_string();
                    attempt.error(MediaError::new(
                        "redirect",
                        format!("redirect to {to} refused by {e}"),
                    ))
                }
            }
        });
        let user_agent = config
            .user_agent
            .clone()
            .unwrap_or_else(|| concat!("dynamo-rs/", env!("CARGO_PKG_VERSION")).to_owned());
        let client = reqwest::Client::builder()
            .user_agent(user_agent)
            .no_proxy()
            .redirect(policy)
            .timeout(timeout)
            .dns_resolver(Arc::new(FilteringResolver {
                allow_private: config.allow_direct_ip || config.allow_private_ips,
            }))
            .build()
            .map_err(|e| MediaError::new("fetch", format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            config: Arc::new(config),
            client,
            max_bytes,
            timeout,
        })
    }

    /// The settings.
    pub fn config(&self) -> &MediaFetcherConfig {
        &self.config
    }

    /// Fetch `url` (`http(s)://` or `data:`).
    ///
    /// # Errors
    /// A [`MediaError`] naming the rule that refused the URL or its response.
    pub async fn fetch(&self, url: &str) -> Result<Fetched, MediaError> {
        let url = url.trim();
        if url.len() >= 5 && url[..5].eq_ignore_ascii_case("data:") {
            return self.data_url(&url[5..]);
        }
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| MediaError::new("scheme", format!("invalid URL: {e}")))?;
        check_url(&self.config, &parsed)?;
        // The client's timeout covers the body too; this outer one also bounds DNS.
        match tokio::time::timeout(self.timeout, self.get(parsed)).await {
            Ok(r) => r,
            Err(_) => Err(self.timed_out()),
        }
    }

    fn timed_out(&self) -> MediaError {
        MediaError::new(
            "timeout",
            format!(
                "the fetch took longer than timeout_ms ({} ms)",
                self.timeout.as_millis()
            ),
        )
    }

    fn transport(&self, e: &reqwest::Error) -> MediaError {
        if let Some(m) = media_error_in(e) {
            return m;
        }
        if e.is_timeout() {
            return self.timed_out();
        }
        MediaError::new("fetch", format!("fetch failed: {e}"))
    }

    async fn get(&self, url: reqwest::Url) -> Result<Fetched, MediaError> {
        let mut resp = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| self.transport(&e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(MediaError::new(
                "http_status",
                format!("the server answered {status}"),
            ));
        }
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        check_content_type(content_type.as_deref())?;
        if let Some(len) = resp.content_length()
            && len > self.max_bytes
        {
            return Err(self.too_big(len));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(&e))? {
            if (body.len() + chunk.len()) as u64 > self.max_bytes {
                return Err(self.too_big((body.len() + chunk.len()) as u64));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            bytes: Bytes::from(body),
            content_type,
        })
    }

    fn too_big(&self, at_least: u64) -> MediaError {
        MediaError::new(
            "max_bytes",
            format!(
                "the media is at least {at_least} bytes, more than max_bytes ({})",
                self.max_bytes
            ),
        )
    }

    /// `data:[<media type>][;base64],<data>` (after `data:`): only base64 image payloads.
    fn data_url(&self, rest: &str) -> Result<Fetched, MediaError> {
        let Some((meta, payload)) = rest.split_once(',') else {
            return Err(MediaError::new(
                "data_url",
                "a data URL needs a ',' before its data",
            ));
        };
        let mut parts = meta.split(';');
        let media_type = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
            return Err(MediaError::new(
                "data_url",
                "only base64 data URLs are supported",
            ));
        }
        check_content_type(Some(if media_type.is_empty() {
            "text/plain"
        } else {
            &media_type
        }))?;
        // Decoded size is at most 3/4 of the encoded size: refuse before decoding.
        let decoded_max = (payload.len() as u64).div_ceil(4) * 3;
        if decoded_max > self.max_bytes.saturating_add(3) {
            return Err(self.too_big(decoded_max.saturating_sub(2)));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(payload.trim())
            .map_err(|e| MediaError::new("data_url", format!("invalid base64: {e}")))?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(self.too_big(bytes.len() as u64));
        }
        Ok(Fetched {
            bytes: Bytes::from(bytes),
            content_type: Some(media_type),
        })
    }
}

/// `image/*`, `application/octet-stream` (the decoder sniffs the format) or no type.
fn check_content_type(content_type: Option<&str>) -> Result<(), MediaError> {
    let Some(ct) = content_type else {
        return Ok(());
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence.starts_with("image/") || essence == "application/octet-stream" {
        Ok(())
    } else {
        Err(MediaError::new(
            "content_type",
            format!("content type {essence:?} is not an image"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<&'static str> {
        forbidden_class(s.parse().expect("an address"))
    }

    #[test]
    fn forbidden_addresses_are_classified() {
        for (ip, want) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "metadata service"),
            ("169.254.1.1", "link-local"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.100.100.200", "carrier-grade NAT"),
            ("0.0.0.0", "this-network"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fd00:ec2::254", "unique-local"),
            ("fc00::1", "unique-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "metadata service"),
            ("64:ff9b::7f00:1", "loopback"),
            ("2002:a00:1::", "private"),
            ("::127.0.0.1", "loopback"),
        ] {
            assert_eq!(class(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "169.255.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(class(ip), None, "{ip}");
        }
    }

    fn fetcher(config: MediaFetcherConfig) -> MediaFetcher {
        MediaFetcher::new(config).expect("client")
    }

    fn rule_of(config: &MediaFetcherConfig, url: &str) -> Option<&'static str> {
        check_url(config, &reqwest::Url::parse(url).expect("url"))
            .err()
            .map(|e| e.rule)
    }

    #[test]
    fn url_rules() {
        let strict = MediaFetcherConfig::default();
        assert_eq!(rule_of(&strict, "ftp://example.com/a.png"), Some("scheme"));
        assert_eq!(
            rule_of(&strict, "http://127.0.0.1/a.png"),
            Some("direct_ip")
        );
        assert_eq!(rule_of(&strict, "http://[::1]/a.png"), Some("direct_ip"));
        assert_eq!(
            rule_of(&strict, "http://example.com:8080/a.png"),
            Some("direct_port")
        );
        assert_eq!(rule_of(&strict, "http://example.com:80/a.png"), None);
        assert_eq!(rule_of(&strict, "https://example.com/a.png"), None);
        let domains = MediaFetcherConfig {
            allowed_media_domains: Some(vec!["Images.example.com".into(), "*.cdn.net".into()]),
            ..Default::default()
        };
        assert_eq!(rule_of(&domains, "https://images.example.com/a"), None);
        assert_eq!(rule_of(&domains, "https://a.images.example.com/a"), None);
        assert_eq!(rule_of(&domains, "https://x.cdn.net/a"), None);
        assert_eq!(
            rule_of(&domains, "https://evilimages.example.com/a"),
            Some("allowed_media_domains")
        );
        assert_eq!(
            rule_of(&domains, "https://example.com/a"),
            Some("allowed_media_domains")
        );
        let open = MediaFetcherConfig {
            allow_direct_ip: true,
            allow_direct_port: true,
            ..Default::default()
        };
        assert_eq!(rule_of(&open, "http://127.0.0.1:9/a.png"), None);
        // Other spellings of an IP literal are normalised by the URL parser first.
        for url in [
            "http://0x7f000001/",
            "http://2130706433/",
            "http://127.1/",
            "http://[::ffff:7f00:1]/",
        ] {
            assert_eq!(rule_of(&strict, url), Some("direct_ip"), "{url}");
        }
    }

    #[tokio::test]
    async fn names_resolving_to_loopback_are_refused_before_connecting() {
        let strict = fetcher(MediaFetcherConfig::default());
        let e = strict
            .fetch("http://localhost/a.png")
            .await
            .expect_err("refused");
        assert_eq!(e.rule, "private_address", "{e}");
        assert!(e.detail.contains("loopback"), "{e}");
        let names = fetcher(MediaFetcherConfig {
            allow_private_ips: true,
            allow_direct_port: true,
            ..Default::default()
        });
        // Allowed to resolve: the connection itself fails (nothing listens on port 1).
        let e = names
            .fetch("http://localhost:1/a.png")
            .await
            .expect_err("no server");
        assert_eq!(e.rule, "fetch", "{e}");
    }

    #[test]
    fn data_urls() {
        let f = fetcher(MediaFetcherConfig {
            max_bytes: Some(8),
            ..Default::default()
        });
        let ok = f.data_url("image/png;base64,AAECAw==").expect("decodes");
        assert_eq!(&ok.bytes[..], &[0, 1, 2, 3]);
        let rule = |s: &str| f.data_url(s).err().map(|e| e.rule);
        assert_eq!(rule("text/html;base64,AAEC"), Some("content_type"));
        assert_eq!(rule(";base64,AAEC"), Some("content_type"));
        assert_eq!(rule("image/png,rawbytes"), Some("data_url"));
        assert_eq!(rule("image/png;base64"), Some("data_url"));
        assert_eq!(rule("image/png;base64,!!!!"), Some("data_url"));
        assert_eq!(rule("image/png;base64,AAAAAAAAAAAAAAAA"), Some("max_bytes"));
    }
}
