//! `helm lint --strict` and `helm template` of charts/kcp-keeper with the real helm: default values, all four
//! agents switched on, the strict schema, the secure defaults, the monitoring toggles.

use anyhow::Result;
use chart::{documents, helm, key, run, template};
use serde_json::{Value, json};

fn example(agent: &str) -> Value {
    let path = chart::repo_root().join(format!("agents/{agent}/example.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).expect("example.yaml parses")
}

/// Every agent on, each with its documented example configuration (the snapshotter with the S3 Secret and age
/// identity its example needs), and both monitoring objects forced (helm template has no cluster to ask).
fn all_agents() -> Value {
    json!({
        "caSyncer": {"enabled": true, "config": example("ca-syncer")},
        "dnsRewriter": {"enabled": true, "config": example("dns-rewriter")},
        "kubeconfigRotator": {"enabled": true, "config": example("kubeconfig-rotator")},
        "etcdSnapshotter": {"enabled": true, "config": example("etcd-snapshotter"),
                            "s3Credentials": {"existingSecret": "etcd-backup-s3"},
                            "ageIdentity": {"existingSecret": "etcd-backup-age"}},
        "monitoring": {
            "serviceMonitor": {"enabled": true, "force": true},
            "prometheusRule": {"enabled": true, "force": true},
        },
    })
}

const AGENTS: [&str; 4] = ["ca-syncer", "dns-rewriter", "kubeconfig-rotator", "etcd-snapshotter"];

fn kinds(objects: &[Value]) -> Vec<(String, String, String)> {
    let mut k: Vec<_> = objects.iter().map(key).collect();
    k.sort();
    k
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

#[test]
fn helm_lint_strict_passes_with_default_values_and_with_every_agent_on() -> Result<()> {
    let home = tempfile::tempdir()?;
    let chart = chart::chart_dir();
    let values = home.path().join("all.yaml");
    std::fs::write(&values, serde_yaml::to_string(&all_agents())?)?;
    for extra in [vec![], vec!["--values", values.to_str().unwrap()]] {
        let mut args = vec!["lint", "--strict", "--kube-version", chart::KUBE_VERSION, chart.to_str().unwrap()];
        args.extend(&extra);
        let out = run(helm(&args, home.path())?)?;
        assert!(out.success, "helm lint --strict {extra:?} failed:\n{}{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("1 chart(s) linted, 0 chart(s) failed"), "{}", out.stdout);
    }
    Ok(())
}

#[test]
fn default_values_run_dns_rewriter_with_two_replicas_a_pdb_and_no_monitoring_objects() -> Result<()> {
    let objects = documents(&template(&json!({}), &[])?)?;
    let names: Vec<_> = kinds(&objects).into_iter().map(|(k, ns, n)| format!("{k} {ns}/{n}")).collect();
    for expected in [
        "ServiceAccount kcp-keeper/kcp-keeper-dns-rewriter",
        "ConfigMap kcp-keeper/kcp-keeper-dns-rewriter",
        "Deployment kcp-keeper/kcp-keeper-dns-rewriter",
        "PodDisruptionBudget kcp-keeper/kcp-keeper-dns-rewriter",
        "Service kcp-keeper/kcp-keeper-dns-rewriter",
        "Role kube-system/kcp-keeper-dns-rewriter",
    ] {
        assert!(names.iter().any(|n| n == expected), "missing {expected} in {names:#?}");
    }
    assert!(!names.iter().any(|n| n.contains("ca-syncer")), "ca-syncer is off by default: {names:#?}");
    assert!(!names.iter().any(|n| n.starts_with("ServiceMonitor") || n.starts_with("PrometheusRule")));
    let deployment = find(&objects, "Deployment", "kcp-keeper-dns-rewriter").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2);
    Ok(())
}

#[test]
fn every_agent_pod_is_non_root_read_only_without_capabilities_or_privilege_escalation() -> Result<()> {
    let objects = documents(&template(&all_agents(), &[])?)?;
    let deployments: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "Deployment").collect();
    assert_eq!(deployments.len(), 4, "{AGENTS:?}");
    for d in deployments {
        let pod = &d["spec"]["template"]["spec"];
        let name = &d["metadata"]["name"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        assert_eq!(pod["serviceAccountName"], *name, "one ServiceAccount per agent");
        for c in pod["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{name}");
            assert!(sc["capabilities"].get("add").is_none(), "{name}");
            // The default tag is the chart's appVersion: chart and agents move in lockstep.
            let agent = name.as_str().unwrap().trim_start_matches("kcp-keeper-");
            assert_eq!(c["image"], format!("ghcr.io/kcp-keeper/{agent}:{}", env!("CARGO_PKG_VERSION")), "{name}");
        }
    }
    Ok(())
}

#[test]
fn a_misspelled_key_anywhere_in_the_values_fails_the_render_and_names_the_key() {
    let cases = [
        (json!({"replica": 2}), "replica"),
        (json!({"dnsRewriter": {"confg": {}}}), "confg"),
        (json!({"monitoring": {"serviceMonitor": {"enable": true}}}), "enable"),
        (
            json!({"caSyncer": {"enabled": true, "config": {"bundles": [{"name": "b", "sorces": [], "targets": []}]}}}),
            "sorces",
        ),
        (
            json!({"dnsRewriter": {"config": {"mode": "k3s", "discovery": {"namespace": "kcp-system", "frontProxy": true}}}}),
            "frontProxy",
        ),
        (
            json!({"kubeconfigRotator": {"enabled": true, "config": {"kubeconfigs": [{"name": "a", "source": {}, "target": []}]}}}),
            "target",
        ),
        (json!({"etcdSnapshotter": {"s3Credential": {}}}), "s3Credential"),
        (json!({"etcdSnapshotter": {"config": {"retention": {"keepLsat": 3}}}}), "keepLsat"),
        (json!({"etcdSnapshotter": {"image": {"repo": "x"}}}), "repo"),
        (json!({"etcdSnapshotter": {"config": {"drills": {"identityFlie": "/x"}}}}), "identityFlie"),
    ];
    for (values, misspelled) in cases {
        let err = template(&values, &[]).expect_err(&format!("{values} must fail"));
        let msg = format!("{err:#}");
        assert!(msg.contains(&format!("'{misspelled}' not allowed")), "{values}: {msg}");
    }
    // A correctly spelled neighbour of each renders (the failures above are about the spelling alone).
    template(&json!({"replicas": 2, "monitoring": {"serviceMonitor": {"enabled": true}}}), &[]).expect("renders");
}

#[test]
fn every_agent_renders_with_two_replicas_a_pdb_its_own_service_account_configmap_and_service() -> Result<()> {
    let objects = documents(&template(&all_agents(), &[])?)?;
    for agent in AGENTS {
        let name = format!("kcp-keeper-{agent}");
        for kind in ["ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"] {
            assert!(find(&objects, kind, &name).is_some(), "{kind} {name}");
        }
        assert_eq!(find(&objects, "Deployment", &name).unwrap()["spec"]["replicas"], 2, "{name}");
    }
    // The chart holds no Secret: S3 keys and the age identity come from Secrets the values only name.
    assert!(!objects.iter().any(|o| o["kind"] == "Secret"), "the chart rendered a Secret");
    Ok(())
}

#[test]
fn images_are_registry_slash_agent_with_the_global_tag_unless_the_agent_names_its_own() -> Result<()> {
    let mut values = all_agents();
    values["image"] = json!({"tag": "1.2.3"});
    values["kubeconfigRotator"]["image"] = json!({"repository": "registry.example.com/rotator", "tag": "dev"});
    let objects = documents(&template(&values, &[])?)?;
    let image = |name: &str| {
        find(&objects, "Deployment", name).unwrap()["spec"]["template"]["spec"]["containers"][0]["image"].clone()
    };
    assert_eq!(image("kcp-keeper-ca-syncer"), "ghcr.io/kcp-keeper/ca-syncer:1.2.3");
    assert_eq!(image("kcp-keeper-kubeconfig-rotator"), "registry.example.com/rotator:dev");
    Ok(())
}

fn snapshotter_pod(values: &Value) -> Result<Value> {
    let objects = documents(&template(values, &[])?)?;
    Ok(find(&objects, "Deployment", "kcp-keeper-etcd-snapshotter").expect("the snapshotter")["spec"]["template"]["spec"]
        .clone())
}

fn names(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn the_snapshotter_mounts_the_named_s3_secret_and_the_age_identity_only_when_configured() -> Result<()> {
    // Without an identity: no Secret named and no identity file in the drills section.
    let mut values = all_agents();
    values["etcdSnapshotter"]["ageIdentity"] = json!({"existingSecret": ""});
    values["etcdSnapshotter"]["config"]["drills"].as_object_mut().unwrap().remove("identityFile");
    let pod = snapshotter_pod(&values)?;
    let container = &pod["containers"][0];
    assert!(!names(&pod["volumes"]).contains(&"age-identity".to_string()), "no identity configured, none mounted");
    let s3 = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "s3-credentials").expect("s3 volume");
    assert_eq!(s3["secret"]["secretName"], "etcd-backup-s3");
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mounted = |name: &str| mounts.iter().find(|m| m["name"] == name).map(|m| m["mountPath"].clone());
    assert_eq!(mounted("s3-credentials"), Some(json!("/var/run/secrets/etcd-snapshotter/s3")));
    assert_eq!(mounted("spill"), Some(json!("/var/lib/etcd-snapshotter")), "the spill directory is an emptyDir");
    let env = &container["env"];
    assert!(names(env).contains(&"AWS_EC2_METADATA_DISABLED".to_string()), "no metadata probe");
    assert!(!names(env).contains(&"AWS_SECRET_ACCESS_KEY".to_string()), "keys come from the mounted files");

    let mut with_age = values.clone();
    with_age["etcdSnapshotter"]["ageIdentity"] = json!({"existingSecret": "etcd-backup-age", "key": "key.txt"});
    with_age["etcdSnapshotter"]["config"]["drills"] =
        json!({"identityFile": "/var/run/secrets/etcd-snapshotter/age/identity.txt"});
    with_age["etcdSnapshotter"]["config"]["shards"][0]["drill"] = json!({"schedule": {"cron": "30 4 * * *"}});
    let pod = snapshotter_pod(&with_age)?;
    let age = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "age-identity").expect("age volume");
    assert_eq!(age["secret"]["secretName"], "etcd-backup-age");
    assert_eq!(age["secret"]["items"], json!([{"key": "key.txt", "path": "identity.txt"}]));
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        mounts.iter().any(|m| m["name"] == "age-identity" && m["mountPath"] == "/var/run/secrets/etcd-snapshotter/age")
    );

    let mut with_key = values.clone();
    with_key["etcdSnapshotter"]["deltaSigningKey"] = json!({"existingSecret": "etcd-backup-delta-key"});
    with_key["etcdSnapshotter"]["config"]["deltaSigningKeyFile"] =
        json!("/var/run/secrets/etcd-snapshotter/delta-key/key");
    let pod = snapshotter_pod(&with_key)?;
    let key = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "delta-signing-key").expect("key volume");
    assert_eq!(key["secret"]["secretName"], "etcd-backup-delta-key");
    assert_eq!(key["secret"]["items"], json!([{"key": "key", "path": "key"}]));
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["name"] == "delta-signing-key"
        && m["mountPath"] == "/var/run/secrets/etcd-snapshotter/delta-key"
        && m["readOnly"] == true));

    // Environment credentials: the keys come from the same named Secret, as references.
    let mut env_creds = values.clone();
    env_creds["etcdSnapshotter"]["config"]["storage"]["credentials"] = json!({"environment": {}});
    let pod = snapshotter_pod(&env_creds)?;
    let env = pod["containers"][0]["env"].as_array().unwrap();
    let key = env.iter().find(|e| e["name"] == "AWS_SECRET_ACCESS_KEY").expect("the key from the Secret");
    assert_eq!(key["valueFrom"]["secretKeyRef"], json!({"name": "etcd-backup-s3", "key": "AWS_SECRET_ACCESS_KEY"}));
    assert!(!names(&pod["volumes"]).contains(&"s3-credentials".to_string()));

    // Web identity needs no Secret: the projected token comes through extraVolumes, and no keys are mounted.
    let mut web = values.clone();
    web["etcdSnapshotter"]["s3Credentials"] = json!({"existingSecret": ""});
    web["etcdSnapshotter"]["config"]["storage"]["credentials"] =
        json!({"webIdentity": {"roleArn": "arn:aws:iam::1:role/backup", "tokenFile": "/var/run/secrets/sts/token"}});
    web["etcdSnapshotter"]["extraVolumes"] = json!([{"name": "sts", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "audience": "backup-sts"}}]}}]);
    web["etcdSnapshotter"]["extraVolumeMounts"] = json!([{"name": "sts", "mountPath": "/var/run/secrets/sts"}]);
    let pod = snapshotter_pod(&web)?;
    assert_eq!(names(&pod["volumes"]), ["config", "tmp", "spill", "drills", "sts"]);
    // Drills get an emptyDir of their own (drillsSizeLimit), at the drills directory, apart from the spill volume.
    let drills = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "drills").unwrap();
    assert_eq!(drills["emptyDir"]["sizeLimit"], "4Gi", "{drills}");
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let at = |name: &str| mounts.iter().find(|m| m["name"] == name).map(|m| m["mountPath"].clone()).unwrap();
    assert_ne!(at("drills"), at("spill"), "{mounts:?}");
    assert!(!names(&pod["containers"][0]["env"]).contains(&"AWS_ACCESS_KEY_ID".to_string()));
    Ok(())
}

