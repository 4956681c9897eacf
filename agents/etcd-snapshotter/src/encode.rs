//! The object's bytes: etcd's stream through zstd, then age, cut into parts of a fixed size. Synchronous and
//! pure (no I/O): the caller writes each chunk in and takes the finished parts out after every write, so at
//! most one part is being filled here whatever the database size. The object's sha256 is not computed here:
//! the caller hashes the finished parts in order on another thread (`snapshot::ObjectHasher`), so this thread
//! only compresses and encrypts.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::config::{Compression, Recipient};
use crate::part_buf::{PartBuf, PartPool};

/// zstd level 1, not zstd's default 3: on a 256 MiB kcp-shaped database level 3 took the agent 3.5 to 3.9 s of
/// CPU (its double-fast matcher was 35% of the profile) and level 1 took 1.45 s, while etcd held the snapshot's
/// read transaction open on a node the agent shares with it (`cargo xtask bench snapshot`, docs/benchmarks.md).
const ZSTD_LEVEL: i32 = 1;

struct Out {
    pool: PartPool,
    filling: PartBuf,
    ready: Vec<Bytes>,
    total: u64,
}

/// The innermost writer: cuts the encoded stream into parts.
struct PartSink(Arc<Mutex<Out>>);

impl Write for PartSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = self.0.lock().expect("sink lock");
        out.total += buf.len() as u64;
        let mut rest = buf;
        while !rest.is_empty() {
            let taken = out.filling.fill(rest);
            rest = &rest[taken..];
            if out.filling.len == out.filling.capacity() {
                let next = out.pool.take()?;
                let part = std::mem::replace(&mut out.filling, next);
                out.ready.push(part.into_bytes());
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A writer stage that must be finished to flush its last bytes (zstd's frame end, age's last chunk).
trait Stage: Write + Send {
    fn finish(self: Box<Self>) -> io::Result<()>;
}

impl Stage for PartSink {
    fn finish(self: Box<Self>) -> io::Result<()> {
        Ok(())
    }
}

/// zstd or age over the next stage: writes go through it, and finishing it hands the next stage back (`finish`,
/// which zstd's encoder and age's writer both have) to be finished in turn.
struct Layer<W>(W, fn(W) -> io::Result<Box<dyn Stage>>);

impl<W: Write + Send> Write for Layer<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write + Send> Stage for Layer<W> {
    fn finish(self: Box<Self>) -> io::Result<()> {
        (self.1)(self.0)?.finish()
    }
}

/// Compresses, encrypts and cuts into parts.
pub struct Encoder {
    stage: Box<dyn Stage>,
    out: Arc<Mutex<Out>>,
}

/// What the encoder produced in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub size: u64,
}

impl Encoder {
    pub fn new(compression: Compression, recipients: &[Recipient], part_size: usize) -> io::Result<Self> {
        let pool = PartPool::new(part_size);
        let filling = pool.take()?;
        let out = Arc::new(Mutex::new(Out { pool, filling, ready: Vec::new(), total: 0 }));
        let mut stage: Box<dyn Stage> = Box::new(PartSink(out.clone()));
        // Compress first: encrypted bytes do not compress.
        if !recipients.is_empty() {
            let keys: Vec<&dyn age::Recipient> = recipients.iter().map(|r| &r.key as &dyn age::Recipient).collect();
            let encryptor = age::Encryptor::with_recipients(keys.into_iter()).map_err(io::Error::other)?;
            stage = Box::new(Layer(encryptor.wrap_output(stage)?, age::stream::StreamWriter::finish));
        }
        if compression == Compression::Zstd {
            let zstd = zstd::stream::write::Encoder::new(stage, ZSTD_LEVEL)?;
            stage = Box::new(Layer(zstd, zstd::stream::write::Encoder::finish));
        }
        Ok(Self { stage, out })
    }

    pub fn write(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.stage.write_all(chunk)
    }

    /// Parts completed since the last call, in order.
    pub fn take_parts(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.out.lock().expect("sink lock").ready)
    }

    /// Flushes every stage; returns the remaining parts (the last one may be short) and the totals.
    pub fn finish(self) -> io::Result<(Vec<Bytes>, Encoded)> {
        self.stage.finish()?;
        let mut out = self.out.lock().expect("sink lock");
        let mut parts = std::mem::take(&mut out.ready);
        if out.filling.len > 0 || (parts.is_empty() && out.total == 0) {
            let last = std::mem::replace(&mut out.filling, PartBuf::unpooled(1)?);
            parts.push(last.into_bytes());
        }
        Ok((parts, Encoded { size: out.total }))
    }
}

