//! The supply chain: what the workspace's crates are allowed to be, and what the images say they carry.
//!
//! - [`check`], the `supply chain` step of `cargo xtask test` (after `house`): cargo-deny over the workspace's
//!   crate graph with deny.toml: licenses on the allowed list, no second version of a crate unless deny.toml lists
//!   it as not avoidable yet, crates from the crates registry only, and no RustSec advisory against a crate we
//!   use. All offline: the advisory database is the pinned snapshot in the third-party directory
//!   ([`ADVISORY_DB`]), unpacked once into the machine cache ([`ensure_advisory_db`]).
//! - [`check_sboms`], run by `cargo xtask images` right after its static build: each agent's SBOM
//!   (`publish::sbom_for`, what `cargo xtask publish` attaches to the image) lists every crate compiled into the
//!   agent's binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::prereqs::MUSL_TARGET;

/// A pinned snapshot of the RustSec advisory database: `git archive --prefix=advisory-db/` of one commit of the
/// database's repository, in `<third-party dir>/<dir>/<archive>` (its README.md there says where it comes from).
pub struct Snapshot {
    /// The directory in the third-party directory.
    pub dir: &'static str,
    pub archive: &'static str,
    pub sha256: &'static str,
    /// The database's commit the archive holds.
    pub commit: &'static str,
    /// That commit's time (the archive's file times), RFC 3339 and in seconds since the epoch.
    pub committed: &'static str,
    pub committed_epoch: u64,
}

/// The snapshot the advisory check reads. A newer one is a new archive in the third-party directory and a new pin
/// here; the cache then unpacks it in place of this one.
pub const ADVISORY_DB: Snapshot = Snapshot {
    dir: "rustsec-advisory-db-2026-08-21",
    archive: "advisory-db-bf5c0d2.tar.gz",
    sha256: "4d880987ef1de9f8908e24ddcd3ae3b943abedfbc1fbab002742e1089b441531",
    commit: "bf5c0d245a92671908518d7e765914d437954ed6",
    committed: "2026-08-21T06:28:40Z",
    committed_epoch: 1_787_293_720,
};

/// Where cargo-deny (0.20, `prereqs::CARGO_DENY_VERSION`) looks for the default advisory database under its
/// `db-path`: the URL's last path segment and the XxHash64 (seed 0xca80de71) of the lower-cased URL, as its
/// `url_to_db_path` names it. deny.toml names no database URL, so cargo-deny looks for the default one here.
pub const CARGO_DENY_DB_DIR: &str = "advisory-db-3157b0e258782691";

/// The file in the unpacked database's `.git` that says which archive it was unpacked from.
const STAMP: &str = "kcp-keeper-snapshot";

