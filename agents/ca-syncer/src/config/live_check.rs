//! `liveCheck`: the TLS endpoints a bundle must verify before it is published, parsed once.

use std::collections::BTreeSet;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names;
use rustls::pki_types::ServerName;
use schemars::JsonSchema;
use serde::Deserialize;

/// The endpoints a bundle must verify, every one of them (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCheck {
    pub endpoints: Vec<Endpoint>,
}

/// One TLS endpoint, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// As configured: names the endpoint in messages and in the `endpoint` label.
    pub url: String,
    /// `host:port` to connect to (IPv6 bracketed).
    pub address: String,
    /// The name the server's certificate is verified for.
    pub server_name: ServerName<'static>,
}

/// Publish the bundle only if it verifies every endpoint's certificate chain (a TLS handshake trusting only the
/// bundle as it will be published). Exactly one of `url` (one endpoint) and `endpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RawLiveCheck {
    /// One endpoint, `https://host[:port][/path]` (the short form of `endpoints` with one entry).
    pub url: Option<String>,
    /// With `url`: the name to verify the server's certificate for, when it differs from the URL's host (a DNS
    /// hostname or an IP address).
    pub server_name: Option<String>,
    /// Every endpoint the bundle must verify, e.g. the front proxy and each shard, each with its own serving
    /// certificate. One that fails keeps every target as it is.
    pub endpoints: Vec<RawEndpoint>,
}

/// One endpoint of `liveCheck.endpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawEndpoint {
    /// `https://host[:port][/path]`.
    pub url: String,
    /// The name to verify the server's certificate for, when it differs from the URL's host (a DNS hostname
    /// or an IP address).
    #[serde(default)]
    pub server_name: Option<String>,
}

pub(super) fn live_check_from_raw(live: &RawLiveCheck, path: &str, errors: &mut Vec<FieldError>) -> Option<LiveCheck> {
    let before = errors.len();
    let mut endpoints = Vec::new();
    match (&live.url, live.endpoints.is_empty()) {
        (Some(url), true) => {
            endpoints.extend(endpoint_from_raw(url, live.server_name.as_deref(), path, errors));
        }
        (None, false) => {
            if live.server_name.is_some() {
                errors.push(FieldError::new(
                    format!("{path}.serverName"),
                    "goes with url; give each of endpoints its own serverName",
                ));
            }
            let mut seen = BTreeSet::new();
            for (i, endpoint) in live.endpoints.iter().enumerate() {
                let path = format!("{path}.endpoints[{i}]");
                if !seen.insert(&endpoint.url) {
                    errors.push(FieldError::new(format!("{path}.url"), "duplicate of an earlier endpoint"));
                }
                endpoints.extend(endpoint_from_raw(&endpoint.url, endpoint.server_name.as_deref(), &path, errors));
            }
        }
        (Some(_), false) => errors.push(FieldError::new(path, "must set exactly one of url, endpoints; has both")),
        (None, true) => errors.push(FieldError::new(path, "must set one of url, endpoints")),
    }
    (errors.len() == before).then_some(LiveCheck { endpoints })
}

fn endpoint_from_raw(
    url: &str,
    server_name: Option<&str>,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<Endpoint> {
    let url_error = |errors: &mut Vec<FieldError>, reason: &str| {
        errors.push(FieldError::new(format!("{path}.url"), reason));
        None::<(String, String)>
    };
    let parsed = match url.parse::<http::Uri>() {
        Err(_) => url_error(errors, "is not a URL"),
        Ok(uri) if uri.scheme_str() != Some("https") => url_error(errors, "must be an https:// URL"),
        Ok(uri) => match uri.authority() {
            Some(authority) if authority.as_str().contains('@') => url_error(errors, "must not carry credentials"),
            Some(authority) if !authority.host().is_empty() => {
                let host = authority.host();
                // IPv6 literals come bracketed from the URI; the socket address wants them bracketed too.
                let address = format!("{host}:{}", authority.port_u16().unwrap_or(443));
                Some((address, host.trim_matches(['[', ']']).to_string()))
            }
            _ => url_error(errors, "must name a host"),
        },
    };
    let name = match server_name {
        Some(name) => match names::check_server_name(name) {
            Ok(()) => Some(name.to_string()),
            Err(reason) => {
                errors.push(FieldError::new(format!("{path}.serverName"), reason));
                None
            }
        },
        None => parsed.as_ref().map(|(_, host)| host.clone()),
    };
    let (address, _) = parsed?;
    let name = name?;
    match ServerName::try_from(name) {
        Ok(server_name) => Some(Endpoint { url: url.to_string(), address, server_name }),
        Err(_) => {
            errors.push(FieldError::new(format!("{path}.serverName"), "must be a DNS hostname or an IP address"));
            None
        }
    }
}
