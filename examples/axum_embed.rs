//! inferscope's measurements inside your own service: an axum app that serves an
//! OpenAI-style `/v1/chat/completions` stream gets TTFT, TPOT, ITL, E2E and outcomes per request,
//! and a Prometheus `/metrics`, by adding one layer — from the `inferscope-meter` crate alone.
//!
//! ```sh
//! cargo run --example axum_embed            # prints: listening on 127.0.0.1:PORT
//! curl -N -X POST http://127.0.0.1:PORT/v1/chat/completions -d '{}'
//! curl -s http://127.0.0.1:PORT/metrics | grep time_to_first_token
//! ```
#![allow(missing_docs)]

use axum::extract::Extension;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use inferscope_meter::stats::Stats;
use inferscope_meter::{Annotations, MeterLayer};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// Time before the first token, and between tokens, of the demo stream.
pub const FIRST_TOKEN: Duration = Duration::from_millis(40);
pub const BETWEEN_TOKENS: Duration = Duration::from_millis(5);

/// The app: a streaming chat endpoint and `/metrics`, measured by `MeterLayer` into `stats`.
pub fn app(stats: Arc<Stats>) -> Router {
    let metrics = {
        let stats = Arc::clone(&stats);
        move || {
            let stats = Arc::clone(&stats);
            async move { inferscope_meter::stats::render_prometheus(&stats.snapshot(), &[]) }
        }
    };
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/metrics", get(metrics))
        // The one layer: every request through the app is measured and recorded into `stats`.
        .layer(MeterLayer::new(stats))
}

/// A made-up model answering five tokens as an OpenAI-style SSE stream.
async fn chat(Extension(notes): Extension<Annotations>) -> axum::response::Response {
    // Optional: enrich the record (labels in /metrics, fields in sinks). Without it the request is
    // still measured; the layer reads the dialect from the path and the stream from the body.
    notes.update(|m| {
        m.model = "demo-model".into();
        m.route = "chat".into();
        m.stream = true;
    });
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        tokio::time::sleep(FIRST_TOKEN).await;
        for word in ["The", " answer", " is", " forty", " two"] {
            let event = format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{word}\"}}}}]}}\n\n"
            );
            if tx.send(Bytes::from(event)).await.is_err() {
                return; // the client left
            }
            tokio::time::sleep(BETWEEN_TOKENS).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::new(ChannelBody(rx)))
        .unwrap_or_default()
}

/// A response body fed by a channel (any `http_body::Body` works under the layer).
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

#[allow(dead_code)] // the tests call `app`, not `main`
#[tokio::main]
async fn main() -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {}", listener.local_addr()?);
    let stats = Arc::new(Stats::new(1024));
    axum::serve(listener, app(stats)).await
}
