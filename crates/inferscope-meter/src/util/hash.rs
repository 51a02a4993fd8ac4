//! The crate's stable hash: the same input gives the same 64 bits on every platform, in every
//! process and every version. Experiment assignment depends on it, so it is fixed forever:
//! changing it would move sticky users between variants.

/// FNV-1a over `bytes`, then a SplitMix64 finalizer so every output bit depends on every input
/// bit (FNV-1a alone mixes the last bytes poorly into the high bits).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_values() {
        // Pinned: sticky experiment assignment on every replica and release depends on these.
        assert_eq!(stable_hash(b""), 0xf52a_15e9_a9b5_e89b);
        assert_eq!(stable_hash(b"user-1"), 0xc499_b5f8_a721_df58);
    }
}
