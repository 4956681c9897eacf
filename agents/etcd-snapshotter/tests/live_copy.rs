//! Replacing a live etcd cluster's keyspace with a source etcd's through the etcd API, against real etcds: the
//! live cluster ends up holding exactly the source's keys, values and lease TTLs, its revision only goes
//! forward, the replaced history is compacted away, and a replacement that did not finish is named and finished
//! by the next one. And the check `restore-installation` makes before it changes anything: a running cluster
//! re-created from an empty volume under the snapshot's own identity is refused (with a real kube-apiserver
//! serving the kcp-operator's RootShard).

mod common;

use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use etcd_snapshotter::restore::live::{self, MARKER_KEY, Marker};

use common::*;

/// Small keys in the source, written a hundred to a transaction.
const SMALL_KEYS: usize = 3000;
/// Over the 1 MiB a copy transaction holds, under etcd's 1.5 MiB request limit: goes alone in its put.
const BIG_VALUE: usize = 1200 << 10;
const LEASE_TTLS: [i64; 2] = [600, 120];

/// Every key and value `client` serves at its current revision, in key order.
async fn everything(client: &mut Client) -> Vec<etcd_client::KeyValue> {
    let mut reader = client.kv_client().max_decoding_message_size(64 << 20);
    reader.get("", Some(GetOptions::new().with_all_keys())).await.unwrap().take_kvs()
}

/// The revision `client`'s cluster is at.
async fn revision(client: &mut Client) -> i64 {
    client.get(MARKER_KEY, Some(GetOptions::new().with_count_only())).await.unwrap().header().unwrap().revision()
}

/// A one-member source with many small keys, five empty values, two of about 1.2 MiB and keys under two
/// leases (TTLs 600 s and 120 s).
async fn source(bed: &Bed) -> (testbed::Etcd, Client) {
    let etcd = bed.etcd("source", 1).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    for chunk in (0..SMALL_KEYS).collect::<Vec<_>>().chunks(100) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|i| TxnOp::put(format!("/registry/small/{i:05}"), format!("value {i} {}", "x".repeat(i % 97)), None))
            .collect();
        client.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    for i in 0..5 {
        client.put(format!("/registry/empty/{i}"), Vec::<u8>::new(), None).await.unwrap();
    }
    for (i, fill) in [b'a', b'b'].into_iter().enumerate() {
        client.put(format!("/registry/big/{i}"), vec![fill; BIG_VALUE], None).await.unwrap();
    }
    for (n, ttl) in LEASE_TTLS.into_iter().enumerate() {
        let lease = client.lease_grant(ttl, None).await.unwrap().id();
        for i in 0..20 {
            let options = PutOptions::new().with_lease(lease);
            client.put(format!("/registry/leased/{n}/{i:02}"), format!("leased {i}"), Some(options)).await.unwrap();
        }
    }
    // History: a key written twice, one deleted.
    client.put("/registry/small/00000", "rewritten", None).await.unwrap();
    client.delete("/registry/small/00001", None).await.unwrap();
    (etcd, client)
}

/// A three-member live cluster with keys of its own: some the source lacks, some it holds with other values.
async fn live_cluster(bed: &Bed) -> (testbed::Etcd, Client) {
    let etcd = bed.etcd("live", 3).await.unwrap();
    let mut client = etcd.member_client(0).await.unwrap();
    load(&mut client, "/registry/stray", 50, 30).await.unwrap();
    client.put("/registry/small/00002", "the live cluster's own", None).await.unwrap();
    client.put("/outside/registry", "also replaced", None).await.unwrap();
    (etcd, client)
}

/// A marker of the restore `restore` of shard `root`.
fn marker_of(restore: &str) -> Marker {
    Marker { restore: restore.into(), shard: "root".into(), at: "2026-12-01T12:00:00Z".into() }
}

