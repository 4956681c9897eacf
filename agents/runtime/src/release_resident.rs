//! Gives back the resident memory a burst of work (a snapshot) leaves behind, for an agent that then waits
//! (etcd-snapshotter between its scheduled snapshots).
//!
//! Why: most of an idle agent's resident memory was its own code. The kernel maps a file 64 KiB around every page
//! fault (fault-around; `madvise(MADV_RANDOM)` does not turn it off, measured on 6.18), so running a snapshot's
//! code once left about 80% of etcd-snapshotter's 26 MB text resident (docs/benchmarks.md, `idle`).
//! `madvise(MADV_DONTNEED)` on this process's read-only file mappings removes them from its page tables only: the
//! pages stay in the page cache while the kernel has room for them, and the next use maps them again as minor
//! faults, no I/O. It needs no privilege (unlike `MADV_PAGEOUT` of file pages, which needs the file's owner or
//! write access to it), so it works the same in the pod (uid 65532, read-only root filesystem, no capabilities).
//!
//! It is invisible to the program: only mappings without write permission and without one anonymous page are
//! dropped. A private file mapping's anonymous pages are its written (copied) ones, such as the relocated
//! read-only data of a position-independent binary (RELRO); dropping those would bring back the file's bytes,
//! so a mapping holding any is left alone. Without write permission, none can appear after the check.
//!
//! With glibc's allocator it also trims the heap (`malloc_trim(0)`): memory freed between live blocks stays
//! resident in glibc's arenas until then (its own trim on free returns only a heap's top). What shrank glibc's
//! anonymous memory in `bench idle` was fewer arenas ([`limit_heap_arenas`]: 4.9 to 2.8 MiB); the trim alone
//! left it at 4.9 MiB there, and is kept for the fragmented case its test shows (64 MiB given back). musl's
//! allocator (the shipped static binaries) returns freed groups on its own.

use std::ops::Range;

/// What [`release`] dropped from this process's page tables.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Mappings advised.
    pub mappings: usize,
    /// Their resident bytes before (`Rss` in smaps).
    pub resident_bytes: u64,
    /// Whether the allocator gave memory back to the system (glibc's `malloc_trim`; always false elsewhere).
    pub heap_trimmed: bool,
}

/// Drops this process's mappings of its read-only, never-written file pages (its code and constants, those of
/// shared libraries). Safe to call at any time from any thread: what runs
/// next maps the pages it needs again.
pub fn release() -> Released {
    let heap_trimmed = trim_heap();
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return Released { heap_trimmed, ..Released::default() };
    };
    let mut released = Released { heap_trimmed, ..Released::default() };
    for mapping in read_only_file_mappings(&smaps) {
        let Some(start) = std::ptr::NonNull::new(mapping.range.start as *mut std::ffi::c_void) else { continue };
        // SAFETY: the range is one of this process's mappings, read-only and with no written page (see the
        // module's comment), so MADV_DONTNEED only unmaps pages the file holds the same bytes of: the next access
        // reads them back unchanged. A mapping gone since smaps was read fails with ENOMEM, which is ignored.
        let advised =
            unsafe { nix::sys::mman::madvise(start, mapping.range.len(), nix::sys::mman::MmapAdvise::MADV_DONTNEED) };
        if advised.is_ok() {
            released.mappings += 1;
            released.resident_bytes += mapping.resident_bytes;
        }
    }
    released
}

/// Gives the allocator's free memory back to the system: every glibc arena, free pages in the middle included.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() -> bool {
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks; any thread may call it at any time.
    unsafe { nix::libc::malloc_trim(0) == 1 }
}

/// musl's allocator unmaps freed groups itself: nothing to trim.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() -> bool {
    false
}

/// Caps glibc's malloc at two arenas, unless the environment already sets `MALLOC_ARENA_MAX` or
/// `GLIBC_TUNABLES` (an operator's choice wins). Call first thing in `main`, before any thread is started.
///
/// glibc gives each thread that allocates an arena of its own, up to eight per core, and each keeps its live
/// blocks and some free memory resident apart from the others; an agent's threads (the runtime's workers, its
/// blocking pool, a snapshot's hashing and upload tasks) allocate little, so the arenas cost more memory than
/// they save contention. Measured with `bench idle` on the glibc build: etcd-snapshotter's anonymous memory after
/// its snapshots went from 4.9 to 2.8 MiB (`MALLOC_ARENA_MAX=2`), with `malloc_trim` in both. musl's allocator (the
/// shipped static binaries) has one heap.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn limit_heap_arenas() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() || std::env::var_os("GLIBC_TUNABLES").is_some() {
        return false;
    }
    // SAFETY: mallopt sets one of glibc's malloc parameters under its own lock.
    unsafe { nix::libc::mallopt(nix::libc::M_ARENA_MAX, 2) == 1 }
}

/// musl's allocator has one heap: nothing to cap.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn limit_heap_arenas() -> bool {
    false
}

