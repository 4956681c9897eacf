//! Reading a bundle's sources: the I/O edge in front of the strict parser.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

use crate::certs::{Certificate, EmptyPolicy, SourceError, parse_certificates};
use crate::config::{KeyRef, Source};

/// Why a source could not be used. Never carries the source's content.
#[derive(Debug, thiserror::Error)]
pub enum SourceFailure {
    #[error("{kind} {namespace}/{name} not found")]
    ObjectMissing { kind: &'static str, namespace: String, name: String },
    #[error("{kind} {namespace}/{name} has no key {key:?}")]
    KeyMissing { kind: &'static str, namespace: String, name: String, key: String },
    #[error("reading {kind} {namespace}/{name}: {source}")]
    Api { kind: &'static str, namespace: String, name: String, source: kube::Error },
    #[error("reading file {path}: {source}")]
    File { path: String, source: std::io::Error },
    #[error("reading from the cluster needs a Kubernetes client")]
    NoClient,
    #[error("rejected: {0}")]
    Rejected(#[from] SourceError),
}

impl SourceFailure {
    pub fn metric_label(&self) -> &'static str {
        match self {
            SourceFailure::ObjectMissing { .. } | SourceFailure::KeyMissing { .. } => "missing",
            SourceFailure::Api { .. } | SourceFailure::NoClient => "apiserver",
            SourceFailure::File { .. } => "file",
            SourceFailure::Rejected(e) => e.metric_label(),
        }
    }

    /// The object to put an Event on: the source Secret or ConfigMap, when there is one.
    pub fn object(source: &Source<'_>) -> Option<(&'static str, KeyRef)> {
        match source {
            Source::Secret(r) => Some(("Secret", (*r).clone())),
            Source::ConfigMap(r) => Some(("ConfigMap", (*r).clone())),
            _ => None,
        }
    }
}

/// Reads and strictly parses one source. `empty` allows a source with no certificate (the empty-means-public
/// mode); otherwise an empty source is an error.
/// `client` may be `None` when no source reads from the cluster (`ca-syncer render` without a cluster).
pub async fn read(
    client: Option<&kube::Client>,
    source: &Source<'_>,
    empty: EmptyPolicy,
) -> Result<Vec<Certificate>, SourceFailure> {
    let bytes = match source {
        Source::Secret(r) => {
            let client = client.ok_or(SourceFailure::NoClient)?;
            let secret = get::<Secret>(client, "Secret", r).await?;
            let data = secret.data.unwrap_or_default();
            data.get(&r.key).map(|v| v.0.clone()).ok_or_else(|| key_missing("Secret", r))?
        }
        Source::ConfigMap(r) => {
            let client = client.ok_or(SourceFailure::NoClient)?;
            let cm = get::<ConfigMap>(client, "ConfigMap", r).await?;
            match (cm.data.unwrap_or_default().remove(&r.key), cm.binary_data.unwrap_or_default().remove(&r.key)) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(bytes)) => bytes.0,
                (None, None) => return Err(key_missing("ConfigMap", r)),
            }
        }
        Source::Inline(text) => text.as_bytes().to_vec(),
        Source::File(path) => tokio::fs::read(path)
            .await
            .map_err(|source| SourceFailure::File { path: path.display().to_string(), source })?,
        Source::PublicRoots => return Ok(public_roots()),
    };
    Ok(parse_certificates(&bytes, empty)?)
}

async fn get<K>(client: &kube::Client, kind: &'static str, r: &KeyRef) -> Result<K, SourceFailure>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), &r.namespace);
    match api.get_opt(&r.name).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(SourceFailure::ObjectMissing { kind, namespace: r.namespace.clone(), name: r.name.clone() }),
        Err(source) => Err(SourceFailure::Api { kind, namespace: r.namespace.clone(), name: r.name.clone(), source }),
    }
}

fn key_missing(kind: &'static str, r: &KeyRef) -> SourceFailure {
    SourceFailure::KeyMissing { kind, namespace: r.namespace.clone(), name: r.name.clone(), key: r.key.clone() }
}

/// The public web roots (Mozilla's list, compiled in), as certificates. Compiled in so the image needs no
/// system trust store and the set only changes with a release.
pub fn public_roots() -> Vec<Certificate> {
    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().filter_map(|der| Certificate::from_der(der).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_roots_are_many_ca_certificates() {
        let roots = public_roots();
        assert!(roots.len() > 100, "{}", roots.len());
        assert!(roots.iter().all(Certificate::is_ca));
    }
}
