//! What routing learns from finished requests. `Observer` is a `RecordSink`: each record is looked
//! up by name in the router serving now — its backend (passive health, latency EWMAs), its route's
//! experiment (guardrails, shadow agreement) — so records stay plain data and the measuring side
//! never calls into routing.

use super::RouterSlot;
use crate::experiment::Trip;
use crate::meter::{Outcome, Purpose, RecordSink, RequestRecord};
use std::sync::Arc;

/// Called when a guardrail rolls a variant back: `(route, variant, trip)`.
pub type TripReporter = Box<dyn Fn(&str, &str, &Trip) + Send + Sync>;

/// Feeds finished requests back into the routing state.
pub struct Observer {
    routes: Arc<RouterSlot>,
    on_trip: TripReporter,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    /// Observes for the router in `routes`; guardrail trips are reported to `on_trip` (logged and
    /// counted by the guardrails themselves; `on_trip` adds an OpenTelemetry event).
    pub fn new(routes: Arc<RouterSlot>, on_trip: TripReporter) -> Self {
        Self { routes, on_trip }
    }

    /// A feedback signal for a variant of the experiment on `route` (for `feedback:NAME`
    /// guardrail rules).
    pub fn feedback(&self, route: &str, variant: &Arc<str>, name: &str, value: f64) {
        if let Some(g) = self.routes.load().guardrails(route) {
            for (v, trip) in g.observe_feedback(variant, name, value) {
                (self.on_trip)(route, &v, &trip);
            }
        }
    }
}

impl RecordSink for Observer {
    fn record(&self, rec: &Arc<RequestRecord>) {
        let router = self.routes.load();
        let m = &rec.meta;
        if let Some(b) = router.backend(&m.backend) {
            match rec.outcome {
                Outcome::Ok => b.observe_success(rec.ttft, rec.tpot),
                // The backend failed, broke the stream, or stalled.
                Outcome::BackendError | Outcome::Truncated | Outcome::Timeout => {
                    b.observe_failure()
                }
                // Neither proves anything about the backend.
                Outcome::ClientError
                | Outcome::ClientCancelled
                | Outcome::Shutdown
                | Outcome::RateLimited
                | Outcome::Rejected
                | Outcome::GatewayError => {}
            }
        }
        let Some(x) = router.experiment(&m.route) else {
            return;
        };
        if let (Some(pair), Some(sh)) = (crate::facts::Facts::of(m).shadow_pair, &x.shadow) {
            let text = rec
                .response
                .output_content
                .clone()
                .filter(|_| rec.outcome == Outcome::Ok);
            sh.offer(pair, m.purpose == Purpose::Shadow, text);
        }
        // Only live traffic the split assigned judges a served variant: shadow copies are
        // measured apart, an eval's or a benchmark's requests are not what users felt, and a
        // client that forced its variant could trip a guardrail at will.
        if let (Some(g), true) = (&x.guard, m.purpose == Purpose::Live && !m.variant_forced) {
            for (variant, trip) in g.observe(rec) {
                (self.on_trip)(&m.route, &variant, &trip);
            }
        }
    }
}