/// `$KCP_KEEPER_CACHE/advisory-dbs`, deny.toml's `db-path`, with `snapshot` unpacked in it as cargo-deny reads a
/// database: a git repository (cargo-deny takes the database's age from `git show -s --format=%cI HEAD` in it
/// when it did not fetch it, and fails where there is no repository), made here of one commit of the unpacked
/// tree at the upstream commit's time. Done once per cache and snapshot; the archive's sha256 is checked first.
pub fn ensure_advisory_db(snapshot: &Snapshot, third_party: &Path, cache: &Path) -> Result<PathBuf> {
    let dbs = cache.join("advisory-dbs");
    let db = dbs.join(CARGO_DENY_DB_DIR);
    let stamp_path = db.join(".git").join(STAMP);
    let stamp = format!("{} {}\n", snapshot.archive, snapshot.sha256);
    let current = || std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp);
    if current() {
        return Ok(dbs);
    }
    let short = &snapshot.commit[..7];
    let _lock = peers::lock_peer(&dbs, "advisory-db", short)?;
    if current() {
        return Ok(dbs);
    }
    let archive = third_party.join(snapshot.dir).join(snapshot.archive);
    ensure!(
        archive.is_file(),
        "{} is missing: the advisory check reads this pinned snapshot of the RustSec database (set \
         KCP_KEEPER_THIRD_PARTY to the directory holding {}/)",
        archive.display(),
        snapshot.dir
    );
    let actual = sha256(&archive)?;
    ensure!(
        actual == snapshot.sha256,
        "{} has sha256 {actual}, the pin says {}: refusing to use it",
        archive.display(),
        snapshot.sha256
    );
    let scratch = dbs.join(format!(".build-advisory-db-{}", std::process::id()));
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)?;
    }
    std::fs::create_dir_all(&scratch)?;
    let mut tar = Command::new("tar");
    tar.arg("-xzf").arg(&archive).arg("-C").arg(&scratch);
    run(tar, "unpacking the advisory database")?;
    let tree = scratch.join("advisory-db");
    ensure!(tree.join("crates").is_dir(), "{} did not unpack into advisory-db/crates/", archive.display());
    let git = |args: &[&str]| {
        let mut cmd = Command::new("git");
        cmd.arg("-C").arg(&tree).args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "user.name=cargo xtask",
            "-c",
            "user.email=xtask@kcp-keeper.invalid",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.hooksPath=/dev/null",
        ]);
        cmd.args(args).env("GIT_AUTHOR_DATE", snapshot.committed).env("GIT_COMMITTER_DATE", snapshot.committed);
        cmd
    };
    run(git(&["init", "--quiet"]), "git init in the advisory database")?;
    run(git(&["add", "--all"]), "git add in the advisory database")?;
    let message =
        format!("RustSec advisory-db {} ({}), unpacked from {}", snapshot.commit, snapshot.committed, snapshot.archive);
    run(git(&["commit", "--quiet", "--message", &message]), "git commit in the advisory database")?;
    std::fs::write(tree.join(".git").join(STAMP), &stamp)?;
    if db.exists() {
        std::fs::remove_dir_all(&db)?;
    }
    std::fs::rename(&tree, &db)?;
    std::fs::remove_dir_all(&scratch)?;
    eprintln!("xtask: unpacked the RustSec advisory database {short} of {} into {}", snapshot.committed, db.display());
    Ok(dbs)
}

fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(path).output().context("starting sha256sum")?;
    ensure!(out.status.success(), "sha256sum {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.split_whitespace().next().unwrap_or_default().to_string())
}

