//! Where each bundle's rotation record lives: one ConfigMap per bundle in the agent's own namespace, which only
//! the agent writes (its RBAC names these objects; people who can edit a target usually cannot write here).
//! The record ([`RotationState`]) says which certificates the bundle's sources held and when each rotated-out one
//! left them; it alone decides what is retained ([`crate::rotation`]).
//!
//! Read with a GET every cycle rather than through a watch: the read must see the agent's own last write, and a
//! cache may lag behind it. Written with the `resourceVersion` it was read at, so two replicas that both think
//! they lead cannot overwrite each other's record unseen.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::rotation::{DecodedState, RotationState, StateTooLarge};

/// The key holding the record (JSON, the same shape as the targets' cache annotation).
pub const STATE_KEY: &str = "state.json";

/// The record's object for `bundle`. Bundle names are DNS labels, so this is a valid object name.
pub fn object_name(bundle: &str) -> String {
    format!("ca-syncer-state-{bundle}")
}

/// A bundle's record as read, with the version to write it back at.
pub struct Stored {
    pub decoded: DecodedState,
    /// `None` when the object does not exist yet (then it is created).
    resource_version: Option<String>,
}

/// Why the record could not be read or written. Never carries the record's content.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {namespace}/{name}: {source}")]
    Read { namespace: String, name: String, source: kube::Error },
    #[error("writing {namespace}/{name}: {source}")]
    Write { namespace: String, name: String, source: kube::Error },
    #[error(transparent)]
    TooLarge(#[from] StateTooLarge),
}

/// The records of all bundles, in the agent's namespace.
#[derive(Clone)]
pub struct StateStore {
    api: Api<ConfigMap>,
    namespace: String,
}

impl StateStore {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { api: Api::namespaced(client, namespace), namespace: namespace.to_string() }
    }

    pub async fn read(&self, bundle: &str) -> Result<Stored, StateError> {
        let name = object_name(bundle);
        let object = self.api.get_opt(&name).await.map_err(|source| StateError::Read {
            namespace: self.namespace.clone(),
            name: name.clone(),
            source,
        })?;
        let Some(object) = object else {
            return Ok(Stored { decoded: DecodedState::default(), resource_version: None });
        };
        let text = object.data.as_ref().and_then(|d| d.get(STATE_KEY)).map(String::as_str).unwrap_or_default();
        Ok(Stored { decoded: RotationState::decode(text), resource_version: object.metadata.resource_version })
    }

    /// Writes `state` over what `stored` was read from: a create when it did not exist, else a replace at the
    /// version read (a concurrent write makes this fail with a conflict, and the cycle is retried).
    pub async fn write(&self, bundle: &str, stored: &Stored, state: &RotationState) -> Result<(), StateError> {
        let name = object_name(bundle);
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: stored.resource_version.clone(),
                labels: Some(BTreeMap::from([
                    ("app.kubernetes.io/name".to_string(), "ca-syncer".to_string()),
                    ("ca-syncer.kcp-keeper.io/bundle".to_string(), bundle.to_string()),
                ])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(STATE_KEY.to_string(), state.encode()?)])),
            ..Default::default()
        };
        let params = PostParams { field_manager: Some(kcp_keeper_runtime::FIELD_MANAGER.into()), ..Default::default() };
        let written = match stored.resource_version {
            None => self.api.create(&params, &object).await,
            Some(_) => self.api.replace(&name, &params, &object).await,
        };
        written.map(|_| ()).map_err(|source| StateError::Write { namespace: self.namespace.clone(), name, source })
    }
}
