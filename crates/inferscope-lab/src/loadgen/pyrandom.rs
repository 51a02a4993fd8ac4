//! Python's `random` module, as far as `vllm bench serve` uses it to pick a workload: the
//! Mersenne Twister (MT19937) seeded as `random.seed(int)` seeds it, `shuffle` and `choice`. With
//! the same seed, the same entries come out in the same order, so a comparison with vLLM's
//! benchmark runs the same requests at any prompt count.
//!
//! `seed(n)` is CPython's `random_seed` for an int: its absolute value cut into 32-bit words,
//! least significant first, fed to MT19937's `init_by_array`. `shuffle` is Fisher–Yates from the
//! end, `choice` one draw; both draw with `_randbelow`: `k = n.bit_length()` bits from the top of
//! a 32-bit output, again while the value is `n` or more.

/// MT19937 as CPython's `random.Random` runs it.
#[derive(Debug, Clone)]
pub struct PyRandom {
    mt: [u32; 624],
    index: usize,
}

impl PyRandom {
    /// `random.seed(seed)`.
    pub fn seed(seed: u64) -> Self {
        let key: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        let mut r = Self::init_genrand(19_650_218);
        let mt = &mut r.mt;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..624.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= 624 {
                mt[0] = mt[623];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..623 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= 624 {
                mt[0] = mt[623];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        r.index = 624;
        r
    }

    fn init_genrand(s: u32) -> Self {
        let mut mt = [0u32; 624];
        mt[0] = s;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Self { mt, index: 624 }
    }

    /// The next 32-bit output (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `_randbelow(n)`: uniform in `0..n` (`n` ≥ 1, below 2³²).
    pub fn below(&mut self, n: usize) -> usize {
        let k = usize::BITS - n.leading_zeros();
        loop {
            let r = (self.next_u32() >> (32 - k)) as usize;
            if r < n {
                return r;
            }
        }
    }

    /// `random.shuffle(v)`.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }

    /// `random.choice(v)`'s index.
    pub fn choice(&mut self, len: usize) -> usize {
        self.below(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures below are what CPython 3.11 prints for the same calls:
    ///
    /// ```text
    /// python3 -c "import random
    /// random.seed(0); x=list(range(10)); random.shuffle(x); print(x)
    /// random.seed(1); x=list(range(46)); random.shuffle(x); print(x)
    /// random.seed(12345678901234); x=list(range(7)); random.shuffle(x); print(x)
    /// random.seed(1); print([random.choice(list(range(13))) for _ in range(8)])
    /// random.seed(5); print([random.getrandbits(32) for _ in range(3)])"
    /// ```
    #[test]
    fn draws_as_cpython_draws() {
        let shuffled = |seed: u64, n: usize| {
            let mut v: Vec<usize> = (0..n).collect();
            PyRandom::seed(seed).shuffle(&mut v);
            v
        };
        assert_eq!(shuffled(0, 10), [7, 8, 1, 5, 3, 4, 2, 0, 9, 6]);
        assert_eq!(
            shuffled(1, 46),
            [
                2, 9, 43, 33, 5, 26, 12, 11, 39, 15, 44, 20, 38, 35, 25, 42, 17, 21, 34, 10, 3, 18,
                41, 23, 45, 14, 22, 0, 29, 32, 19, 27, 37, 1, 40, 6, 13, 24, 30, 28, 31, 7, 16, 4,
                36, 8
            ]
        );
        assert_eq!(shuffled(12_345_678_901_234, 7), [6, 5, 2, 3, 1, 4, 0]);
        let mut r = PyRandom::seed(1);
        let picks: Vec<usize> = (0..8).map(|_| r.choice(13)).collect();
        assert_eq!(picks, [2, 9, 12, 12, 1, 4, 1, 7]);
        let mut r = PyRandom::seed(5);
        assert_eq!(
            [r.next_u32(), r.next_u32(), r.next_u32()],
            [2_675_342_405, 1_097_127_993, 3_185_950_873]
        );
    }
}
