//! Byte tests shared by the JSON readers here and the JSON writers above this crate.

/// The bytes of `w` (eight bytes of a JSON string read little-endian: the first is the lowest)
/// that are not printable ASCII other than `"` and `\`, as their high bits, give or take false
/// positives above a true one: the zero-byte and less-than tests below have no false negatives,
/// and a borrow reaches only the bytes above the byte it comes from. So `w` is plain when this
/// is 0, and its lowest set bit marks the first byte that is not.
pub fn not_plain(w: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let quote = has_zero(w ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(w ^ (ONES * u64::from(b'\\')));
    (w & HIGH) | below_space | quote | backslash
}
