//! `dns-rewriter run`'s work: the reconciler on the runtime's driver, and [`daemon`], which runs it. It has one
//! item, the managed key; a cycle runs on any change to what [`crate::scope`] watches, on a configuration
//! change, on leadership, and every `resyncInterval`:
//!
//! 1. plan the rules from the stores ([`crate::plan`]); per-rule errors are counted, logged and, when new,
//!    published as Events on the managed ConfigMap; the other rules go on;
//! 2. compute the new value of the key and check it before writing ([`crate::output::desired_value`]);
//! 3. write only when the bytes differ, conditional on the resourceVersion it was computed from (the runtime's
//!    [`kcp_keeper_runtime::marked_block::configmap::write_key`]: a merge patch of the one key; on a 409 it
//!    re-reads, and the value is computed and checked again, so a change someone made meanwhile is kept); a
//!    cycle with nothing to do sends no write; the ConfigMap is never created;
//! 4. when NodeLocal DNSCache is there (node-local-dns's ConfigMap exists; `nodeLocalDns`), the same for its
//!    Corefile: a marked server block forwarding the rules' names to the cluster DNS ([`crate::node_local`]),
//!    so pods behind it see the rules too; a failure there is its own error and does not stop step 3;
//! 5. verify through every resolver a pod can be given (the cluster DNS Service and node-local-dns's listen
//!    addresses; a name counts as verified only when all answer it right): after a write, ask until every
//!    name answers its Service's ClusterIP or `verify.settle` (projection delay plus reload interval) has passed; otherwise ask once. Each host's result
//!    is exported, so a host that answers anything else (a cache holding a recreated Service's old address,
//!    rules that never loaded) shows as `host_verified 0`.
//!
//! The ConfigMap is never created, in either mode: a Corefile ConfigMap is its owner's, and creating
//! `coredns-custom` would need `create` on every ConfigMap of `kube-system` (RBAC cannot limit a create by name;
//! the apiserver checks `create` even for a server-side apply that would create). It is created once at
//! install time instead (the chart, or `kubectl -n kube-system create configmap coredns-custom`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::net::{IpAddr, SocketAddr};

use hickory_resolver::TokioResolver;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kcp_keeper_runtime::admin::Health;
use kcp_keeper_runtime::agent::Context;
use kcp_keeper_runtime::apply::Outcome;
use kcp_keeper_runtime::driver::{self, Named, ReconcileMetrics, Reconciler, Settings};
use kcp_keeper_runtime::events::{EventType, Recorder, reference};
use kcp_keeper_runtime::marked_block::configmap::{OwnWrite, fresher, write_key};
use kube::Api;
use tokio::time::Instant;

use crate::config::{CLUSTER_DNS_SERVICE, Config, ConfigMapKey, Target};
use crate::error::{CycleError, WriteError};
use crate::hostname::Hostname;
use crate::metrics::Metrics;
use crate::node_local::{self, NodeLocalError};
use crate::output::desired_value_adopting;
use crate::plan::{Plan, RuleError};
use crate::rules::RuleSet;
use crate::scope::Scope;
use crate::verify::{self, HostCheck, Outcome as Answer};

/// How often to ask again while waiting for a written change to answer.
const VERIFY_POLL: Duration = Duration::from_secs(1);

/// `dns-rewriter run`'s work, on the runtime's driver: `reconcile` is the driver's metrics (the runtime
/// registered them from [`CycleError`]).
pub async fn daemon(ctx: Context<Config>, metrics: Metrics, reconcile: ReconcileMetrics) -> anyhow::Result<()> {
    // The configured resyncInterval comes back as each cycle's requeue time, so a reloaded value applies at
    // once; the driver's own resync is only a backstop.
    let settings = Settings { resync: Duration::from_secs(3600), ..Settings::default() };
    let (client, events) = (ctx.client.clone(), ctx.events.clone());
    let reported = Arc::new(Mutex::new(BTreeSet::new()));
    let own_write = Arc::new(Mutex::new(None));
    // One item whose whole job fails together: a leader is ready once it has written (or found nothing to
    // write), not merely after a pass that failed.
    ctx.health.require_success();
    let health = ctx.health.clone();
    let started = crate::cleanup::unix_seconds();
    driver::run(&ctx, &reconcile, settings, |config: Arc<Config>| {
        let (scope, watches) = Scope::build(&client, &config);
        let rewriter = Rewriter {
            client: client.clone(),
            events: events.clone(),
            health: health.clone(),
            metrics: metrics.clone(),
            config,
            scope,
            reported: reported.clone(),
            own_write: own_write.clone(),
            started,
        };
        (rewriter, watches)
    })
    .await;
    Ok(())
}

