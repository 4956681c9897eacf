//! Scoped watches served from reflector stores, and the signals a reconcile driver needs from them.
//!
//! An agent builds one [`Watches`] from its configuration: each watch names exactly what the configuration
//! names (a namespace, a `metadata.name` field selector, a label selector), so RBAC can be as narrow as
//! `resourceNames` and an unrelated change elsewhere in the cluster wakes nothing. Reads go through the
//! returned [`Store`]s, not fresh GETs every cycle. The driver polls the merged stream: it learns when every
//! watch has delivered its initial list (readiness), when something changed (a trigger), and when a watch
//! failed (the apiserver may be unreachable).

use std::fmt::Debug;
use std::hash::Hash;

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

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
    /// returned store. `name` describes it in logs.
    pub fn add<K>(&mut self, name: impl Into<String>, api: Api<K>, config: watcher::Config) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        let (store, writer) = reflector::store();
        let index = self.streams.len();
        let name = name.into();
        let label = name.clone();
        let stream =
            reflector::reflector(writer, watcher::watcher(api, config).default_backoff()).filter_map(move |event| {
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
