//! `spill`: the memory and disk bounds of the streaming upload.

use std::path::PathBuf;
use std::time::Duration;

use kcp_keeper_runtime::config::FieldError;
use kcp_keeper_runtime::field::{Checked, GoDuration, Parse, duration_within};
use schemars::JsonSchema;
use serde::Deserialize;

/// S3 refuses parts below 5 MiB (except the last).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;

/// How much of a snapshot may sit in memory, and where the rest waits when S3 lags.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawSpill {
    /// Absolute directory for parts that find no memory (and for drills' directories, unless
    /// `drills.directory` says otherwise).
    pub directory: PathBuf,
    /// Bytes of snapshot parts held in memory at most (`64Mi`, `256Mi`, plain bytes).
    pub memory_budget: Checked<Size>,
    /// Multipart part size (5Mi to 5Gi); 8Mi when absent.
    #[serde(default)]
    pub part_size: Option<Checked<Size>>,
    /// Parts uploading at once; the budget must hold one more than this.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1))]
    pub parts_in_flight: usize,
    /// Go-style duration: how long a finished part may wait for memory before it goes to disk instead.
    #[serde(default)]
    pub spill_after: Option<Checked<GoDuration>>,
    /// Bytes of parts a run may hold in the spill directory at once (`2Gi`; at least one part); set it below
    /// the volume's size (an emptyDir's `sizeLimit`). At the cap a finished part waits for memory instead, which
    /// holds etcd's stream back rather than letting the kubelet evict the pod. Unbounded when absent.
    #[serde(default)]
    pub max_bytes: Option<Checked<Size>>,
}

fn default_in_flight() -> usize {
    2
}

/// Memory and disk bounds of the streaming upload.
///
/// By construction at most `memory_parts` finished parts sit in memory (queued or uploading), plus the one
/// being filled: `(memory_parts + 1) * part_size <= memory_budget`. Parts that find no memory within
/// `spill_after` go to `directory` and are uploaded from there. Neither `directory` nor `max_bytes` concerns the
/// second store: its copy (`secondary`) holds one part of `part_size` in memory, beside `memory_budget`, and
/// writes nothing to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    pub directory: PathBuf,
    pub memory_budget: u64,
    /// The snapshot's multipart part size, and the piece the second store's copy streams in.
    pub part_size: u64,
    pub parts_in_flight: usize,
    pub memory_parts: usize,
    pub spill_after: Duration,
    /// At most this many bytes of parts on disk at once (`None`: unbounded).
    pub max_bytes: Option<u64>,
}

pub(super) fn spill(raw: RawSpill, errors: &mut Vec<FieldError>) -> Option<Spill> {
    let before = errors.len();
    // A size that does not parse is an error, and 0 for the checks below.
    let memory_budget = raw.memory_budget.value("spill.memoryBudget", errors).map_or(0, |s| s.0);
    let part_size = raw.part_size.map_or(8 * 1024 * 1024, |s| s.value("spill.partSize", errors).map_or(0, |s| s.0));
    let max_bytes = raw.max_bytes.map(|s| s.value("spill.maxBytes", errors).map_or(0, |s| s.0));
    if !raw.directory.is_absolute() {
        errors.push(FieldError::new("spill.directory", "must be an absolute path"));
    }
    if part_size != 0 && part_size < MIN_PART_SIZE {
        errors.push(FieldError::new("spill.partSize", "must be at least 5Mi (S3's smallest part)"));
    }
    if part_size > 5 * 1024 * 1024 * 1024 {
        errors.push(FieldError::new("spill.partSize", "must be at most 5Gi (S3's largest part)"));
    }
    if raw.parts_in_flight == 0 {
        errors.push(FieldError::new("spill.partsInFlight", "must be at least 1"));
    }
    // Any duration: the range is the whole type, so the message stays this field's own.
    let spill_after = duration_within(
        raw.spill_after,
        Duration::ZERO..=Duration::MAX,
        Duration::from_secs(1),
        "spill.spillAfter",
        "must be a Go duration like 500ms",
        errors,
    );
    if let Some(max) = max_bytes
        && max != 0
        && max < part_size
    {
        errors.push(FieldError::new("spill.maxBytes", "must hold at least one part (maxBytes >= partSize)"));
    }
    // One part is always being filled; the rest of the budget holds finished parts.
    let memory_parts = memory_budget.checked_div(part_size).unwrap_or(0).saturating_sub(1) as usize;
    if errors.len() == before && memory_parts < raw.parts_in_flight {
        errors.push(FieldError::new(
            "spill.memoryBudget",
            "must hold partsInFlight + 1 parts (memoryBudget >= (partsInFlight + 1) * partSize)",
        ));
    }
    (errors.len() == before).then_some(Spill {
        directory: raw.directory,
        memory_budget,
        part_size,
        parts_in_flight: raw.parts_in_flight,
        memory_parts,
        spill_after,
        max_bytes,
    })
}

/// A size as [`parse_size`] reads it (`64Mi`, plain bytes), for a [`Checked`] raw field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Parse for Size {
    fn parse(text: &str) -> Result<Self, String> {
        parse_size(text).map(Size).map_err(Into::into)
    }
}

/// `64Mi`, `1Gi`, `512Ki`, `10M`, or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, &'static str> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| "must be a size like 64Mi")?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err("unknown unit (use Ki, Mi, Gi, K, M or G)"),
    };
    n.checked_mul(factor).ok_or("too large")
}
