//! Leader election: the pure decision logic directly, and the election itself against a real kube-apiserver.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kcp_keeper_runtime::lease::{self, Decision, Leadership, LeaseConfig, LeaseError, decide, released_spec};
use kube::api::Api;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(300);
const LEASE_NAME: &str = "election";

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("kcp_keeper_runtime=debug"));
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter(filter).try_init();
}

fn config(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: LEASE_DURATION,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY_PERIOD,
        ..LeaseConfig::new(namespace, LEASE_NAME, identity)
    }
}

struct Instance {
    identity: &'static str,
    leadership: Leadership,
    task: JoinHandle<Result<(), LeaseError>>,
    shutdown: CancellationToken,
}

/// Each instance gets its own client (own connections), as separate replicas would.
async fn start(bed: &testbed::ControlPlane, namespace: &str, identity: &'static str) -> anyhow::Result<Instance> {
    let client = bed.apiserver.admin_client().await?;
    let shutdown = CancellationToken::new();
    let (leadership, task) = lease::spawn(client, config(namespace, identity), shutdown.clone());
    Ok(Instance { identity, leadership, task, shutdown })
}

impl Instance {
    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        assert!(matches!(result, Ok(Ok(Ok(())))), "{} did not stop cleanly: {result:?}", self.identity);
    }
}

async fn read_lease(bed: &testbed::ControlPlane, namespace: &str) -> LeaseSpec {
    let lease: Lease = Api::namespaced(bed.client(), namespace).get(LEASE_NAME).await.expect("reading the lease");
    lease.spec.expect("the lease has a spec")
}

/// Waits until exactly one of `instances` leads; returns its index.
/// Two contenders "a" and "b" on one Lease, split into the one that won and the other.
async fn leader_and_follower(bed: &testbed::ControlPlane, ns: &str) -> anyhow::Result<(Instance, Instance)> {
    let (a, b) = (start(bed, ns, "a").await?, start(bed, ns, "b").await?);
    Ok(match one_leader(&[&a, &b], Duration::from_secs(10)).await {
        0 => (a, b),
        _ => (b, a),
    })
}