struct Rewriter {
    client: kube::Client,
    events: Arc<Recorder>,
    health: Arc<Health>,
    metrics: Metrics,
    config: Arc<Config>,
    scope: Scope,
    /// The rule errors and warnings already published as Events, so a steady problem is told once, not every
    /// cycle (and a no-op cycle sends nothing).
    reported: Arc<Mutex<BTreeSet<String>>>,
    /// When this process started (Unix seconds): a `cleanup` marked after it means uninstalling, so nothing
    /// more is written ([`crate::cleanup::cleaned_since`]).
    started: u64,
    /// The key's last write: the version written over and the object written. Until the store shows that
    /// write, a pass compares with it, so a settled agent sends nothing (a store that lags its own write would
    /// make a pass write again, refused as a conflict).
    own_write: Arc<Mutex<Option<OwnWrite>>>,
}

impl Reconciler for Rewriter {
    type Item = Named;
    type Error = CycleError;

    fn items(&self) -> Vec<Named> {
        let key = self.config.target.configmap();
        vec![Named::new("configmap", format!("{}/{}/{}", key.namespace, key.name, key.key))]
    }

    async fn reconcile(&self, _: &Named) -> Result<Option<Duration>, CycleError> {
        let mut plan = crate::cluster::plan_with(&self.config, &self.scope.view());
        let resolver = self.resolver().await;
        if let Some((_, resolver)) = &resolver {
            // Each rule's target is resolved before it is written: one that does not exist (a wrong
            // clusterDomain) is an error for that rule alone.
            for (host, target) in verify::unresolved_targets(resolver, &plan.rules, &self.config.cluster_domain).await {
                plan.rules.remove(&host);
                plan.errors.push(RuleError::TargetUnresolved { host, target });
            }
        }
        self.metrics.observe_plan(&plan);
        self.report(&plan).await;
        let written = self.write(&plan.rules).await;
        let node_local = self.write_node_local(&plan.rules).await;
        // Every resolver a pod can be given: the cluster DNS, and node-local-dns's listen addresses.
        let listen = node_local.as_ref().map(|(_, listen)| listen.clone()).unwrap_or_default();
        let resolvers = self.resolvers(resolver, &listen);
        let after_write = matches!(written, Ok(true)) || matches!(node_local, Ok((true, _)));
        // Verification runs even when the write failed: the metrics then say what the cluster answers now.
        let checks = self.verify(&resolvers, &plan.rules, after_write).await;
        written?;
        self.health.mark_succeeded();
        node_local?;
        let failed: Vec<&HostCheck> = checks.iter().filter(|c| c.outcome != Answer::Match).collect();
        if !failed.is_empty() {
            let detail = failed
                .iter()
                .map(|c| match c.resolver {
                    Some(r) => format!("{} {} (through {r})", c.host.as_str(), c.outcome),
                    None => format!("{} {}", c.host.as_str(), c.outcome),
                })
                .collect::<Vec<_>>();
            return Err(CycleError::NotVerified {
                failed: failed.len(),
                total: checks.len(),
                detail: detail.join(", "),
            });
        }
        Ok(Some(self.config.resync_interval))
    }
}

impl Rewriter {
    fn key(&self) -> &ConfigMapKey {
        self.config.target.configmap()
    }