#[test]
fn snapshotter_credentials_the_pod_could_not_read_fail_the_render_naming_the_value() {
    let mut no_secret = all_agents();
    no_secret["etcdSnapshotter"]["s3Credentials"] = json!({"existingSecret": ""});
    let err = format!("{:#}", template(&no_secret, &[]).expect_err("no Secret named"));
    assert!(err.contains("etcdSnapshotter.s3Credentials.existingSecret: name the Secret"), "{err}");

    let mut elsewhere = all_agents();
    elsewhere["etcdSnapshotter"]["config"]["storage"]["credentials"] = json!({"secretDirectory": "/s3"});
    let err = format!("{:#}", template(&elsewhere, &[]).expect_err("another directory"));
    assert!(err.contains("secretDirectory: must be /var/run/secrets/etcd-snapshotter/s3"), "{err}");

    let mut elsewhere = all_agents();
    elsewhere["etcdSnapshotter"]["ageIdentity"] = json!({"existingSecret": "age"});
    elsewhere["etcdSnapshotter"]["config"]["drills"] = json!({"identityFile": "/keys/age.txt"});
    let err = format!("{:#}", template(&elsewhere, &[]).expect_err("identity elsewhere"));
    assert!(err.contains("drills.identityFile: must be /var/run/secrets/etcd-snapshotter/age/identity.txt"), "{err}");

    let mut unmounted = all_agents();
    unmounted["etcdSnapshotter"]["ageIdentity"] = json!({"existingSecret": ""});
    unmounted["etcdSnapshotter"]["config"]["drills"] =
        json!({"identityFile": "/var/run/secrets/etcd-snapshotter/age/identity.txt"});
    let err = format!("{:#}", template(&unmounted, &[]).expect_err("identity without its Secret"));
    assert!(err.contains("etcdSnapshotter.ageIdentity.existingSecret: name the Secret"), "{err}");

    let mut elsewhere = all_agents();
    elsewhere["etcdSnapshotter"]["deltaSigningKey"] = json!({"existingSecret": "delta-key"});
    elsewhere["etcdSnapshotter"]["config"]["deltaSigningKeyFile"] = json!("/keys/delta");
    let err = format!("{:#}", template(&elsewhere, &[]).expect_err("key elsewhere"));
    assert!(err.contains("deltaSigningKeyFile: must be /var/run/secrets/etcd-snapshotter/delta-key/key"), "{err}");

    let mut unmounted = all_agents();
    unmounted["etcdSnapshotter"]["config"]["deltaSigningKeyFile"] =
        json!("/var/run/secrets/etcd-snapshotter/delta-key/key");
    let err = format!("{:#}", template(&unmounted, &[]).expect_err("key without its Secret"));
    assert!(err.contains("etcdSnapshotter.deltaSigningKey.existingSecret: name the Secret"), "{err}");

    let mut no_spill = all_agents();
    no_spill["etcdSnapshotter"]["config"]["spill"] = json!(null);
    let err = format!("{:#}", template(&no_spill, &[]).expect_err("no spill directory"));
    assert!(err.contains("spill"), "{err}");
}

