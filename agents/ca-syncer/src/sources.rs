//! Reading a bundle's sources: the I/O edge in front of the strict parser. The agent reads through its
//! reflector stores ([`crate::scope::Scope`]); `render`, a one-shot, reads with GETs (and a LIST by label for
//! a selector source).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kcp_keeper_runtime::watch::Namespaced;
use kube::api::{Api, ListParams};

use crate::certs::{Certificate, EmptyPolicy, MAX_SOURCE_BYTES, SourceError, parse_certificates};
use crate::config::{Bundle, KeyRef, Keys, Pick, Placement, Selection, Source, Target, TargetKind};
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
    /// A selected object's key holds something other than certificates (a private key, say).
    #[error("rejected: {kind} {namespace}/{name} key {key:?}: {error}")]
    RejectedIn { kind: &'static str, namespace: String, name: String, key: String, error: SourceError },
    /// Every selector source matches nothing and no other source adds a certificate: the bundle would be
    /// empty; its targets keep what they hold.
    #[error("no {kind} in namespace {namespace} matches the selector {selector}")]
    NothingSelected { kind: &'static str, namespace: String, selector: String },
}

impl SourceFailure {
    /// The reason label of `<prefix>_source_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SourceFailure::ObjectMissing { .. }
            | SourceFailure::KeyMissing { .. }
            | SourceFailure::NothingSelected { .. } => "missing",
            SourceFailure::Api { .. } | SourceFailure::NoClient => "apiserver",
            SourceFailure::File { .. } => "file",
            SourceFailure::Rejected(e) | SourceFailure::RejectedIn { error: e, .. } => e.metric_label(),
        }
    }

    /// The object to put an Event on (kind, namespace, name): the source Secret or ConfigMap, or the selected
    /// object at fault, when there is one.
    pub fn regarding(&self, source: &Source) -> Option<(&'static str, String, String)> {
        match (self, source) {
            (SourceFailure::RejectedIn { kind, namespace, name, .. }, _)
            | (SourceFailure::KeyMissing { kind, namespace, name, .. }, Source::Selected(_)) => {
                Some((kind, namespace.clone(), name.clone()))
            }
            (_, Source::Secret(r)) => Some(("Secret", r.namespace.clone(), r.name.clone())),
            (_, Source::ConfigMap(r)) => Some(("ConfigMap", r.namespace.clone(), r.name.clone())),
            _ => None,
        }
    }
}

/// One object a selection read: its name and its keys' bytes (`data`, and a ConfigMap's `binaryData`).
pub struct Entries {
    pub name: String,
    pub keys: BTreeMap<String, Vec<u8>>,
}

impl Entries {
    fn of_secret(secret: &Secret) -> Self {
        let keys = secret.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
        Entries { name: secret.metadata.name.clone().unwrap_or_default(), keys }
    }

    fn of_config_map(cm: &ConfigMap) -> Self {
        let text = cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes()));
        let binary = cm.binary_data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone()));
        Entries { name: cm.metadata.name.clone().unwrap_or_default(), keys: binary.chain(text).collect() }
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

    /// The objects a selection reads, sorted by name.
    async fn selected(&self, selection: &Selection) -> Result<Vec<Entries>, SourceFailure> {
        let mut entries = match (self, selection.kind) {
            (Reader::Stores(scope), TargetKind::Secret) => {
                scope.selected_secrets(selection).iter().map(|s| Entries::of_secret(s)).collect()
            }
            (Reader::Stores(scope), TargetKind::ConfigMap) => {
                scope.selected_config_maps(selection).iter().map(|c| Entries::of_config_map(c)).collect()
            }
            (Reader::Client(client), TargetKind::Secret) => {
                list::<Secret>(*client, selection).await?.iter().map(Entries::of_secret).collect()
            }
            (Reader::Client(client), TargetKind::ConfigMap) => {
                list::<ConfigMap>(*client, selection).await?.iter().map(Entries::of_config_map).collect::<Vec<_>>()
            }
            // Never a source: the configuration has no such field.
            (_, TargetKind::ClusterTrustBundle) => Vec::new(),
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }
}

/// Reads and strictly parses one source. `empty` allows a source with no certificate (the empty-means-public
/// mode); otherwise an empty source is an error. A selection never reads a key one of `targets` writes (the
/// bundle would feed on itself).
pub async fn read(
    reader: &Reader<'_>,
    source: &Source,
    empty: EmptyPolicy,
    targets: &[Target],
) -> Result<Vec<Certificate>, SourceFailure> {
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
        Source::Selected(selection) => return read_selected(reader, selection, empty, targets).await,
    };
    Ok(parse_certificates(&bytes, empty)?)
}

