//! Per-request measurement: the body wrapper that timestamps every upstream frame where the bytes
//! are, and the one `RequestRecord` each request produces.

mod body;
mod progress;
mod record;

pub use body::MeteredBody;
pub use progress::{End, Framing, Meter, MeterOptions, Permit, StripPlan};
pub use record::{
    ItlSample, Outcome, RequestMeta, RequestParams, RequestRecord, ResponseInfo, TokensSource,
};