#[test]
fn one_replica_renders_no_disruption_budget() -> Result<()> {
    let objects = documents(&template(&json!({"replicas": 1}), &[])?)?;
    assert!(find(&objects, "Deployment", "kcp-keeper-dns-rewriter").is_some());
    assert!(find(&objects, "PodDisruptionBudget", "kcp-keeper-dns-rewriter").is_none());
    let objects = documents(&template(&json!({"replicas": 1, "dnsRewriter": {"replicas": 3}}), &[])?)?;
    assert_eq!(find(&objects, "Deployment", "kcp-keeper-dns-rewriter").unwrap()["spec"]["replicas"], 3);
    assert!(find(&objects, "PodDisruptionBudget", "kcp-keeper-dns-rewriter").is_some());
    Ok(())
}

#[test]
fn monitoring_objects_render_only_where_the_api_exists_or_when_forced() -> Result<()> {
    let on = json!({"monitoring": {"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}}});
    let has = |objects: &[Value], kind: &str| objects.iter().any(|o| o["kind"] == kind);
    let without_api = documents(&template(&on, &[])?)?;
    assert!(!has(&without_api, "ServiceMonitor") && !has(&without_api, "PrometheusRule"));
    let with_api = documents(&template(&on, &["--api-versions", "monitoring.coreos.com/v1"])?)?;
    assert!(has(&with_api, "ServiceMonitor") && has(&with_api, "PrometheusRule"));
    let forced = documents(&template(&all_agents(), &[])?)?;
    assert!(has(&forced, "ServiceMonitor") && has(&forced, "PrometheusRule"));
    Ok(())
}

#[test]
fn the_prometheus_rule_carries_every_alert_of_the_enabled_agents_with_the_configured_runbook_base() -> Result<()> {
    let mut values = all_agents();
    values["monitoring"]["prometheusRule"]["runbookBaseURL"] = json!("https://docs.example.org/runbooks.md");
    let objects = documents(&template(&values, &[])?)?;
    let rule = find(&objects, "PrometheusRule", "kcp-keeper").expect("PrometheusRule");
    let alerts: Vec<&Value> =
        rule["spec"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    let mut in_files = Vec::new();
    // The chart adds them in the order of the agents' values keys.
    for file in ["common", "ca-syncer", "dns-rewriter", "etcd-snapshotter", "kubeconfig-rotator"] {
        let text = std::fs::read_to_string(chart::chart_dir().join(format!("rules/{file}.rules.yaml")))?;
        for group in serde_yaml::from_str::<Value>(&text)?["groups"].as_array().unwrap() {
            in_files.extend(group["rules"].as_array().unwrap().iter().map(|r| r["alert"].clone()));
        }
    }
    let rendered: Vec<Value> = alerts.iter().map(|a| a["alert"].clone()).collect();
    assert_eq!(rendered, in_files);
    for a in &alerts {
        let url = a["annotations"]["runbook_url"].as_str().unwrap();
        assert!(url.starts_with("https://docs.example.org/runbooks.md#"), "{url}");
    }
    // With only dns-rewriter on, ca-syncer's alerts stay out.
    values["caSyncer"]["enabled"] = json!(false);
    let objects = documents(&template(&values, &[])?)?;
    let text = serde_json::to_string(find(&objects, "PrometheusRule", "kcp-keeper").unwrap())?;
    assert!(!text.contains("KcpKeeperCABundle") && text.contains("KcpKeeperDNSHostWrongAddress"));
    Ok(())
}

/// `KcpKeeperAgentDown` also fires when an agent's job has no `up` series at all (`absent`), which can only
/// name the labels it selects on: the release's namespace is written into each enabled agent's selector.
#[test]
fn the_agent_down_alerts_absent_selectors_name_each_enabled_agent_in_the_release_namespace() -> Result<()> {
    let objects = documents(&template(&all_agents(), &["--namespace", "platform-ops"])?)?;
    let rule = find(&objects, "PrometheusRule", "kcp-keeper").expect("PrometheusRule");
    let absent: Vec<&str> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r["alert"] == "KcpKeeperAgentDown")
        .filter_map(|r| r["expr"].as_str().filter(|e| e.starts_with("absent(")))
        .collect();
    let expected: Vec<String> = ["ca-syncer", "dns-rewriter", "etcd-snapshotter", "kubeconfig-rotator"]
        .iter()
        .map(|a| format!("absent(up{{job=\"kcp-keeper-{a}\",namespace=\"platform-ops\"}})"))
        .collect();
    assert_eq!(absent, expected);
    Ok(())
}

#[test]
fn the_dashboard_renders_when_enabled_and_charts_only_metrics_the_alerts_read() -> Result<()> {
    let objects = documents(&template(&json!({}), &[])?)?;
    assert!(find(&objects, "ConfigMap", "kcp-keeper-dashboard").is_none(), "off by default");
    let objects = documents(&template(&json!({"grafana": {"dashboard": {"enabled": true}}}), &[])?)?;
    let cm = find(&objects, "ConfigMap", "kcp-keeper-dashboard").expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(cm["data"]["kcp-keeper.json"].as_str().unwrap())?;
    // The alerts' metrics are proven present in the agents' real /metrics (their tests/chart.rs), so a panel
    // on one of them is never empty for want of a metric.
    let mut alerting = std::collections::BTreeSet::new();
    let prefixes = ["ca_syncer_", "dns_rewriter_", "kubeconfig_rotator_", "etcd_snapshotter_"];
    for prefix in prefixes {
        let files = [
            "common.rules.yaml",
            "ca-syncer.rules.yaml",
            "dns-rewriter.rules.yaml",
            "kubeconfig-rotator.rules.yaml",
            "etcd-snapshotter.rules.yaml",
        ];
        alerting.extend(testbed::alert_rules::metric_names(&files, prefix)?);
    }
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 14, "a panel per alerting metric of every agent");
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for name in testbed::alert_rules::names_in(expr) {
                if prefixes.iter().any(|p| name.starts_with(p)) {
                    assert!(alerting.contains(&name), "panel {}: {name} is not read by any alert", panel["title"]);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn k3s_mode_creates_the_empty_coredns_custom_configmap_dns_rewriter_may_not_create_and_keeps_it() -> Result<()> {
    let objects = documents(&template(&json!({}), &[])?)?;
    let created = find(&objects, "ConfigMap", "coredns-custom").expect("coredns-custom is rendered in k3s mode");
    assert_eq!(created["metadata"]["namespace"], "kube-system");
    assert_eq!(created["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    assert!(created.get("data").is_none(), "the chart must never own the agent's data: {created}");

    let off = documents(&template(&json!({"dnsRewriter": {"createCorednsCustom": false}}), &[])?)?;
    assert!(find(&off, "ConfigMap", "coredns-custom").is_none(), "createCorednsCustom: false still rendered it");
    let corefile = json!({"dnsRewriter": {"config": {"mode": "corefile"}}});
    let corefile = documents(&template(&corefile, &[])?)?;
    assert!(
        corefile.iter().all(|o| !(o["kind"] == "ConfigMap" && o["metadata"]["namespace"] == "kube-system")),
        "corefile mode edits the existing Corefile ConfigMap and must not render one"
    );
    Ok(())
}

fn policies(objects: &[Value]) -> Vec<&Value> {
    objects.iter().filter(|o| o["kind"] == "NetworkPolicy").collect()
}

/// An egress rule as `(ports as "port/protocol", to)`, so a test compares what a rule allows, not its layout.
fn egress(policy: &Value) -> Vec<(Vec<String>, Value)> {
    let rules = policy["spec"]["egress"].as_array().expect("egress rules");
    rules
        .iter()
        .map(|r| {
            let ports = r["ports"].as_array().expect("every rule names its ports");
            let ports = ports.iter().map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap())).collect();
            (ports, r.get("to").cloned().unwrap_or(Value::Null))
        })
        .collect()
}

fn tcp(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("{p}/TCP")).collect()
}

/// The default cluster DNS peers (kube-dns's pods in kube-system, node-local-dns's link-local address) and its
/// ports.
fn dns_rule() -> (Vec<String>, Value) {
    (
        vec!["53/UDP".into(), "53/TCP".into()],
        json!([{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }, {"ipBlock": {"cidr": "169.254.20.10/32"}}]),
    )
}

/// The kcp namespace as a peer.
fn kcp_ns() -> Value {
    json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kcp-system"}}}])
}

/// `networkPolicy` on, with a peer named for every rule of [`all_agents`] and the doctor that needs one (the render
/// fails without), and `extra`'s keys over them.
fn policy_values(extra: Value) -> Value {
    let mut np = json!({
        "enabled": true,
        "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]},
        "caSyncer": {"kcp": {"to": kcp_ns()}},
        "kubeconfigRotator": {"kcp": {"to": kcp_ns()}},
        "etcdSnapshotter": {"etcd": {"to": [{"podSelector": {"matchLabels": {"app": "etcd"}}}]},
                            "s3": {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}},
        "doctor": {"kcp": {"to": kcp_ns()}},
    });
    for (k, v) in extra.as_object().unwrap() {
        np[k] = v.clone();
    }
    np
}

#[test]
fn network_policies_are_off_by_default_one_per_enabled_agent_when_on_and_switchable_per_agent() -> Result<()> {
    assert!(policies(&documents(&template(&all_agents(), &[])?)?).is_empty(), "off by default");
    let mut values = all_agents();
    values["networkPolicy"] = policy_values(json!({}));
    let objects = documents(&template(&values, &[])?)?;
    let names: Vec<_> = policies(&objects).iter().map(|p| p["metadata"]["name"].as_str().unwrap()).collect();
    let mut expected: Vec<String> = AGENTS.iter().map(|a| format!("kcp-keeper-{a}")).collect();
    expected.sort();
    assert_eq!(names, expected);
    // Each selects exactly its agent's pods (the Deployment's own selector), and both directions are governed.
    for policy in policies(&objects) {
        let name = policy["metadata"]["name"].as_str().unwrap();
        let deployment = find(&objects, "Deployment", name).unwrap();
        assert_eq!(policy["spec"]["podSelector"], deployment["spec"]["selector"], "{name}");
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]), "{name}");
    }
    // An agent's own switch wins both ways; a disabled agent gets none.
    values["networkPolicy"]["etcdSnapshotter"] = json!({"enabled": false});
    values["caSyncer"]["enabled"] = json!(false);
    let objects = documents(&template(&values, &[])?)?;
    let names: Vec<_> = policies(&objects).iter().map(|p| p["metadata"]["name"].clone()).collect();
    assert_eq!(names, [json!("kcp-keeper-dns-rewriter"), json!("kcp-keeper-kubeconfig-rotator")]);
    let only = json!({"networkPolicy": {"apiServer": values["networkPolicy"]["apiServer"],
                                        "kubeconfigRotator": {"enabled": true, "kcp": {"to": kcp_ns()}}},
                      "kubeconfigRotator": values["kubeconfigRotator"]});
    let objects = documents(&template(&only, &[])?)?;
    let names: Vec<_> = policies(&objects).iter().map(|p| p["metadata"]["name"].clone()).collect();
    assert_eq!(names, [json!("kcp-keeper-kubeconfig-rotator")]);
    Ok(())
}

#[test]
fn a_network_policy_admits_only_the_configured_scrapers_to_the_admin_port_and_nothing_when_none_is_configured()
-> Result<()> {
    let mut values = all_agents();
    values["networkPolicy"] = policy_values(json!({}));
    let objects = documents(&template(&values, &[])?)?;
    for policy in policies(&objects) {
        assert_eq!(policy["spec"]["ingress"], json!([]), "no scraper configured: no ingress at all");
    }
    let monitoring = json!({"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}});
    let prometheus = json!({"matchLabels": {"app.kubernetes.io/name": "prometheus"}});
    values["adminPort"] = json!(9102);
    for (metrics, from) in [
        // Both: those pods in those namespaces (one peer, so both must match).
        (
            json!({"namespaceSelector": monitoring, "podSelector": prometheus}),
            json!([{"namespaceSelector": monitoring, "podSelector": prometheus}]),
        ),
        // Namespaces alone: any pod there.
        (json!({"namespaceSelector": monitoring}), json!([{"namespaceSelector": monitoring}])),
        // Pods alone: in the release namespace.
        (json!({"podSelector": prometheus}), json!([{"podSelector": prometheus}])),
    ] {
        values["networkPolicy"]["metrics"] = metrics.clone();
        let objects = documents(&template(&values, &[])?)?;
        for policy in policies(&objects) {
            let expected = json!([{"ports": [{"port": 9102, "protocol": "TCP"}], "from": from}]);
            assert_eq!(policy["spec"]["ingress"], expected, "{metrics}");
        }
    }
    Ok(())
}

#[test]
fn network_policy_egress_is_the_apiserver_dns_and_the_peers_on_the_ports_each_agents_configuration_names() -> Result<()>
{
    let etcd_pods = json!([{"podSelector": {"matchLabels": {"app": "etcd"}}}]);
    let s3_block = json!([{"ipBlock": {"cidr": "192.0.2.0/24"}}]);
    let kcp_pods = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kcp-system"}}}]);
    let apiserver = json!([{"ipBlock": {"cidr": "10.0.0.10/32"}}]);
    let mut values = all_agents();
    values["networkPolicy"] = json!({
        "enabled": true,
        "apiServer": {"to": apiserver, "ports": [6443]},
        "caSyncer": {"kcp": {"to": kcp_pods}},
        "kubeconfigRotator": {"kcp": {"to": kcp_pods, "ports": [8443, 6443]}},
        "etcdSnapshotter": {"etcd": {"to": etcd_pods, "ports": [2379]}, "s3": {"to": s3_block}},
    });
    let objects = documents(&template(&values, &[])?)?;
    let policy = |agent: &str| egress(find(&objects, "NetworkPolicy", &format!("kcp-keeper-{agent}")).unwrap());
    let api = (tcp(&[6443]), apiserver.clone());

    // ca-syncer: its liveCheck endpoints' ports (6443 written, 443 for https:// without one).
    assert_eq!(policy("ca-syncer"), [api.clone(), dns_rule(), (tcp(&[6443, 443]), kcp_pods.clone())]);
    // dns-rewriter: apiserver and DNS, and its verify.resolver's own address and port.
    let resolver = (vec!["53/UDP".into(), "53/TCP".into()], json!([{"ipBlock": {"cidr": "10.43.0.10/32"}}]));
    assert_eq!(policy("dns-rewriter"), [api.clone(), dns_rule(), resolver]);
    // kubeconfig-rotator: its server's port, and the extra ones (6443 once).
    assert_eq!(policy("kubeconfig-rotator"), [api.clone(), dns_rule(), (tcp(&[6443, 8443]), kcp_pods.clone())]);
    // etcd-snapshotter: every shard's endpoint ports (2379 once) to the etcd pods; S3's endpoint port to S3.
    assert_eq!(
        policy("etcd-snapshotter"),
        [api.clone(), dns_rule(), (tcp(&[2379, 22379, 32379, 42379]), etcd_pods), (tcp(&[7070]), s3_block.clone())]
    );

    // AWS (no endpoint) is 443, and webIdentity's STS is 443 too; an IPv6 resolver with its port is one /128.
    values["etcdSnapshotter"]["config"]["storage"].as_object_mut().unwrap().remove("endpoint");
    values["dnsRewriter"]["config"]["verify"]["resolver"] = json!("[fd00::10]:5353");
    let collector = json!([{"ipBlock": {"cidr": "198.51.100.7/32"}}]);
    values["networkPolicy"]["extraEgress"] = json!([{"to": collector, "ports": [{"port": 4317, "protocol": "TCP"}]}]);
    let objects = documents(&template(&values, &[])?)?;
    let policy = |agent: &str| egress(find(&objects, "NetworkPolicy", &format!("kcp-keeper-{agent}")).unwrap());
    let extra = (tcp(&[4317]), collector);
    let s3 = policy("etcd-snapshotter");
    assert_eq!(s3[3], (tcp(&[443]), s3_block), "{s3:?}");
    assert_eq!(s3[4], extra, "extraEgress goes to every agent");
    let dns = policy("dns-rewriter");
    assert_eq!(dns[2], (vec!["5353/UDP".into(), "5353/TCP".into()], json!([{"ipBlock": {"cidr": "fd00::10/128"}}])));
    assert_eq!(dns[3], extra);
    // A bare IPv4 resolver is port 53.
    values["dnsRewriter"]["config"]["verify"]["resolver"] = json!("10.43.0.10");
    let objects = documents(&template(&values, &[])?)?;
    let dns = egress(find(&objects, "NetworkPolicy", "kcp-keeper-dns-rewriter").unwrap());
    assert_eq!(dns[2], (vec!["53/UDP".into(), "53/TCP".into()], json!([{"ipBlock": {"cidr": "10.43.0.10/32"}}])));
    // Without a resolver, dns-rewriter asks the cluster DNS, which the DNS rule already allows.
    values["dnsRewriter"]["config"]["verify"].as_object_mut().unwrap().remove("resolver");
    let objects = documents(&template(&values, &[])?)?;
    let dns = egress(find(&objects, "NetworkPolicy", "kcp-keeper-dns-rewriter").unwrap());
    assert_eq!(dns, [api, dns_rule(), extra]);
    Ok(())
}

/// The doctor on, with the seed's names and every reference set (issue 29).
fn doctor_on() -> Value {
    json!({"doctor": {
        "enabled": true,
        "interval": 60,
        "kcp": {"namespace": "kcp-system", "rootShards": ["root"], "shards": ["alpha"], "frontProxies": ["frontproxy"]},
        "hubOidc": {"namespace": "railgrid-system", "name": "railgrid-hub"},
        "caConfigMaps": [{"namespace": "kcp-system", "name": "root-ca-bundle"}, {"namespace": "kcp-system", "name": "front-ca", "key": "tls.crt"}],
        "verify": {"nodeLocalDns": ["169.254.20.10"], "serverCA": {"namespace": "kcp-system", "name": "kcp-server-ca"}},
    }})
}

fn env_of(container: &Value) -> std::collections::BTreeMap<String, String> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect()
}

#[test]
fn the_doctor_is_off_by_default_and_when_on_runs_one_restricted_pod_of_the_kcp_keeper_image_serving_its_checks()
-> Result<()> {
    let off = documents(&template(&json!({}), &[])?)?;
    assert!(!off.iter().any(|o| o["metadata"]["name"] == "kcp-keeper-doctor"), "the doctor is off by default");

    let objects = documents(&template(&doctor_on(), &[])?)?;
    for kind in ["ServiceAccount", "Deployment", "Service"] {
        assert!(find(&objects, kind, "kcp-keeper-doctor").is_some(), "{kind} kcp-keeper-doctor");
    }
    assert!(find(&objects, "PodDisruptionBudget", "kcp-keeper-doctor").is_none(), "one replica, no budget");
    let d = find(&objects, "Deployment", "kcp-keeper-doctor").unwrap();
    assert_eq!(d["spec"]["replicas"], 1, "it only reads: a second replica would report every line twice");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "kcp-keeper-doctor");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["image"], format!("ghcr.io/kcp-keeper/kcp-keeper:{}", env!("CARGO_PKG_VERSION")), "lockstep tag");
    assert_eq!(c["args"], json!(["doctor"]));
    assert_eq!(c["ports"][0]["name"], "admin");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let env = env_of(c);
    let want = [
        ("KCP_KEEPER_DOCTOR_SERVE", "0.0.0.0:9090"),
        ("KCP_KEEPER_DOCTOR_INTERVAL", "60"),
        ("KCP_KEEPER_DOCTOR_NAMESPACE", "kcp-system"),
        ("KCP_KEEPER_DOCTOR_HUB_OIDC", "configmap:railgrid-system/railgrid-hub:oidc.yaml"),
        ("KCP_KEEPER_DOCTOR_CAS", "configmap:kcp-system/root-ca-bundle:ca.crt,configmap:kcp-system/front-ca:tls.crt"),
        ("KCP_KEEPER_DOCTOR_SERVER_CA", "configmap:kcp-system/kcp-server-ca:ca.crt"),
        ("KCP_KEEPER_DOCTOR_NODE_LOCAL_DNS", "169.254.20.10"),
        // The in-cluster doctor reads no Secret: a flag naming one is refused, a check needing one not checked.
        ("KCP_KEEPER_DOCTOR_NO_SECRETS", "true"),
    ];
    for (name, value) in want {
        assert_eq!(env.get(name).map(String::as_str), Some(value), "{name} in {env:#?}");
    }
    for flag in ["HUB_KUBECONFIG", "KCP_KUBECONFIG", "ENDPOINT_CA", "ROTATOR_METRICS", "CA_SYNCER_METRICS"] {
        assert!(!env.contains_key(&format!("KCP_KEEPER_DOCTOR_{flag}")), "{flag}: {env:#?}");
    }
    assert!(!env.contains_key("KCP_KEEPER_DOCTOR_NO_VERIFY"), "the Verify checks run by default");
    assert!(!env.contains_key("KCP_KEEPER_DOCTOR_SNAPSHOTTER_METRICS"), "no snapshotter in this release");
    assert_eq!(
        env.get("KCP_KEEPER_DOCTOR_REWRITER_METRICS").map(String::as_str),
        Some("http://kcp-keeper-dns-rewriter-replicas.kcp-keeper.svc:9090/metrics"),
        "dns-rewriter is on by default"
    );
    let svc = find(&objects, "Service", "kcp-keeper-doctor").unwrap();
    assert_eq!(svc["spec"]["ports"][0]["name"], "admin");
    assert_eq!(svc["spec"]["selector"]["app.kubernetes.io/name"], "doctor");

    // With the release's etcd-snapshotter on, the doctor reads its metrics through every replica's address.
    let mut values = all_agents();
    values["doctor"] = doctor_on()["doctor"].clone();
    let objects = documents(&template(&values, &[])?)?;
    let c = &find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["template"]["spec"]["containers"][0];
    let env = env_of(c);
    for (flag, agent) in [
        ("SNAPSHOTTER_METRICS", "etcd-snapshotter"),
        ("ROTATOR_METRICS", "kubeconfig-rotator"),
        ("CA_SYNCER_METRICS", "ca-syncer"),
    ] {
        assert_eq!(
            env.get(&format!("KCP_KEEPER_DOCTOR_{flag}")).map(String::as_str),
            Some(format!("http://kcp-keeper-{agent}-replicas.kcp-keeper.svc:9090/metrics").as_str())
        );
    }
    Ok(())
}

