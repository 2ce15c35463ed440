//! One small seeded random generator for tests and benchmarks (xorshift64: fast, not
//! cryptographic, the same numbers on every platform for one seed).
//!
//! [`Rng::from_env`] is for tests that pick moments or data at random: the seed comes from
//! `SLUICE_TEST_SEED` when set, from the clock otherwise, and is printed on stderr when the
//! generator is made (libtest shows a failing test's stderr) and again if the thread panics while
//! it lives, so a failure can be replayed with `SLUICE_TEST_SEED=<seed>`. [`Rng::with_seed`] is
//! for benchmarks and tests whose data must be the same every run.

use std::ops::Range;

/// The environment variable that fixes the seed of every [`Rng::from_env`].
pub const SEED_VAR: &str = "SLUICE_TEST_SEED";

/// A xorshift64 generator that knows its seed.
#[derive(Debug, Clone)]
pub struct Rng {
    seed: u64,
    state: u64,
    /// Whether to name the seed when the thread panics (seeds from the environment or clock).
    announce: bool,
}

impl Rng {
    /// The same numbers on every run. Seed 0 (where xorshift would stay at zero) is replaced
    /// by a fixed non-zero one.
    pub fn with_seed(seed: u64) -> Rng {
        Rng { seed, state: if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed }, announce: false }
    }

    /// A seed from `SLUICE_TEST_SEED` (decimal, or hex with `0x`), or a new one from the clock;
    /// printed now, and again when the thread panics while this generator lives.
    ///
    /// # Panics
    /// When `SLUICE_TEST_SEED` is set but is not a number.
    pub fn from_env() -> Rng {
        let seed = match std::env::var(SEED_VAR) {
            Ok(text) => parse_seed(&text).unwrap_or_else(|| panic!("{SEED_VAR}={text:?} is not a number")),
            Err(_) => clock_seed(),
        };
        eprintln!("random seed {seed} (replay with {SEED_VAR}={seed})");
        Rng { announce: true, ..Rng::with_seed(seed) }
    }

    /// The seed this generator started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// A number below `n` (`n > 0`; the modulo bias is negligible for test data).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        self.next_u64() % n
    }

    /// An index below `len` (`len > 0`).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A number in `range` (not empty).
    pub fn range(&mut self, range: Range<u64>) -> u64 {
        assert!(!range.is_empty(), "Rng::range of an empty range {range:?}");
        range.start + self.below(range.end - range.start)
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

impl Drop for Rng {
    fn drop(&mut self) {
        if self.announce && std::thread::panicking() {
            eprintln!("the failing test's random seed was {0}: replay with {SEED_VAR}={0}", self.seed);
        }
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => text.replace('_', "").parse().ok(),
    }
}

/// A seed from the clock's nanoseconds: another one each run.
fn clock_seed() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (now.as_nanos() as u64) | 1
}

#[cfg(test)]
mod tests {
    use super::{Rng, parse_seed};

    #[test]
    fn a_seed_gives_the_same_numbers_as_the_xorshift_it_replaces() {
        let mut x = 7u64;
        let mut rng = Rng::with_seed(7);
        for _ in 0..100 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(rng.next_u64(), x);
        }
        assert_eq!(rng.seed(), 7);
    }

    #[test]
    fn seed_zero_does_not_stick_at_zero() {
        let mut rng = Rng::with_seed(0);
        assert_ne!(rng.next_u64(), 0);
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut rng = Rng::with_seed(99);
        for _ in 0..1000 {
            let n = rng.range(10..13);
            assert!((10..13).contains(&n), "{n}");
            assert!(rng.below(5) < 5);
        }
    }

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("12345"), Some(12345));
        assert_eq!(parse_seed(" 0xDEAD_BEEF "), Some(0xDEAD_BEEF));
        assert_eq!(parse_seed("nope"), None);
    }
}
