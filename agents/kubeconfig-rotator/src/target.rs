//! What a target Secret holds and what the agent writes into it: the kubeconfig under the target's key, split
//! keys where configured, and annotations saying what it holds (for people and for `status`). Pure.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::Secret;
use kcp_keeper_runtime::consumer_restart::Keys;
use serde_json::json;
use time::OffsetDateTime;

use crate::config::{KUBECONFIG_ANNOTATION, Kubeconfig, Target};
use crate::credential::{self, Credential, rfc3339};
use crate::policy::Live;
use crate::scope::secret_key;

/// Annotations on a target Secret: what it holds, for people and for `status`.
pub const SERIAL_ANNOTATION: &str = "kcp-keeper.io/serial";
pub const NOT_AFTER_ANNOTATION: &str = "kcp-keeper.io/not-after";
pub const HASH_ANNOTATION: &str = "kcp-keeper.io/content-hash";

/// The annotations kubeconfig `kubeconfig` writes on its read-once consumers
/// ([`kcp_keeper_runtime::consumer_restart`]):
/// `kcp-keeper.io/restarted-for-<kubeconfig>` (pod template: the content hash it was restarted for) and
/// `kcp-keeper.io/restarted-not-after-<kubeconfig>` (metadata: that credential's notAfter, the window's deadline).
pub fn restart_keys(kubeconfig: &str) -> Keys {
    Keys::for_owner("kcp-keeper.io/", kubeconfig)
}

/// What the target's key holds now.
pub fn live_state(secret: Option<&Secret>, target: &Target, now: OffsetDateTime) -> Live {
    match secret_key(secret, &target.key) {
        None => Live::Missing,
        Some(bytes) => match credential::parse(bytes, now) {
            // The hash of what it holds, not of the re-rendering: a target holding the same parts in another
            // shape is rewritten into the published one.
            Ok(c) => Live::Valid { hash: credential::content_hash(bytes), cert: c.cert, server: c.server },
            Err(_) => Live::Unusable,
        },
    }
}

/// The CA data of what the target holds, if the agent wrote it (its content-hash annotation matches its content):
/// only that is carried into the next bundle by the CA overlap, never trust anchors someone else put there.
pub fn published_ca(secret: Option<&Secret>, target: &Target) -> Option<Vec<u8>> {
    let bytes = secret_key(secret, &target.key)?;
    let annotated = secret?.metadata.annotations.as_ref()?.get(HASH_ANNOTATION)?;
    (*annotated == credential::content_hash(bytes)).then(|| credential::peek_ca(bytes)).flatten()
}

/// Split keys are wanted and hold exactly the candidate's parts (true when not wanted).
pub fn split_keys_current(secret: Option<&Secret>, target: &Target, c: &Credential) -> bool {
    let key = |k: &str| secret_key(secret, k);
    !target.split_keys
        || (key("tls.crt") == Some(&c.cert_pem[..])
            && key("tls.key") == Some(&c.key_pem.expose()[..])
            && key("ca.crt") == Some(&c.ca_pem[..]))
}

/// The fields the agent owns in a target, with the resourceVersion it compared against: a concurrent change
/// (another writer, a newer credential) fails the write instead of being overwritten by what may be worse.
pub fn desired_secret(
    kc: &Kubeconfig,
    t: &Target,
    c: &Credential,
    rv: Option<&str>,
    creating: bool,
) -> serde_json::Value {
    let mut data = serde_json::Map::new();
    data.insert(t.key.clone(), json!(B64.encode(c.kubeconfig.expose())));
    if t.split_keys {
        data.insert("tls.crt".into(), json!(B64.encode(&c.cert_pem)));
        data.insert("tls.key".into(), json!(B64.encode(c.key_pem.expose())));
        data.insert("ca.crt".into(), json!(B64.encode(&c.ca_pem)));
    }
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": t.name, "namespace": t.namespace,
            "annotations": {
                SERIAL_ANNOTATION: c.cert.serial,
                NOT_AFTER_ANNOTATION: rfc3339(c.cert.not_after),
                HASH_ANNOTATION: c.hash(),
                KUBECONFIG_ANNOTATION: kc.name,
            },
        },
        "data": data,
    });
    if let Some(rv) = rv {
        secret["metadata"]["resourceVersion"] = json!(rv);
    }
    if creating {
        secret["type"] = json!("Opaque");
    }
    secret
}