/// Only the Lease holder snapshots, drills and verifies, so a ClusterIP Service would hand the doctor a follower
/// about half the time (the chart's default is two replicas): the doctor gets a headless Service per agent it
/// reads, which the ServiceMonitor does not select (no pod scraped twice), and those agents' NetworkPolicies
/// admit the doctor's pod.
#[test]
fn the_doctor_reads_every_replica_through_headless_services_the_service_monitor_skips_and_network_policies_admit()
-> Result<()> {
    let mut values = all_agents();
    values["doctor"] = doctor_on()["doctor"].clone();
    values["networkPolicy"] =
        policy_values(json!({"metrics": {"podSelector": {"matchLabels": {"app": "prometheus"}}}}));
    let objects = documents(&template(&values, &[])?)?;
    let c = &find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["template"]["spec"]["containers"][0];
    let env = env_of(c);
    assert_eq!(
        env.get("KCP_KEEPER_DOCTOR_REWRITER_METRICS").map(String::as_str),
        Some("http://kcp-keeper-dns-rewriter-replicas.kcp-keeper.svc:9090/metrics")
    );
    let monitored: Vec<String> =
        find(&objects, "ServiceMonitor", "kcp-keeper").unwrap()["spec"]["selector"]["matchExpressions"][0]["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
    for agent in AGENTS {
        let svc = find(&objects, "Service", &format!("kcp-keeper-{agent}-replicas")).unwrap();
        assert_eq!(svc["spec"]["clusterIP"], "None", "{agent}");
        assert_eq!(svc["spec"]["publishNotReadyAddresses"], true, "{agent}: a not-ready leader is read too");
        assert_eq!(
            svc["spec"]["selector"],
            json!({"app.kubernetes.io/name": agent, "app.kubernetes.io/instance": "kcp-keeper"})
        );
        let name = svc["metadata"]["labels"]["app.kubernetes.io/name"].as_str().unwrap_or("");
        assert!(!monitored.iter().any(|m| m == name), "{agent}'s replicas Service is not scraped: {name:?}");
        let policy = find(&objects, "NetworkPolicy", &format!("kcp-keeper-{agent}")).unwrap();
        assert_eq!(
            policy["spec"]["ingress"][0]["from"],
            json!([{"podSelector": {"matchLabels": {"app": "prometheus"}}},
                   {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "doctor", "app.kubernetes.io/instance": "kcp-keeper"}}}]),
            "{agent}"
        );
    }
    // Without the doctor, no replicas Service and no ingress for it.
    values["doctor"] = json!({"enabled": false});
    let objects = documents(&template(&values, &[])?)?;
    assert!(find(&objects, "Service", "kcp-keeper-dns-rewriter-replicas").is_none());
    let policy = find(&objects, "NetworkPolicy", "kcp-keeper-dns-rewriter").unwrap();
    assert_eq!(policy["spec"]["ingress"][0]["from"].as_array().unwrap().len(), 1);
    Ok(())
}

