//! Live statistics (the `inferscope-meter` crate's `stats`, under its name here), the figures
//! per benchmark run, and the roofline model of what a backend's hardware could do.

pub use inferscope_meter::stats::*;

pub mod roofline;
pub mod runs;
