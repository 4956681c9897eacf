//! The shutdown grace with finish-or-abort hooks, on the job it exists for: a multipart upload to a real S3
//! server (versitygw). A job that finishes within its grace completes its upload and its abort hook never
//! runs; a job that overruns is dropped and its hook aborts the upload, so nothing is left in the bucket. The
//! overrun case is started by a real SIGTERM to this test process, through the runtime's signal handling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Result;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use kcp_keeper_runtime::shutdown::{Grace, JobEnd, finish_or_abort, on_signals};
use tokio_util::sync::CancellationToken;

const KEY: &str = "snapshots/root/0001.db";

/// Only the S3 server: these tests need no apiserver.
async fn start_s3() -> Result<(tempfile::TempDir, testbed::S3Server)> {
    testbed::init_crypto();
    let dir = tempfile::tempdir()?;
    let s3 = testbed::S3Server::start(peers::locate()?.path("versitygw"), dir.path()).await?;
    Ok((dir, s3))
}

/// Multipart uploads the bucket still holds (started, neither completed nor aborted).
async fn open_uploads(s3: &testbed::S3Server) -> Result<usize> {
    let out = s3.client().list_multipart_uploads().bucket(&s3.bucket).send().await?;
    Ok(out.uploads().len())
}

async fn object_exists(s3: &testbed::S3Server) -> bool {
    s3.client().head_object().bucket(&s3.bucket).key(KEY).send().await.is_ok()
}

/// Starts a multipart upload and sends its first part; returns the upload id and the part.
async fn start_upload(s3: &testbed::S3Server) -> Result<(String, CompletedPart)> {
    let client = s3.client();
    let upload = client.create_multipart_upload().bucket(&s3.bucket).key(KEY).send().await?;
    let id = upload.upload_id().expect("an upload id").to_string();
    let part = client
        .upload_part()
        .bucket(&s3.bucket)
        .key(KEY)
        .upload_id(&id)
        .part_number(1)
        .body(ByteStream::from(vec![7u8; 1024]))
        .send()
        .await?;
    let part = CompletedPart::builder().part_number(1).set_e_tag(part.e_tag().map(str::to_string)).build();
    Ok((id, part))
}

async fn abort_upload(s3: &testbed::S3Server, id: &str) {
    s3.client().abort_multipart_upload().bucket(&s3.bucket).key(KEY).upload_id(id).send().await.expect("abort");
}

#[tokio::test]
async fn a_job_that_finishes_within_its_grace_completes_its_upload_and_its_abort_hook_never_runs() -> Result<()> {
    let (_dir, s3) = start_s3().await?;
    let shutdown = CancellationToken::new();
    let aborted = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();

    let job = {
        let (s3, shutdown) = (&s3, shutdown.clone());
        async move {
            let (id, part) = start_upload(s3).await.expect("upload started");
            let _ = started_tx.send(());
            // Still uploading when shutdown starts; the rest takes less than the grace.
            shutdown.cancelled().await;
            let parts = CompletedMultipartUpload::builder().parts(part).build();
            s3.client()
                .complete_multipart_upload()
                .bucket(&s3.bucket)
                .key(KEY)
                .upload_id(&id)
                .multipart_upload(parts)
                .send()
                .await
                .expect("completed");
            "uploaded"
        }
    };
    let abort = || async {
        aborted.store(true, Ordering::SeqCst);
    };
    let grace = Grace { finish: Duration::from_secs(20), abort: Duration::from_secs(10) };
    let guarded = finish_or_abort(&shutdown, grace, job, abort);
    let trigger = async {
        started_rx.await.expect("the job started");
        assert_eq!(open_uploads(&s3).await.expect("listing"), 1, "the upload is in flight at shutdown");
        shutdown.cancel();
    };
    let (end, ()) = tokio::join!(guarded, trigger);

    assert_eq!(end, JobEnd::Finished("uploaded"));
    assert!(!aborted.load(Ordering::SeqCst), "the abort hook must not run for a job that finished");
    assert!(object_exists(&s3).await, "the object was completed");
    assert_eq!(open_uploads(&s3).await?, 0);
    Ok(())
}

#[tokio::test]
async fn sigterm_gives_an_overrunning_upload_its_grace_then_the_abort_hook_aborts_it_in_the_bucket() -> Result<()> {
    let (_dir, s3) = start_s3().await?;
    let shutdown = on_signals()?;
    let upload_id = Arc::new(OnceLock::<String>::new());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();

    let job = {
        let (s3, upload_id) = (&s3, upload_id.clone());
        async move {
            let (id, _part) = start_upload(s3).await.expect("upload started");
            upload_id.set(id).expect("set once");
            let _ = started_tx.send(());
            // A stream that ignores shutdown and never ends: only the grace can stop it.
            std::future::pending::<()>().await;
        }
    };
    let abort = || async {
        let id = upload_id.get().expect("the job recorded its upload");
        abort_upload(&s3, id).await;
    };
    let grace = Grace { finish: Duration::from_millis(500), abort: Duration::from_secs(10) };
    let guarded = finish_or_abort(&shutdown, grace, job, abort);
    let trigger = async {
        started_rx.await.expect("the job started");
        assert_eq!(open_uploads(&s3).await.expect("listing"), 1, "the upload is in flight at shutdown");
        nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    };
    let started = tokio::time::Instant::now();
    let (end, ()) = tokio::join!(guarded, trigger);

    assert_eq!(end, JobEnd::Aborted);
    assert!(started.elapsed() >= grace.finish, "the job got its grace before it was given up");
    assert_eq!(open_uploads(&s3).await?, 0, "the abort hook aborted the upload: nothing is left half-done");
    assert!(!object_exists(&s3).await, "no object appears from an aborted upload");
    Ok(())
}

#[tokio::test]
async fn an_abort_hook_that_hangs_is_bounded_too() {
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    let grace = Grace { finish: Duration::from_millis(50), abort: Duration::from_millis(200) };
    let end = finish_or_abort(&shutdown, grace, std::future::pending::<()>(), std::future::pending::<()>).await;
    assert_eq!(end, JobEnd::AbortTimedOut);
}
