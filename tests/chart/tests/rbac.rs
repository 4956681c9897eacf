//! The chart's Roles are the agents' own (all four): for each configuration, the RBAC `helm template` renders equals
//! what the agent's `rbac` one-shot renders from the configuration file the chart put in its ConfigMap (read
//! back from the rendered ConfigMap and loaded with the agent's own loader, so the file is also valid for it).

use anyhow::Result;
use chart::{agent_rbac, differences, documents, rbac_of, rendered_config, template};
use serde_json::{Value, json};

fn example(agent: &str) -> Value {
    let path = chart::repo_root().join(format!("agents/{agent}/example.yaml"));
    serde_yaml::from_str(&std::fs::read_to_string(path).expect("example.yaml")).expect("parses")
}

/// Renders the chart with `key.config = config` (that agent alone on) and compares its RBAC with the agent's.
fn assert_same_rbac(key: &str, agent: &str, config: Value) -> Result<()> {
    let mut values = json!({"caSyncer": {"enabled": false}, "dnsRewriter": {"enabled": false}});
    values[key] = json!({"enabled": true, "config": config});
    if key == "etcdSnapshotter" {
        values[key]["s3Credentials"] = json!({"existingSecret": "s3"});
        if values[key]["config"]["drills"]["identityFile"].is_string() {
            values[key]["ageIdentity"] = json!({"existingSecret": "age"});
        }
    }
    let objects = documents(&template(&values, &[])?)?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, rendered_config(&objects, agent)?)?;
    let from_agent = documents(&agent_rbac(agent, &file)?)?;
    let (chart, agent_side) = (rbac_of(&objects, agent), rbac_of(&from_agent, agent));
    assert!(!agent_side.is_empty(), "{agent} rendered no RBAC");
    let diff = differences(&chart, &agent_side);
    assert!(diff.is_empty(), "{agent}: the chart's RBAC is not the agent's:\n{}", diff.join("\n"));
    Ok(())
}

#[test]
fn ca_syncer_roles_in_the_chart_equal_its_rbac_one_shot_for_its_example() -> Result<()> {
    assert_same_rbac("caSyncer", "ca-syncer", example("ca-syncer"))
}

#[test]
fn ca_syncer_roles_equal_for_configmap_sources_and_targets_and_no_selector() -> Result<()> {
    // ConfigMaps on both sides, two bundles sharing a namespace, a file source (no RBAC), no selector target
    // (so no ClusterRole), and the same object named twice (granted once).
    let config = json!({"bundles": [
        {"name": "one",
         "sources": [{"configMap": {"namespace": "trust", "name": "roots", "key": "ca.crt"}},
                     {"secret": {"namespace": "kcp-system", "name": "root-ca", "key": "ca.crt"}},
                     {"file": "/etc/extra/ca.pem"}],
         "targets": [{"configMap": {"namespace": "apps", "name": "kcp-ca", "key": "ca.crt"}}]},
        {"name": "two",
         "sources": [{"secret": {"namespace": "kcp-system", "name": "root-ca", "key": "ca.crt"}}],
         "targets": [{"secret": {"namespace": "apps", "name": "kcp-ca-secret", "key": "ca.crt"}},
                     {"configMap": {"namespace": "trust", "name": "out", "key": "b"}}]}
    ], "resyncInterval": "10m"});
    assert_same_rbac("caSyncer", "ca-syncer", config)
}

