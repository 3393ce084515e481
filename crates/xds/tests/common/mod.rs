//! Protobuf fields built by hand, so tests prove field numbers without the generated code.

/// A length-delimited field.
pub(crate) fn ld(field: u32, bytes: &[u8]) -> Vec<u8> {
    let mut v = varint(u64::from(field << 3 | 2));
    v.extend(varint(bytes.len() as u64));
    v.extend_from_slice(bytes);
    v
}

/// A varint field.
pub(crate) fn vi(field: u32, value: u64) -> Vec<u8> {
    let mut v = varint(u64::from(field << 3));
    v.extend(varint(value));
    v
}

/// A base-128 varint.
fn varint(mut x: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (x & 0x7f) as u8;
        x >>= 7;
        if x == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}
