//! Live statistics (the `inferscope-meter` crate's `stats`, under its name here) and the roofline
//! model of what a backend's hardware could do.

pub use inferscope_meter::stats::*;

pub mod roofline;