fn run(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    ensure!(out.status.success(), "{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// `cargo deny` on the workspace at `root` with its deny.toml, offline (no crate, index or database is fetched),
/// the advisory database found through `KCP_KEEPER_CACHE` (deny.toml's `db-path`).
fn cargo_deny(root: &Path, cache: &Path) -> Command {
    let mut cmd = crate::cargo(&["deny", "--offline", "--locked", "--color", "never"]);
    cmd.arg("--manifest-path").arg(root.join("Cargo.toml")).arg("--config").arg(root.join("deny.toml"));
    cmd.env("KCP_KEEPER_CACHE", cache).current_dir(root);
    cmd
}

/// The target deny.toml's `[graph] targets` names: cargo-deny reads the crates of this target's graph.
const DENY_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Downloads the crates cargo-deny reads (every crate's manifest, for [`DENY_TARGET`]) when some are missing, as
/// the build would: the step runs before anything is built, and cargo-deny itself runs offline. Where every crate
/// is there already (any machine that built the workspace once), nothing is fetched.
fn fetch_crates(root: &Path) -> Result<()> {
    let fetch = |offline: bool| {
        let mut cmd = crate::cargo(&["fetch", "--locked", "--target", DENY_TARGET]);
        cmd.arg("--manifest-path").arg(root.join("Cargo.toml"));
        if offline {
            cmd.arg("--offline");
        }
        cmd
    };
    if fetch(true).output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    eprintln!("xtask: some crates of the workspace are not downloaded yet; fetching them (cargo-deny reads them)");
    crate::step("cargo fetch", fetch(false))
}

/// The `supply chain` step: cargo-deny installed if missing, the advisory database unpacked if missing, then
/// `cargo deny check` (licenses, bans, sources, advisories). Its report is printed when it fails; when it passes,
/// its warnings, the duplicates deny.toml lets through and the database's age.
pub fn check(root: &Path) -> Result<()> {
    crate::prereqs::ensure_cargo_deny()?;
    crate::step_with("supply chain (cargo deny: licenses, duplicate versions, sources, advisories)", || {
        let cache = peers::cache_root();
        ensure_advisory_db(&ADVISORY_DB, &peers::third_party_dir(), &cache)?;
        fetch_crates(root)?;
        let out = cargo_deny(root, &cache).arg("check").output().context("starting cargo deny")?;
        let report = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            eprintln!("{report}");
            bail!(
                "cargo deny check failed ({}): its report is above; deny.toml says what is allowed and why \
                 (an advisory with a fixed version within semver: `cargo update -p <crate>`; one without: an \
                 `ignore` entry with its reason)",
                out.status
            );
        }
        for line in report.lines().filter(|l| l.starts_with("warning[")) {
            eprintln!("xtask: cargo deny: {}", line.trim());
        }
        let mut skipped = skipped_duplicates(&std::fs::read_to_string(root.join("deny.toml"))?);
        skipped.sort();
        skipped.dedup();
        if !skipped.is_empty() {
            eprintln!(
                "xtask: warning: {} crates are in two or more versions, each pulled in by dependencies that have \
                 not moved yet (deny.toml [bans] skip says which and why): {}",
                skipped.len(),
                skipped.join(", ")
            );
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        eprintln!(
            "xtask: advisories from the RustSec database at {} of {}, {} days old (a pinned snapshot: newer \
             advisories are not in it)",
            &ADVISORY_DB.commit[..7],
            ADVISORY_DB.committed,
            now.saturating_sub(ADVISORY_DB.committed_epoch) / 86_400
        );
        Ok(())
    })
}

/// The crates named in deny.toml's `[bans] skip` list (`{ crate = "name:version", ... }` lines).
pub fn skipped_duplicates(deny_toml: &str) -> Vec<String> {
    let mut inside = false;
    let mut names = Vec::new();
    for line in deny_toml.lines().map(str::trim) {
        if line.starts_with("skip = [") {
            inside = true;
        } else if inside && line.starts_with(']') {
            break;
        } else if inside && let Some(rest) = line.split_once("crate = \"").map(|(_, rest)| rest) {
            names.push(rest.split(['"', ':', '@']).next().unwrap_or_default().to_string());
        }
    }
    names
}

/// A crate: its package name and version.
pub type Crate = (String, String);

/// The package of a cargo package ID: `registry+<index>#name@1.2.3`, `path+file:///.../name#name@1.2.3`, or
/// `path+file:///.../name#1.2.3` (the name then is the directory's).
fn package_of(id: &str) -> Option<Crate> {
    let (source, spec) = id.rsplit_once('#')?;
    match spec.split_once('@') {
        Some((name, version)) => Some((name.to_string(), version.to_string())),
        None => {
            let name = source.split(['?', '#']).next()?.trim_end_matches('/').rsplit('/').next()?;
            Some((name.to_string(), spec.to_string()))
        }
    }
}

/// The crates that a cargo build's JSON messages (`--message-format=json...`) show compiled as libraries for
/// `target`: what the binaries for that target link. Proc-macros and build scripts are compiled for the host (and
/// only their output goes into a binary, as code or as files); their artifacts lie outside `<target-dir>/<target>/`
/// and are in no binary, nor are the host builds of crates that both sides use.
pub fn compiled_for_target(messages: &str, target: &str) -> Result<BTreeSet<Crate>> {
    let marker = format!("/{target}/");
    let mut crates = BTreeSet::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let message: serde_json::Value = serde_json::from_str(line).context("a cargo JSON message")?;
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let kinds: Vec<&str> =
            message["target"]["kind"].as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
        let library = kinds.iter().any(|k| matches!(*k, "lib" | "rlib" | "staticlib"));
        let for_target = message["filenames"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f.as_str().is_some_and(|f| f.contains(&marker)));
        if library && for_target {
            let id = message["package_id"].as_str().context("a compiler-artifact without package_id")?;
            crates.insert(package_of(id).with_context(|| format!("cannot read the package ID {id}"))?);
        }
    }
    Ok(crates)
}

/// Each root's crates (itself left out) from `cargo tree --prefix depth --format '{p}'` over several roots: one
/// graph, as one build of those roots resolves it. cargo tree expands each crate's dependencies once over the
/// whole output (later occurrences end in `(*)`), so the edges are gathered from every root's tree first, and
/// each root's closure walked after.
pub fn crates_per_root(tree: &str) -> Result<BTreeMap<String, BTreeSet<Crate>>> {
    let mut edges: BTreeMap<Crate, BTreeSet<Crate>> = BTreeMap::new();
    let mut roots = Vec::new();
    let mut path: Vec<Crate> = Vec::new();
    for line in tree.lines().filter(|l| !l.trim().is_empty()) {
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        let depth: usize =
            line[..digits].parse().with_context(|| format!("no depth in the cargo tree line {line:?}"))?;
        let mut fields = line[digits..].split_whitespace();
        let (Some(name), Some(version)) = (fields.next(), fields.next().and_then(|v| v.strip_prefix('v'))) else {
            bail!("cannot read the cargo tree line {line:?}");
        };
        let krate = (name.to_string(), version.to_string());
        ensure!(depth <= path.len(), "the cargo tree line {line:?} is deeper than the line above it allows");
        path.truncate(depth);
        match path.last() {
            Some(parent) => {
                edges.entry(parent.clone()).or_default().insert(krate.clone());
            }
            None => roots.push(krate.clone()),
        }
        path.push(krate);
    }
    let mut per_root = BTreeMap::new();
    for root in roots {
        let mut seen = BTreeSet::new();
        let mut stack = vec![root.clone()];
        while let Some(krate) = stack.pop() {
            for dep in edges.get(&krate).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    stack.push(dep.clone());
                }
            }
        }
        seen.remove(&root);
        per_root.insert(root.0, seen);
    }
    Ok(per_root)
}

