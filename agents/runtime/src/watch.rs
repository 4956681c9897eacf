//! Scoped watches served from reflector stores, and the signals a reconcile driver needs from them.
//!
//! An agent builds one [`Watches`] from its configuration: each watch names exactly what the configuration
//! names (a namespace, a `metadata.name` field selector, a label selector), so RBAC can be as narrow as
//! `resourceNames` and an unrelated change elsewhere in the cluster wakes nothing. Reads go through the
//! returned [`Store`]s, not fresh GETs every cycle. The driver polls the merged stream: it learns when every
//! watch has delivered its initial list (readiness), when something changed (a trigger), and when a watch
//! failed (the apiserver may be unreachable).
//!
//! A store holds only what its agent reads ([`Trim`]): every object is trimmed as it arrives, before it is
//! stored, so memory grows with what the agent needs of each object rather than with the whole object.
//! `metadata.managedFields` (the apiserver's record of which manager set which field, often the largest part
//! of a small object) is dropped from every store; an agent keeps only the labels, annotations and data keys it
//! names. A watch whose objects are read for their names alone (Namespaces chosen by a label selector) is a
//! metadata-only watch ([`Watches::add_metadata`]): the apiserver sends no spec or status at all.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::hash::Hash;

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ObjectMeta};
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use crate::FIELD_MANAGER;

/// A namespaced kind with a static `DynamicType` (every k8s-openapi kind, every [`crate::foreign_kind!`]): what
/// a watch by name, a store and a read of one object by namespace and name take.
pub trait Namespaced:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K: Resource<DynamicType = (), Scope = NamespaceResourceScope>> Namespaced for K where
    K: Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// What one watch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The (re)list completed: the store holds everything that matches.
    Synced(usize),
    /// An object was added, changed or deleted.
    Changed(usize),
    /// The watch broke (apiserver gone, RBAC, expired resourceVersion); it retries with backoff.
    Failed(usize),
}

/// A set of watches under construction; [`Watches::start`] turns it into a [`WatchSet`].
#[derive(Default)]
pub struct Watches {
    streams: Vec<BoxStream<'static, Signal>>,
    names: Vec<String>,
}

impl Watches {
    pub fn new() -> Self {
        Self::default()
    }

    /// Objects named `name` in every namespace: a cluster-wide list and watch that always carries the name's field
    /// selector ([`by_name`]), so a role granting that name by `resourceNames` is all it needs and nothing else of
    /// the kind (every Secret in the cluster, say) is ever listed. How an agent
    /// watches a namespaced kind across the cluster.
    pub fn add_named_everywhere<K: Namespaced>(&mut self, client: &kube::Client, name: &str) -> Store<K> {
        self.add(format!("{} */{name}", K::kind(&()).to_lowercase()), Api::<K>::all(client.clone()), by_name(name))
    }

    /// Adds a watch of `api` (namespaced or all) with `config` (field and label selectors), served into the
    /// returned store. `name` describes it in logs. The store keeps each object whole but for its
    /// `managedFields` ([`Trim::default`]).
    pub fn add<K>(&mut self, name: impl Into<String>, api: Api<K>, config: watcher::Config) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        self.add_trimmed(name, api, config, Trim::default())
    }

    /// [`Watches::add`], each object trimmed by `trim` before it is stored: the store holds only what the agent
    /// reads of it.
    pub fn add_trimmed<K>(
        &mut self,
        name: impl Into<String>,
        api: Api<K>,
        config: watcher::Config,
        trim: Trim<K>,
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        let events = watcher::watcher(api, config).default_backoff().modify(move |object| trim.apply(object));
        self.reflect(name.into(), events)
    }

    /// A metadata-only watch with `config` (`api` of [`PartialObjectMeta`]: the apiserver sends each object's
    /// metadata alone, as `PartialObjectMetadata`); the store keeps its identity and whether it is being deleted
    /// ([`keep_identity`]). For objects the agent reads by name only, such as the Namespaces a label selector
    /// chooses (the selector is applied by the apiserver; the labels are not read again).
    pub fn add_metadata<K>(
        &mut self,
        name: impl Into<String>,
        api: Api<PartialObjectMeta<K>>,
        config: watcher::Config,
    ) -> Store<PartialObjectMeta<K>>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        let events = watcher::watcher(api, config)
            .default_backoff()
            .modify(|object: &mut PartialObjectMeta<K>| keep_identity(&mut object.metadata));
        self.reflect(name.into(), events)
    }

    /// Serves `events` into a new store, and keeps the signals they give.
    fn reflect<K>(
        &mut self,
        name: String,
        events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    ) -> Store<K>
    where
        K: Resource + Clone + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        let (store, writer) = reflector::store();
        let index = self.streams.len();
        let label = name.clone();
        let stream = reflector::reflector(writer, events).filter_map(move |event| {
            let signal = match event {
                Ok(Event::InitDone) => Some(Signal::Synced(index)),
                Ok(Event::Apply(_) | Event::Delete(_)) => Some(Signal::Changed(index)),
                // Followed by InitDone: the list is complete only then.
                Ok(Event::Init | Event::InitApply(_)) => None,
                Err(e) => {
                    tracing::warn!(watch = %label, error = %e, "watch failed; retrying");
                    Some(Signal::Failed(index))
                }
            };
            futures::future::ready(signal)
        });
        self.streams.push(stream.boxed());
        self.names.push(name);
        store
    }

    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// The watches, merged; they run while the set is polled and stop when it is dropped.
    pub fn start(self) -> WatchSet {
        let synced = vec![false; self.streams.len()];
        WatchSet { streams: futures::stream::select_all(self.streams), names: self.names, synced }
    }
}

