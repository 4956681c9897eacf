//! `liveCheck`: the TLS endpoint a bundle must verify before it is published, parsed once.

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::names;
use rustls::pki_types::ServerName;
use schemars::JsonSchema;
use serde::Deserialize;

/// A TLS endpoint the bundle must verify, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCheck {
    /// As configured, for messages.
    pub url: String,
    /// `host:port` to connect to (IPv6 bracketed).
    pub address: String,
    /// The name the server's certificate is verified for.
    pub server_name: ServerName<'static>,
}

/// Publish the bundle only if it verifies this endpoint's certificate chain (a TLS handshake trusting only
/// the bundle as it will be published).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawLiveCheck {
    /// `https://host[:port][/path]`.
    pub url: String,
    /// The name to verify the server's certificate for, when it differs from the URL's host (a DNS hostname
    /// or an IP address).
    #[serde(default)]
    pub server_name: Option<String>,
}

pub(super) fn live_check_from_raw(live: &RawLiveCheck, path: &str, errors: &mut Vec<FieldError>) -> Option<LiveCheck> {
    let url_error = |errors: &mut Vec<FieldError>, reason: &str| {
        errors.push(FieldError::new(format!("{path}.url"), reason));
        None::<(String, String)>
    };
    let parsed = match live.url.parse::<http::Uri>() {
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
    let name = match &live.server_name {
        Some(name) => match names::check_server_name(name) {
            Ok(()) => Some(name.clone()),
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
        Ok(server_name) => Some(LiveCheck { url: live.url.clone(), address, server_name }),
        Err(_) => {
            errors.push(FieldError::new(format!("{path}.serverName"), "must be a DNS hostname or an IP address"));
            None
        }
    }
}