/// How one agent's SBOM covers its binary.
#[derive(Debug)]
pub struct Coverage {
    pub agent: String,
    /// Crates compiled into the binary.
    pub linked: usize,
    /// Crates the SBOM lists.
    pub components: usize,
    /// Listed crates not in the binary: proc-macros and what only they use, read from `cargo metadata`'s graph,
    /// which does not tell a proc-macro from a library.
    pub not_linked: Vec<String>,
}

/// Compares, for each agent, the SBOM's crates with the crates compiled into its static binary: `messages` are
/// the JSON messages of the images' build (`cargo build --release --target <musl> --bins -p <each agent>`), which
/// name what was compiled for the target; `cargo tree` over the same packages says which agent links which of
/// them. Fails when an SBOM misses a linked crate, or when the two sources disagree.
pub fn check_sboms(root: &Path, messages: &str) -> Result<Vec<Coverage>> {
    let built = compiled_for_target(messages, MUSL_TARGET)?;
    ensure!(!built.is_empty(), "the build's messages name no crate compiled for {MUSL_TARGET}");
    let mut tree = crate::cargo(&[
        "tree",
        "--locked",
        "--offline",
        "--target",
        MUSL_TARGET,
        "--edges",
        "normal,no-proc-macro",
        "--prefix",
        "depth",
        "--format",
        "{p}",
    ]);
    tree.arg("--manifest-path").arg(root.join("Cargo.toml")).current_dir(root);
    for agent in crate::images::AGENTS {
        tree.args(["--package", agent]);
    }
    let out = tree.output().context("starting cargo tree")?;
    ensure!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let per_root = crates_per_root(&String::from_utf8_lossy(&out.stdout))?;
    let mut listed = BTreeMap::new();
    for agent in crate::images::AGENTS {
        let sbom = crate::publish::sbom_for(root, agent, "0.0.0")?;
        let crates: BTreeSet<Crate> = sbom["components"]
            .as_array()
            .context("the SBOM's components")?
            .iter()
            .filter(|c| c["purl"].as_str().is_some_and(|p| p.starts_with("pkg:cargo/")))
            .filter_map(|c| Some((c["name"].as_str()?.to_string(), c["version"].as_str()?.to_string())))
            .collect();
        listed.insert(agent.to_string(), crates);
    }
    coverage(&crate::images::AGENTS, &built, &per_root, &listed)
}