/// Running watches: a stream of [`Signal`]s (ending at once when there are none), and which have synced.
pub struct WatchSet {
    streams: SelectAll<BoxStream<'static, Signal>>,
    names: Vec<String>,
    synced: Vec<bool>,
}

impl WatchSet {
    /// Whether every watch has delivered its initial list at least once (true for no watches).
    pub fn all_synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    /// The watches that have not synced yet, for logs.
    pub fn pending(&self) -> Vec<&str> {
        self.names.iter().zip(&self.synced).filter(|(_, s)| !**s).map(|(n, _)| n.as_str()).collect()
    }
}

impl Stream for WatchSet {
    type Item = Signal;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Signal>> {
        let polled = self.streams.poll_next_unpin(cx);
        if let std::task::Poll::Ready(Some(Signal::Synced(i))) = polled {
            self.synced[i] = true;
        }
        polled
    }
}

/// `metadata.name=<name>`: the field selector that lets RBAC's `resourceNames` cover a list and watch.
pub fn by_name(name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={name}"))
}

/// What a store keeps of each object. By default: everything but `metadata.managedFields`. An agent narrows it
/// to what it reads: the labels and annotations it names ([`Trim::labels`], [`Trim::annotations`]), kcp-keeper's
/// own record of which labels and annotations it set ([`Trim::own_metadata_ownership`]), and anything else of
/// the object's kind ([`Trim::object`], e.g. [`keep_keys`] on a Secret's data).
pub struct Trim<K> {
    labels: Option<BTreeSet<String>>,
    annotations: Option<BTreeSet<String>>,
    own_metadata_ownership: bool,
    object: Option<TrimObject<K>>,
}

/// A kind-specific trim ([`Trim::object`]).
type TrimObject<K> = Box<dyn Fn(&mut K) + Send + Sync>;

impl<K> Default for Trim<K> {
    fn default() -> Self {
        Self { labels: None, annotations: None, own_metadata_ownership: false, object: None }
    }
}

impl<K: Resource> Trim<K> {
    /// Keeps only these labels (none when empty).
    pub fn labels<S: Into<String>>(mut self, keys: impl IntoIterator<Item = S>) -> Self {
        self.labels = Some(keys.into_iter().map(Into::into).collect());
        self
    }

    /// Keeps only these annotations (none when empty).
    pub fn annotations<S: Into<String>>(mut self, keys: impl IntoIterator<Item = S>) -> Self {
        self.annotations = Some(keys.into_iter().map(Into::into).collect());
        self
    }

    /// Keeps, of `managedFields`, which labels and annotations kcp-keeper's field manager set (what decides
    /// whether a configured key someone changed is still ours); every other manager's entry, and every other
    /// field of ours, is dropped.
    pub fn own_metadata_ownership(mut self, keep: bool) -> Self {
        self.own_metadata_ownership = keep;
        self
    }

    /// Also trims the object with `f` (data keys, spec fields).
    pub fn object(mut self, f: impl Fn(&mut K) + Send + Sync + 'static) -> Self {
        self.object = Some(Box::new(f));
        self
    }

    /// Trims `object` in place.
    pub fn apply(&self, object: &mut K) {
        let meta = object.meta_mut();
        meta.managed_fields = if self.own_metadata_ownership { own_metadata_ownership(meta) } else { None };
        if let Some(keys) = &self.labels {
            keep_keys(&mut meta.labels, keys);
        }
        if let Some(keys) = &self.annotations {
            keep_keys(&mut meta.annotations, keys);
        }
        if let Some(f) = &self.object {
            f(object);
        }
    }
}