#[test]
fn the_doctor_is_scraped_by_the_service_monitor_and_its_alerts_are_in_the_prometheus_rule_only_when_it_runs()
-> Result<()> {
    let monitoring =
        json!({"serviceMonitor": {"enabled": true, "force": true}, "prometheusRule": {"enabled": true, "force": true}});
    let alerts = |objects: &[Value]| -> Vec<String> {
        find(objects, "PrometheusRule", "kcp-keeper").unwrap()["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter().map(|r| r["alert"].as_str().unwrap().to_string()))
            .collect()
    };
    let selected = |objects: &[Value]| -> Value {
        find(objects, "ServiceMonitor", "kcp-keeper").unwrap()["spec"]["selector"]["matchExpressions"][0]["values"]
            .clone()
    };
    let mut values = doctor_on();
    values["monitoring"] = monitoring.clone();
    let on = documents(&template(&values, &[])?)?;
    assert_eq!(selected(&on), json!(["dns-rewriter", "doctor"]));
    let on_alerts = alerts(&on);
    for alert in ["KcpKeeperDoctorCheckFailing", "KcpKeeperDoctorNotRunning"] {
        assert!(on_alerts.iter().any(|a| a == alert), "{alert} in {on_alerts:?}");
    }
    let off = documents(&template(&json!({"monitoring": monitoring}), &[])?)?;
    assert_eq!(selected(&off), json!(["dns-rewriter"]));
    assert!(!alerts(&off).iter().any(|a| a.starts_with("KcpKeeperDoctor")), "{:?}", alerts(&off));
    Ok(())
}

#[test]
fn the_doctor_with_verify_checks_and_no_root_shard_named_fails_the_render_naming_the_value() -> Result<()> {
    let err = template(&json!({"doctor": {"enabled": true}}), &[]).expect_err("no root shard named");
    assert!(format!("{err:#}").contains("doctor.kcp.rootShards"), "{err:#}");
    let err = template(&json!({"doctor": {"enabled": true, "intervall": 5}}), &[]).expect_err("misspelled");
    assert!(format!("{err:#}").contains("'intervall' not allowed"), "{err:#}");
    // Without the Verify checks no root shard is needed.
    let objects = documents(&template(&json!({"doctor": {"enabled": true, "verify": {"enabled": false}}}), &[])?)?;
    let c = &find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(c).get("KCP_KEEPER_DOCTOR_NO_VERIFY").map(String::as_str), Some("true"));
    Ok(())
}