#[test]
fn ca_syncer_roles_equal_for_selector_sources_beside_named_ones_in_one_namespace() -> Result<()> {
    // Secrets and ConfigMaps by label (one key, every key) in a namespace that also holds a named source and a
    // target, a selector source in a namespace of its own, and a named source read with includeAllKeys.
    let config = json!({"bundles": [
        {"name": "one",
         "sources": [{"secret": {"namespace": "trust", "selector": {"matchLabels": {"ca": "trusted"}}, "key": "ca.crt"}},
                     {"configMap": {"namespace": "trust", "selector": {"matchExpressions": [{"key": "ca", "operator": "Exists"}]}, "includeAllKeys": true}},
                     {"secret": {"namespace": "trust", "name": "root-ca", "key": "ca.crt"}},
                     {"configMap": {"namespace": "roots", "selector": {"matchLabels": {"ca": "trusted"}}, "key": "ca.crt"}},
                     {"configMap": {"namespace": "kcp-system", "name": "all-roots", "includeAllKeys": true}}],
         "targets": [{"configMap": {"namespace": "trust", "name": "kcp-ca", "key": "ca.crt"}}]}
    ]});
    assert_same_rbac("caSyncer", "ca-syncer", config)
}

#[test]
fn ca_syncer_roles_equal_for_restart_consumers_of_every_kind_by_name_in_their_targets_namespace() -> Result<()> {
    // Two targets in one namespace naming the same Deployment (granted once), every kind, and a target in
    // another namespace with a window; a target without consumers grants no apps rule.
    let config = json!({"bundles": [
        {"name": "one",
         "sources": [{"secret": {"namespace": "kcp-system", "name": "root-ca", "key": "ca.crt"}}],
         "targets": [{"configMap": {"namespace": "hub", "name": "kcp-ca", "key": "ca.crt",
                                    "restartDeployments": ["hub", "api"], "restartStatefulSets": ["db"]}},
                     {"secret": {"namespace": "hub", "name": "kcp-ca", "key": "ca.crt",
                                 "restartDeployments": ["hub"], "restartDaemonSets": ["agent"]}},
                     {"secret": {"namespace": "edge", "name": "kcp-ca", "key": "ca.crt", "restartDeployments": ["proxy"],
                                 "restartWindow": {"cron": "0 2 * * *", "duration": "2h"}}},
                     {"secret": {"namespace": "plain", "name": "kcp-ca", "key": "ca.crt"}}]}
    ]});
    assert_same_rbac("caSyncer", "ca-syncer", config)
}

#[test]
fn ca_syncer_roles_equal_with_trust_store_password_secrets_read_by_name_beside_sources_and_for_selector_targets()
-> Result<()> {
    // A password Secret in the sources' namespace (one rule with the source), one in a namespace nothing else
    // names, one for a selector target; inline and default passwords grant nothing.
    let config = json!({"bundles": [
        {"name": "java",
         "sources": [{"secret": {"namespace": "kcp-system", "name": "root-ca", "key": "ca.crt"}}],
         "targets": [{"secret": {"namespace": "hub", "name": "kcp-ca", "key": "ca.crt", "additionalFormats": {
                         "jks": {"key": "truststore.jks"},
                         "pkcs12": {"key": "truststore.p12", "passwordSecretRef":
                                    {"namespace": "kcp-system", "name": "p12-password", "key": "password"}}}}},
                     {"configMap": {"namespace": "hub", "name": "kcp-ca", "key": "ca.crt", "additionalFormats": {
                         "jks": {"key": "truststore.jks", "passwordSecretRef":
                                 {"namespace": "passwords", "name": "jks-password", "key": "password"}},
                         "pkcs12": {"key": "truststore.p12", "password": "inline"}}}},
                     {"secret": {"name": "fleet-ca", "key": "ca.crt", "namespaceSelector": {"matchLabels": {"java": "true"}},
                                 "additionalFormats": {"pkcs12": {"key": "truststore.p12", "passwordSecretRef":
                                     {"namespace": "passwords", "name": "fleet-password", "key": "password"}}}}}]}
    ]});
    assert_same_rbac("caSyncer", "ca-syncer", config)
}