/// The live cluster (read through `other`, another member than the one written to) holds exactly the source's
/// keys and values, each leased key under a lease of the source's granted TTL, no marker; its revision went
/// past `before`, and `before` is compacted away.
async fn assert_holds_exactly_the_source(source: &mut Client, other: &mut Client, before: i64, copied: &live::Copied) {
    let (want, got) = (everything(source).await, everything(other).await);
    let pairs = |kvs: &[etcd_client::KeyValue]| kvs.iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect();
    let (want_pairs, got_pairs): (Vec<_>, Vec<_>) = (pairs(&want), pairs(&got));
    assert_eq!(got_pairs.len(), want_pairs.len(), "as many keys as the source");
    assert!(got_pairs == want_pairs, "the same keys and values as the source");
    assert_eq!(copied.keys as usize, want.len());
    assert_eq!(copied.bytes, want.iter().map(|kv| (kv.key().len() + kv.value().len()) as u64).sum::<u64>());
    assert_eq!(copied.source_revision, revision(source).await);
    assert_eq!(copied.leases, LEASE_TTLS.len() as u64);
    assert_eq!(copied.unknown_leases, 0);
    assert!(want.iter().any(|kv| kv.value().is_empty()) && want.iter().any(|kv| kv.value().len() == BIG_VALUE));

    let mut leased = 0;
    for (w, g) in want.iter().zip(&got) {
        if w.lease() == 0 {
            assert_eq!(g.lease(), 0, "{}: no lease in the source, none here", String::from_utf8_lossy(g.key()));
            continue;
        }
        leased += 1;
        assert_ne!(g.lease(), 0, "{}: leased in the source", String::from_utf8_lossy(g.key()));
        let source_ttl = source.lease_time_to_live(w.lease(), None).await.unwrap().granted_ttl();
        let live_ttl = other.lease_time_to_live(g.lease(), None).await.unwrap();
        assert_eq!(live_ttl.granted_ttl(), source_ttl, "{}", String::from_utf8_lossy(g.key()));
        assert!(live_ttl.ttl() > 0, "the lease is alive");
    }
    assert_eq!(leased, 20 * LEASE_TTLS.len());

    assert!(other.get(MARKER_KEY, None).await.unwrap().kvs().is_empty(), "the marker is gone");
    assert_eq!(live::marker(other).await.unwrap(), None);
    let now = revision(other).await;
    assert!(now > before, "the live revision went forward: {before} then {now}");
    assert_eq!(copied.live_revision, now);
    let old = other.get("", Some(GetOptions::new().with_all_keys().with_revision(before))).await;
    let error = old.expect_err("the replaced history is compacted").to_string();
    assert!(error.contains("compacted"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_cluster_ends_with_exactly_the_sources_keys_values_and_lease_ttls() {
    let bed = Bed::start().await.unwrap();
    let (_source_etcd, mut source) = source(&bed).await;
    let (live_etcd, mut writer) = live_cluster(&bed).await;
    let before = revision(&mut writer).await;

    let copied = live::replace_keyspace(&mut source, &mut writer, &marker_of("r-1")).await.unwrap();

    assert_eq!(copied.interrupted, None);
    let mut other = live_etcd.member_client(2).await.unwrap();
    assert_holds_exactly_the_source(&mut source, &mut other, before, &copied).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_replacement_is_named_and_finished_by_the_next() {
    let bed = Bed::start().await.unwrap();
    let (_source_etcd, mut source) = source(&bed).await;
    let (live_etcd, mut writer) = live_cluster(&bed).await;
    // As a replacement killed mid-copy leaves it: its marker, and part of a copy beside the live keys.
    let killed = marker_of("r-killed");
    writer.put(MARKER_KEY, serde_json::to_vec(&killed).unwrap(), None).await.unwrap();
    load(&mut writer, "/registry/small", 10, 8).await.unwrap();
    let before = revision(&mut writer).await;
    assert_eq!(live::marker(&mut writer).await.unwrap(), Some(killed.clone()));

    let copied = live::replace_keyspace(&mut source, &mut writer, &marker_of("r-2")).await.unwrap();

    assert_eq!(copied.interrupted, Some(killed));
    let mut other = live_etcd.member_client(1).await.unwrap();
    assert_holds_exactly_the_source(&mut source, &mut other, before, &copied).await;
}

/// A one-member etcd whose members, peer URL and `--initial-cluster-token` are fixed: started again on an emptied
/// volume with the same token it is the same cluster id again, as a StatefulSet re-created with its volumes lost is.
struct FixedEtcd {
    binary: std::path::PathBuf,
    dir: std::path::PathBuf,
    client_url: String,
    peer_url: String,
    process: Option<testbed::process::Process>,
}

impl FixedEtcd {
    fn new(bed: &Bed) -> Self {
        let port = || testbed::process::free_port().unwrap();
        Self {
            binary: bed.peers.path("etcd").to_path_buf(),
            dir: bed.path("fixed-etcd"),
            client_url: format!("http://127.0.0.1:{}", port()),
            peer_url: format!("http://127.0.0.1:{}", port()),
            process: None,
        }
    }

    /// Stops the member (if running), empties its volume and starts it as a new cluster under `token`: a client
    /// once it answers.
    async fn start_empty(&mut self, token: &str) -> Client {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        let data = self.dir.join("member");
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&self.dir).unwrap();
        let args = vec![
            "--name=member-0".to_string(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={}", self.client_url),
            format!("--advertise-client-urls={}", self.client_url),
            format!("--listen-peer-urls={}", self.peer_url),
            format!("--initial-advertise-peer-urls={}", self.peer_url),
            format!("--initial-cluster=member-0={}", self.peer_url),
            "--initial-cluster-state=new".into(),
            format!("--initial-cluster-token={token}"),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        let log = self.dir.join(format!("member-{token}.log"));
        self.process = Some(testbed::process::Process::start("fixed-etcd", &self.binary, args, log).unwrap());
        let url = self.client_url.clone();
        testbed::eventually(WAIT, "the fixed etcd to answer", || {
            let url = url.clone();
            async move {
                let mut client = Client::connect([url], None).await.ok()?;
                client.status().await.ok()?;
                Some(client)
            }
        })
        .await
    }
}

async fn cluster_id(client: &mut Client) -> u64 {
    client.status().await.unwrap().header().unwrap().cluster_id()
}

/// `restore-installation --yes` of the RootShard `namespace/root` to the newest consistent point, as an admin of
/// the cluster, with a kcp kubeconfig that does not exist (the command must stop before it reads it).
fn restore_installation(bed: &Bed, config: &std::path::Path, namespace: &str) -> std::process::Output {
    let kubeconfig = bed.cluster().apiserver.user_kubeconfig("restorer", &["system:masters"], WAIT * 10).unwrap();
    let root_shard = format!("{namespace}/root");
    let missing = bed.path("no-such-kcp.kubeconfig");
    let args = ["restore-installation", "--config", config.to_str().unwrap(), "--root-shard", &root_shard];
    std::process::Command::new(BINARY)
        .args(args)
        .args(["--at", "latest-consistent", "--yes", "--kcp-kubeconfig", missing.to_str().unwrap()])
        .env(NO_METADATA.0, NO_METADATA.1)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("the binary runs")
}

/// What a refused restore must leave as it was: no record in the bucket, the RootShard's replicas, and every key
/// and the revision of the running etcd.
async fn nothing_changed(
    bed: &Bed,
    roots: &kube::Api<kube::api::DynamicObject>,
    etcd: &mut Client,
    before: (i64, usize),
) {
    let record = format!("{PREFIX}/installation-restore.json");
    assert!(!keys(&bed.s3.client(), &bed.s3.bucket).await.contains(&record), "a record was written");
    let root = roots.get("root").await.unwrap();
    assert_eq!(root.data["spec"]["replicas"], 1, "the RootShard was scaled");
    assert_eq!(root.data["spec"]["proxy"]["replicas"], 1, "the RootShard's proxy was scaled");
    assert_eq!((revision(etcd).await, everything(etcd).await.len()), before, "the running etcd was written to");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_installation_refuses_an_etcd_recreated_empty_under_the_snapshots_identity_but_not_under_another_token()
{
    let bed = Bed::with_cluster().await.unwrap();
    let namespace = bed.cluster().namespace().await.unwrap();
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("operator.kcp.io", "v1alpha1", "RootShard"),
        "rootshards",
    );
    let roots = kube::Api::<kube::api::DynamicObject>::namespaced_with(bed.cluster().client(), &namespace, &resource);
    let mut root = testbed::seed::layout::root_shard();
    root["metadata"]["namespace"] = serde_json::json!(namespace);
    let root: kube::api::DynamicObject = serde_json::from_value(root).unwrap();
    roots.create(&Default::default(), &root).await.unwrap();

    let mut etcd = FixedEtcd::new(&bed);
    let mut client = etcd.start_empty("kcp-root").await;
    load(&mut client, "/registry/base", 20, 100).await.unwrap();
    let snapshotted = cluster_id(&mut client).await;
    let config =
        write_config(&bed, &Options::new(&bed, "root", vec![etcd.client_url.clone()]).with_drills(&bed)).unwrap();
    snapshot_ok(&config);

    // The volume lost, the cluster re-created with the same member and token: the snapshot's cluster id, revision 1.
    let mut client = etcd.start_empty("kcp-root").await;
    assert_eq!(cluster_id(&mut client).await, snapshotted, "the same identity gives the same cluster id");
    let before = (revision(&mut client).await, everything(&mut client).await.len());
    let out = restore_installation(&bed, &config, &namespace);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("re-created from empty volumes under the same identity"), "{said}");
    assert!(said.contains("shard root: nothing was changed"), "{said}");
    nothing_changed(&bed, &roots, &mut client, before).await;

    // Re-created under another token (another cluster id): that check passes, and the command stops at the next,
    // the kcp kubeconfig, still before anything changed.
    let mut client = etcd.start_empty("kcp-root-2").await;
    assert_ne!(cluster_id(&mut client).await, snapshotted);
    let before = (revision(&mut client).await, everything(&mut client).await.len());
    let out = restore_installation(&bed, &config, &namespace);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(!said.contains("same identity"), "{said}");
    assert!(said.contains("reading --kcp-kubeconfig"), "{said}");
    nothing_changed(&bed, &roots, &mut client, before).await;
}
