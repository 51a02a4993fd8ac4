//! `load()` → `parse()` → `validate()`: text to an immutable `Config`, or an error that names the
//! file, the line and the key.

use super::locate::{locate, Seg};
use super::schema::{BackendConfig, Config, RouteConfig};
use crate::sim::Profile;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// A configuration problem, located: `file:line:column: key: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {key}: {message}", location(*.line, *.column))]
pub struct ConfigError {
    /// File name as given (or `<embedded default>`).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// Dotted key path, e.g. `routes[0].backends[1]`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// `:line:column`, `:line` or nothing.
fn location(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

/// Reads, parses and validates the config file at `path`.
pub fn load(path: &Path) -> Result<Arc<Config>, ConfigError> {
    let file = path.display().to_string();
    let text = crate::util::fs::read_to_string(path, crate::util::fs::CONFIG_CAP).map_err(|e| {
        ConfigError {
            file: file.clone(),
            line: None,
            column: None,
            key: "(file)".into(),
            message: format!("cannot read: {e}"),
        }
    })?;
    parse(&text, &file).map(Arc::new)
}

/// 1-based line and column of byte `index` in `text`, lines ending at `\n` only, as editors and
/// `sed -n Np` count them. The YAML parser's own line count also breaks at `\r`, U+0085, U+2028
/// and U+2029 (YAML 1.1 line breaks), which would name a line no editor shows.
pub(super) fn line_and_column(text: &str, index: usize) -> (usize, usize) {
    let mut end = index.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

/// Parses and validates config `text`; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
        let key = match e.path().to_string() {
            p if p == "." || p.is_empty() => "(top level)".to_string(),
            p => p,
        };
        let inner = e.into_inner();
        let loc = inner.location();
        let message = inner.to_string();
        // the YAML parser appends " at line L column C"; the location is printed in front instead.
        let message = match message.find(" at line ") {
            Some(i) => message[..i].to_string(),
            None => message,
        };
        // it also prefixes its own path ("routes[0]: …"); the key is printed already.
        let message = match message.split_once(": ") {
            Some((head, rest)) if !head.contains(' ') && key.starts_with(head) => rest.to_string(),
            _ => message,
        };
        let (line, column) = match loc.map(|l| line_and_column(text, l.index())) {
            Some((l, c)) => (Some(l), Some(c)),
            None => (None, None),
        };
        ConfigError {
            file: file.to_string(),
            line,
            column,
            key,
            message,
        }
    })?;
    validate(&config).map_err(|(path, message)| {
        let at = locate(text, &path);
        ConfigError {
            file: file.to_string(),
            line: at.map(|(l, _)| l),
            column: at.map(|(_, c)| c),
            key: super::locate::render(&path),
            message,
        }
    })?;
    Ok(config)
}

/// What `serve` would refuse that the file alone does not show: an `api_key_env` variable that
/// is unset or not a valid header value, an access-log or feedback path that is a directory or
/// whose directory is missing, telemetry the environment leaves incomplete. `inferscope check`
/// runs it after `load`, so a config it calls ok starts. (`env` reads the environment.)
pub fn check_environment(
    path: &Path,
    c: &Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let text =
        crate::util::fs::read_to_string(path, crate::util::fs::CONFIG_CAP).unwrap_or_default();
    environment(c, &env).map_err(|(keys, message)| {
        let at = locate(&text, &keys);
        ConfigError {
            file: path.display().to_string(),
            line: at.map(|(l, _)| l),
            column: at.map(|(_, c)| c),
            key: super::locate::render(&keys),
            message,
        }
    })
}