#[test]
fn ca_syncer_roles_equal_for_cluster_trust_bundle_targets_with_and_without_a_signer_or_a_selector() -> Result<()> {
    let bundle = |targets: Value| {
        json!({"bundles": [{"name": "one",
            "sources": [{"secret": {"namespace": "kcp-system", "name": "root-ca", "key": "ca.crt"}}],
            "targets": targets}]})
    };
    // Two bundles, one with a signer (attest on it), one without; no selector target, so no Namespaces rule.
    assert_same_rbac(
        "caSyncer",
        "ca-syncer",
        bundle(
            json!([{"clusterTrustBundle": {"name": "kcp-keeper.io:kcp-root-ca:primary", "signerName": "kcp-keeper.io/kcp-root-ca"}},
                      {"clusterTrustBundle": {"name": "kcp-root-ca"}}]),
        ),
    )?;
    // Beside a namespace-selector target: one ClusterRole with both.
    assert_same_rbac(
        "caSyncer",
        "ca-syncer",
        bundle(
            json!([{"clusterTrustBundle": {"name": "kcp-keeper.io:kcp-root-ca:primary", "signerName": "kcp-keeper.io/kcp-root-ca"}},
                      {"configMap": {"name": "kcp-ca", "key": "ca.crt", "namespaceSelector": {"matchLabels": {"trust": "kcp"}}}}]),
        ),
    )
}

#[test]
fn dns_rewriter_roles_in_the_chart_equal_its_rbac_one_shot_for_its_example() -> Result<()> {
    assert_same_rbac("dnsRewriter", "dns-rewriter", example("dns-rewriter"))
}

#[test]
fn dns_rewriter_roles_equal_in_corefile_mode_with_rules_in_other_namespaces_and_some_kinds() -> Result<()> {
    let config = json!({
        "mode": "corefile",
        "corefile": {"namespace": "dns", "name": "my-coredns", "serverBlock": ".:53"},
        "rules": [
            {"host": "a.example.com", "service": {"namespace": "zeta", "name": "a"}},
            {"host": "b.example.com", "service": {"namespace": "alpha", "name": "b"}, "port": 443},
            {"host": "c.example.com", "service": {"namespace": "kcp", "name": "c"}}],
        "discovery": {"namespace": "kcp", "shards": true},
    });
    assert_same_rbac("dnsRewriter", "dns-rewriter", config)?;
    // k3s mode with everything defaulted and no discovery: its ConfigMap, node-local-dns's, the Lease.
    assert_same_rbac("dnsRewriter", "dns-rewriter", json!({"mode": "k3s"}))?;
    // node-local-dns elsewhere (its own Events rule there), or switched off (no grant for it at all).
    let elsewhere = json!({"mode": "k3s", "nodeLocalDns": {"namespace": "dns", "name": "nodelocal"}});
    assert_same_rbac("dnsRewriter", "dns-rewriter", elsewhere)?;
    assert_same_rbac("dnsRewriter", "dns-rewriter", json!({"mode": "k3s", "nodeLocalDns": {"enabled": false}}))
}

#[test]
fn kubeconfig_rotator_roles_in_the_chart_equal_its_rbac_one_shot_for_its_example() -> Result<()> {
    assert_same_rbac("kubeconfigRotator", "kubeconfig-rotator", example("kubeconfig-rotator"))
}

