//! Reading a bundle's sources: the I/O edge in front of the strict parser. The agent reads through its
//! reflector stores ([`crate::scope::Scope`]); `render`, a one-shot, reads with GETs.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

use crate::certs::{Certificate, EmptyPolicy, MAX_SOURCE_BYTES, SourceError, parse_certificates};
use crate::config::{Bundle, KeyRef, Source};
use crate::scope::Scope;

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
    /// The reason label of `<prefix>_source_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SourceFailure::ObjectMissing { .. } | SourceFailure::KeyMissing { .. } => "missing",
            SourceFailure::Api { .. } | SourceFailure::NoClient => "apiserver",
            SourceFailure::File { .. } => "file",
            SourceFailure::Rejected(e) => e.metric_label(),
        }
    }

    /// The object to put an Event on: the source Secret or ConfigMap, when there is one.
    pub fn object(source: &Source) -> Option<(&'static str, &KeyRef)> {
        match source {
            Source::Secret(r) => Some(("Secret", r)),
            Source::ConfigMap(r) => Some(("ConfigMap", r)),
            _ => None,
        }
    }
}

/// Where Secrets and ConfigMaps are read from.
pub enum Reader<'a> {
    /// The agent's reflector stores.
    Stores(&'a Scope),
    /// GETs, for one-shot commands; `None` when no source reads from the cluster.
    Client(Option<&'a kube::Client>),
}

impl Reader<'_> {
    async fn secret(&self, r: &KeyRef) -> Result<Option<Secret>, SourceFailure> {
        match self {
            Reader::Stores(scope) => Ok(scope.secret(&r.namespace, &r.name).map(|s| (*s).clone())),
            Reader::Client(client) => get(*client, "Secret", r).await,
        }
    }

    async fn config_map(&self, r: &KeyRef) -> Result<Option<ConfigMap>, SourceFailure> {
        match self {
            Reader::Stores(scope) => Ok(scope.config_map(&r.namespace, &r.name).map(|c| (*c).clone())),
            Reader::Client(client) => get(*client, "ConfigMap", r).await,
        }
    }
}

/// Reads and strictly parses one source. `empty` allows a source with no certificate (the empty-means-public
/// mode); otherwise an empty source is an error.
pub async fn read(reader: &Reader<'_>, source: &Source, empty: EmptyPolicy) -> Result<Vec<Certificate>, SourceFailure> {
    let missing =
        |kind, r: &KeyRef| SourceFailure::ObjectMissing { kind, namespace: r.namespace.clone(), name: r.name.clone() };
    let bytes = match source {
        Source::Secret(r) => {
            let secret = reader.secret(r).await?.ok_or_else(|| missing("Secret", r))?;
            let data = secret.data.unwrap_or_default();
            data.get(&r.key).map(|v| v.0.clone()).ok_or_else(|| key_missing("Secret", r))?
        }
        Source::ConfigMap(r) => {
            let cm = reader.config_map(r).await?.ok_or_else(|| missing("ConfigMap", r))?;
            match (cm.data.unwrap_or_default().remove(&r.key), cm.binary_data.unwrap_or_default().remove(&r.key)) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(bytes)) => bytes.0,
                (None, None) => return Err(key_missing("ConfigMap", r)),
            }
        }
        // Parsed at load with the same strict parser.
        Source::Inline(certs) => return Ok(certs.clone()),
        Source::File(path) => read_bounded(path).await?,
        Source::PublicRoots => return Ok(public_roots()),
    };
    Ok(parse_certificates(&bytes, empty)?)
}

/// Reads every source of a bundle, as its `emptyMeansPublicRoots` allows; the first failure (with its index)
/// stops it.
pub async fn read_bundle(reader: &Reader<'_>, bundle: &Bundle) -> Result<Vec<Certificate>, (usize, SourceFailure)> {
    let empty = if bundle.empty_means_public_roots { EmptyPolicy::Allow } else { EmptyPolicy::Reject };
    let mut certs = Vec::new();
    for (i, source) in bundle.sources.iter().enumerate() {
        certs.extend(read(reader, source, empty).await.map_err(|e| (i, e))?);
    }
    Ok(certs)
}

async fn get<K>(client: Option<&kube::Client>, kind: &'static str, r: &KeyRef) -> Result<Option<K>, SourceFailure>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let client = client.ok_or(SourceFailure::NoClient)?;
    let api: Api<K> = Api::namespaced(client.clone(), &r.namespace);
    api.get_opt(&r.name).await.map_err(|source| SourceFailure::Api {
        kind,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        source,
    })
}

/// Reads at most one byte more than a source may hold, so a huge (or endless) file is refused without being
/// read whole.
async fn read_bounded(path: &std::path::Path) -> Result<Vec<u8>, SourceFailure> {
    use tokio::io::AsyncReadExt;
    let failure = |source| SourceFailure::File { path: path.display().to_string(), source };
    let file = tokio::fs::File::open(path).await.map_err(failure)?;
    let mut bytes = Vec::new();
    file.take(MAX_SOURCE_BYTES as u64 + 1).read_to_end(&mut bytes).await.map_err(failure)?;
    if bytes.len() > MAX_SOURCE_BYTES {
        return Err(SourceError::TooLarge { size: bytes.len(), limit: MAX_SOURCE_BYTES }.into());
    }
    Ok(bytes)
}

fn key_missing(kind: &'static str, r: &KeyRef) -> SourceFailure {
    SourceFailure::KeyMissing { kind, namespace: r.namespace.clone(), name: r.name.clone(), key: r.key.clone() }
}

/// The public web roots (Mozilla's list, compiled in), as certificates. Compiled in so the image needs no
/// system trust store and the set only changes with a release.
/// The crate the compiled-in public roots come from, and its release (from Cargo.lock at build time).
pub const PUBLIC_ROOTS_PACKAGE: &str = "webpki-root-certs";
pub const PUBLIC_ROOTS_VERSION: &str = env!("CA_SYNCER_PUBLIC_ROOTS_VERSION");

/// One line naming the compiled-in public roots: package, release and how many certificates it holds.
pub fn public_roots_summary() -> String {
    format!("{PUBLIC_ROOTS_PACKAGE} {PUBLIC_ROOTS_VERSION}, {} certificates", public_roots().len())
}

pub fn public_roots() -> Vec<Certificate> {
    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().filter_map(|der| Certificate::from_der(der).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_roots_release_is_the_one_in_cargo_lock() {
        let lock = include_str!("../../../Cargo.lock");
        let entry = format!("name = \"{PUBLIC_ROOTS_PACKAGE}\"\nversion = \"{PUBLIC_ROOTS_VERSION}\"");
        assert!(lock.contains(&entry), "{entry}");
        assert!(public_roots_summary().ends_with(&format!("{} certificates", public_roots().len())));
    }

    #[test]
    fn public_roots_are_many_ca_certificates() {
        let roots = public_roots();
        assert!(roots.len() > 100, "{}", roots.len());
        assert!(roots.iter().all(Certificate::is_ca));
    }

    #[tokio::test]
    async fn a_file_source_is_read_no_further_than_its_limit() {
        // /dev/zero never ends: only a bounded read returns at all.
        let source = Source::File("/dev/zero".into());
        let err = read(&Reader::Client(None), &source, EmptyPolicy::Reject).await.unwrap_err();
        assert_eq!(err.metric_label(), "too_large", "{err}");
    }
}