fn environment(c: &Config, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Invalid> {
    use Seg::{Index as I, Key as K};
    for (i, b) in c.backends.iter().enumerate() {
        if let Some(var) = &b.api_key_env {
            let at = || vec![K("backends"), I(i), K("api_key_env")];
            match env(var) {
                None => return err(at(), format!("environment variable {var} is not set")),
                Some(v) if http::HeaderValue::try_from(format!("Bearer {v}")).is_err() => {
                    return err(at(), format!("{var} is not a valid header value"))
                }
                Some(_) => {}
            }
        }
    }
    if let Some(var) = &c.admin.token_env {
        match env(var) {
            None => {
                return err(
                    vec![K("admin"), K("token_env")],
                    format!("environment variable {var} is not set"),
                )
            }
            Some(t) if t.len() < 16 => {
                return err(
                    vec![K("admin"), K("token_env")],
                    format!("{var} holds fewer than 16 characters: too short for a token"),
                )
            }
            Some(_) => {}
        }
    }
    if let Some(m) = super::admin_exposure(&c.admin, c.admin.listen) {
        return err(vec![K("admin"), K("listen")], m);
    }
    let writable = |p: &Path| -> Result<(), String> {
        if p.as_os_str() == "-" {
            return Ok(());
        }
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => Err(format!("{} is a directory", p.display())),
            Ok(_) => std::fs::OpenOptions::new()
                .append(true)
                .open(p)
                .map(drop)
                .map_err(|e| format!("{} cannot be opened for appending: {e}", p.display())),
            Err(_) => {
                let dir = match p.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                if dir.is_dir() {
                    Ok(())
                } else {
                    Err(format!("directory {} does not exist", dir.display()))
                }
            }
        }
    };
    if let Some(a) = &c.access_log {
        writable(&a.path).map_err(|m| (vec![K("access_log"), K("path")], m))?;
    }
    if let Some(f) = &c.feedback {
        writable(&f.path).map_err(|m| (vec![K("feedback"), K("path")], m))?;
    }
    if let Some(dir) = &c.state_dir {
        // The directory is made at start where it is missing; its file must be appendable.
        if dir.is_file() {
            return err(
                vec![K("state_dir")],
                format!("{} is a file, not a directory", dir.display()),
            );
        }
        if dir.is_dir() {
            writable(&dir.join("quality.jsonl")).map_err(|m| (vec![K("state_dir")], m))?;
        }
    }
    let telemetry = super::telemetry::resolve(c.telemetry.as_ref(), |k| env(k))
        .map_err(|m| (vec![K("telemetry")], m.to_string()))?;
    if let Some(files) = telemetry.and_then(|t| t.tls) {
        crate::tls::ClientTls::new(&files, &[])
            .map_err(|e| (vec![K("telemetry"), K("otlp"), K("tls")], e.to_string()))?;
    }
    // TLS material loads as it will at start.
    if let Some(t) = &c.tls {
        crate::tls::ServerTls::load(t.files()).map_err(|e| (vec![K("tls")], e.to_string()))?;
    }
    if let Some(t) = &c.admin.tls {
        crate::tls::ServerTls::load(t.files())
            .map_err(|e| (vec![K("admin"), K("tls")], e.to_string()))?;
    }
    for (i, b) in c.backends.iter().enumerate() {
        if b.url.as_deref().is_some_and(|u| u.starts_with("https://")) {
            crate::tls::ClientTls::new(&b.tls.clone().unwrap_or_default().files(), &[])
                .map_err(|e| (vec![K("backends"), I(i), K("tls")], e.to_string()))?;
        }
    }
    // Client keys from the environment or a file are there and not empty.
    if let Some(a) = &c.auth {
        for (i, k) in a.keys.iter().enumerate() {
            let at = |f: &'static str| vec![K("auth"), K("keys"), I(i), K(f)];
            if let Some(var) = &k.key_env {
                if env(var).is_none_or(|v| v.trim().is_empty()) {
                    return err(
                        at("key_env"),
                        format!("environment variable {var} is not set"),
                    );
                }
            }
            if let Some(p) = &k.key_file {
                match crate::util::fs::read_to_string(p, crate::util::fs::SECRET_CAP) {
                    Ok(t) if !t.trim().is_empty() => {}
                    Ok(_) => return err(at("key_file"), format!("{} is empty", p.display())),
                    Err(e) => return err(at("key_file"), format!("{}: {e}", p.display())),
                }
            }
        }
    }
    Ok(())
}