/// Keeps only `keys` of `map` (labels, annotations, a Secret's or ConfigMap's data); an emptied map becomes
/// `None`.
pub fn keep_keys<V>(map: &mut Option<BTreeMap<String, V>>, keys: &BTreeSet<String>) {
    if let Some(m) = map {
        m.retain(|k, _| keys.contains(k));
        if m.is_empty() {
            *map = None;
        }
    }
}

/// What a metadata-only store keeps: name, namespace, uid, resourceVersion and the deletion timestamp; labels,
/// annotations, owners, finalizers and managedFields are dropped.
pub fn keep_identity(meta: &mut ObjectMeta) {
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

/// kcp-keeper's own `managedFields` entries reduced to `f:metadata`'s `f:labels` and `f:annotations`; `None`
/// when it set neither.
fn own_metadata_ownership(
    meta: &mut ObjectMeta,
) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry>> {
    let entries: Vec<_> = meta
        .managed_fields
        .take()
        .into_iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
        .filter_map(|mut entry| {
            let metadata = entry.fields_v1.as_ref()?.0.get("f:metadata")?;
            let kept: serde_json::Map<String, serde_json::Value> = ["f:labels", "f:annotations"]
                .into_iter()
                .filter_map(|field| Some((field.to_string(), metadata.get(field)?.clone())))
                .collect();
            if kept.is_empty() {
                return None;
            }
            entry.fields_v1 = Some(FieldsV1(serde_json::json!({ "f:metadata": kept })));
            // Only the manager and the fields are read.
            entry.time = None;
            entry.api_version = None;
            entry.subresource = None;
            entry.fields_type = None;
            Some(entry)
        })
        .collect();
    (!entries.is_empty()).then_some(entries)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(fields)),
            time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default())),
            ..Default::default()
        }
    }

    fn secret() -> Secret {
        let map = |keys: &[&str]| Some(keys.iter().map(|k| (k.to_string(), k.to_string())).collect());
        Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                labels: map(&["mine", "theirs"]),
                annotations: map(&["state", "last-applied"]),
                managed_fields: Some(vec![
                    entry(
                        FIELD_MANAGER,
                        json!({"f:data": {"f:ca.crt": {}}, "f:metadata": {"f:labels": {"f:mine": {}}, "f:annotations": {"f:state": {}}}}),
                    ),
                    entry("kubectl", json!({"f:metadata": {"f:labels": {"f:theirs": {}}}})),
                ]),
                ..Default::default()
            },
            data: Some(
                ["ca.crt", "tls.key"].map(|k| (k.to_string(), k8s_openapi::ByteString(k.as_bytes().to_vec()))).into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_default_trim_drops_managed_fields_and_keeps_the_rest() {
        let mut s = secret();
        Trim::default().apply(&mut s);
        assert!(s.metadata.managed_fields.is_none());
        assert_eq!(s.metadata.labels.as_ref().map(BTreeMap::len), Some(2));
        assert_eq!(s.metadata.annotations.as_ref().map(BTreeMap::len), Some(2));
        assert_eq!(s.data.as_ref().map(BTreeMap::len), Some(2));
    }

    #[test]
    fn a_narrowed_trim_keeps_the_named_keys_and_only_our_metadata_ownership() {
        let mut s = secret();
        let keys = BTreeSet::from(["ca.crt".to_string()]);
        Trim::default()
            .labels(["mine"])
            .annotations(Vec::<String>::new())
            .own_metadata_ownership(true)
            .object(move |s: &mut Secret| keep_keys(&mut s.data, &keys))
            .apply(&mut s);
        assert_eq!(s.metadata.labels.map(|l| l.into_keys().collect::<Vec<_>>()), Some(vec!["mine".to_string()]));
        assert!(s.metadata.annotations.is_none(), "an emptied map is dropped");
        assert_eq!(s.data.map(|d| d.into_keys().collect::<Vec<_>>()), Some(vec!["ca.crt".to_string()]));
        let managed = s.metadata.managed_fields.expect("ours is kept");
        assert_eq!(managed.len(), 1);
        assert_eq!(managed[0].manager.as_deref(), Some(FIELD_MANAGER));
        assert!(managed[0].time.is_none());
        assert_eq!(
            managed[0].fields_v1.as_ref().map(|f| &f.0),
            Some(&json!({"f:metadata": {"f:labels": {"f:mine": {}}, "f:annotations": {"f:state": {}}}}))
        );
    }

    #[test]
    fn identity_is_all_a_metadata_only_store_keeps() {
        let mut meta = secret().metadata;
        meta.resource_version = Some("7".into());
        keep_identity(&mut meta);
        assert_eq!(
            meta,
            ObjectMeta { name: Some("s".into()), resource_version: Some("7".into()), ..Default::default() }
        );
    }
}