    /// Writes the key when its bytes differ; `Ok(true)` when it wrote. The value is computed from the key as
    /// last seen and checked before any write; when the ConfigMap changed since (a 409), the runtime re-reads
    /// it and the value is computed and checked again from the fresh object.
    async fn write(&self, rules: &RuleSet) -> Result<bool, CycleError> {
        let key = self.key();
        let result = match self.scope.configmap() {
            // Not in the store: nothing to ask the apiserver, and nothing to create.
            None => Err(CycleError::ConfigMapMissing(format!("{}/{}", key.namespace, key.name))),
            Some(live) if self.cleaned(&live) => Ok((Outcome::Unchanged, Vec::new())),
            Some(live) => {
                let live = fresher(live, self.own_write.lock().expect("own write").as_ref());
                self.write_key(key, live, rules).await
            }
        };
        match result {
            Ok((Outcome::Unchanged, _)) => Ok(false),
            Ok((_, adopted)) => {
                self.metrics.wrote();
                if !adopted.is_empty() {
                    self.adopted(key, &adopted, rules).await;
                }
                tracing::info!(configmap = %format!("{}/{}", key.namespace, key.name), key = %key.key, rules = rules.len(), "updated");
                let note = format!("key {} updated with {} rules", key.key, rules.len());
                self.event(EventType::Normal, "RulesWritten", &note).await;
                Ok(true)
            }
            Err(error) => {
                self.not_written(key, &error).await;
                Err(error)
            }
        }
    }

