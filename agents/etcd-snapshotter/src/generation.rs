//! Which etcd cluster a snapshot belongs to. Manifests record etcd's cluster id; the shard's own cluster is the
//! one its endpoints serve now. Everything that orders, picks or deletes snapshots (retention, `latest`,
//! drills) looks only at the shard's own cluster: another installation writing to the same prefix, or one
//! stray manifest with a huge revision, is reported instead of used or deleted, and an etcd re-created from
//! scratch (a new cluster id, revisions restarting low) is a new generation whose snapshots are ordered and
//! kept among themselves, its newest being `latest`.

use crate::config::Shard;
use crate::manifest::Manifest;

/// The shard's own cluster: its id and its members' ids (hex, as manifests write them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Own {
    pub cluster_id: String,
    pub member_ids: Vec<String>,
}

impl Own {
    /// Whether `manifest` is a snapshot of this cluster. A manifest written before cluster ids were recorded
    /// belongs to it when its member is one of the cluster's members (member ids are drawn at random when a
    /// member is added: a re-created cluster has others).
    pub fn owns(&self, manifest: &Manifest) -> bool {
        match &manifest.cluster_id {
            Some(id) => *id == self.cluster_id,
            None => self.member_ids.contains(&manifest.member.id),
        }
    }
}

/// How a manifest names its cluster in listings and messages.
pub fn cluster_of(manifest: &Manifest) -> &str {
    manifest.cluster_id.as_deref().unwrap_or("unknown")
}

/// The cluster the shard's endpoints serve now: the first member that answers. `None` when none does.
pub async fn live(shard: &Shard) -> Option<Own> {
    for endpoint in &shard.endpoints {
        let Ok(mut client) = crate::member::connect(endpoint, shard.tls.as_ref()).await else { continue };
        if let Ok(own) = of_member(&mut client).await {
            return Some(own);
        }
    }
    None
}

/// The cluster the member behind `client` belongs to: the id in its status header and the member list.
pub async fn of_member(client: &mut etcd_client::Client) -> anyhow::Result<Own> {
    let timeout = crate::member::CALL_TIMEOUT;
    let status = tokio::time::timeout(timeout, client.status()).await??;
    let header = status.header().ok_or_else(|| anyhow::anyhow!("status has no header"))?;
    let cluster_id = format!("{:x}", header.cluster_id());
    let members = tokio::time::timeout(timeout, client.member_list()).await??;
    Ok(Own { cluster_id, member_ids: members.members().iter().map(|m| format!("{:x}", m.id())).collect() })
}

/// Splits `items` (newest first) into the own cluster's and the others', keeping the order.
pub fn split<T>(items: Vec<T>, own: &Own, manifest: impl Fn(&T) -> &Manifest) -> (Vec<T>, Vec<T>) {
    items.into_iter().partition(|item| own.owns(manifest(item)))
}

/// The shard's cluster when its etcd does not answer (a restore after a disaster): the one cluster all its
/// snapshots come from. Several: none can be chosen safely, and the error names them with their newest.
pub fn only_cluster(newest_first: &[Manifest]) -> Result<Option<String>, String> {
    let mut clusters: Vec<(&str, &str)> = Vec::new();
    for m in newest_first {
        if !clusters.iter().any(|(c, _)| *c == cluster_of(m)) {
            clusters.push((cluster_of(m), &m.id));
        }
    }
    match clusters.as_slice() {
        [] => Ok(None),
        [(only, _)] => Ok(Some(only.to_string())),
        several => Err(format!(
            "the shard's snapshots come from {} etcd clusters ({}) and its etcd does not answer to say which is \
             its own: name the snapshot id",
            several.len(),
            several.iter().map(|(c, newest)| format!("cluster {c}, newest {newest}")).collect::<Vec<_>>().join("; ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::sample;

    fn of(cluster: Option<&str>, member: &str, id: &str) -> Manifest {
        let mut m = sample();
        m.cluster_id = cluster.map(Into::into);
        m.member.id = member.into();
        m.id = id.into();
        m
    }

    #[test]
    fn a_cluster_owns_its_snapshots_and_older_manifests_of_its_members_only() {
        let own = Own { cluster_id: "c1".into(), member_ids: vec!["m1".into(), "m2".into()] };
        assert!(own.owns(&of(Some("c1"), "m9", "a")));
        assert!(!own.owns(&of(Some("c2"), "m1", "b")), "another cluster, whatever its member id");
        assert!(own.owns(&of(None, "m2", "c")), "written before cluster ids, by one of its members");
        assert!(!own.owns(&of(None, "m9", "d")));
        let (mine, others) =
            split(vec![of(Some("c2"), "x", "new"), of(Some("c1"), "x", "old")], &own, |m: &Manifest| m);
        assert_eq!((mine[0].id.as_str(), others[0].id.as_str()), ("old", "new"));
    }

    #[test]
    fn without_a_live_cluster_only_a_single_cluster_is_chosen() {
        assert_eq!(only_cluster(&[]), Ok(None));
        let one = [of(Some("c1"), "m", "a"), of(Some("c1"), "m", "b")];
        assert_eq!(only_cluster(&one), Ok(Some("c1".into())));
        let two = [of(Some("c2"), "m", "new"), of(Some("c1"), "m", "a"), of(Some("c2"), "m", "b")];
        let error = only_cluster(&two).unwrap_err();
        assert!(error.contains("2 etcd clusters") && error.contains("cluster c1, newest a"), "{error}");
    }
}
