//! Images of peers the node runs as pods (CoreDNS as a cluster runs it), written as docker-archives the way the
//! peers' pause image is: one layer holding one static binary, its config and `manifest.json`. No registry can be
//! reached and no container tool is needed: `ctr images import` takes the archive as is.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// Writes `<dir>/<file name of tag>.tar`: an image `tag` whose only file is `binary` at `/<name>`, run as
/// `user` (numeric, so `runAsNonRoot` can check it) with `entrypoint`.
pub fn single_binary_image(dir: &Path, tag: &str, binary: &Path, name: &str, user: &str) -> Result<PathBuf> {
    let work = dir.join(format!("image-{name}"));
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    std::fs::copy(binary, rootfs.join(name)).with_context(|| format!("copying {}", binary.display()))?;
    let layer = work.join("layer.tar");
    run(Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-cf"])
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .arg(name))?;
    let layer_sha = sha256(&layer)?;
    std::fs::create_dir_all(work.join(&layer_sha))?;
    std::fs::rename(&layer, work.join(&layer_sha).join("layer.tar"))?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": [format!("/{name}")], "User": user},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_sha}")]},
    })
    .to_string();
    let config_file = work.join("config.json");
    std::fs::write(&config_file, &config)?;
    let config_name = format!("{}.json", sha256(&config_file)?);
    std::fs::rename(&config_file, work.join(&config_name))?;
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": [format!("{layer_sha}/layer.tar")],
    }]);
    std::fs::write(work.join("manifest.json"), manifest.to_string())?;
    let archive = dir.join(format!("{name}.tar"));
    run(Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(&work)
        .args(["manifest.json", &config_name, &format!("{layer_sha}/layer.tar")]))?;
    std::fs::remove_dir_all(&work)?;
    Ok(archive)
}

fn sha256(file: &Path) -> Result<String> {
    let out = run(Command::new("sha256sum").arg(file))?;
    let sum = out.split_whitespace().next().unwrap_or_default().to_string();
    ensure!(sum.len() == 64, "sha256sum printed {out:?}");
    Ok(sum)
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    ensure!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