    /// Writes our server block into node-local-dns's Corefile when NodeLocal DNSCache is there; `Ok((true, _))`
    /// when it wrote, with node-local-dns's listen addresses (from its cluster domain block) to verify through.
    async fn write_node_local(&self, rules: &RuleSet) -> Result<(bool, Vec<SocketAddr>), CycleError> {
        let Some(key) = &self.config.node_local_dns else { return Ok((false, Vec::new())) };
        let Some(live) = self.scope.node_local() else {
            self.metrics.node_local_detected(false);
            return Ok((false, Vec::new()));
        };
        self.metrics.node_local_detected(true);
        if self.cleaned(&live) {
            return Ok((false, Vec::new()));
        }
        let domain = &self.config.cluster_domain;
        let object = format!("{}/{}", key.namespace, key.name);
        let current = live.data.as_ref().and_then(|d| d.get(&key.key));
        let parsed = current.ok_or(NodeLocalError::NoCorefile).and_then(|c| {
            let cluster = node_local::cluster_block(c, domain)?;
            Ok((node_local::zones(c, &cluster, rules)?, cluster))
        });
        let ((_, taken), cluster) = match parsed {
            Ok(parsed) => parsed,
            Err(e) => return Err(self.node_local_failed(key, &object, &e.to_string()).await),
        };
        for host in &taken {
            tracing::warn!(host = host.as_str(), configmap = %object, "another server block of node-local-dns's Corefile serves this name; left out of ours");
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
        let compute = |current: Option<&str>| {
            let current = current.ok_or(NodeLocalError::NoCorefile)?;
            let cluster = node_local::cluster_block(current, domain)?;
            let (hosts, _) = node_local::zones(current, &cluster, rules)?;
            node_local::desired_value(current, &cluster, &hosts, domain)
        };
        match write_key(&api, &key.name, &key.key, Some(live), compute).await {
            Ok(written) if written.outcome == Outcome::Unchanged => Ok((false, cluster.listen_addresses())),
            Ok(_) => {
                self.metrics.node_local_wrote();
                tracing::info!(configmap = %object, key = %key.key, rules = rules.len() - taken.len(), "node-local-dns updated");
                let note = format!(
                    "key {}: the public names of {} rules forwarded to the cluster DNS",
                    key.key,
                    rules.len() - taken.len()
                );
                self.event_on(key, "", EventType::Normal, "NodeLocalDnsWritten", &note).await;
                Ok((true, cluster.listen_addresses()))
            }
            Err(e) => Err(self.node_local_failed(key, &object, &e.to_string()).await),
        }
    }

    async fn node_local_failed(&self, key: &ConfigMapKey, object: &str, error: &str) -> CycleError {
        tracing::warn!(configmap = %object, %error, "node-local-dns not written");
        self.event_on(
            key,
            "",
            EventType::Warning,
            "NodeLocalDnsNotWritten",
            &format!("key {}: nothing written: {error}", key.key),
        )
        .await;
        CycleError::NodeLocalDns(format!("ConfigMap {object}: {error}"))
    }

    /// The cluster DNS resolver, then one for each node-local-dns listen address that is not the same address.
    fn resolvers(
        &self,
        cluster: Option<(SocketAddr, TokioResolver)>,
        listen: &[SocketAddr],
    ) -> Vec<(SocketAddr, TokioResolver)> {
        let Some(cluster) = cluster else { return Vec::new() };
        let mut out = vec![cluster];
        for addr in listen {
            if out.iter().any(|(a, _)| a == addr) {
                continue;
            }
            match verify::resolver(*addr, self.config.verify.timeout) {
                Ok(r) => out.push((*addr, r)),
                Err(e) => tracing::warn!(error = %e, resolver = %addr, "cannot build a resolver for node-local-dns"),
            }
        }
        out
    }

    /// Whether `cleanup` took the rules out of `live` since this process started (uninstalling): then nothing
    /// is written into it, logged once per cycle.
    fn cleaned(&self, live: &ConfigMap) -> bool {
        let Some(at) = crate::cleanup::cleaned_since(live, self.started) else { return false };
        let name = live.metadata.name.as_deref().unwrap_or_default();
        tracing::info!(
            configmap = name,
            cleaned_at = at,
            "dns-rewriter cleanup ran after this agent started (uninstalling); not writing"
        );
        true
    }

    /// Says what a write did with the unmarked lines it took out of the Corefile: counted, one summary Event,
    /// and one `AdoptedExistingRule` Event per line (its own rate limit) naming it and whether it now stands in
    /// the block or is gone. No marker tells our lines from an administrator's own in the same form, so no such
    /// line leaves the Corefile unannounced.
    async fn adopted(&self, key: &ConfigMapKey, lines: &[String], rules: &RuleSet) {
        self.metrics.adopted(lines.len());
        let note = format!(
            "key {}: {} rule lines without markers, in exactly the form dns-rewriter writes, were adopted into the block (a kubeadm CoreDNS upgrade drops every comment, our markers included); each is named in an AdoptedExistingRule Event",
            key.key,
            lines.len()
        );
        tracing::warn!("{note}");
        self.event(EventType::Warning, "UnmarkedRulesAdopted", &note).await;
        let Target::Corefile { server_block, .. } = &self.config.target else { return };
        let written = crate::render::render(rules, &self.config.cluster_domain);
        for line in lines {
            let kept = written.lines().any(|l| l.trim() == line);
            let note = adopted_note(&key.key, server_block, line, kept);
            tracing::warn!(line = line.as_str(), kept, "{note}");
            self.event_on(key, line, EventType::Warning, "AdoptedExistingRule", &note).await;
        }
    }

    /// Writes the key; the outcome, and the unmarked lines the value written was computed without (adopted
    /// from the very version it replaced, a re-read after a conflict included).
    async fn write_key(
        &self,
        key: &ConfigMapKey,
        live: ConfigMap,
        rules: &RuleSet,
    ) -> Result<(Outcome, Vec<String>), CycleError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
        let (target, domain) = (&self.config.target, &self.config.cluster_domain);
        let mut adopted = Vec::new();
        let compute = |current: Option<&str>| {
            let (value, lines) = desired_value_adopting(target, domain, rules, current)?;
            adopted = lines;
            Ok::<_, crate::output::OutputError>(value)
        };
        let written = write_key(&api, &key.name, &key.key, Some(live), compute).await?;
        if written.conflicts > 0 {
            tracing::info!(conflicts = written.conflicts, "the ConfigMap changed since it was read; recomputed");
        }
        if written.written.is_some() {
            *self.own_write.lock().expect("own write") = written.written;
        }
        Ok((written.outcome, adopted))
    }

