//! Small shared pieces with no home of their own: stable hashing, a seeded RNG, request and span
//! ids, time formatting, a JSON object writer, bounded file reads, fair shares of a pool, error chains and sparse error logging, bounded label strings, the one
//! Prometheus text writer and a reader of backends' expositions. Nothing here depends on another
//! module of the crate.

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