/// One mapping [`release`] may drop.
#[derive(Debug, PartialEq, Eq)]
pub struct Mapping {
    pub range: Range<usize>,
    pub resident_bytes: u64,
}

/// The mappings of `smaps` (the text of `/proc/<pid>/smaps`) that are backed by a file, have no write permission
/// and hold no anonymous (written, copied) page, and have something resident.
pub fn read_only_file_mappings(smaps: &str) -> Vec<Mapping> {
    struct Current {
        range: Range<usize>,
        candidate: bool,
        rss: u64,
        anonymous: u64,
        locked: u64,
    }
    fn finish(current: Option<Current>, out: &mut Vec<Mapping>) {
        if let Some(c) = current
            && c.candidate
            && c.anonymous == 0
            && c.locked == 0
            && c.rss > 0
        {
            out.push(Mapping { range: c.range, resident_bytes: c.rss });
        }
    }
    let mut out = Vec::new();
    let mut current: Option<Current> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            // A mapping's header: range, perms, offset, device, inode, then the path if any.
            finish(current.take(), &mut out);
            let perms = fields.next().unwrap_or("");
            let inode = fields.nth(2).unwrap_or("0");
            let path = fields.next().unwrap_or("");
            let candidate = perms.starts_with('r')
                && !perms.contains('w')
                && inode != "0"
                && !path.is_empty()
                && !path.starts_with('[');
            current = Some(Current { range: start..end, candidate, rss: 0, anonymous: 0, locked: 0 });
            continue;
        }
        let Some(current) = current.as_mut() else { continue };
        let kib = || fields.clone().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
        match first {
            "Rss:" => current.rss = kib(),
            "Anonymous:" => current.anonymous = kib(),
            "Locked:" => current.locked = kib(),
            _ => {}
        }
    }
    finish(current, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that call [`release`] one at a time: each measures what the process holds around its own call.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    const SMAPS: &str = "\
00400000-00401000 r--p 00000000 fd:01 1234 /usr/bin/agent
Rss:                   4 kB
Anonymous:             0 kB
Locked:                0 kB
00401000-00800000 r-xp 00001000 fd:01 1234 /usr/bin/agent
Size:               4092 kB
Rss:                3000 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd ex mr mw me
00800000-00900000 r--p 00400000 fd:01 1234 /usr/bin/agent
Rss:                  64 kB
Anonymous:            12 kB
Locked:                0 kB
00900000-00910000 rw-p 00500000 fd:01 1234 /usr/bin/agent
Rss:                  64 kB
Anonymous:             0 kB
00910000-00920000 rw-p 00000000 00:00 0
Rss:                  64 kB
Anonymous:            64 kB
7f0000000000-7f0000010000 r-xp 00000000 fd:01 99 /usr/lib/libc.so.6
Rss:                  40 kB
Anonymous:             0 kB
Locked:               40 kB
7f0000010000-7f0000020000 r--p 00010000 fd:01 99 /usr/lib/libc.so.6
Rss:                   0 kB
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
Anonymous:             0 kB
7ffd00010000-7ffd00020000 r--p 00000000 00:05 77 /memfd:part (deleted)
Rss:                   8 kB
Anonymous:             0 kB
";

    #[test]
    fn only_read_only_never_written_resident_file_mappings_are_released() {
        let ranges: Vec<_> = read_only_file_mappings(SMAPS).into_iter().map(|m| (m.range, m.resident_bytes)).collect();
        assert_eq!(
            ranges,
            vec![
                // The binary's first read-only segment and its code.
                (0x400000..0x401000, 4 * 1024),
                (0x401000..0x800000, 3000 * 1024),
                // A read-only file mapping that is not the binary's: as safe.
                (0x7ffd00010000..0x7ffd00020000, 8 * 1024),
            ],
            "skipped: the written RELRO segment (anonymous pages), the writable data, anonymous memory, a locked \
             mapping, an empty one and the vdso"
        );
    }

    fn own_code_resident_bytes() -> u64 {
        let exe = std::fs::read_link("/proc/self/exe").unwrap().display().to_string();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let (mut ours, mut total) = (false, 0);
        for line in smaps.lines() {
            let mut fields = line.split_whitespace();
            let first = fields.next().unwrap_or("");
            if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                let perms = fields.next().unwrap_or("");
                ours = fields.nth(3) == Some(exe.as_str()) && perms.contains('x');
            } else if ours && first == "Rss:" {
                total += fields.next().unwrap().parse::<u64>().unwrap() * 1024;
            }
        }
        total
    }

    #[test]
    fn release_drops_the_resident_code_of_this_process_and_it_still_runs() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // Run a fair share of code first (YAML and JSON, formatting, collections), so its pages are resident.
        let work = || {
            let text: String = (0..2000).map(|i| format!("- {{n: {i}, hex: '{i:x}'}}\n")).collect();
            let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
            let json = serde_json::to_string(&yaml).unwrap();
            let back: Vec<std::collections::BTreeMap<String, serde_json::Value>> = serde_json::from_str(&json).unwrap();
            back.iter().map(|m| m["hex"].as_str().unwrap().to_owned()).collect::<std::collections::BTreeSet<_>>()
        };
        let parsed = work();
        assert_eq!(parsed.len(), 2000);
        let before = own_code_resident_bytes();
        let released = release();
        let after = own_code_resident_bytes();
        assert!(released.mappings > 0 && released.resident_bytes >= before / 2, "{released:?} of {before}");
        assert!(after < before / 2, "the test binary's resident code: {before} bytes before, {after} after");
        // The same code again: mapped back from the page cache, same results.
        assert_eq!(parsed, work());
    }

    fn anonymous_resident_bytes() -> u64 {
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        let line = rollup.lines().find(|l| l.starts_with("Anonymous:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    /// glibc keeps freed memory between live blocks resident (its own trim only returns the top of a heap); the
    /// release gives it back. On a thread of its own, as a runtime's worker allocates in its own arena.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn release_gives_back_heap_memory_freed_between_live_blocks() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        const BLOCKS: usize = 64 * 1024;
        // 64 Ki blocks of 1 KiB (64 MiB), written so they are resident; one in 64 kept, the rest freed. The kept
        // ones pin every 64 KiB stretch's end, so nothing is at a heap's top to be trimmed on free.
        let (kept, freed_resident) = std::thread::spawn(|| {
            let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|i| vec![(i % 251) as u8; 1000]).collect();
            let mut kept = Vec::new();
            for (i, block) in blocks.into_iter().enumerate() {
                if i % 64 == 63 {
                    kept.push(block);
                }
            }
            (kept, anonymous_resident_bytes())
        })
        .join()
        .unwrap();
        let released = release();
        let after = anonymous_resident_bytes();
        assert!(released.heap_trimmed, "{released:?}");
        assert!(
            after + 32 * 1024 * 1024 < freed_resident,
            "anonymous memory: {freed_resident} bytes with 63 of 64 blocks freed, {after} after the release"
        );
        // The live blocks are untouched.
        assert!(kept.iter().enumerate().all(|(i, b)| b.iter().all(|&v| v == ((i * 64 + 63) % 251) as u8)));
    }

    /// The arenas glibc's `malloc_info` reports (one `<heap nr=...>` each).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn heap_arenas() -> usize {
        use std::io::{Read, Seek};
        let mut file = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: a FILE over a duplicate of the temp file's descriptor, flushed and closed right after.
        unsafe {
            let stream = nix::libc::fdopen(nix::libc::dup(fd), c"w".as_ptr());
            assert!(!stream.is_null());
            assert_eq!(nix::libc::malloc_info(0, stream), 0);
            nix::libc::fclose(stream);
        }
        let mut xml = String::new();
        file.rewind().unwrap();
        file.read_to_string(&mut xml).unwrap();
        xml.matches("<heap nr=").count()
    }

    /// Sixteen threads allocating at once, each with a block live while the others allocate: without the cap
    /// glibc makes new arenas for them (up to eight per core), with it they share what exists.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn with_the_arena_cap_threads_allocating_at_once_share_the_existing_arenas() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        assert!(limit_heap_arenas(), "mallopt(M_ARENA_MAX) refused (or the environment sets it)");
        let before = heap_arenas();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let block = std::hint::black_box(vec![1u8; 4096]);
                    barrier.wait();
                    block.len()
                })
            })
            .collect();
        assert!(threads.into_iter().all(|t| t.join().unwrap() == 4096));
        let after = heap_arenas();
        assert!(after <= before.max(2), "{before} arenas before 16 threads allocated at once, {after} after");
    }

    #[test]
    fn release_keeps_what_was_written_to_a_private_file_mapping_made_read_only() {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap, mprotect, munmap};
        use std::io::Write;
        use std::num::NonZeroUsize;
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[b'f'; 8192]).unwrap();
        let len = NonZeroUsize::new(8192).unwrap();
        // What the loader does with RELRO: a private file mapping, written, then made read-only.
        // SAFETY: a fresh mapping of a file this test owns, used only here and unmapped at the end.
        let map = unsafe {
            mmap(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE, &file, 0).unwrap()
        };
        // SAFETY: within the mapping just made, writable.
        unsafe { map.cast::<u8>().as_ptr().write_bytes(b'w', 4096) };
        // SAFETY: the same mapping.
        unsafe { mprotect(map, 8192, ProtFlags::PROT_READ).unwrap() };
        release();
        // SAFETY: the mapping is still there, readable.
        let bytes = unsafe { std::slice::from_raw_parts(map.cast::<u8>().as_ptr(), 8192) };
        assert!(bytes[..4096].iter().all(|&b| b == b'w'), "the written page came back as the file's bytes");
        assert!(bytes[4096..].iter().all(|&b| b == b'f'));
        // SAFETY: unmapped once, nothing refers to it after.
        unsafe { munmap(map, 8192).unwrap() };
    }
}