    /// Logs why nothing was written and says so in an Event; a conflict is not evented (someone else wrote,
    /// and the next cycle recomputes).
    async fn not_written(&self, key: &ConfigMapKey, error: &CycleError) {
        match error {
            CycleError::ConfigMapMissing(_) => {
                tracing::warn!(%error, "not written");
                self.event(EventType::Warning, "ConfigMapMissing", &error.to_string()).await;
            }
            CycleError::Refused(e) => {
                tracing::warn!(error = %e, "not written");
                self.event(EventType::Warning, "WriteRefused", &format!("key {}: nothing written: {e}", key.key)).await;
            }
            CycleError::WriteFailed(e) => {
                tracing::warn!(error = %e, "write failed");
                if !matches!(e, WriteError::Conflict(..)) {
                    self.event(EventType::Warning, "WriteFailed", &format!("key {}: {e}", key.key)).await;
                }
            }
            CycleError::NotVerified { .. } | CycleError::NodeLocalDns(_) => {}
        }
    }

    /// The resolver to verify through: `verify.resolver`, else the cluster DNS Service's ClusterIP on port 53
    /// (`kube-system/kube-dns`, read each cycle: a recreated Service gets a new address). `None`, logged, when
    /// neither is there: nothing is verified, and `verify_timestamp_seconds` says so.
    async fn resolver(&self) -> Option<(SocketAddr, TokioResolver)> {
        let addr = match self.config.verify.resolver {
            Some(addr) => addr,
            None => {
                let (ns, name) = CLUSTER_DNS_SERVICE;
                let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
                let ip = match api.get_opt(name).await {
                    Ok(found) => found.and_then(|s| s.spec?.cluster_ip).and_then(|ip| ip.parse::<IpAddr>().ok()),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the cluster DNS Service {ns}/{name}; not verified");
                        return None;
                    }
                };
                let Some(ip) = ip else {
                    tracing::warn!(
                        "no verify.resolver and no ClusterIP on the cluster DNS Service {ns}/{name}; not verified"
                    );
                    return None;
                };
                SocketAddr::new(ip, 53)
            }
        };
        let resolver = match verify::resolver(addr, self.config.verify.timeout) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, resolver = %addr, "cannot build a resolver; not verified");
                return None;
            }
        };
        // Only the cluster DNS under the right domain may say a target does not exist: anything else (a
        // resolver that answers NXDOMAIN for every name, a wrong clusterDomain) would drop every rule. Every
        // cluster has the apiserver's `kubernetes.default` Service, so that name is the proof.
        let probe = format!("kubernetes.default.svc.{}", self.config.cluster_domain);
        let answered = match Hostname::parse(&probe) {
            Ok(name) => !verify::check_one(&resolver, &name, None).await.answered.is_empty(),
            Err(_) => false,
        };
        if !answered {
            tracing::warn!(
                resolver = %addr,
                "the resolver does not answer {probe}: it is not the cluster DNS, or clusterDomain is wrong; not verified, no target checked"
            );
            return None;
        }
        Some((addr, resolver))
    }

    /// Asks the resolver for every name; after a write, again until all match or `verify.settle` has passed.
    /// Without a resolver nothing is asked, and every host reads "not verified". Verification has run (the
    /// timestamp) when the resolver answered at least one question, or there was none to ask.
    async fn verify(
        &self,
        resolvers: &[(SocketAddr, TokioResolver)],
        rules: &RuleSet,
        after_write: bool,
    ) -> Vec<HostCheck> {
        if resolvers.is_empty() {
            return Vec::new();
        }
        let deadline = Instant::now() + if after_write { self.config.verify.settle } else { Duration::ZERO };
        loop {
            let checks = verify::check_everywhere(resolvers, rules).await;
            self.metrics.observe_checks(&checks);
            if checks.is_empty() || checks.iter().any(|c| c.outcome != Answer::Error) {
                self.metrics.verification_ran();
            }
            if checks.iter().all(|c| c.outcome == Answer::Match) || Instant::now() + VERIFY_POLL > deadline {
                for c in checks.iter().filter(|c| c.outcome != Answer::Match) {
                    tracing::warn!(host = c.host.as_str(), resolver = ?c.resolver, expected = ?c.expected, answered = ?c.answered, outcome = %c.outcome, "not verified");
                }
                return checks;
            }
            tokio::time::sleep(VERIFY_POLL).await;
        }
    }

    /// Logs every rule error and warning, and publishes the new ones as Events on the managed ConfigMap.
    async fn report(&self, plan: &Plan) {
        let current: Vec<(EventType, String, String)> = plan
            .errors
            .iter()
            .map(|e| (EventType::Warning, camel(e.reason()), e.to_string()))
            .chain(plan.warnings.iter().map(|w| (EventType::Warning, w.event_reason().to_string(), w.to_string())))
            .collect();
        let new: Vec<&(EventType, String, String)> = {
            let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            let new = current.iter().filter(|(_, _, note)| !reported.contains(note)).collect();
            *reported = current.iter().map(|(_, _, note)| note.clone()).collect();
            new
        };
        for e in &plan.errors {
            tracing::warn!(reason = e.reason(), "rule left out: {e}");
        }
        for w in plan.warnings.iter().filter(|w| !w.once()) {
            tracing::warn!("{w}");
        }
        // A normalised name is said once (log and Event) while it lasts, not every cycle.
        for (_, _, note) in new.iter().filter(|(_, reason, _)| reason == "NameNormalized") {
            tracing::warn!("{note}");
        }
        // One rate-limit bucket per note (each names its rule): a sixth rule error of one reason is not lost to
        // the runtime's burst of five per object and reason.
        for (kind, reason, note) in new {
            self.event_on(self.key(), note, *kind, reason, note).await;
        }
    }

    /// An Event about ConfigMap `key` (the managed one, or node-local-dns's) whose rate limit is `subject`'s own.
    async fn event_on(&self, key: &ConfigMapKey, subject: &str, kind: EventType, reason: &str, note: &str) {
        let regarding = reference("v1", "ConfigMap", &key.namespace, &key.name, None);
        self.events.publish_about(&regarding, subject, kind, reason, "Rewrite", note).await;
    }

    async fn event(&self, kind: EventType, reason: &str, note: &str) {
        self.event_on(self.key(), "", kind, reason, note).await;
    }
}