type Invalid = (Vec<Seg>, String);

fn err<T>(path: Vec<Seg>, msg: impl Into<String>) -> Result<T, Invalid> {
    Err((path, msg.into()))
}

/// Checks what the schema alone cannot: references, uniqueness, ranges.
pub(super) fn validate(c: &Config) -> Result<(), Invalid> {
    use Seg::{Index as I, Key as K};
    if c.backends.is_empty() {
        return err(vec![K("backends")], "at least one backend is required");
    }
    let mut names = HashSet::new();
    for (i, b) in c.backends.iter().enumerate() {
        let at = |k: &'static str| vec![K("backends"), I(i), K(k)];
        if b.name.is_empty() || !names.insert(b.name.as_str()) {
            return err(
                at("name"),
                format!("backend name `{}` is empty or not unique", b.name),
            );
        }
        validate_backend(b).map_err(|(k, m)| (at(k), m))?;
    }
    if c.routes.is_empty() {
        return err(vec![K("routes")], "at least one route is required");
    }
    let mut routes = HashSet::new();
    for (i, r) in c.routes.iter().enumerate() {
        if r.name.is_empty() || !routes.insert(r.name.as_str()) {
            return err(
                vec![K("routes"), I(i), K("name")],
                format!("route name `{}` is empty or not unique", r.name),
            );
        }
        validate_route(r, &names).map_err(|(mut p, m)| {
            let mut full = vec![K("routes"), I(i)];
            full.append(&mut p);
            (full, m)
        })?;
    }
    validate_auth(c)?;
    let l = &c.limits;
    let limits = [
        ("max_request_body_bytes", l.max_request_body_bytes),
        ("max_concurrent_requests", l.max_concurrent_requests),
        ("max_event_bytes", l.max_event_bytes),
        ("max_connections", l.max_connections),
        ("listen_backlog", l.listen_backlog as usize),
        ("max_header_count", l.max_header_count),
        ("max_header_bytes", l.max_header_bytes),
        ("h2_max_streams", l.h2_max_streams as usize),
        ("max_buffered_body_bytes", l.max_buffered_body_bytes),
        ("max_model_name_bytes", l.max_model_name_bytes),
    ];
    for (k, v) in limits {
        if v == 0 {
            return err(vec![K("limits"), K(k)], "must be greater than 0");
        }
    }
    let durations = [
        ("header_read_timeout", l.header_read_timeout),
        ("client_idle_timeout", l.client_idle_timeout),
        ("body_read_timeout", l.body_read_timeout),
    ];
    for (k, d) in durations {
        if d.is_zero() {
            return err(vec![K("limits"), K(k)], "must be longer than 0");
        }
    }
    if !(l.overload_at > 0.0 && l.overload_at <= 1.0) {
        return err(
            vec![K("limits"), K("overload_at")],
            "must be a fraction above 0 and at most 1 (1: never under pressure)",
        );
    }
    if let Some(a) = &c.access_log {
        if a.queue == 0 {
            return err(vec![K("access_log"), K("queue")], "must be greater than 0");
        }
        if let Some(r) = &a.rotate {
            if r.max_bytes.is_none() && r.max_age.is_none() {
                return err(
                    vec![K("access_log"), K("rotate")],
                    "needs max_bytes or max_age",
                );
            }
            if r.max_bytes == Some(0) {
                return err(
                    vec![K("access_log"), K("rotate"), K("max_bytes")],
                    "must be greater than 0",
                );
            }
            if a.path.as_os_str() == "-" {
                return err(
                    vec![K("access_log"), K("rotate")],
                    "standard output cannot be rotated",
                );
            }
        }
    }
    if let Some(t) = &c.telemetry {
        // The environment may still complete it at start; here only what the file says is judged.
        super::telemetry::resolve(Some(t), |_| None)
            .map_err(|m| (vec![K("telemetry")], m.to_string()))?;
    }
    Ok(())
}

