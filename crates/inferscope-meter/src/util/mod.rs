//! Small pieces the meter and the statistics share with the rest of inferscope: the percentile
//! rule, a stable hash, a seeded RNG, request and trace ids, the Prometheus text writer.

pub mod hash;
pub mod ids;
pub mod prometheus;
pub mod quantile;
pub mod rng;

pub use hash::stable_hash;
pub use ids::Ids;
pub use rng::Rng;
