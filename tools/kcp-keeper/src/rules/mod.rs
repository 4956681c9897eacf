//! The rules, pure: what was read in, one verdict per subject out. No client, no network.

pub mod base_url;
pub mod etcd_spread;
pub mod expiry;
pub mod feature_gates;
pub mod images;
pub mod oidc;
pub mod restore;

use crate::layout::Layout;
use crate::verdict::Verdict;

/// Every rule on the kcp-operator objects and the etcd StatefulSets.
pub fn objects(layout: &Layout, hub: Option<&crate::layout::Oidc>) -> Vec<Verdict> {
    let mut out = Vec::new();
    out.extend(images::pinned(layout));
    out.extend(images::proxy_matches_shard(layout));
    out.extend(images::lockstep(layout));
    out.extend(base_url::shard_base_url(layout));
    out.extend(feature_gates::cache_apis(layout));
    out.extend(oidc::matches_hub(layout, hub));
    out.extend(etcd_spread::spread(layout));
    out
}