async fn one_leader(instances: &[&Instance], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let leaders: Vec<usize> = (0..instances.len()).filter(|&i| instances[i].leadership.is_leader()).collect();
        assert!(leaders.len() <= 1, "more than one leader: {leaders:?}");
        if let [leader] = leaders[..] {
            return leader;
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn two_instances_elect_exactly_one_leader() -> anyhow::Result<()> {
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (a, b) = (start(&bed, &ns, "a").await?, start(&bed, &ns, "b").await?);

    let leader = one_leader(&[&a, &b], Duration::from_secs(10)).await;
    let (leader, follower) = if leader == 0 { (&a, &b) } else { (&b, &a) };
    // Stay through two lease durations: renewals keep the leader, and the follower never also leads.
    let until = Instant::now() + 2 * LEASE_DURATION;
    while Instant::now() < until {
        assert!(leader.leadership.is_leader(), "{} stopped leading", leader.identity);
        assert!(!follower.leadership.is_leader(), "{} leads too", follower.identity);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let spec = read_lease(&bed, &ns).await;
    assert_eq!(spec.holder_identity.as_deref(), Some(leader.identity));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert_eq!(spec.lease_transitions, Some(0), "one holder since creation");
    let acquired = spec.acquire_time.expect("acquireTime is set").0;
    let renewed = spec.renew_time.expect("renewTime is set").0;
    assert!(renewed.duration_since(acquired) >= SignedDuration::try_from(LEASE_DURATION)?, "renewed all along");
    assert!(Timestamp::now().duration_since(renewed) < SignedDuration::from_secs(1), "renewed recently");

    a.stop().await;
    b.stop().await;
    Ok(())
}

#[tokio::test]
async fn when_the_leader_dies_without_releasing_the_other_takes_over_within_the_lease_duration() -> anyhow::Result<()> {
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (leader, mut follower) = leader_and_follower(&bed, &ns).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A crash: the task is dropped mid-flight, so nothing releases the lease.
    leader.task.abort();
    let crashed_at = Instant::now();
    assert!(leader.task.await.is_err_and(|e| e.is_cancelled()));
    assert!(!leader.leadership.is_leader(), "a dead election task must not read as leading");
    let held = read_lease(&bed, &ns).await;
    assert_eq!(held.holder_identity.as_deref(), Some(leader.identity), "not released");
    // The dead leader's last renewal that landed (one still in flight carries an earlier stamp than the abort).
    let last_renew = held.renew_time.expect("renewTime is set").0;

    tokio::time::timeout(LEASE_DURATION + Duration::from_secs(10), follower.leadership.wait_until_leader())
        .await
        .map_err(|_| anyhow::anyhow!("{} did not take over", follower.identity))?;
    let took = crashed_at.elapsed();
    let since_renew = Timestamp::now().duration_since(last_renew);
    println!("takeover after {took:?}, {since_renew:?} after the last renewal");
    // Soon after the term ran out: the follower's next try (a retry period) and its read and write, with room
    // for a loaded apiserver's round trips.
    let limit = LEASE_DURATION + RETRY_PERIOD + Duration::from_secs(2);
    assert!(since_renew < SignedDuration::try_from(limit)?, "took over {since_renew:?} after the last renewal");
    // Never before the dead leader's term ran out: a full lease duration after its last renewal, whenever that
    // was (a loaded apiserver delays renewals, so the crash time bounds nothing).
    assert!(
        since_renew >= SignedDuration::try_from(LEASE_DURATION)?,
        "took over {since_renew:?} after the last renewal: before the lease expired"
    );

    let spec = read_lease(&bed, &ns).await;
    assert_eq!(spec.holder_identity.as_deref(), Some(follower.identity));
    assert_eq!(spec.lease_transitions, Some(1));
    follower.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_lease_renewed_by_a_holder_whose_clock_is_an_hour_behind_is_not_taken_until_it_stops_renewing()
-> anyhow::Result<()> {
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    // The holder: another replica whose clock is an hour behind ours, renewing every retry period with its
    // own (old) time, as client-go or this runtime would on that node.
    let api: Api<Lease> = Api::namespaced(bed.client(), &ns);
    let behind = |now: Timestamp| MicroTime(now.checked_sub(SignedDuration::from_hours(1)).unwrap());
    let spec = LeaseSpec {
        holder_identity: Some("skewed".into()),
        acquire_time: Some(behind(Timestamp::now())),
        renew_time: Some(behind(Timestamp::now())),
        lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
        ..Default::default()
    };
    let metadata = kube::api::ObjectMeta { name: Some(LEASE_NAME.into()), ..Default::default() };
    api.create(&Default::default(), &Lease { metadata, spec: Some(spec) }).await?;
    let renewing = CancellationToken::new();
    let holder = {
        let (api, renewing) = (api.clone(), renewing.clone());
        tokio::spawn(async move {
            while !renewing.is_cancelled() {
                if let Ok(mut lease) = api.get(LEASE_NAME).await {
                    lease.spec.as_mut().unwrap().renew_time = Some(behind(Timestamp::now()));
                    let _ = api.replace(LEASE_NAME, &Default::default(), &lease).await;
                }
                tokio::time::sleep(RETRY_PERIOD).await;
            }
        })
    };

    // Our replica reads a renewTime an hour old; by the wall clock the lease expired long ago, but it is
    // being renewed: three lease durations without leading.
    let mut b = start(&bed, &ns, "b").await?;
    let until = Instant::now() + 3 * LEASE_DURATION;
    while Instant::now() < until {
        assert!(!b.leadership.is_leader(), "took over a lease that is being renewed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(b.leadership.is_decided(), "following is a decision");
    assert_eq!(read_lease(&bed, &ns).await.holder_identity.as_deref(), Some("skewed"));

    // The holder stops renewing: taken over once its record stood still for a lease duration.
    renewing.cancel();
    holder.await?;
    let stopped = Instant::now();
    tokio::time::timeout(LEASE_DURATION + Duration::from_secs(10), b.leadership.wait_until_leader()).await?;
    let took = stopped.elapsed();
    println!("taken over {took:?} after the last renewal");
    assert!(took >= LEASE_DURATION - RETRY_PERIOD, "taken over {took:?} after the last renewal");
    b.stop().await;
    Ok(())
}

#[tokio::test]
async fn graceful_shutdown_releases_the_lease_so_the_other_takes_over_at_once() -> anyhow::Result<()> {
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (leader, mut follower) = leader_and_follower(&bed, &ns).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The term as it stands before the stop; a renewal in between only extends it.
    let renewed = read_lease(&bed, &ns).await.renew_time.expect("renewTime is set").0;
    let stopped_at = Instant::now();
    let leader_identity = leader.identity;
    let leader_leadership = leader.leadership.clone();
    leader.stop().await;
    assert!(!leader_leadership.is_leader());

    tokio::time::timeout(LEASE_DURATION + Duration::from_secs(10), follower.leadership.wait_until_leader())
        .await
        .map_err(|_| anyhow::anyhow!("{} did not take over", follower.identity))?;
    println!("takeover after {:?}", stopped_at.elapsed());
    let spec = read_lease(&bed, &ns).await;
    // Without the release the follower could acquire only once the term ran out (renewTime + leaseDuration):
    // acquiring before that proves the release, whatever the apiserver's round trips cost.
    let acquired = spec.acquire_time.clone().expect("acquireTime is set").0;
    let before_expiry = renewed.checked_add(SignedDuration::try_from(LEASE_DURATION)?)?;
    assert!(acquired < before_expiry, "acquired at {acquired}, the released term ran to {before_expiry}");
    assert_eq!(spec.holder_identity.as_deref(), Some(follower.identity));
    assert_ne!(spec.holder_identity.as_deref(), Some(leader_identity));
    assert_eq!(spec.lease_transitions, Some(1));
    follower.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_holder_that_cannot_renew_stops_leading_before_its_lease_could_be_taken() -> anyhow::Result<()> {
    init_tracing();
    let mut bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let mut a = start(&bed, &ns, "a").await?;
    one_leader(&[&a], Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut leading = a.leadership.subscribe();

    // The lease as others last saw it; the holder may renew once more before the kill, only extending it.
    let seen_renew = read_lease(&bed, &ns).await.renew_time.expect("renewTime is set").0;
    let killed_at = Instant::now();
    bed.apiserver.process.kill();

    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| !*l)).await??;
    let (stepped_down_after, stepped_down_wall) = (killed_at.elapsed(), Timestamp::now());
    let since_renew = stepped_down_wall.duration_since(seen_renew);
    println!("stepped down {stepped_down_after:?} after the kill, {since_renew:?} after the last renew seen");
    // Every renew before the kill started before it, so the deadline ran out at most renew_deadline after it.
    // (Slack for timers and a loaded machine, not a margin the claim needs: the claim is the last assertion.)
    assert!(stepped_down_after <= RENEW_DEADLINE + Duration::from_millis(700), "{stepped_down_after:?}");
    // Not at the first failed request: the holder keeps leading through blips shorter than the deadline.
    assert!(stepped_down_after >= RENEW_DEADLINE - RETRY_PERIOD - Duration::from_millis(500));
    assert!(since_renew <= SignedDuration::try_from(RENEW_DEADLINE + RETRY_PERIOD + Duration::from_millis(700))?);
    // The point of it all: others could take the lease only at renewTime + leaseDuration.
    assert!(since_renew < SignedDuration::try_from(LEASE_DURATION)?, "still leading after the lease expired");

    // Errors do not end the election: once the apiserver is back, the same task leads again.
    assert!(!a.task.is_finished());
    bed.apiserver.restart().await?;
    tokio::time::timeout(Duration::from_secs(15), a.leadership.wait_until_leader()).await?;
    assert_eq!(read_lease(&bed, &ns).await.holder_identity.as_deref(), Some("a"));
    a.stop().await;
    Ok(())
}

// The pure decision logic, without any client.

fn ts(s: &str) -> Timestamp {
    s.parse().expect("a valid timestamp")
}

fn held_by(holder: &str, renewed: &str) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        acquire_time: Some(MicroTime(ts("2026-01-01T00:00:00Z"))),
        renew_time: Some(MicroTime(ts(renewed))),
        lease_duration_seconds: Some(15),
        lease_transitions: Some(4),
        ..Default::default()
    }
}

const DEFAULT: Duration = Duration::from_secs(15);

#[test]
fn decide_acquires_when_there_is_no_lease_or_no_holder() {
    assert_eq!(decide(None, "me", Duration::ZERO, DEFAULT), Decision::Acquire { previous: None });
    assert_eq!(
        decide(Some(&LeaseSpec::default()), "me", Duration::ZERO, DEFAULT),
        Decision::Acquire { previous: None }
    );
    let empty = LeaseSpec { holder_identity: Some(String::new()), ..held_by("x", "2026-01-01T00:00:59Z") };
    assert_eq!(decide(Some(&empty), "me", Duration::ZERO, DEFAULT), Decision::Acquire { previous: None });
}

#[test]
fn decide_follows_a_lease_of_another_until_its_record_is_unchanged_for_its_duration() {
    let lease = held_by("other", "2026-01-01T00:01:00Z");
    let follow = |left: Duration| Decision::Follow { holder: "other".into(), expires_in: left };
    assert_eq!(decide(Some(&lease), "me", Duration::ZERO, DEFAULT), follow(Duration::from_secs(15)));
    assert_eq!(decide(Some(&lease), "me", Duration::from_millis(14_999), DEFAULT), follow(Duration::from_millis(1)));
    for unchanged in [Duration::from_secs(15), Duration::from_secs(3600)] {
        assert_eq!(
            decide(Some(&lease), "me", unchanged, DEFAULT),
            Decision::Acquire { previous: Some("other".into()) },
            "unchanged for {unchanged:?}"
        );
    }
}

#[test]
fn decide_follows_a_just_renewed_lease_whatever_time_its_renew_time_states() {
    // A holder whose clock is a year behind ours, or a year ahead: its renewTime says nothing to us; that
    // the record changed does.
    for renewed in ["2025-01-01T00:00:00Z", "2027-01-01T00:00:00Z"] {
        let lease = held_by("other", renewed);
        assert!(matches!(decide(Some(&lease), "me", Duration::from_secs(1), DEFAULT), Decision::Follow { .. }));
    }
}

#[test]
fn decide_renews_its_own_lease_even_when_expired() {
    let lease = held_by("me", "2026-01-01T00:00:00Z");
    assert_eq!(decide(Some(&lease), "me", Duration::from_secs(1), DEFAULT), Decision::Renew);
    assert_eq!(decide(Some(&lease), "me", Duration::from_secs(86_400), DEFAULT), Decision::Renew);
}

#[test]
fn decide_uses_the_default_duration_and_acquire_time_when_fields_are_missing() {
    let no_duration = LeaseSpec { lease_duration_seconds: None, ..held_by("other", "2026-01-01T00:01:00Z") };
    let after = |seconds| decide(Some(&no_duration), "me", Duration::from_secs(seconds), Duration::from_secs(30));
    assert!(matches!(after(29), Decision::Follow { .. }));
    assert!(matches!(after(30), Decision::Acquire { .. }));

    let no_renew = LeaseSpec { renew_time: None, ..held_by("other", "2026-01-01T00:01:00Z") };
    assert_eq!(
        decide(Some(&no_renew), "me", Duration::from_secs(14), DEFAULT),
        Decision::Follow { holder: "other".into(), expires_in: Duration::from_secs(1) }
    );

    // Nothing shows the holder is alive.
    let no_times = LeaseSpec { renew_time: None, acquire_time: None, ..held_by("other", "2026-01-01T00:01:00Z") };
    assert_eq!(
        decide(Some(&no_times), "me", Duration::ZERO, DEFAULT),
        Decision::Acquire { previous: Some("other".into()) }
    );
}

#[test]
fn acquiring_sets_holder_times_duration_and_counts_a_transition() {
    let now = ts("2026-01-01T00:05:00Z");
    let current = LeaseSpec { preferred_holder: Some("p".into()), ..held_by("other", "2026-01-01T00:01:00Z") };
    let decision = decide(Some(&current), "me", Duration::from_secs(15), DEFAULT);
    let spec = decision.next_spec(Some(&current), "me", now, 3).expect("acquiring writes");
    assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    assert_eq!(spec.acquire_time, Some(MicroTime(now)));
    assert_eq!(spec.renew_time, Some(MicroTime(now)));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert_eq!(spec.lease_transitions, Some(5));
    assert_eq!(spec.preferred_holder.as_deref(), Some("p"), "fields we do not manage are kept");

    let fresh = Decision::Acquire { previous: None }.next_spec(None, "me", now, 3).expect("creating writes");
    assert_eq!(fresh.lease_transitions, Some(0), "a new lease has had no transitions");
}

#[test]
fn renewing_moves_only_renew_time_and_duration() {
    let current = held_by("me", "2026-01-01T00:01:00Z");
    let now = ts("2026-01-01T00:01:02Z");
    let spec = Decision::Renew.next_spec(Some(&current), "me", now, 3).expect("renewing writes");
    assert_eq!(spec, LeaseSpec { renew_time: Some(MicroTime(now)), lease_duration_seconds: Some(3), ..current });
}

#[test]
fn following_writes_nothing() {
    let current = held_by("other", "2026-01-01T00:01:00Z");
    let now = ts("2026-01-01T00:01:01Z");
    let decision = decide(Some(&current), "me", Duration::from_secs(1), DEFAULT);
    assert!(matches!(decision, Decision::Follow { .. }));
    assert_eq!(decision.next_spec(Some(&current), "me", now, 3), None);
}

#[test]
fn a_released_lease_is_taken_at_once_and_keeps_its_transition_count() {
    let now = ts("2026-01-01T00:01:01Z");
    let released = released_spec(&held_by("other", "2026-01-01T00:01:00Z"), now);
    assert_eq!(released.holder_identity, None);
    assert_eq!(released.lease_duration_seconds, Some(1));
    assert_eq!(released.renew_time, Some(MicroTime(now)));
    assert_eq!(released.lease_transitions, Some(4));
    assert_eq!(decide(Some(&released), "me", Duration::ZERO, DEFAULT), Decision::Acquire { previous: None });
    let spec = Decision::Acquire { previous: None }.next_spec(Some(&released), "me", now, 3).expect("writes");
    assert_eq!(spec.lease_transitions, Some(5));
}

#[test]
fn config_defaults_are_valid_and_unsafe_timings_are_rejected() {
    let ok = LeaseConfig::new("ns", "lease", "me");
    assert_eq!(ok.validate(), Ok(()));
    assert_eq!(
        (ok.lease_duration, ok.renew_deadline, ok.retry_period),
        (DEFAULT, Duration::from_secs(10), Duration::from_secs(2))
    );
    let bad = |change: fn(&mut LeaseConfig)| {
        let mut c = ok.clone();
        change(&mut c);
        c.validate().expect_err("invalid")
    };
    assert!(bad(|c| c.renew_deadline = c.lease_duration).starts_with("renew_deadline: must be shorter"));
    assert!(bad(|c| c.renew_deadline = c.retry_period).starts_with("renew_deadline: must be longer"));
    assert!(bad(|c| c.lease_duration = Duration::from_millis(15_500)).starts_with("lease_duration:"));
    assert!(bad(|c| c.retry_period = Duration::ZERO).starts_with("retry_period:"));
    assert!(bad(|c| c.identity.clear()).starts_with("identity:"));
}

#[tokio::test]
async fn always_leads_and_waiting_returns_at_once() {
    let mut always = Leadership::always();
    assert!(always.is_leader());
    tokio::time::timeout(Duration::from_millis(100), always.wait_until_leader()).await.expect("returns at once");
    assert!(always.subscribe().has_changed().is_ok(), "the channel stays open");
}

/// A client for a port nobody listens on: every request fails at once.
fn unreachable_client() -> kube::Client {
    testbed::init_crypto();
    let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a valid URL"));
    kube::Client::try_from(config).expect("a client")
}

#[tokio::test]
async fn an_invalid_config_ends_the_task_with_an_error() {
    let bad = LeaseConfig { renew_deadline: Duration::from_secs(20), ..LeaseConfig::new("ns", "lease", "me") };
    let (leadership, task) = lease::spawn(unreachable_client(), bad, CancellationToken::new());
    let result = tokio::time::timeout(Duration::from_secs(5), task).await.expect("ends at once").expect("no panic");
    assert!(matches!(result, Err(LeaseError::Config(ref m)) if m.contains("renew_deadline")), "{result:?}");
    assert!(!leadership.is_leader());
}

#[tokio::test]
async fn apiserver_errors_do_not_end_the_election_only_shutdown_does() {
    init_tracing();
    let shutdown = CancellationToken::new();
    let (leadership, task) = lease::spawn(unreachable_client(), config("ns", "me"), shutdown.clone());
    tokio::time::sleep(4 * RETRY_PERIOD).await;
    assert!(!task.is_finished(), "the election gave up on errors");
    assert!(!leadership.is_leader());
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops on shutdown");
    assert!(matches!(result, Ok(Ok(()))), "{result:?}");
}

/// Waits until `<prefix>_leader` of one instance, as its `/metrics` would show it, reads `expected`.
async fn wait_for_leader_series(registry: &kcp_keeper_runtime::metrics::Registry, expected: &str) {
    let shown = || {
        let text = kcp_keeper_runtime::metrics::encode(registry);
        text.lines().find(|l| l.starts_with("demo_leader ")).unwrap_or_default().to_string()
    };
    let deadline = Instant::now() + LEASE_DURATION + Duration::from_secs(10);
    while shown() != expected {
        assert!(Instant::now() < deadline, "{expected:?} never shown: {:?}", shown());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every daemon exports `<prefix>_leader` from its election, whatever the form of its work (the driver's
/// reconcilers and etcd-snapshotter's schedules alike): the alert on "no replica leads" reads it.
#[tokio::test]
async fn the_leader_series_follows_the_election_on_the_leader_the_follower_and_after_a_handover() -> anyhow::Result<()>
{
    init_tracing();
    let bed = testbed::ControlPlane::start().await?;
    let ns = bed.namespace().await?;
    let (leader, mut follower) = leader_and_follower(&bed, &ns).await?;
    let mut registries = Vec::new();
    for instance in [&leader, &follower] {
        let mut registry = kcp_keeper_runtime::metrics::Registry::with_prefix("demo");
        instance.leadership.export(lease::LeaderMetrics::register(&mut registry));
        registries.push(registry);
    }
    let [led, followed] = &registries[..] else { unreachable!() };
    wait_for_leader_series(led, "demo_leader 1").await;
    wait_for_leader_series(followed, "demo_leader 0").await;
    leader.stop().await;
    wait_for_leader_series(led, "demo_leader 0").await;
    tokio::time::timeout(LEASE_DURATION + Duration::from_secs(10), follower.leadership.wait_until_leader()).await?;
    wait_for_leader_series(followed, "demo_leader 1").await;
    follower.stop().await;
    wait_for_leader_series(followed, "demo_leader 0").await;
    Ok(())
}
