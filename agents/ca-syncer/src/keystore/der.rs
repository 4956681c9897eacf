//! The few DER constructions PKCS#12 needs, written by hand: every structure here is fixed by the encoder, so a
//! general ASN.1 library would add code without adding checks (the files are read back by OpenSSL and Java's
//! keytool in the tests).

pub const SEQUENCE: u8 = 0x30;
pub const SET: u8 = 0x31;
pub const INTEGER: u8 = 0x02;
pub const OCTET_STRING: u8 = 0x04;
pub const NULL: u8 = 0x05;
pub const OID: u8 = 0x06;
pub const BMP_STRING: u8 = 0x1e;
/// `[0] EXPLICIT` (constructed, context-specific 0).
pub const EXPLICIT_0: u8 = 0xa0;
/// `[0] IMPLICIT OCTET STRING` (primitive, context-specific 0).
pub const IMPLICIT_0: u8 = 0x80;

/// One TLV: `tag`, the definite length in its shortest form, `content`.
pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len() - 1);
        out.push(0x80 | (bytes.len() - first) as u8);
        out.extend_from_slice(&bytes[first..]);
    }
    out.extend_from_slice(content);
    out
}

/// A constructed value from already-encoded parts.
pub fn constructed(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    tlv(tag, &parts.concat())
}

pub fn sequence(parts: &[&[u8]]) -> Vec<u8> {
    constructed(SEQUENCE, parts)
}

/// A `SET OF`: DER orders its elements by their encodings.
pub fn set_of(mut elements: Vec<Vec<u8>>) -> Vec<u8> {
    elements.sort();
    tlv(SET, &elements.concat())
}

/// A non-negative INTEGER.
pub fn uint(value: u32) -> Vec<u8> {
    let bytes = value.to_be_bytes();
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len() - 1);
    let mut content = bytes[first..].to_vec();
    if content[0] & 0x80 != 0 {
        content.insert(0, 0);
    }
    tlv(INTEGER, &content)
}

/// An OBJECT IDENTIFIER from its arcs.
pub fn oid(arcs: &[u64]) -> Vec<u8> {
    let mut content = Vec::new();
    let mut push = |mut v: u64| {
        let mut chunk = vec![(v & 0x7f) as u8];
        v >>= 7;
        while v > 0 {
            chunk.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        content.extend(chunk.iter().rev());
    };
    push(arcs[0] * 40 + arcs[1]);
    for arc in &arcs[2..] {
        push(*arc);
    }
    tlv(OID, &content)
}

pub fn octet_string(content: &[u8]) -> Vec<u8> {
    tlv(OCTET_STRING, content)
}

/// A BMPString (UTF-16 big-endian, no terminator).
pub fn bmp_string(text: &str) -> Vec<u8> {
    tlv(BMP_STRING, &text.encode_utf16().flat_map(u16::to_be_bytes).collect::<Vec<_>>())
}

/// `AlgorithmIdentifier { algorithm, parameters }`; `None`: a NULL parameter.
pub fn algorithm(arcs: &[u64], parameters: Option<&[u8]>) -> Vec<u8> {
    sequence(&[&oid(arcs), parameters.unwrap_or(&tlv(NULL, &[]))])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_integers_and_oids_take_their_shortest_der_form() {
        assert_eq!(tlv(OCTET_STRING, &[1; 3]), [4, 3, 1, 1, 1]);
        assert_eq!(&tlv(OCTET_STRING, &[0; 200])[..3], [4, 0x81, 200]);
        assert_eq!(&tlv(OCTET_STRING, &[0; 300])[..4], [4, 0x82, 1, 44]);
        assert_eq!(uint(3), [2, 1, 3]);
        assert_eq!(uint(2048), [2, 2, 8, 0]);
        assert_eq!(uint(128), [2, 2, 0, 128], "a leading 0 keeps it positive");
        // 1.2.840.113549.1.7.1 (id-data), as every PKCS#7 text spells it.
        assert_eq!(oid(&[1, 2, 840, 113549, 1, 7, 1]), [6, 9, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 7, 1]);
    }

    #[test]
    fn a_set_of_is_sorted_by_encoding() {
        assert_eq!(set_of(vec![vec![4, 1, 2], vec![2, 1, 9]]), [0x31, 6, 2, 1, 9, 4, 1, 2]);
    }
}
