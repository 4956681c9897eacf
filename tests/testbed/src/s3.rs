//! A real S3 server: versitygw with its posix backend, one bucket, static credentials, plain HTTP on loopback.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

use crate::process::{Process, free_port, wait_until};

pub const BUCKET: &str = "kcp-keeper-test";
pub const REGION: &str = "us-east-1";

pub struct S3Server {
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    pub bucket: String,
    pub process: Process,
}

impl S3Server {
    pub async fn start(versitygw: &Path, dir: &Path) -> Result<Self> {
        Self::start_with(versitygw, dir, false).await
    }

    /// As [`Self::start`], with a versioning directory for the posix backend: then versitygw answers a bucket's
    /// versioning status (without one it answers 501; versioning itself stays off until a client turns it on).
    pub async fn start_with_versioning_dir(versitygw: &Path, dir: &Path) -> Result<Self> {
        Self::start_with(versitygw, dir, true).await
    }

    async fn start_with(versitygw: &Path, dir: &Path, versioning_dir: bool) -> Result<Self> {
        let port = free_port()?;
        let data = dir.join("s3-data");
        std::fs::create_dir_all(&data)?;
        let access_key = format!("tb{:016x}", rand::random::<u64>());
        let secret_key = format!("{:032x}", rand::random::<u128>());
        let mut args: Vec<String> = vec![
            "--port".into(),
            format!("127.0.0.1:{port}"),
            "--region".into(),
            REGION.into(),
            "--quiet".into(),
            "posix".into(),
        ];
        if versioning_dir {
            let versions = dir.join("s3-versions");
            std::fs::create_dir_all(&versions)?;
            args.extend(["--versioning-dir".into(), versions.display().to_string()]);
        }
        args.push(data.display().to_string());
        // The root credentials go through the environment so they never show in a process listing.
        let process = Process::start_with_env(
            "versitygw",
            versitygw,
            args,
            &[("ROOT_ACCESS_KEY", access_key.as_str()), ("ROOT_SECRET_KEY", secret_key.as_str())],
            dir.join("versitygw.log"),
        )?;
        let mut server = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            access_key,
            secret_key,
            bucket: BUCKET.into(),
            process,
        };
        let client = server.client();
        wait_until(&mut server.process, Duration::from_secs(30), "ready", || {
            let client = client.clone();
            async move {
                client.list_buckets().send().await?;
                Ok(())
            }
        })
        .await?;
        client.create_bucket().bucket(BUCKET).send().await.context("creating the test bucket")?;
        Ok(server)
    }

    /// An SDK client as S3-compatible stores need it: path-style, static credentials (so the SDK never
    /// probes a cloud metadata endpoint), checksums only where the operation requires them.
    pub fn client(&self) -> aws_sdk_s3::Client {
        client(&self.endpoint, &self.access_key, &self.secret_key)
    }
}

/// [`S3Server::client`] for a store the bed did not start (e.g. the real node's, from inside its network).
pub fn client(endpoint: &str, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        // Plain HTTP on loopback; the SDK has no default client here (the workspace leaves aws-lc out).
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(access_key, secret_key, None, None, "testbed"))
        .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}
