//! Small shared pieces with no home of their own: stable hashing, a seeded RNG, request and span
//! ids, time formatting, a JSON object writer, bounded file reads, fair shares of a pool, error chains and sparse error logging, bounded label strings, the one
//! Prometheus text writer and a reader of backends' expositions. Nothing here depends on another
//! module of the crate.

pub mod errors;
pub mod fs;
pub mod hash;
pub mod ids;
pub mod json;
pub mod label;
pub mod prometheus;
pub mod promtext;
pub mod quantile;
pub mod rng;
pub mod shares;
pub mod time;

pub use hash::stable_hash;
pub use ids::Ids;
pub use rng::Rng;