#[test]
fn kubeconfig_rotator_roles_equal_for_every_source_kind_across_namespaces() -> Result<()> {
    // A plain Secret source, a certificate Secret with its CA in another namespace, an operator Kubeconfig
    // without a server CA, two kubeconfigs sharing namespaces, one target in the release namespace, restarts.
    let config = json!({"resyncInterval": "30s", "kubeconfigs": [
        {"name": "plain",
         "source": {"secret": {"namespace": "kcp-system", "name": "admin-kc", "key": "kubeconfig"}},
         "expect": {"username": "kcp-admin", "groups": ["system:kcp:admin"]},
         "targets": [{"namespace": "apps", "name": "a-kc", "restartDeployments": ["web", "api"]},
                     {"namespace": "kcp-keeper", "name": "own-kc", "splitKeys": true}]},
        {"name": "certs",
         "source": {"certificateSecret": {"namespace": "certs", "name": "client-cert", "server": "https://kcp.example.com:6443",
                                          "ca": {"namespace": "kcp-system", "name": "root-server-ca", "key": "tls.crt"}}},
         "expect": {"username": "bot"},
         "targets": [{"namespace": "apps", "name": "b-kc", "key": "config", "adopt": true, "restartDeployments": ["api"]}]},
        {"name": "operator",
         "source": {"kubeconfig": {"namespace": "kcp-system", "name": "op", "renderedSecret": "op-kubeconfig"}},
         "renewBefore": "240h",
         "targets": [{"namespace": "zeta", "name": "z-kc"}]}
    ]});
    assert_same_rbac("kubeconfigRotator", "kubeconfig-rotator", config)?;
    // No kubeconfig at all: the Lease alone.
    assert_same_rbac("kubeconfigRotator", "kubeconfig-rotator", json!({"kubeconfigs": []}))
}

#[test]
fn kubeconfig_rotator_roles_equal_with_statefulset_and_daemonset_consumers_and_a_restart_window() -> Result<()> {
    let config = json!({"kubeconfigs": [
        {"name": "plain",
         "source": {"secret": {"namespace": "kcp-system", "name": "admin-kc", "key": "kubeconfig"}},
         "expect": {"username": "kcp-admin"},
         "targets": [{"namespace": "apps", "name": "a-kc", "restartDeployments": ["web"],
                      "restartStatefulSets": ["db", "cache"], "restartDaemonSets": ["node-agent"],
                      "restartWindow": {"cron": "0 2 * * *", "timeZone": "Europe/Berlin", "duration": "2h", "margin": "48h"}},
                     {"namespace": "other", "name": "o-kc", "restartDaemonSets": ["only-ds"]}]}
    ]});
    assert_same_rbac("kubeconfigRotator", "kubeconfig-rotator", config)
}

#[test]
fn kubeconfig_rotator_roles_equal_with_targets_by_namespace_selector_within_allowed_namespaces_beside_named_ones()
-> Result<()> {
    // Two selector targets (one with consumers of every kind, one with matchExpressions only), their allow lists
    // overlapping each other and a named target's namespace: a ClusterRole to read and withdraw the selector
    // targets' names, and Roles to write them and restart their consumers in the allowed namespaces only.
    let config = json!({"kubeconfigs": [
        {"name": "plain",
         "source": {"secret": {"namespace": "kcp-system", "name": "admin-kc", "key": "kubeconfig"}},
         "expect": {"username": "kcp-admin"},
         "targets": [{"name": "hub-kc", "namespaceSelector": {"matchLabels": {"kcp-hub": "railgrid"}},
                      "allowedNamespaces": ["railgrid-prod", "apps"],
                      "restartDeployments": ["hub"], "restartStatefulSets": ["db"], "restartDaemonSets": ["agent"]},
                     {"name": "team-kc", "namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod"]}]},
                      "allowedNamespaces": ["railgrid-prod", "team-a"]},
                     {"namespace": "apps", "name": "a-kc", "restartDeployments": ["web"]}]}
    ]});
    assert_same_rbac("kubeconfigRotator", "kubeconfig-rotator", config)
}

#[test]
fn etcd_snapshotter_role_in_the_chart_equals_its_rbac_one_shot_and_the_rendered_file_loads() -> Result<()> {
    assert_same_rbac("etcdSnapshotter", "etcd-snapshotter", example("etcd-snapshotter"))
}

#[test]
fn etcd_snapshotter_role_is_the_same_with_drills_and_the_file_with_drills_loads() -> Result<()> {
    let mut config = example("etcd-snapshotter");
    config["shards"][0]["drill"] = json!({"schedule": {"cron": "30 4 * * *"}, "olderRate": 0.2});
    config["drills"] = json!({"identityFile": "/var/run/secrets/etcd-snapshotter/age/identity.txt",
                              "sampleKeys": 50, "timeout": "30m"});
    assert_same_rbac("etcdSnapshotter", "etcd-snapshotter", config)
}