fn validate_auth(c: &Config) -> Result<(), Invalid> {
    use Seg::{Index as I, Key as K};
    let mut key_names = HashSet::new();
    if let Some(a) = &c.auth {
        if a.keys.is_empty() {
            return err(vec![K("auth"), K("keys")], "at least one key is required");
        }
        for (i, k) in a.keys.iter().enumerate() {
            let at = |f: &'static str| vec![K("auth"), K("keys"), I(i), K(f)];
            if k.name.is_empty()
                || k.name.len() > 64
                || !k
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            {
                return err(
                    at("name"),
                    format!("key name `{}`: 1 to 64 of A-Z a-z 0-9 - _ . :", k.name),
                );
            }
            if !key_names.insert(k.name.as_str()) {
                return err(at("name"), format!("key name `{}` is not unique", k.name));
            }
            let sources = [
                k.sha256.is_some(),
                k.key_env.is_some(),
                k.key_file.is_some(),
            ];
            if sources.iter().filter(|s| **s).count() != 1 {
                return err(
                    at("name"),
                    format!(
                        "key `{}`: give exactly one of sha256, key_env, key_file",
                        k.name
                    ),
                );
            }
            if let Some(h) = &k.sha256 {
                if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return err(at("sha256"), "must be 64 hex digits (a SHA-256 digest)");
                }
            }
        }
    }
    let Some(r) = &c.rate_limits else {
        return Ok(());
    };
    let check = |limit: &super::schema::RateLimit, at: Vec<Seg>| -> Result<(), Invalid> {
        if limit.requests_per_minute.is_none() && limit.tokens_per_minute.is_none() {
            return err(at, "needs requests_per_minute or tokens_per_minute");
        }
        for (k, v) in [
            ("requests_per_minute", limit.requests_per_minute),
            ("tokens_per_minute", limit.tokens_per_minute),
        ] {
            if v == Some(0) {
                let mut at = at.clone();
                at.push(K(k));
                return err(at, "must be greater than 0");
            }
        }
        Ok(())
    };
    if let Some(p) = &r.per_key {
        if c.auth.is_none() {
            return err(
                vec![K("rate_limits"), K("per_key")],
                "per-key limits need client keys (an `auth` section)",
            );
        }
        check(p, vec![K("rate_limits"), K("per_key")])?;
    }
    for (name, limit) in &r.keys {
        let at = vec![K("rate_limits"), K("keys")];
        if !key_names.contains(name.as_str()) {
            return err(at, format!("no key named `{name}` in auth.keys"));
        }
        check(limit, at).map_err(|(p, m)| (p, format!("{name}: {m}")))?;
    }
    for (name, limit) in &r.routes {
        let at = vec![K("rate_limits"), K("routes")];
        if !c.routes.iter().any(|rt| &rt.name == name) {
            return err(at, format!("no route named `{name}`"));
        }
        check(limit, at).map_err(|(p, m)| (p, format!("{name}: {m}")))?;
    }
    Ok(())
}

