//! Serving and connecting, the layers between the measuring layer and the gateway:
//!
//! | module | owns |
//! |---|---|
//! | [`util`] | time formatting, error chains and sparse error logging, bounded label strings, bounded reads of regular files, fair shares of a pool, a JSON object writer, a reader of backends' expositions; the meter crate's percentile rule, ids, hash, RNG and Prometheus writer under the same names |
//! | [`tls`] | rustls (ring) both ways: the listener's certificate (ALPN, mTLS, reload), the upstream client's roots and certificate, `connect` |
//! | [`server`] | `run(listener, service, options, shutdown)`: accept, the TLS handshake, HTTP/1.1 + h2c, connection limits, refused heads reported, graceful drain |
//!
//! Each uses only the ones above it in this table (and the meter and wire crates).

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod server;
pub mod tls;
pub mod util;

// The measuring layer under the names the modules use.
use inferscope_meter as meter;
use inferscope_meter::clock;
