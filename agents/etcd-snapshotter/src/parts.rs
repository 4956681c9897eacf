//! How a snapshot is cut into multipart parts: S3 takes at most 10,000 parts per upload, so a database that
//! would need more at `spill.partSize` gets larger parts, as long as the memory budget still holds
//! `partsInFlight + 1` of them; otherwise the run is refused before anything is uploaded, saying what to raise.
//! Pure: the caller knows the database's size from etcd's first message.

use crate::config::Spill;

/// S3's limit on parts per multipart upload.
pub const MAX_PARTS: u64 = 10_000;
/// S3's largest part.
const MAX_PART_SIZE: u64 = 5 << 30;
const MIB: u64 = 1 << 20;

/// The part size and the finished parts memory holds for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    pub part_size: u64,
    pub memory_parts: usize,
}

/// The stored object's size at most, for a database of `db_size` bytes: zstd on incompressible data and age's
/// per-chunk tags add well under 1%, plus headers.
fn object_bound(db_size: u64) -> u64 {
    db_size + db_size / 100 + MIB
}

/// The parts for a database of `db_size` bytes under `spill`.
pub fn plan(db_size: u64, spill: &Spill) -> Result<Parts, String> {
    let configured = Parts { part_size: spill.part_size, memory_parts: spill.memory_parts };
    let needed = object_bound(db_size).div_ceil(MAX_PARTS);
    if needed <= spill.part_size {
        return Ok(configured);
    }
    let part_size = needed.div_ceil(MIB) * MIB;
    let memory_parts = (spill.memory_budget / part_size).saturating_sub(1) as usize;
    if part_size > MAX_PART_SIZE || memory_parts < spill.parts_in_flight {
        return Err(format!(
            "the database ({db_size} bytes) needs more than {MAX_PARTS} parts of spill.partSize ({} bytes): it \
             needs parts of at least {part_size} bytes, and spill.memoryBudget ({} bytes) must hold partsInFlight + \
             1 of them: raise spill.memoryBudget to at least {} bytes (or partsInFlight lower)",
            spill.part_size,
            spill.memory_budget,
            (spill.parts_in_flight as u64 + 1) * part_size
        ));
    }
    Ok(Parts { part_size, memory_parts })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn spill(memory_budget: u64, part_size: u64) -> Spill {
        Spill {
            directory: "/spill".into(),
            memory_budget,
            part_size,
            parts_in_flight: 2,
            memory_parts: (memory_budget / part_size - 1) as usize,
            spill_after: Duration::from_secs(1),
            max_bytes: None,
        }
    }

    #[test]
    fn a_database_within_ten_thousand_parts_keeps_the_configured_size() {
        let s = spill(64 * MIB, 8 * MIB);
        assert_eq!(plan(8 << 30, &s), Ok(Parts { part_size: 8 * MIB, memory_parts: 7 }));
    }

    #[test]
    fn a_larger_database_gets_larger_parts_that_never_exceed_ten_thousand_and_fit_the_budget() {
        // 100 GiB at 8 MiB would be 12,800 parts.
        let s = spill(256 * MIB, 8 * MIB);
        let db = 100u64 << 30;
        let parts = plan(db, &s).unwrap();
        assert!(parts.part_size > 8 * MIB && parts.part_size.is_multiple_of(MIB), "{parts:?}");
        assert!(object_bound(db).div_ceil(parts.part_size) <= MAX_PARTS, "{parts:?}");
        assert!((parts.memory_parts as u64 + 1) * parts.part_size <= 256 * MIB, "the memory bound holds: {parts:?}");
        assert!(parts.memory_parts >= 2);
    }

    #[test]
    fn a_budget_too_small_for_the_larger_parts_is_refused_saying_what_to_raise() {
        let s = spill(24 * MIB, 8 * MIB);
        let error = plan(100u64 << 30, &s).unwrap_err();
        assert!(error.contains("more than 10000 parts") && error.contains("raise spill.memoryBudget"), "{error}");
    }
}