fn validate_backend(b: &BackendConfig) -> Result<(), (&'static str, String)> {
    if let Some(p) = &b.price {
        match (p.per_million_output_tokens, p.per_gpu_hour) {
            (Some(x), None) | (None, Some(x)) if x.is_finite() && x >= 0.0 => {}
            (Some(_), Some(_)) | (None, None) => {
                return Err((
                    "price",
                    "give exactly one of per_million_output_tokens and per_gpu_hour".into(),
                ))
            }
            _ => return Err(("price", "a price is a number, 0 or more".into())),
        }
        let c = p.currency();
        if !(c.len() == 3 && c.chars().all(|c| c.is_ascii_uppercase())) {
            return Err((
                "price",
                format!("currency `{c}` is not a three-letter ISO 4217 code such as USD or EUR"),
            ));
        }
    }
    match (&b.url, &b.sim) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(("url", "give exactly one of `url` and `sim`".into()))
        }
        (Some(url), None) => {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| ("url", format!("`{url}` is not a URL: {e}")))?;
            match uri.scheme_str() {
                Some("http") => {
                    if b.tls.is_some() {
                        return Err(("tls", format!("`{url}` is http://: tls needs https://")));
                    }
                }
                Some("https") => {}
                _ => {
                    return Err((
                        "url",
                        format!("`{url}` must start with http:// or https://"),
                    ))
                }
            }
            if uri.host().is_none() {
                return Err(("url", format!("`{url}` has no host")));
            }
            let path = uri.path().trim_end_matches('/');
            if let Some(endpoint) = [
                "/chat/completions",
                "/completions",
                "/messages",
                "/responses",
                "/embeddings",
                "/generate",
            ]
            .into_iter()
            .find(|e| path.ends_with(e))
            {
                let trimmed = url.trim_end_matches('/');
                let base = trimmed.strip_suffix(endpoint).unwrap_or(trimmed);
                return Err((
                    "url",
                    format!(
                        "`{url}` names an endpoint ({endpoint}): give the server's base URL, e.g. `{base}` (each request keeps its own path)"
                    ),
                ));
            }
            if uri.query().is_some() {
                return Err((
                    "url",
                    format!("`{url}`: no query string; the request's own is forwarded"),
                ));
            }
        }
        (None, Some(sim)) => {
            sim_profile(&sim.profile).map_err(|m| ("sim", m.to_string()))?;
        }
    }
    if b.sim.is_some() && b.tls.is_some() {
        return Err((
            "tls",
            "a simulated backend is reached over plain http".into(),
        ));
    }
    if http::HeaderName::try_from(b.api_key_header.as_str()).is_err() {
        return Err((
            "api_key_header",
            format!("`{}` is not a header name", b.api_key_header),
        ));
    }
    if let Some(t) = &b.tls {
        if t.cert.is_some() != t.key.is_some() {
            return Err(("tls", "a client certificate needs both cert and key".into()));
        }
        if t.roots == super::schema::RootsConfig::None && t.ca_file.is_none() {
            return Err(("tls", "roots: none needs a ca_file to trust".into()));
        }
    }
    if b.max_concurrency == Some(0) {
        return Err(("max_concurrency", "must be greater than 0".into()));
    }
    if let Some(m) = &b.model {
        let positive = |x: f64| x > 0.0 && x.is_finite();
        if !positive(m.params_b)
            || !positive(m.bytes_per_param)
            || m.kv_bytes_per_token.is_some_and(|k| !positive(k))
        {
            return Err((
                "model",
                "params_b, bytes_per_param and kv_bytes_per_token must be positive".into(),
            ));
        }
        if b.gpu.is_none() {
            return Err(("model", "a roofline needs `gpu:` too".into()));
        }
    }
    if let Some(g) = &b.gpu {
        if let Some(p) = &g.preset {
            let known = crate::GPU_PRESETS;
            if !known.iter().any(|k| k.eq_ignore_ascii_case(p)) {
                return Err((
                    "gpu",
                    format!("preset `{p}` is none of {}", known.join(", ")),
                ));
            }
        } else if g.hbm_gb_s.is_none() || g.tflops.is_none() {
            return Err(("gpu", "give a preset, or both hbm_gb_s and tflops".into()));
        }
        if [g.hbm_gb_s, g.tflops]
            .into_iter()
            .flatten()
            .any(|x| x <= 0.0 || !x.is_finite())
        {
            return Err(("gpu", "hbm_gb_s and tflops must be positive".into()));
        }
        if b.model.is_none() {
            return Err(("gpu", "a roofline needs `model:` too".into()));
        }
    }
    if let Some(e) = &b.engine_spans {
        if !(e.starved_factor.is_finite() && e.starved_factor >= 1.0) {
            return Err((
                "engine_spans",
                "starved_factor must be a number of at least 1".into(),
            ));
        }
        if e.starved_window.is_zero() {
            return Err((
                "engine_spans",
                "starved_window must be longer than 0s".into(),
            ));
        }
    }
    if let Some(m) = &b.metrics {
        if let Some(u) = &m.url {
            super::forms::check_scrape_url(u).map_err(|e| ("metrics", e))?;
        }
        if m.url.is_none() && m.gpu_url.is_none() {
            return Err((
                "metrics",
                "url and gpu_url are both null: nothing to scrape".into(),
            ));
        }
        if m.interval.is_zero() || m.timeout.is_zero() {
            return Err((
                "metrics",
                "interval and timeout must be greater than 0".into(),
            ));
        }
    }
    if let Some(p) = &b.probe {
        if !p.path.starts_with('/') {
            return Err(("probe", format!("path `{}` must start with /", p.path)));
        }
        if p.interval.is_zero()
            || p.timeout.is_zero()
            || p.healthy_threshold == 0
            || p.unhealthy_threshold == 0
        {
            return Err((
                "probe",
                "interval, timeout and thresholds must be greater than 0".into(),
            ));
        }
    }
    Ok(())
}

