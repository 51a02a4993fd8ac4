//! Gateway-made errors: each has a bounded `kind`, who is to blame, an outcome, and exactly one
//! way to become a response — an OpenAI-shaped JSON body with `x-inferscope-error: <kind>`, so
//! clients never confuse it with a backend's own error.

use crate::meter::Outcome;
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

/// Who caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The client's request.
    Downstream,
    /// The backend.
    Upstream,
    /// The gateway itself (limits, configuration).
    Gateway,
}

/// Everything the gateway itself can answer with instead of a backend response. The `Display`
/// text is the message clients get.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No route matches the request.
    #[error("no route matches this request (check the model name and path)")]
    NoRoute,
    /// The JSON body of an inference request is larger than the limit.
    #[error("request body is larger than the gateway's limit of {0} bytes")]
    BodyTooLarge(usize),
    /// The request body could not be read.
    #[error("the request body could not be read")]
    BodyRead,
    /// The client hung up before its request body was complete.
    #[error("the client closed the connection before the request body was complete")]
    ClientGone,
    /// The request body arrived too slowly (a silence or an average rate past the limits).
    #[error("the request body arrived too slowly")]
    BodyTimeout,
    /// Request bodies held across all requests are at the gateway's budget.
    #[error("the gateway holds too many request bodies right now; retry later")]
    BodyBudget,
    /// The JSON body nests deeper than the parser allows (its model cannot be read).
    #[error("the JSON body nests deeper than {0} levels")]
    JsonTooDeep(usize),
    /// Too many requests in flight.
    #[error("the gateway is at its concurrency limit; retry later")]
    Overloaded,
    /// The gateway is under pressure and this client (address or key) holds its fair share.
    #[error("the gateway is busy and this client holds its share of it; retry later")]
    ClientShare,
    /// The backend could not be reached or failed before answering.
    #[error("{}", if .0.is_connect() { "the backend could not be reached" } else { "the backend failed before sending a response" })]
    Upstream(#[source] super::upstream::UpstreamError),
    /// The upstream request could not be built.
    #[error("the gateway could not build the upstream request")]
    BadUpstreamRequest,
    /// No response head from the backend before the first-token deadline.
    #[error("the backend did not answer in time")]
    UpstreamTimeout,
    /// The backend's admission queue refused or timed out.
    #[error("{}", match .0 { crate::route::Busy::QueueFull => "the backend's queue is full; retry later", crate::route::Busy::QueueTimeout => "waited too long for the backend; retry later" })]
    Busy(crate::route::Busy),
    /// No key, or not one of the gateway's.
    #[error(
        "missing or invalid API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`"
    )]
    Unauthorized,
    /// The client's address made too many failed key checks this minute.
    #[error("too many requests with a missing or invalid API key from this address; retry later")]
    AuthThrottled,
    /// A rate limit of the client's key or of the route.
    #[error("rate limit reached for this {}; retry after {:.1} s", .0.scope, .0.retry_after.as_secs_f64())]
    RateLimited(crate::access::Limited),
}

impl ProxyError {
    /// Bounded error code for logs, headers and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "no_route",
            ProxyError::BodyTooLarge(_) => "body_too_large",
            ProxyError::BodyRead => "body_read",
            ProxyError::BodyTimeout => "body_timeout",
            ProxyError::ClientGone => "client_disconnected",
            ProxyError::BodyBudget => "body_budget",
            ProxyError::JsonTooDeep(_) => "json_too_deep",
            ProxyError::Overloaded => "overloaded",
            ProxyError::ClientShare => "client_share",
            ProxyError::Upstream(e) if e.is_connect() => "upstream_connect",
            ProxyError::Upstream(_) => "upstream_failed",
            ProxyError::BadUpstreamRequest => "bad_upstream_request",
            ProxyError::UpstreamTimeout => "upstream_timeout",
            ProxyError::Busy(crate::route::Busy::QueueFull) => "backend_queue_full",
            ProxyError::Busy(crate::route::Busy::QueueTimeout) => "backend_queue_timeout",
            ProxyError::Unauthorized => "invalid_api_key",
            ProxyError::AuthThrottled => "auth_throttled",
            ProxyError::RateLimited(_) => "rate_limit_exceeded",
        }
    }

    /// Who is to blame.
    pub fn blame(&self) -> Blame {
        match self {
            ProxyError::NoRoute
            | ProxyError::BodyTooLarge(_)
            | ProxyError::BodyRead
            | ProxyError::BodyTimeout
            | ProxyError::ClientGone
            | ProxyError::JsonTooDeep(_)
            | ProxyError::Unauthorized
            | ProxyError::AuthThrottled
            | ProxyError::RateLimited(_) => Blame::Downstream,
            ProxyError::Upstream(_) | ProxyError::UpstreamTimeout => Blame::Upstream,
            ProxyError::Overloaded
            | ProxyError::ClientShare
            | ProxyError::BodyBudget
            | ProxyError::BadUpstreamRequest
            | ProxyError::Busy(_) => Blame::Gateway,
        }
    }

    /// Status sent to the client.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyRead | ProxyError::JsonTooDeep(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            // Nobody reads it; recorded as nginx logs a client that left.
            ProxyError::ClientGone => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            ProxyError::BodyBudget => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Overloaded | ProxyError::ClientShare => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::BadUpstreamRequest => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Busy(crate::route::Busy::QueueFull) => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Busy(crate::route::Busy::QueueTimeout) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Unauthorized => StatusCode::UNAUTHORIZED,
            ProxyError::AuthThrottled => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The outcome recorded for the request.
    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::BadUpstreamRequest => Outcome::GatewayError,
            ProxyError::Upstream(_) => Outcome::BackendError,
            ProxyError::UpstreamTimeout => Outcome::Timeout,
            ProxyError::ClientGone => Outcome::ClientCancelled,
            ProxyError::RateLimited(_) | ProxyError::AuthThrottled => Outcome::RateLimited,
            _ => Outcome::Rejected,
        }
    }

    /// The one place an error becomes a response.
    pub fn into_response<D: bytes::Buf + From<Bytes>>(self) -> Response<Full<D>> {
        let typ = match (&self, self.blame()) {
            // As OpenAI names a rate-limit refusal.
            (ProxyError::RateLimited(_), _) => "requests",
            (_, Blame::Downstream) => "invalid_request_error",
            (_, Blame::Upstream) => "upstream_error",
            (_, Blame::Gateway) => "gateway_error",
        };
        let body = json!({"error": {"message": self.to_string(), "type": typ, "param": null, "code": self.kind()}});
        let mut r = Response::new(Full::new(D::from(Bytes::from(body.to_string()))));
        *r.status_mut() = self.status();
        let h = r.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-inferscope-error", HeaderValue::from_static(self.kind()));
        if matches!(
            self,
            ProxyError::Overloaded
                | ProxyError::ClientShare
                | ProxyError::BodyBudget
                | ProxyError::Busy(_)
        ) {
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let ProxyError::AuthThrottled = &self {
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("60"));
        }
        if let ProxyError::RateLimited(l) = &self {
            // Whole seconds, rounded up: a client that waits that long is admitted.
            let secs = l.retry_after.as_secs() + u64::from(l.retry_after.subsec_nanos() > 0);
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            l.state.write(h);
        }
        if let ProxyError::Unauthorized = &self {
            h.insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}