#[test]
fn the_doctors_lockstep_references_become_its_flags_and_the_operators_default_is_the_seeds() -> Result<()> {
    let container = |values: &Value| -> Result<Value> {
        let objects = documents(&template(values, &[])?)?;
        Ok(find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["template"]["spec"]["containers"][0]
            .clone())
    };
    let mut values = doctor_on();
    let env = env_of(&container(&values)?);
    assert_eq!(env.get("KCP_KEEPER_DOCTOR_OPERATOR_DEPLOYMENT").map(String::as_str), Some("kcp-operator/kcp-operator"));
    assert!(!env.contains_key("KCP_KEEPER_DOCTOR_PROVIDER_DEPLOYMENT"), "no provider named");
    values["doctor"]["provider"] = json!({"namespace": "ops", "name": "infra-provider"});
    let env = env_of(&container(&values)?);
    assert_eq!(env.get("KCP_KEEPER_DOCTOR_PROVIDER_DEPLOYMENT").map(String::as_str), Some("ops/infra-provider"));
    Ok(())
}

/// The values that named Secrets for the doctor (the hub's and a kcp kubeconfig, the endpoint CA, CA Secrets)
/// fail the render naming the value and what replaces it; left empty, as an old values file copied from the
/// defaults has them, they render.
#[test]
fn doctor_values_that_name_secrets_fail_the_render_naming_the_value_and_its_replacement() -> Result<()> {
    let cases = [
        ("hubKubeconfig", json!({"namespace": "railgrid-system", "name": "railgrid-kcp"}), "doctor.rotatorMetrics"),
        ("kcpKubeconfig", json!({"namespace": "kcp-system", "name": "kcp-admin"}), "--kcp-kubeconfig"),
        ("endpointCA", json!({"namespace": "providers", "name": "kcp-public-ca"}), "--endpoint-ca"),
        ("cas", json!([{"namespace": "kcp-system", "name": "root-ca"}]), "doctor.caConfigMaps"),
    ];
    for (key, value, replacement) in cases {
        let mut values = doctor_on();
        values["doctor"][key] = value;
        let err = format!("{:#}", template(&values, &[]).expect_err(key));
        assert!(err.contains(&format!("doctor.{key}: removed")), "{key}: {err}");
        assert!(err.contains("reads no Secret") && err.contains(replacement), "{key}: {err}");
    }
    let mut values = doctor_on();
    values["doctor"]["hubKubeconfig"] = json!({"namespace": "", "name": "", "key": "kubeconfig"});
    values["doctor"]["cas"] = json!([]);
    template(&values, &[])?;
    Ok(())
}

/// The doctor has a NetworkPolicy like the agents': on with `networkPolicy.enabled` (or its own
/// `networkPolicy.doctor.enabled`), selecting its pod, admitting the scrapers to its admin port, and letting out
/// only the apiserver, the cluster DNS, this release's agents' admin ports (their metrics), kcp's Services on
/// `networkPolicy.doctor.kcp` (the Verify requests) and the resolvers the split-horizon check asks.
#[test]
fn the_doctors_network_policy_allows_the_apiserver_dns_the_agents_metrics_kcp_and_the_resolvers_it_asks() -> Result<()>
{
    let mut values = all_agents();
    values["doctor"] = doctor_on()["doctor"].clone();
    values["doctor"]["verify"]["clusterDns"] = json!("10.43.0.10:53");
    let off = documents(&template(&values, &[])?)?;
    assert!(find(&off, "NetworkPolicy", "kcp-keeper-doctor").is_none(), "off with networkPolicy.enabled false");
    let kcp = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kcp-system"}}}]);
    values["networkPolicy"] = policy_values(json!({
        "metrics": {"podSelector": {"matchLabels": {"app": "prometheus"}}},
        "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "ports": [6443]},
        "doctor": {"kcp": {"to": kcp, "ports": [6443, 8443]}},
    }));
    let objects = documents(&template(&values, &[])?)?;
    let policy = find(&objects, "NetworkPolicy", "kcp-keeper-doctor").expect("the doctor's policy");
    let pod = &find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["selector"]["matchLabels"];
    assert_eq!(&policy["spec"]["podSelector"]["matchLabels"], pod, "it selects the doctor's pod");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"ports": [{"port": 9090, "protocol": "TCP"}], "from": [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]}])
    );
    let agents: Vec<Value> = AGENTS
        .iter()
        .map(|a| json!({"podSelector": {"matchLabels": {"app.kubernetes.io/name": a, "app.kubernetes.io/instance": "kcp-keeper"}}}))
        .collect();
    let mut agents_sorted = agents.clone();
    agents_sorted.sort_by_key(|v| v.to_string());
    // The agents' rule lists them in the chart's order; compare the peers of each rule as a set.
    let as_sets = |mut rules: Vec<(Vec<String>, Value)>| {
        for rule in rules.iter_mut() {
            if let Some(to) = rule.1.as_array_mut() {
                to.sort_by_key(|v| v.to_string());
            }
        }
        rules
    };
    let got = as_sets(egress(policy));
    let udp_tcp = |ip: &str, port: u16| -> (Vec<String>, Value) {
        (vec![format!("{port}/UDP"), format!("{port}/TCP")], json!([{"ipBlock": {"cidr": ip}}]))
    };
    assert_eq!(
        got,
        as_sets(vec![
            (tcp(&[6443]), json!([{"ipBlock": {"cidr": "10.0.0.10/32"}}])),
            dns_rule(),
            (tcp(&[9090]), Value::Array(agents_sorted)),
            (tcp(&[6443, 8443]), kcp),
            udp_tcp("10.43.0.10/32", 53),
            udp_tcp("169.254.20.10/32", 53),
        ])
    );
    // Without the Verify checks, no kcp and no resolvers; its own switch wins over the global one.
    values["doctor"]["verify"] = json!({"enabled": false});
    let objects = documents(&template(&values, &[])?)?;
    assert_eq!(egress(find(&objects, "NetworkPolicy", "kcp-keeper-doctor").unwrap()).len(), 3);
    values["networkPolicy"]["doctor"]["enabled"] = json!(false);
    let objects = documents(&template(&values, &[])?)?;
    assert!(find(&objects, "NetworkPolicy", "kcp-keeper-doctor").is_none());
    assert!(find(&objects, "NetworkPolicy", "kcp-keeper-ca-syncer").is_some(), "the agents' stay");
    values["networkPolicy"] = json!({"enabled": false, "apiServer": values["networkPolicy"]["apiServer"],
                                     "doctor": {"enabled": true, "kcp": {"to": kcp_ns()}}});
    let objects = documents(&template(&values, &[])?)?;
    assert_eq!(policies(&objects).len(), 1, "the doctor's alone");
    Ok(())
}

