//! Every OpenTelemetry attribute, event and metric name the gateway emits, in one place.
//!
//! GenAI names follow the OpenTelemetry semantic conventions for generative AI (development
//! status, as of semconv 1.37); HTTP names the stable HTTP conventions. The constants are their
//! own documentation.
#![allow(missing_docs)]

// HTTP server span (stable HTTP semantic conventions).
pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
pub const HTTP_ROUTE: &str = "http.route";
pub const URL_PATH: &str = "url.path";
pub const NETWORK_PROTOCOL_VERSION: &str = "network.protocol.version";
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const ERROR_TYPE: &str = "error.type";

// GenAI (client span for the upstream attempt, and metric attributes).
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// Semconv ≤ 1.36 name of `gen_ai.provider.name`, emitted too unless the latest-only opt-in is set.
pub const GEN_AI_SYSTEM: &str = "gen_ai.system";
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const GEN_AI_REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const GEN_AI_REQUEST_TOP_P: &str = "gen_ai.request.top_p";
pub const GEN_AI_REQUEST_STREAM: &str = "gen_ai.request.stream";
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub const GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
pub const GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: &str = "gen_ai.usage.reasoning.output_tokens";
pub const GEN_AI_INPUT_MESSAGES: &str = "gen_ai.input.messages";
pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
pub const GEN_AI_TOKEN_TYPE: &str = "gen_ai.token.type";

// inferscope's own measurements (seconds, like the GenAI conventions).
pub const IS_REQUEST_ID: &str = "inferscope.request_id";
pub const IS_ROUTE: &str = "inferscope.route";
/// Name of the client's API key (never the key).
pub const IS_CLIENT_KEY: &str = "inferscope.client.key";
pub const IS_BACKEND: &str = "inferscope.backend";
pub const IS_VARIANT: &str = "inferscope.variant";
/// Why the request was sent: `live`, `shadow`, `eval`, `bench`.
pub const IS_PURPOSE: &str = "inferscope.purpose";
/// The client forced the experiment's variant (present only when it did).
pub const IS_VARIANT_FORCED: &str = "inferscope.variant_forced";
pub const IS_OUTCOME: &str = "inferscope.outcome";
pub const IS_TTFT: &str = "inferscope.ttft";
pub const IS_TTFC: &str = "inferscope.ttfc";
pub const IS_TPOT: &str = "inferscope.tpot";
pub const IS_E2E: &str = "inferscope.e2e";
pub const IS_UPSTREAM_TTFT: &str = "inferscope.upstream_ttft";
pub const IS_OVERHEAD: &str = "inferscope.overhead";
/// Where `t0` came from: `kernel` (the receive stamp of the request's first byte) or `user`.
pub const IS_CLOCK: &str = "inferscope.clock";
/// Kernel arrival → the gateway's service call, seconds.
pub const IS_ACCEPT_DELAY: &str = "inferscope.accept_delay";
/// Largest upstream read stamp → hand-off to the client, seconds (a lower bound).
pub const IS_FORWARD_LAG: &str = "inferscope.forward_lag";
pub const IS_ITL_P50: &str = "inferscope.itl.p50";
pub const IS_ITL_P99: &str = "inferscope.itl.p99";
pub const IS_ITL_MAX: &str = "inferscope.itl.max";
pub const IS_ITL_COUNT: &str = "inferscope.itl.count";
pub const IS_TOKENS_SOURCE: &str = "inferscope.tokens_source";
/// What an inter-token gap means per token: `exact`, `derived` or `assumed`.
pub const IS_EVENT_TOKENS: &str = "inferscope.event_tokens";
/// The engine's own prefill and decode time (Ollama, llama.cpp), seconds.
pub const IS_ENGINE_PREFILL: &str = "inferscope.engine.prefill";
pub const IS_ENGINE_DECODE: &str = "inferscope.engine.decode";
/// Time in the engine's queue, seconds (from the engine's span, `engine_spans:`).
pub const IS_ENGINE_QUEUE: &str = "inferscope.engine.queue";
/// `joined` or `missing`: whether the engine's span came (`engine_spans:`).
pub const IS_ENGINE_SPAN: &str = "inferscope.engine.span";
/// The request waited in the engine's queue far longer than its neighbours.
pub const IS_STARVED: &str = "inferscope.starved";
/// What neither the gateway nor the engine accounts for in the TTFT / E2E, seconds (signed).
pub const IS_TTFT_REST: &str = "inferscope.ttft.rest";
/// See `IS_TTFT_REST`.
pub const IS_E2E_REST: &str = "inferscope.e2e.rest";
/// The backend engine's load when the request was sent (its latest fresh scrape).
pub const IS_BACKEND_RUNNING: &str = "inferscope.backend.running";
pub const IS_BACKEND_QUEUE_DEPTH: &str = "inferscope.backend.queue_depth";
pub const IS_BACKEND_KV_CACHE_USAGE: &str = "inferscope.backend.kv_cache_usage";
/// Event on the client span at the first output token.
pub const EVENT_FIRST_TOKEN: &str = "inferscope.first_token";

// OpenInference (Arize Phoenix), used with `format: openinference`.
pub const OI_SPAN_KIND: &str = "openinference.span.kind";
pub const OI_LLM_MODEL_NAME: &str = "llm.model_name";
pub const OI_LLM_PROVIDER: &str = "llm.provider";
pub const OI_LLM_INVOCATION_PARAMETERS: &str = "llm.invocation_parameters";
pub const OI_TOKEN_COUNT_PROMPT: &str = "llm.token_count.prompt";
pub const OI_TOKEN_COUNT_COMPLETION: &str = "llm.token_count.completion";
pub const OI_TOKEN_COUNT_TOTAL: &str = "llm.token_count.total";
pub const OI_INPUT_VALUE: &str = "input.value";
pub const OI_OUTPUT_VALUE: &str = "output.value";

// Metrics (GenAI conventions' names, units and advisory bucket boundaries).
pub const M_REQUEST_DURATION: &str = "gen_ai.server.request.duration";
pub const M_TTFT: &str = "gen_ai.server.time_to_first_token";
pub const M_TPOT: &str = "gen_ai.server.time_per_output_token";
pub const M_TOKEN_USAGE: &str = "gen_ai.client.token.usage";

/// Instrumentation scope name.
pub const SCOPE: &str = "inferscope";