/// An age identity as read from an identity file.
pub type Identity = Box<dyn age::Identity + Send + Sync>;

/// The reverse, for restore and verify: age (when an identity is given), then zstd, into `sink`.
pub fn decode(
    input: impl io::Read,
    compression: &str,
    identities: Option<&[Identity]>,
    sink: &mut impl Write,
) -> anyhow::Result<u64> {
    let reader: Box<dyn io::Read> = match identities {
        Some(ids) => {
            let decryptor = age::Decryptor::new(input)?;
            Box::new(decryptor.decrypt(ids.iter().map(|i| i.as_ref() as &dyn age::Identity))?)
        }
        None => Box::new(input),
    };
    let mut reader: Box<dyn io::Read> = match compression {
        "zstd" => Box::new(zstd::stream::read::Decoder::new(reader)?),
        "none" => reader,
        other => anyhow::bail!("unknown compression {other:?} in the manifest"),
    };
    Ok(io::copy(&mut reader, sink)?)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn input() -> Vec<u8> {
        (0..3_000_000u32).map(|i| ((i / 64) % 200) as u8).collect()
    }

    fn encode(compression: Compression, recipients: &[Recipient], part: usize) -> (Vec<Bytes>, Encoded) {
        let mut enc = Encoder::new(compression, recipients, part).unwrap();
        let mut parts = Vec::new();
        for chunk in input().chunks(32 * 1024) {
            enc.write(chunk).unwrap();
            let ready = enc.take_parts();
            assert!(ready.iter().all(|p| p.len() == part), "every part but the last has the part size");
            parts.extend(ready);
        }
        let (rest, encoded) = enc.finish().unwrap();
        parts.extend(rest);
        (parts, encoded)
    }

    #[test]
    fn parts_reassemble_to_an_object_that_decodes_to_the_input() {
        let identity = age::x25519::Identity::generate();
        let recipient = Recipient { id: identity.to_public().to_string(), key: identity.to_public() };
        for (compression, recipients) in
            [(Compression::None, vec![]), (Compression::Zstd, vec![]), (Compression::Zstd, vec![recipient])]
        {
            let (parts, encoded) = encode(compression, &recipients, 64 * 1024);
            let object: Vec<u8> = parts.concat();
            assert_eq!(object.len() as u64, encoded.size);
            let ids: Vec<Identity> = vec![Box::new(identity.clone())];
            let mut back = Vec::new();
            let with = (!recipients.is_empty()).then_some(&ids[..]);
            decode(&object[..], compression.as_str(), with, &mut back).unwrap();
            assert!(back == input(), "{compression:?} round trip");
            if compression == Compression::Zstd {
                assert!(object.len() < input().len() / 4, "zstd compresses: {}", object.len());
            }
        }
    }

    #[test]
    fn the_wrong_identity_cannot_decrypt() {
        let identity = age::x25519::Identity::generate();
        let recipient = Recipient { id: "x".into(), key: identity.to_public() };
        let (parts, _) = encode(Compression::Zstd, &[recipient], 1 << 20);
        let other: Vec<Identity> = vec![Box::new(age::x25519::Identity::generate())];
        assert!(decode(&parts.concat()[..], "zstd", Some(&other), &mut Vec::new()).is_err());
        assert!(age::x25519::Recipient::from_str("age1nope").is_err());
    }
}
