//! Records which release of the compiled-in public roots (`webpki-root-certs`, Mozilla's list) the binary carries,
//! read from the workspace's Cargo.lock, for `ca_syncer_public_roots_info` and `render`.

fn main() {
    // The manifest directory as cargo gives it to this run, not `env!` at this script's compile time: cargo reuses a
    // compiled build script across checkouts of the workspace (its hash is relative to the workspace root), and the
    // images' target directory is shared by every checkout on the machine, so a compiled-in path names another
    // checkout's Cargo.lock, or one that is gone ("unknown" in the shipped image).
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR for build scripts");
    let lock = std::path::Path::new(&manifest_dir).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let version =
        text.split("[[package]]").find(|p| p.lines().any(|l| l.trim() == "name = \"webpki-root-certs\"")).and_then(
            |p| p.lines().find_map(|l| l.trim().strip_prefix("version = \"")?.strip_suffix('"').map(String::from)),
        );
    if version.is_none() {
        println!("cargo:warning=webpki-root-certs not found in {}; its version reads unknown", lock.display());
    }
    println!("cargo:rustc-env=CA_SYNCER_PUBLIC_ROOTS_VERSION={}", version.unwrap_or_else(|| "unknown".into()));
}