/// A connection a pod of the release opens: to `ip` (and, when the destination is a pod, its namespace's and its
/// own labels) on `port`/`protocol`.
struct Dest {
    ip: std::net::IpAddr,
    pod: Option<(Value, Value)>,
    port: u16,
    protocol: &'static str,
}

fn dest(ip: &str, port: u16, protocol: &'static str) -> Dest {
    Dest { ip: ip.parse().unwrap(), pod: None, port, protocol }
}

/// A label selector's verdict on `labels` (matchLabels, and matchExpressions with In, NotIn, Exists, DoesNotExist).
fn selects(selector: &Value, labels: &Value) -> bool {
    let labels_ok = selector["matchLabels"].as_object().is_none_or(|m| m.iter().all(|(k, v)| &labels[k] == v));
    let exprs_ok = selector["matchExpressions"].as_array().is_none_or(|es| {
        es.iter().all(|e| {
            let (key, values) = (e["key"].as_str().unwrap(), e["values"].as_array().cloned().unwrap_or_default());
            match e["operator"].as_str().unwrap() {
                "In" => values.contains(&labels[key]),
                "NotIn" => !values.contains(&labels[key]),
                "Exists" => !labels[key].is_null(),
                "DoesNotExist" => labels[key].is_null(),
                op => panic!("operator {op}"),
            }
        })
    });
    labels_ok && exprs_ok
}

fn in_cidr(cidr: &str, ip: std::net::IpAddr) -> bool {
    let (net, prefix) = cidr.split_once('/').unwrap();
    let (net, prefix): (std::net::IpAddr, u32) = (net.parse().unwrap(), prefix.parse().unwrap());
    let bits = |a: std::net::IpAddr| match a {
        std::net::IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        std::net::IpAddr::V6(a) => (u128::from(a), 128),
    };
    let ((n, width), (i, iwidth)) = (bits(net), bits(ip));
    if width != iwidth {
        return false;
    }
    prefix == 0 || (n >> (width - prefix)) == (i >> (width - prefix))
}

/// Whether `policy`'s egress lets the connection out, read as Kubernetes defines it: a rule matches when one of
/// its ports does (none: every port; protocol TCP unless named) and one of its peers does (none: any address).
fn allows(policy: &Value, d: &Dest) -> bool {
    let namespace = &policy["metadata"]["namespace"];
    policy["spec"]["egress"].as_array().unwrap().iter().any(|rule| {
        let port_ok = rule["ports"].as_array().is_none_or(|ps| {
            ps.is_empty()
                || ps.iter().any(|p| {
                    let protocol = p["protocol"].as_str().unwrap_or("TCP");
                    let (from, to) =
                        (p["port"].as_u64().unwrap(), p["endPort"].as_u64().unwrap_or(p["port"].as_u64().unwrap()));
                    protocol == d.protocol && (from..=to).contains(&u64::from(d.port))
                })
        });
        let peer_ok = rule["to"].as_array().is_none_or(|peers| {
            peers.is_empty()
                || peers.iter().any(|peer| {
                    if let Some(block) = peer.get("ipBlock") {
                        let except = block["except"].as_array().cloned().unwrap_or_default();
                        return in_cidr(block["cidr"].as_str().unwrap(), d.ip)
                            && !except.iter().any(|e| in_cidr(e.as_str().unwrap(), d.ip));
                    }
                    let Some((ns_labels, pod_labels)) = &d.pod else { return false };
                    let ns_ok = match peer.get("namespaceSelector") {
                        Some(sel) => selects(sel, ns_labels),
                        None => &ns_labels["kubernetes.io/metadata.name"] == namespace,
                    };
                    ns_ok && peer.get("podSelector").is_none_or(|sel| selects(sel, pod_labels))
                })
        });
        port_ok && peer_ok
    })
}

/// Every agent and the doctor, with both stores (the second one's credentials through web identity) and
/// [`policy_values`] naming the second store's and STS's peers too.
fn every_policy_values() -> Value {
    let mut values = all_agents();
    values["doctor"] = doctor_on()["doctor"].clone();
    values["etcdSnapshotter"]["config"]["secondary"] = json!({
        "storage": {"bucket": "offsite", "endpoint": "https://s3.eu-central-1.example.net", "region": "eu-central-1",
                    "credentials": {"webIdentity": {"roleArn": "arn:aws:iam::1:role/x", "tokenFile": "/var/run/secrets/token"}}},
        "retention": {"keepLast": 3},
    });
    values["networkPolicy"] = policy_values(json!({}));
    values["networkPolicy"]["etcdSnapshotter"]["secondary"] = json!({"to": [{"ipBlock": {"cidr": "203.0.113.0/28"}}]});
    values["networkPolicy"]["etcdSnapshotter"]["sts"] = json!({"to": [{"ipBlock": {"cidr": "198.51.100.64/26"}}]});
    values
}

/// The defaults allow nothing beyond what the values name: every egress rule of every policy (each agent's and the
/// doctor's, both stores and STS configured) lists its peers, none of them anywhere, and an address no value names
/// is refused on 443 and 6443 from every pod.
#[test]
fn with_the_required_peers_named_every_egress_rule_lists_its_peers_and_an_unnamed_address_is_refused_on_443_and_6443()
-> Result<()> {
    let objects = documents(&template(&every_policy_values(), &[])?)?;
    let all = policies(&objects);
    assert_eq!(all.len(), 5, "four agents and the doctor");
    for policy in &all {
        let name = &policy["metadata"]["name"];
        for rule in policy["spec"]["egress"].as_array().unwrap() {
            let to = rule["to"].as_array().map_or(0, Vec::len);
            assert!(to > 0, "{name}: a rule without peers is any address: {rule}");
            assert!(!rule["ports"].as_array().is_none_or(Vec::is_empty), "{name}: a rule without ports: {rule}");
        }
        for ip in ["203.0.113.200", "8.8.8.8", "2001:db8::1"] {
            for port in [443, 6443] {
                assert!(!allows(policy, &dest(ip, port, "TCP")), "{name} lets {ip}:{port} out");
            }
        }
        // And the kcp-keeper doctor's own rule finds nothing to warn on.
        let parsed: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value((*policy).clone())?;
        let lines = kcp_keeper_doctor::rules::network_policy::judge("kcp-keeper", &[parsed]);
        assert_eq!(lines[0].result, kcp_keeper_doctor::verdict::Level::Ok, "{name}: {lines:?}");
    }
    Ok(())
}

/// DNS goes to the cluster DNS pods and to node-local-dns's addresses (`networkPolicy.dns.nodeLocalDns`, default
/// its link-local 169.254.20.10), on 53 over UDP and TCP, from every policy; nowhere else on 53.
#[test]
fn dns_is_allowed_to_the_kube_dns_pods_and_to_each_configured_node_local_dns_address_from_every_policy() -> Result<()> {
    let kube_dns = |port, protocol| Dest {
        ip: "10.42.0.5".parse().unwrap(),
        pod: Some((json!({"kubernetes.io/metadata.name": "kube-system"}), json!({"k8s-app": "kube-dns"}))),
        port,
        protocol,
    };
    let mut values = every_policy_values();
    let objects = documents(&template(&values, &[])?)?;
    for policy in policies(&objects) {
        let name = &policy["metadata"]["name"];
        for protocol in ["UDP", "TCP"] {
            assert!(allows(policy, &kube_dns(53, protocol)), "{name}: kube-dns {protocol}");
            assert!(allows(policy, &dest("169.254.20.10", 53, protocol)), "{name}: node-local-dns {protocol}");
            assert!(!allows(policy, &dest("169.254.20.11", 53, protocol)), "{name}: another link-local address");
            assert!(!allows(policy, &dest("8.8.8.8", 53, protocol)), "{name}: a public resolver");
        }
        assert!(!allows(policy, &kube_dns(8080, "TCP")), "{name}: kube-dns pods on another port");
        assert!(!allows(policy, &dest("169.254.20.10", 443, "TCP")), "{name}: node-local-dns on 443");
    }
    // With kube-proxy in iptables mode node-local-dns binds the cluster DNS Service's ClusterIP too, pods' nameserver,
    // which it answers on the node without the Service's translation: listed, it is allowed. IPv6 is a /128.
    values["networkPolicy"]["dns"] = json!({"nodeLocalDns": ["169.254.20.10", "10.96.0.10", "fd00::a"]});
    let objects = documents(&template(&values, &[])?)?;
    for policy in policies(&objects) {
        let name = &policy["metadata"]["name"];
        for ip in ["169.254.20.10", "10.96.0.10", "fd00::a"] {
            assert!(allows(policy, &dest(ip, 53, "UDP")), "{name}: {ip}");
        }
        assert!(!allows(policy, &dest("fd00::b", 53, "UDP")), "{name}: only that /128");
        assert!(allows(policy, &kube_dns(53, "UDP")), "{name}: the pods stay");
    }
    // Without node-local-dns (in the DNS rule, and among the doctor's split-horizon resolvers), only the pods.
    values["networkPolicy"]["dns"] = json!({"nodeLocalDns": []});
    values["doctor"]["verify"]["nodeLocalDns"] = json!([]);
    let objects = documents(&template(&values, &[])?)?;
    for policy in policies(&objects) {
        assert!(!allows(policy, &dest("169.254.20.10", 53, "UDP")), "{}", policy["metadata"]["name"]);
        assert!(allows(policy, &kube_dns(53, "UDP")));
    }
    Ok(())
}