/// What an `AdoptedExistingRule` Event says about one adopted line of key `key`: where it stood, that it was taken
/// as dns-rewriter's, whether it now stands in the block (`kept`: a configured rule writes the same line, and
/// it goes when that rule goes) or was removed, and how an administrator keeps a line of their own.
fn adopted_note(key: &str, server_block: &str, line: &str, kept: bool) -> String {
    let fate = if kept {
        "it now stands inside the managed block, where a configured rule writes the same line, and goes when that rule goes"
    } else {
        "no configured rule writes it, so it was removed"
    };
    format!(
        "key {key}: the line `{line}` stood in server block {server_block} without kcp-keeper's markers, in exactly the form dns-rewriter writes, so it was taken as dns-rewriter's: {fate}. If it is yours, write it back in another form (e.g. without the trailing dots) or in another server block: dns-rewriter leaves those alone"
    )
}

/// `service_missing` to `ServiceMissing`, an Event reason.
fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut chars = w.chars();
            chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_reasons_are_the_rule_error_reasons_in_camel_case() {
        assert_eq!(camel("service_missing"), "ServiceMissing");
        assert_eq!(camel("conflict"), "Conflict");
    }

    #[test]
    fn an_adopted_line_is_named_with_what_became_of_it_and_the_form_it_suggests_is_left_alone() {
        let line = "rewrite name exact admin.example.com. web.team.svc.cluster.local.";
        let removed = adopted_note("Corefile", ".:53", line, false);
        assert!(removed.contains(&format!("`{line}` stood in server block .:53")), "{removed}");
        assert!(removed.contains("so it was removed"), "{removed}");
        let kept = adopted_note("Corefile", ".:53", line, true);
        assert!(kept.contains("goes when that rule goes") && !kept.contains("removed"), "{kept}");
        let domain = crate::hostname::Domain::parse("cluster.local").unwrap();
        assert!(crate::render::is_rule_line(line, &domain), "the line is in exactly our form");
        let other = "rewrite name exact admin.example.com web.team.svc.cluster.local";
        assert!(!crate::render::is_rule_line(other, &domain), "without the trailing dots it is not adopted");
    }
}