/// A simulator profile that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Neither a built-in name nor a readable file.
    #[error("profile `{name}` is neither fp16, int8 nor a readable file: {error}")]
    Unreadable {
        /// As given.
        name: String,
        /// Why it could not be read.
        error: std::io::Error,
    },
    /// Not a profile YAML.
    #[error("profile file `{name}`: {error}")]
    Parse {
        /// File name.
        name: String,
        /// The YAML error.
        error: serde_yaml_ng::Error,
    },
    /// Values out of range.
    #[error("profile file `{name}`: {error}")]
    Invalid {
        /// File name.
        name: String,
        /// What is wrong.
        error: crate::sim::InvalidProfile,
    },
}

/// Resolves a simulator profile: a built-in name or a YAML file.
pub fn sim_profile(name: &str) -> Result<Profile, ProfileError> {
    if let Some(p) = Profile::named(name) {
        return Ok(p);
    }
    let text = crate::util::fs::read_to_string(Path::new(name), crate::util::fs::CONFIG_CAP)
        .map_err(|error| ProfileError::Unreadable {
            name: name.into(),
            error,
        })?;
    let p: Profile = serde_yaml_ng::from_str(&text).map_err(|error| ProfileError::Parse {
        name: name.into(),
        error,
    })?;
    p.validate().map_err(|error| ProfileError::Invalid {
        name: name.into(),
        error,
    })?;
    Ok(p)
}

