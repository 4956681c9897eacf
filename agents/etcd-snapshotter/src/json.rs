//! How the agent writes its JSON objects to the bucket (manifests, drill reports, lock bodies, upgrade state):
//! pretty, with a trailing newline. A leaf: it imports nothing of the crate.

use serde::Serialize;

/// `value` as the agent writes its JSON objects.
pub fn object(value: &impl Serialize) -> Vec<u8> {
    let mut text = serde_json::to_vec_pretty(value).expect("an object always serializes");
    text.push(b'\n');
    text
}
