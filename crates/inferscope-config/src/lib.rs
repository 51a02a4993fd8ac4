//! Configuration: YAML schema (serde, unknown keys rejected), `load()` → `validate()` → immutable
//! `Arc<Config>`, errors that name file, line and key, and the embedded default. serde_yaml_ng (the maintained fork of serde_yaml) is used
//! only here.

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

// The layers below under the names the modules use.
use inferscope_meter as meter;
use inferscope_server::{tls, util};
use inferscope_sim as sim;
use inferscope_wire::sse;

mod duration;
mod forms;
mod load;
mod locate;
mod schema;
pub mod telemetry;

pub use duration::{parse as parse_duration, BadDuration};
pub use forms::{GpuSource, GuardLatency, GuardMetric, StickyKey};
pub use load::{check_environment, load, parse, sim_profile, ConfigError, ProfileError};
pub use schema::{
    AcceptConfig, AccessLogConfig, AdminConfig, BackendConfig, BatchConfig, Config,
    EngineSpansConfig, ExperimentConfig, HistogramAggregation, Limits, MatchConfig, OtlpConfig,
    RouteConfig, SimBackend, TelemetryConfig, TelemetryFormat, VariantConfig,
};
pub use schema::{
    ApiKeyConfig, AuthConfig, ClientAuth, ClientTlsConfig, RateLimit, RateLimitsConfig,
    RootsConfig, ServerTlsConfig,
};
pub use schema::{
    Balancer, FeedbackConfig, GpuSpec, GuardRule, GuardrailsConfig, MetricsConfig, ModelSpec,
    OnAccept, OnReject, OutlierConfig, PriceConfig, ProbeConfig, PromoteConfig, RetryConfig,
    ShadowConfig, SloConfig, TimeoutsConfig, GPU_PRESETS,
};
pub use schema::{
    DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, DEFAULT_MAX_CLIENT_SHARE, DEFAULT_MIN_SAMPLES,
};
pub use telemetry::{
    resolve as resolve_telemetry, Protocol, Settings as TelemetrySettings, SettingsError,
};

/// The embedded default (also shipped as `config/default.yaml`): two in-process simulated
/// backends, `fp16` and `int8`, behind model `demo`, split 50/50.
pub const DEFAULT_YAML: &str = include_str!("../../../config/default.yaml");

/// Name used for the embedded default in errors and logs.
pub const DEFAULT_NAME: &str = "<embedded default>";

/// The JSON Schema (draft-07, which editors' YAML language servers read) of the config file,
/// from the config types themselves: their keys, types, defaults and doc comments.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<Config>();
    schema.insert("title".into(), "inferscope configuration".into());
    schema.to_value()
}

/// The embedded default, parsed.
pub fn embedded_default() -> Result<Config, ConfigError> {
    parse(DEFAULT_YAML, DEFAULT_NAME)
}

/// Why the admin plane may not listen on `addr` as configured: a non-loopback address without a
/// token (and without `allow_unauthenticated`) would hand `/stats`, `/experiments` and
/// `POST /feedback` to anyone who reaches it.
pub fn admin_exposure(admin: &AdminConfig, addr: std::net::SocketAddr) -> Option<String> {
    let mtls = admin
        .tls
        .as_ref()
        .is_some_and(|t| t.client_ca.is_some() && t.client_auth == ClientAuth::Required);
    (!addr.ip().is_loopback()
        && admin.token_env.is_none()
        && !mtls
        && !admin.allow_unauthenticated)
        .then(|| {
            format!(
                "{addr} is not a loopback address: set admin.token_env (a bearer token), admin.tls with a required client certificate, or admin.allow_unauthenticated: true"
            )
        })
}
