//! Small shared pieces with no home of their own: time formatting, a JSON object writer, bounded
//! file reads, fair shares of a pool, error chains and sparse error logging, bounded label
//! strings and a reader of backends' expositions; and, from the meter crate, stable hashing, a
//! seeded RNG, request and span ids, the percentile rule and the one Prometheus text writer.
//! Nothing here depends on another module of the crate.

// The percentile rule, the stable hash, the RNG, ids and the Prometheus writer live in the
// meter crate (crates/inferscope-meter), under their names here.
pub use inferscope_meter::util::{hash, ids, prometheus, quantile, rng, stable_hash, Ids, Rng};

pub mod errors;
pub mod fs;
pub mod json;
pub mod label;
pub mod promtext;
pub mod shares;
pub mod time;