/// Every chosen key of every selected object, in name then key order, each parsed strictly on its own so a
/// failure names the object and key (never the content).
async fn read_selected(
    reader: &Reader<'_>,
    selection: &Selection,
    empty: EmptyPolicy,
    targets: &[Target],
) -> Result<Vec<Certificate>, SourceFailure> {
    let kind = selection.kind.as_str();
    let namespace = &selection.namespace;
    let objects = reader.selected(selection).await?;
    match &selection.pick {
        Pick::Name(name) if objects.is_empty() => {
            return Err(SourceFailure::ObjectMissing { kind, namespace: namespace.clone(), name: name.clone() });
        }
        // A selector matching nothing adds nothing; [`read_bundle`] refuses a bundle left empty by it.
        _ => {}
    }
    let mut certs = Vec::new();
    for object in objects {
        let chosen: Vec<(&String, &Vec<u8>)> = match &selection.keys {
            Keys::One(key) => match object.keys.get_key_value(key) {
                Some(entry) => vec![entry],
                None => {
                    let (namespace, name, key) = (namespace.clone(), object.name.clone(), key.clone());
                    return Err(SourceFailure::KeyMissing { kind, namespace, name, key });
                }
            },
            Keys::All => object.keys.iter().collect(),
        };
        for (key, bytes) in chosen {
            if writes(targets, selection.kind, namespace, &object.name, key) {
                continue;
            }
            let parsed = parse_certificates(bytes, empty).map_err(|error| SourceFailure::RejectedIn {
                kind,
                namespace: namespace.clone(),
                name: object.name.clone(),
                key: key.clone(),
                error,
            })?;
            certs.extend(parsed);
        }
    }
    Ok(certs)
}

/// Whether one of `targets` writes this key of this object (in that namespace, or by a selector that may).
fn writes(targets: &[Target], kind: TargetKind, namespace: &str, name: &str, key: &str) -> bool {
    targets.iter().any(|t| {
        t.kind == kind
            && t.name == name
            && t.key == key
            && match &t.placement {
                Placement::Namespace(ns) => ns == namespace,
                Placement::Selector(_) => true,
                Placement::Cluster => false,
            }
    })
}

/// Reads every source of a bundle, as its `emptyMeansPublicRoots` allows; the first failure (with its index)
/// stops it. A selector source matching no object adds nothing, as long as the bundle holds a certificate.
pub async fn read_bundle(reader: &Reader<'_>, bundle: &Bundle) -> Result<Vec<Certificate>, (usize, SourceFailure)> {
    let empty = if bundle.empty_means_public_roots { EmptyPolicy::Allow } else { EmptyPolicy::Reject };
    let mut certs = Vec::new();
    let mut unmatched = None;
    for (i, source) in bundle.sources.iter().enumerate() {
        let read = read(reader, source, empty, &bundle.targets).await.map_err(|e| (i, e))?;
        if let Source::Selected(selection) = source
            && let Pick::Labels(selector) = &selection.pick
            && read.is_empty()
        {
            unmatched = unmatched.or(Some((i, selection, selector)));
        }
        certs.extend(read);
    }
    // Only selector sources can be empty without an error: with all of them matching nothing, the bundle
    // would be written empty (which means "public roots" to its consumers), so it is refused instead, unless
    // that is what the bundle asks for.
    if let Some((i, selection, selector)) = unmatched.filter(|_| certs.is_empty() && empty == EmptyPolicy::Reject) {
        let failure = SourceFailure::NothingSelected {
            kind: selection.kind.as_str(),
            namespace: selection.namespace.clone(),
            selector: selector.label_selector(),
        };
        return Err((i, failure));
    }
    Ok(certs)
}

async fn get<K: Namespaced>(
    client: Option<&kube::Client>,
    kind: &'static str,
    r: &KeyRef,
) -> Result<Option<K>, SourceFailure> {
    let client = client.ok_or(SourceFailure::NoClient)?;
    let api: Api<K> = Api::namespaced(client.clone(), &r.namespace);
    let (namespace, name) = (r.namespace.clone(), r.name.clone());
    api.get_opt(&r.name).await.map_err(|source| SourceFailure::Api { kind, namespace, name, source })
}

/// The objects of a selection, listed (by label selector, or by a `metadata.name` field selector).
async fn list<K: Namespaced>(client: Option<&kube::Client>, selection: &Selection) -> Result<Vec<K>, SourceFailure> {
    let client = client.ok_or(SourceFailure::NoClient)?;
    let api: Api<K> = Api::namespaced(client.clone(), &selection.namespace);
    let (params, name) = match &selection.pick {
        Pick::Name(name) => (ListParams::default().fields(&format!("metadata.name={name}")), name.clone()),
        Pick::Labels(selector) => {
            let selector = selector.label_selector();
            (ListParams::default().labels(&selector), selector)
        }
    };
    let (kind, namespace) = (selection.kind.as_str(), selection.namespace.clone());
    let listed = api.list(&params).await.map_err(|source| SourceFailure::Api { kind, namespace, name, source })?;
    Ok(listed.items)
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
        let err = read(&Reader::Client(None), &source, EmptyPolicy::Reject, &[]).await.unwrap_err();
        assert_eq!(err.metric_label(), "too_large", "{err}");
    }
}
