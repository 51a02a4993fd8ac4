//! Per-request measurement: the body wrapper that timestamps every upstream frame where the bytes
//! are, and the one `RequestRecord` each request produces.

mod body;
mod progress;
mod record;

pub use body::MeteredBody;
pub use progress::{Deadlines, End, Framing, Guards, Meter, MeterOptions, Permit, StripPlan};
pub use record::{
    Attempt, ItlSample, ItlSummary, Outcome, RequestMeta, RequestParams, RequestRecord,
    ResponseInfo, TokensSource,
};