/// The values block docs/install.md walks through (the layout of DESIGN.md section 1, all four agents).
fn install_guide_values() -> Value {
    let text = std::fs::read_to_string(chart::repo_root().join("docs/install.md")).expect("docs/install.md");
    let start = text.find("```yaml\n# kcp-keeper-values.yaml\n").expect("the values block") + "```yaml\n".len();
    let end = start + text[start..].find("```").expect("the block ends");
    serde_yaml::from_str(&text[start..end]).expect("the install guide's values parse")
}

#[test]
fn the_install_guide_values_render_every_agent_with_a_file_it_accepts_and_its_own_roles() -> Result<()> {
    let values = install_guide_values();
    let objects = documents(&template(&values, &[])?)?;
    let dir = tempfile::tempdir()?;
    for agent in ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter"] {
        let file = dir.path().join(format!("{agent}.yaml"));
        std::fs::write(&file, rendered_config(&objects, agent)?)?;
        // The agent's own loader accepts the file (its errors name the field) and renders the same Roles.
        let from_agent = documents(&agent_rbac(agent, &file)?)?;
        let diff = differences(&rbac_of(&objects, agent), &rbac_of(&from_agent, agent));
        assert!(diff.is_empty(), "{agent}: the chart's RBAC is not the agent's:\n{}", diff.join("\n"));
    }
    Ok(())
}

/// One rule of a Role, a resource at a time: `(group, resource, resourceNames, verbs)`.
type Rule = (String, String, Vec<String>, String);

/// The doctor's rules per namespace, from its rendered Roles.
fn doctor_rules(values: Value) -> Result<std::collections::BTreeMap<String, Vec<Rule>>> {
    let objects = documents(&template(&values, &[])?)?;
    let mut out = std::collections::BTreeMap::new();
    for (key, role) in rbac_of(&objects, "doctor") {
        if key.0 != "Role" {
            assert_eq!(key.0, "RoleBinding", "the doctor has no cluster-wide RBAC: {key:?}");
            assert_eq!(role["subjects"][0]["name"], "kcp-keeper-doctor");
            continue;
        }
        let rules: &mut Vec<_> = out.entry(key.1.clone()).or_default();
        for rule in role["rules"].as_array().unwrap() {
            let strings = |v: &Value| -> Vec<String> {
                v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()).unwrap_or_default()
            };
            for resource in strings(&rule["resources"]) {
                rules.push((
                    rule["apiGroups"][0].as_str().unwrap().to_string(),
                    resource,
                    strings(&rule["resourceNames"]),
                    strings(&rule["verbs"]).join(","),
                ));
            }
        }
    }
    Ok(out)
}

fn r(group: &str, resource: &str, names: &[&str], verbs: &str) -> Rule {
    (group.into(), resource.into(), names.iter().map(|n| n.to_string()).collect(), verbs.into())
}

/// No doctor Role names Secrets (nor every resource): RBAC cannot grant one key of a Secret, and those holding
/// what the doctor checks hold a private key, a client key or a token beside it.
fn assert_no_secret(rules: &std::collections::BTreeMap<String, Vec<Rule>>) {
    for (ns, rules) in rules {
        for (_, resource, _, verbs) in rules {
            assert!(resource != "secrets" && resource != "*", "{ns}: the doctor may {verbs} {resource}");
        }
    }
}