/// [`check_sboms`]'s comparison: `built`, the crates compiled for the target; `per_root`, each agent's linked
/// crates by cargo tree; `listed`, each agent's SBOM's crates.
fn coverage(
    agents: &[&str],
    built: &BTreeSet<Crate>,
    per_root: &BTreeMap<String, BTreeSet<Crate>>,
    listed: &BTreeMap<String, BTreeSet<Crate>>,
) -> Result<Vec<Coverage>> {
    let show = |crates: &mut dyn Iterator<Item = &Crate>| crates.map(|(n, v)| format!("{n}@{v}")).collect::<Vec<_>>();
    let mut coverage = Vec::new();
    let mut problems = Vec::new();
    let mut linked_anywhere = BTreeSet::new();
    for agent in agents {
        let linked = per_root.get(*agent).with_context(|| format!("cargo tree printed no tree for {agent}"))?;
        let listed = listed.get(*agent).with_context(|| format!("no SBOM for {agent}"))?;
        let not_built = show(&mut linked.difference(built));
        if !not_built.is_empty() {
            problems.push(format!(
                "cargo tree says {agent} links {}, which the build did not compile for {MUSL_TARGET}",
                not_built.join(", ")
            ));
        }
        let missing = show(&mut linked.difference(listed));
        if !missing.is_empty() {
            problems.push(format!(
                "{agent}'s SBOM misses {} crate(s) of its binary: {}",
                missing.len(),
                missing.join(", ")
            ));
        }
        let not_linked = show(&mut listed.difference(linked));
        linked_anywhere.extend(linked.iter().cloned());
        coverage.push(Coverage {
            agent: agent.to_string(),
            linked: linked.len(),
            components: listed.len(),
            not_linked,
        });
    }
    // The agents' own crates are the SBOMs' subjects, not components.
    let unexplained =
        show(&mut built.difference(&linked_anywhere).filter(|(name, _)| !agents.contains(&name.as_str())));
    if !unexplained.is_empty() {
        problems.push(format!(
            "the build compiled {} for {MUSL_TARGET}, but cargo tree puts it in no agent's binary",
            unexplained.join(", ")
        ));
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(coverage)
}

/// [`check_sboms`] as a step of `cargo xtask images`, one line per agent.
pub fn sbom_step(root: &Path, messages: &Path) -> Result<()> {
    crate::step_with("each agent's SBOM lists every crate in its binary", || {
        let messages = std::fs::read_to_string(messages).with_context(|| format!("reading {}", messages.display()))?;
        for c in check_sboms(root, &messages)? {
            eprintln!(
                "xtask: {}: {} crates in the binary, all in its SBOM ({} components; {} not linked: proc-macros \
                 and what only they use)",
                c.agent,
                c.linked,
                c.components,
                c.not_linked.len()
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_ids_of_registry_and_path_crates_give_name_and_version() {
        let krate = |n: &str, v: &str| Some((n.to_string(), v.to_string()));
        assert_eq!(package_of("registry+https://example.invalid/index#tokio@1.54.1"), krate("tokio", "1.54.1"));
        assert_eq!(
            package_of("path+file:///w/agents/runtime#kcp-keeper-runtime@0.2.0"),
            krate("kcp-keeper-runtime", "0.2.0")
        );
        assert_eq!(package_of("path+file:///w/agents/ca-syncer#0.2.0"), krate("ca-syncer", "0.2.0"));
        assert_eq!(package_of("no-fragment"), None);
    }

    #[test]
    fn only_libraries_compiled_for_the_target_count_as_in_the_binary() {
        let artifact = |id: &str, kind: &str, file: &str| {
            serde_json::json!({
                "reason": "compiler-artifact", "package_id": id, "target": {"kind": [kind]}, "filenames": [file],
            })
            .to_string()
        };
        let messages = [
            artifact(
                "registry+https://example.invalid/index#tokio@1.54.1",
                "lib",
                "/t/x86_64-unknown-linux-musl/release/deps/libtokio-1.rlib",
            ),
            // The host's build of a crate both sides use, a proc-macro and a build script: not in the binary.
            artifact("registry+https://example.invalid/index#memchr@2.8.3", "lib", "/t/release/deps/libmemchr-2.rlib"),
            artifact(
                "registry+https://example.invalid/index#serde_derive@1.0.229",
                "proc-macro",
                "/t/release/deps/libserde_derive-3.so",
            ),
            artifact(
                "registry+https://example.invalid/index#ring@0.17.14",
                "custom-build",
                "/t/release/build/ring-4/build-script-build",
            ),
            artifact(
                "registry+https://example.invalid/index#ring@0.17.14",
                "lib",
                "/t/x86_64-unknown-linux-musl/release/deps/libring-5.rlib",
            ),
            // The binary itself, and messages of other kinds.
            artifact("path+file:///w/agents/ca-syncer#0.2.0", "bin", "/t/x86_64-unknown-linux-musl/release/ca-syncer"),
            r#"{"reason":"build-script-executed","package_id":"registry+https://example.invalid/index#ring@0.17.14"}"#
                .into(),
            r#"{"reason":"build-finished","success":true}"#.into(),
        ]
        .join("\n");
        let crates = compiled_for_target(&messages, MUSL_TARGET).unwrap();
        let names: Vec<&str> = crates.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["ring", "tokio"]);
    }

    #[test]
    fn each_root_gets_its_whole_closure_though_cargo_tree_expands_a_crate_once() {
        // b's dependencies are printed under a only; under r2, b is marked (*).
        let tree = "0r1 v0.2.0 (/w/r1)\n1a v1.0.0\n2b v2.0.0\n3c v3.0.0\n1d v4.0.0\n\n0r2 v0.2.0 (/w/r2)\n1b v2.0.0 (*)\n1r1 v0.2.0 (/w/r1) (*)\n";
        let per_root = crates_per_root(tree).unwrap();
        let names = |root: &str| per_root[root].iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names("r1"), ["a", "b", "c", "d"]);
        assert_eq!(names("r2"), ["a", "b", "c", "d", "r1"]);
        assert!(crates_per_root("2deep v1.0.0\n").is_err(), "a line deeper than its parent allows");
        assert!(crates_per_root("x\n").is_err());
    }

    #[test]
    fn an_sbom_missing_a_linked_crate_fails_and_build_only_components_are_counted_apart() {
        let set = |names: &[&str]| names.iter().map(|n| (n.to_string(), "1.0.0".to_string())).collect::<BTreeSet<_>>();
        let built = set(&["a", "b", "agent"]);
        let per_root = BTreeMap::from([("agent".to_string(), set(&["a", "b"]))]);
        let full = BTreeMap::from([("agent".to_string(), set(&["a", "b", "serde_derive"]))]);
        let covered = coverage(&["agent"], &built, &per_root, &full).unwrap();
        assert_eq!((covered[0].linked, covered[0].components), (2, 3));
        assert_eq!(covered[0].not_linked, ["serde_derive@1.0.0"]);

        let short = BTreeMap::from([("agent".to_string(), set(&["a"]))]);
        let err = coverage(&["agent"], &built, &per_root, &short).unwrap_err().to_string();
        assert!(err.contains("agent's SBOM misses 1 crate(s) of its binary: b@1.0.0"), "{err}");
        // The two sources must agree: a crate cargo tree links but the build did not compile, and the reverse.
        let err = coverage(&["agent"], &set(&["a"]), &per_root, &full).unwrap_err().to_string();
        assert!(err.contains("did not compile"), "{err}");
        let err = coverage(&["agent"], &set(&["a", "b", "c"]), &per_root, &full).unwrap_err().to_string();
        assert!(err.contains("c@1.0.0") && err.contains("no agent's binary"), "{err}");
    }

    #[test]
    fn deny_tomls_skipped_duplicates_are_listed_by_name_and_its_target_is_the_one_fetched() {
        let deny_toml = std::fs::read_to_string(crate::images::workspace_root().join("deny.toml")).unwrap();
        assert!(deny_toml.contains(&format!("targets = [\"{DENY_TARGET}\"]")), "deny.toml's [graph] targets");
        let skipped = skipped_duplicates(&deny_toml);
        assert!(skipped.contains(&"digest".to_string()), "{skipped:?}");
        assert!(skipped.iter().all(|s| !s.is_empty() && !s.contains([':', '"'])), "{skipped:?}");
        let toml = "[bans]\nskip = [\n    # why\n    { crate = \"a:0.1\", reason = \"x\" },\n    { crate = \"b@1.2.3\" },\n]\n[sources]\nx = { crate = \"c\" }\n";
        assert_eq!(skipped_duplicates(toml), ["a", "b"]);
    }

    #[test]
    fn the_advisory_snapshot_is_unpacked_once_as_a_git_repository_and_a_wrong_archive_is_refused() {
        let cache = tempfile::tempdir().unwrap();
        let dbs = ensure_advisory_db(&ADVISORY_DB, &peers::third_party_dir(), cache.path()).unwrap();
        let db = dbs.join(CARGO_DENY_DB_DIR);
        assert!(db.join("crates").join("ring").is_dir(), "{}", db.display());
        let head =
            Command::new("git").arg("-C").arg(&db).args(["show", "-s", "--format=%cI", "HEAD"]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&head.stdout).trim(), "2026-08-21T06:28:40+00:00", "cargo-deny reads this");
        // A second call finds it by its stamp and changes nothing.
        std::fs::write(db.join("marker"), "").unwrap();
        ensure_advisory_db(&ADVISORY_DB, &peers::third_party_dir(), cache.path()).unwrap();
        assert!(db.join("marker").exists(), "unpacked again");

        let other = tempfile::tempdir().unwrap();
        let wrong = Snapshot { sha256: "00", ..ADVISORY_DB };
        let err = ensure_advisory_db(&wrong, &peers::third_party_dir(), other.path()).unwrap_err().to_string();
        assert!(err.contains("refusing"), "{err}");
        let err = ensure_advisory_db(&ADVISORY_DB, other.path(), other.path()).unwrap_err().to_string();
        assert!(err.contains("KCP_KEEPER_THIRD_PARTY"), "{err}");
    }

    /// The workspace's metadata with ring at 0.17.5, before the fix of RUSTSEC-2025-0009 (patched: >= 0.17.12).
    fn metadata_with_an_old_ring(root: &Path) -> serde_json::Value {
        let out = crate::cargo(&[
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--offline",
            "--filter-platform",
            "x86_64-unknown-linux-gnu",
        ])
        .current_dir(root)
        .output()
        .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ring = metadata["packages"].as_array().unwrap().iter().find(|p| p["name"] == "ring").unwrap();
        let old_id = ring["id"].as_str().unwrap().to_string();
        let new_id = old_id.replace(&format!("ring@{}", ring["version"].as_str().unwrap()), "ring@0.17.5");
        let id = |v: &mut serde_json::Value| {
            if v.as_str() == Some(old_id.as_str()) {
                *v = new_id.clone().into();
            }
        };
        for package in metadata["packages"].as_array_mut().unwrap() {
            if package["name"] == "ring" {
                package["version"] = "0.17.5".into();
                id(&mut package["id"]);
            }
            for dep in package["dependencies"].as_array_mut().unwrap() {
                if dep["name"] == "ring" {
                    dep["req"] = "^0.17".into();
                }
            }
        }
        for node in metadata["resolve"]["nodes"].as_array_mut().unwrap() {
            id(&mut node["id"]);
            node["dependencies"].as_array_mut().unwrap().iter_mut().for_each(id);
            node["deps"].as_array_mut().unwrap().iter_mut().for_each(|d| id(&mut d["pkg"]));
        }
        metadata
    }

    #[test]
    fn the_pinned_database_is_the_one_read_and_flags_a_ring_older_than_its_fix() {
        crate::prereqs::ensure_cargo_deny().unwrap();
        let root = crate::images::workspace_root();
        let cache = peers::cache_root();
        ensure_advisory_db(&ADVISORY_DB, &peers::third_party_dir(), &cache).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let metadata = dir.path().join("metadata.json");
        std::fs::write(&metadata, metadata_with_an_old_ring(&root).to_string()).unwrap();
        let out = cargo_deny(&root, &cache)
            .arg("--metadata-path")
            .arg(&metadata)
            .args(["check", "advisories"])
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "an affected ring passed: {report}");
        assert!(report.contains("RUSTSEC-2025-0009"), "{report}");
    }

    #[test]
    fn the_workspace_passes_the_supply_chain_step() {
        // The step as `cargo xtask test` runs it: `cargo test -p xtask supply_chain` runs it alone.
        check(&crate::images::workspace_root()).unwrap();
    }
}
