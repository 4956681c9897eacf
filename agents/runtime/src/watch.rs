//! Watches that survive apiserver restarts and tell the agent when to reconcile.

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// Yields `()` whenever an object of this kind changes (watching metadata only: the agent re-reads what it
/// needs, so Secret data is not streamed into memory for nothing), and after every (re)list, so a reconcile loop driven by
/// it catches up on everything after a watch broke (apiserver restart, expired resourceVersion). Errors are
/// logged and retried with backoff; the stream never ends on its own.
pub fn changes<K>(api: Api<PartialObjectMeta<K>>, config: watcher::Config) -> impl Stream<Item = ()> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api, config).default_backoff().filter_map(|event| async move {
        match event {
            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => Some(()),
            // Init and InitApply are followed by InitDone: reconcile once the list is complete.
            Ok(Event::Init | Event::InitApply(_)) => None,
            Err(e) => {
                tracing::warn!(error = %e, kind = %K::kind(&K::DynamicType::default()), "watch interrupted; retrying");
                None
            }
        }
    })
}