#[test]
fn the_doctors_roles_are_reads_only_of_what_its_checks_read_by_name_where_the_values_name_the_objects_and_no_secret()
-> Result<()> {
    let values = json!({"doctor": {
        "enabled": true,
        "kcp": {"namespace": "kcp-system", "rootShards": ["root"], "shards": ["alpha"], "frontProxies": ["frontproxy"],
                "etcdNamespaces": ["etcd"]},
        "hubOidc": {"namespace": "railgrid-system", "name": "railgrid-hub"},
        "caConfigMaps": [{"namespace": "kcp-system", "name": "root-ca-bundle"}],
        "verify": {"serverCA": {"namespace": "kcp-system", "name": "kcp-server-ca"}},
    }});
    let got = doctor_rules(values.clone())?;
    let want: std::collections::BTreeMap<String, Vec<_>> = [
        ("etcd".to_string(), vec![r("apps", "statefulsets", &[], "list")]),
        (
            "kcp-system".to_string(),
            vec![
                r("operator.kcp.io", "rootshards", &[], "list"),
                r("operator.kcp.io", "shards", &[], "list"),
                r("operator.kcp.io", "frontproxies", &[], "list"),
                r("apps", "statefulsets", &[], "list"),
                r(
                    "apps",
                    "deployments",
                    &["root-kcp", "root-proxy", "alpha-shard-kcp", "frontproxy-front-proxy"],
                    "get",
                ),
                r("", "services", &["alpha-shard-kcp", "frontproxy-front-proxy"], "get"),
                // The CA bundle the values name and the server CA's copy: ConfigMaps, never the
                // `root-server-ca` Secret (it holds the CA's tls.key).
                r("", "configmaps", &["root-ca-bundle"], "get"),
                r("", "configmaps", &["kcp-server-ca"], "get"),
            ],
        ),
        // The lockstep check reads the operator's Deployment (the values' default, the seed's).
        ("kcp-operator".to_string(), vec![r("apps", "deployments", &["kcp-operator"], "get")]),
        // The release's own pods (agent-pods): listed by the chart's selector labels, never one read by name.
        (chart::NAMESPACE.to_string(), vec![r("", "pods", &[], "list")]),
        ("kube-system".to_string(), vec![r("", "services", &["kube-dns"], "get")]),
        ("railgrid-system".to_string(), vec![r("", "configmaps", &["railgrid-hub"], "get")]),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want);
    assert_no_secret(&got);

    // No names for the shards and front proxies: every Deployment and Service of the namespace (still get only);
    // a given cluster DNS needs no kube-dns; the endpoints' route needs EndpointSlices; without Verify checks
    // only the object rules' lists stay.
    let mut values = values;
    values["doctor"]["kcp"] = json!({"namespace": "kcp-system", "rootShards": ["root"]});
    values["doctor"]["verify"] = json!({"clusterDns": "10.43.0.10:53", "viaEndpoints": true});
    let got = doctor_rules(values.clone())?;
    assert_no_secret(&got);
    assert!(!got.contains_key("kube-system"), "{got:#?}");
    let kcp = &got["kcp-system"];
    assert!(kcp.contains(&r("apps", "deployments", &[], "get")), "{kcp:#?}");
    assert!(kcp.contains(&r("", "services", &[], "get")), "{kcp:#?}");
    assert!(kcp.contains(&r("discovery.k8s.io", "endpointslices", &[], "list")), "{kcp:#?}");
    values["doctor"]["verify"] = json!({"enabled": false});
    let got = doctor_rules(values)?;
    assert_eq!(
        got["kcp-system"],
        vec![
            r("operator.kcp.io", "rootshards", &[], "list"),
            r("operator.kcp.io", "shards", &[], "list"),
            r("operator.kcp.io", "frontproxies", &[], "list"),
            r("apps", "statefulsets", &[], "list"),
            r("", "configmaps", &["root-ca-bundle"], "get"),
        ]
    );
    // Never a write, and never a Secret or ConfigMap that is not named.
    for rules in got.values() {
        for (_, resource, names, verbs) in rules {
            assert!(verbs.split(',').all(|v| v == "get" || v == "list"), "{resource}: {verbs}");
            if resource == "secrets" || resource == "configmaps" {
                assert!(!names.is_empty(), "{resource} without resourceNames");
            }
        }
    }
    Ok(())
}