fn validate_route(r: &RouteConfig, backends: &HashSet<&str>) -> Result<(), Invalid> {
    use Seg::{Index as I, Key as K};
    if !(0.0..=10.0).contains(&r.retry.budget_ratio) {
        return err(
            vec![K("retry"), K("budget_ratio")],
            "must be between 0 and 10",
        );
    }
    if let Some(s) = r.retry.statuses.iter().find(|s| !(100..=599).contains(*s)) {
        return err(
            vec![K("retry"), K("statuses")],
            format!("{s} is not an HTTP status"),
        );
    }
    if let Some(slo) = &r.slo {
        let set = [slo.ttft, slo.tpot, slo.itl, slo.e2e];
        if set.iter().all(Option::is_none) {
            return err(vec![K("slo")], "set at least one of ttft, tpot, itl, e2e");
        }
        if set.iter().flatten().any(std::time::Duration::is_zero) {
            return err(vec![K("slo")], "an objective of 0s can never be met");
        }
    }
    if let Some(p) = &r.matcher.path_prefix {
        if !p.starts_with('/') {
            return err(
                vec![K("match"), K("path_prefix")],
                format!("`{p}` must start with /"),
            );
        }
    }
    let check = |list: &[String], base: Vec<Seg>| -> Result<(), Invalid> {
        if list.is_empty() {
            return err(base, "needs at least one backend");
        }
        for (j, b) in list.iter().enumerate() {
            if !backends.contains(b.as_str()) {
                let mut p = base.clone();
                p.push(I(j));
                return err(p, format!("unknown backend `{b}`"));
            }
        }
        Ok(())
    };
    match (&r.experiment, r.backends.is_empty()) {
        (Some(_), false) => err(
            vec![K("backends")],
            "give either `backends` or `experiment`, not both",
        ),
        (None, true) => err(
            vec![K("backends")],
            "a route needs `backends` or an `experiment`",
        ),
        (None, false) => check(&r.backends, vec![K("backends")]),
        (Some(x), true) => {
            let base = || vec![K("experiment")];
            if x.variants.is_empty() {
                return err(
                    vec![K("experiment"), K("variants")],
                    "at least one variant is required",
                );
            }
            if let Some(sh) = &x.shadow {
                let at = vec![K("experiment"), K("shadow")];
                if !x.variants.iter().any(|v| v.name == sh.variant) {
                    return err(at, format!("unknown variant `{}`", sh.variant));
                }
                if !(0.0..=1.0).contains(&sh.fraction) || sh.max_concurrency == 0 {
                    return err(
                        at,
                        "fraction must be between 0 and 1 and max_concurrency above 0",
                    );
                }
            }
            if let Some(a) = &x.accept {
                if a.limits().next().is_none() {
                    return err(vec![K("experiment"), K("accept")], "set at least one of ttft_change_max, tpot_change_max, e2e_change_max, accuracy_drop_max_points, ppl_rise_max, energy_change_max");
                }
                if let Some((k, v)) = a.limits().find(|(_, v)| !v.is_finite()) {
                    return err(
                        vec![K("experiment"), K("accept"), K(k)],
                        format!("{v} is not a number"),
                    );
                }
            }
            if !(x.max_client_share > 0.0 && x.max_client_share <= 1.0) {
                return err(
                    vec![K("experiment"), K("max_client_share")],
                    "a share above 0 and at most 1 (1: unbounded)",
                );
            }
            if x.on_accept.is_some() && x.accept.is_none() {
                return err(
                    vec![K("experiment"), K("on_accept")],
                    "promote acts on the verdict: set `accept:` limits too",
                );
            }
            if let Some(p) = &x.promote {
                let at = vec![K("experiment"), K("promote"), K("steps")];
                if p.steps.is_empty()
                    || p.steps.windows(2).any(|w| w[0] >= w[1])
                    || p.steps.iter().any(|s| !(1..=100).contains(s))
                {
                    return err(
                        at,
                        "rising shares in percent, 1 to 100 (e.g. [25, 50, 100])",
                    );
                }
                if x.on_accept.is_none() {
                    return err(
                        vec![K("experiment"), K("promote")],
                        "used by `on_accept: promote`, which is not set",
                    );
                }
            }
            if let Some(g) = &x.guardrails {
                for (j, rule) in g.rules.iter().enumerate() {
                    let at = vec![K("experiment"), K("guardrails"), K("rules"), I(j)];
                    if rule.max.is_none() && rule.min.is_none() {
                        return err(at, "a rule needs `max` or `min`");
                    }
                    if let Some(v) = &rule.variant {
                        if !x.variants.iter().any(|x| &x.name == v) {
                            return err(at, format!("unknown variant `{v}`"));
                        }
                    }
                }
            }
            let mut seen = HashSet::new();
            let mut total = 0u64;
            let mut controls = 0;
            for (v, var) in x.variants.iter().enumerate() {
                let at = |k: &'static str| vec![K("experiment"), K("variants"), I(v), K(k)];
                if var.name.is_empty() || !seen.insert(var.name.as_str()) {
                    return err(
                        at("name"),
                        format!("variant name `{}` is empty or not unique", var.name),
                    );
                }
                check(&var.backends, at("backends"))?;
                total += u64::from(var.weight);
                controls += usize::from(var.control);
            }
            if total == 0 {
                return err(base(), "the variants' weights add up to 0");
            }
            if controls != 1 {
                return err(
                    vec![K("experiment"), K("variants")],
                    format!("exactly one variant must be `control: true` (found {controls})"),
                );
            }
            Ok(())
        }
    }
}