/// etcd-snapshotter's second store (`secondary.storage.endpoint`'s port, to `networkPolicy.etcdSnapshotter.secondary`)
/// and STS (443, to `.sts`, when either store uses web identity) are let out when configured, and not otherwise.
#[test]
fn the_second_store_and_sts_are_allowed_when_configured_and_refused_when_not() -> Result<()> {
    let snapshotter = |values: &Value| -> Result<Value> {
        let objects = documents(&template(values, &[])?)?;
        Ok(find(&objects, "NetworkPolicy", "kcp-keeper-etcd-snapshotter").unwrap().clone())
    };
    let (second, sts, primary) =
        (dest("203.0.113.5", 443, "TCP"), dest("198.51.100.70", 443, "TCP"), dest("192.0.2.9", 7070, "TCP"));
    let mut values = every_policy_values();
    let p = snapshotter(&values)?;
    assert!(allows(&p, &second) && allows(&p, &sts) && allows(&p, &primary));
    assert!(!allows(&p, &dest("203.0.113.5", 7070, "TCP")), "the second store on its own port only");
    assert!(!allows(&p, &dest("198.51.100.70", 6443, "TCP")), "STS on 443 only");
    // A second store with its own port, static credentials: no STS.
    values["etcdSnapshotter"]["config"]["secondary"]["storage"]["endpoint"] = json!("http://minio.backup.example:9000");
    values["etcdSnapshotter"]["config"]["secondary"]["storage"]["credentials"] =
        json!({"secretDirectory": "/var/run/secrets/etcd-snapshotter/s3-secondary"});
    values["etcdSnapshotter"]["secondaryS3Credentials"] = json!({"existingSecret": "offsite-s3"});
    let p = snapshotter(&values)?;
    assert!(allows(&p, &dest("203.0.113.5", 9000, "TCP")) && !allows(&p, &second));
    assert!(!allows(&p, &sts), "no web identity, no STS");
    // Web identity on the primary store alone: STS again.
    values["etcdSnapshotter"]["config"]["storage"]["credentials"] =
        json!({"webIdentity": {"roleArn": "arn:aws:iam::1:role/x", "tokenFile": "/var/run/secrets/token"}});
    assert!(allows(&snapshotter(&values)?, &sts));
    // No second store: its peers are not let out even though the value names them.
    values["etcdSnapshotter"]["config"].as_object_mut().unwrap().remove("secondary");
    values["etcdSnapshotter"].as_object_mut().unwrap().remove("secondaryS3Credentials");
    let p = snapshotter(&values)?;
    assert!(!allows(&p, &dest("203.0.113.5", 9000, "TCP")) && !allows(&p, &second));
    Ok(())
}

/// A rule that needs peers and has none fails the render naming the value (an empty `to` is any address), for the
/// apiserver, each agent's peers, the second store, STS, the doctor's kcp and `extraEgress`.
#[test]
fn a_rule_whose_peers_are_not_named_fails_the_render_naming_the_value() {
    type Break = fn(&mut Value);
    let cases: [(&str, Break); 9] = [
        ("networkPolicy.apiServer.to", |v| v["networkPolicy"]["apiServer"]["to"] = json!([])),
        ("networkPolicy.caSyncer.kcp.to", |v| v["networkPolicy"]["caSyncer"]["kcp"]["to"] = json!([])),
        ("networkPolicy.kubeconfigRotator.kcp.to", |v| {
            v["networkPolicy"]["kubeconfigRotator"]["kcp"]["to"] = json!([])
        }),
        ("networkPolicy.etcdSnapshotter.etcd.to", |v| v["networkPolicy"]["etcdSnapshotter"]["etcd"]["to"] = json!([])),
        ("networkPolicy.etcdSnapshotter.s3.to", |v| v["networkPolicy"]["etcdSnapshotter"]["s3"]["to"] = json!([])),
        ("networkPolicy.etcdSnapshotter.secondary.to", |v| {
            v["networkPolicy"]["etcdSnapshotter"]["secondary"]["to"] = json!([])
        }),
        ("networkPolicy.etcdSnapshotter.sts.to", |v| v["networkPolicy"]["etcdSnapshotter"]["sts"]["to"] = json!([])),
        ("networkPolicy.doctor.kcp.to", |v| v["networkPolicy"]["doctor"]["kcp"]["to"] = json!([])),
        ("networkPolicy.extraEgress[1]", |v| {
            v["networkPolicy"]["extraEgress"] =
                json!([{"to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}]}, {"ports": [{"port": 443}]}])
        }),
    ];
    for (value, break_it) in cases {
        let mut values = every_policy_values();
        break_it(&mut values);
        let e = template(&values, &[]).expect_err(value).to_string();
        assert!(e.contains(value) && e.contains("any address"), "{value}: {e}");
    }
}

/// "Anywhere" is a value spelled out: `0.0.0.0/0` or `::/0` renders as written, the doctor is told to read the
/// release's policies (and may list them, nothing more), and its `network-policy` rule warns on exactly those.
#[test]
fn anywhere_spelled_out_renders_and_the_doctor_lists_the_policies_and_warns_on_it() -> Result<()> {
    let mut values = every_policy_values();
    values["networkPolicy"]["apiServer"]["to"] =
        json!([{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]);
    let objects = documents(&template(&values, &[])?)?;
    let mut warned = Vec::new();
    for policy in policies(&objects) {
        assert!(
            allows(policy, &dest("203.0.113.200", 6443, "TCP")) && allows(policy, &dest("2001:db8::1", 443, "TCP"))
        );
        let parsed: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(policy.clone())?;
        let line = kcp_keeper_doctor::rules::network_policy::judge("kcp-keeper", &[parsed]).remove(0);
        assert_eq!(line.result, kcp_keeper_doctor::verdict::Level::Warn, "{line:?}");
        assert!(line.saw.contains("0.0.0.0/0, ::/0 on 443, 6443"), "{}", line.saw);
        warned.push(line.subject);
    }
    assert_eq!(warned.len(), 5, "every policy carries the apiserver rule: {warned:?}");
    let doctor =
        &find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(doctor).get("KCP_KEEPER_DOCTOR_NETWORK_POLICIES").map(String::as_str), Some("kcp-keeper"));
    let role = objects
        .iter()
        .find(|o| {
            o["kind"] == "Role"
                && o["metadata"]["name"] == "kcp-keeper-doctor"
                && o["metadata"]["namespace"] == "kcp-keeper"
        })
        .expect("the doctor's Role in the release namespace");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
               {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list"]}]),
        "list on NetworkPolicies, and on Pods (agent-pods), nothing else there"
    );
    // Without any policy rendered, neither the flag nor the grant.
    values["networkPolicy"]["enabled"] = json!(false);
    let objects = documents(&template(&values, &[])?)?;
    let doctor =
        &find(&objects, "Deployment", "kcp-keeper-doctor").unwrap()["spec"]["template"]["spec"]["containers"][0];
    assert!(!env_of(doctor).contains_key("KCP_KEEPER_DOCTOR_NETWORK_POLICIES"));
    let role = objects.iter().find(|o| {
        o["kind"] == "Role"
            && o["metadata"]["namespace"] == "kcp-keeper"
            && o["metadata"]["name"] == "kcp-keeper-doctor"
    });
    assert_eq!(
        role.map(|r| r["rules"].clone()),
        Some(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])),
        "the release namespace's Role keeps only agent-pods' list on Pods"
    );
    Ok(())
}