#[test]
fn the_doctors_roles_read_the_operator_and_provider_deployments_by_name_and_no_secret_with_every_agent_on() -> Result<()>
{
    let got = doctor_rules(json!({"doctor": {
        "enabled": true,
        "verify": {"enabled": false},
        "operator": {"namespace": "ops", "name": "kcp-operator"},
        "provider": {"namespace": "ops", "name": "infra-provider"},
    }}))?;
    assert_eq!(
        got["ops"],
        vec![r("apps", "deployments", &["kcp-operator"], "get"), r("apps", "deployments", &["infra-provider"], "get")]
    );
    assert_no_secret(&got);
    // Every agent on and every doctor value that names an object set: still no Secret, only reads.
    let example = |agent: &str| -> Value {
        let path = chart::repo_root().join(format!("agents/{agent}/example.yaml"));
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("example.yaml")).expect("parses")
    };
    let got = doctor_rules(json!({
        "caSyncer": {"enabled": true, "config": example("ca-syncer")},
        "kubeconfigRotator": {"enabled": true, "config": example("kubeconfig-rotator")},
        "etcdSnapshotter": {"enabled": true, "config": example("etcd-snapshotter"),
                            "s3Credentials": {"existingSecret": "s3"}, "ageIdentity": {"existingSecret": "age"}},
        "doctor": {
            "enabled": true,
            "kcp": {"namespace": "kcp-system", "rootShards": ["root"], "etcdNamespaces": ["etcd"]},
            "hubOidc": {"namespace": "railgrid-system", "name": "railgrid-hub"},
            "caConfigMaps": [{"namespace": "apps", "name": "kcp-ca"}],
            "verify": {"serverCA": {"namespace": "kcp-system", "name": "kcp-server-ca"}, "viaEndpoints": true},
            "provider": {"namespace": "ops", "name": "infra-provider"},
        },
    }))?;
    assert_no_secret(&got);
    for rules in got.values() {
        for (_, resource, _, verbs) in rules {
            assert!(verbs.split(',').all(|v| v == "get" || v == "list"), "{resource}: {verbs}");
        }
    }
    // Empty names: neither Deployment is read.
    let got =
        doctor_rules(json!({"doctor": {"enabled": true, "verify": {"enabled": false}, "operator": {"name": ""}}}))?;
    assert!(!got.values().flatten().any(|(_, resource, _, _)| resource == "deployments"), "{got:#?}");
    Ok(())
}

/// The agent-pods check lists the release's pods: `list` on Pods in the release namespace alone (beside the
/// NetworkPolicies when the chart renders any), nowhere else, and never Secrets, so no `imagePullSecrets` entry
/// can be read through the doctor.
#[test]
fn the_doctor_lists_pods_in_the_release_namespace_only_and_beside_network_policies_still_no_secret() -> Result<()> {
    let values = json!({"doctor": {"enabled": true, "verify": {"enabled": false}, "operator": {"name": ""},
                                   "kcp": {"namespace": "kcp-system", "etcdNamespaces": ["etcd"]}},
                        "imagePullSecrets": [{"name": "regcred"}]});
    let got = doctor_rules(values.clone())?;
    assert_eq!(got[chart::NAMESPACE], vec![r("", "pods", &[], "list")]);
    let pods: Vec<&String> = got
        .iter()
        .filter(|(_, rules)| rules.iter().any(|(_, resource, _, _)| resource == "pods"))
        .map(|(ns, _)| ns)
        .collect();
    assert_eq!(pods, [chart::NAMESPACE], "{got:#?}");
    assert_no_secret(&got);
    let mut values = values;
    values["networkPolicy"] =
        json!({"doctor": {"enabled": true}, "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}});
    let got = doctor_rules(values)?;
    assert_eq!(
        got[chart::NAMESPACE],
        vec![r("", "pods", &[], "list"), r("networking.k8s.io", "networkpolicies", &[], "list")]
    );
    assert_no_secret(&got);
    Ok(())
}
