//! Request-side helpers: what the gateway reads from an inference request's JSON body (and the
//! `stream_options.include_usage` it adds), and hop-by-hop header removal.

use crate::dialect::Endpoint;
use crate::meter::RequestParams;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// What the gateway learned from an inference request body, and the body to forward.
#[derive(Debug)]
pub struct Prepared {
    /// `model`, when the body names one.
    pub model: Option<String>,
    /// `stream: true`.
    pub stream: bool,
    /// The body's `user` (an experiment's sticky key may use it).
    pub user: Option<String>,
    /// The gateway added `include_usage`, so the usage-only chunk must be cut from the response.
    pub strip_usage: bool,
    /// The body to forward (the original bytes unless usage was injected).
    pub body: Bytes,
    /// Parameters telemetry reports (operation left for the caller).
    pub params: RequestParams,
}

/// Deepest nesting of a JSON request body (serde_json's recursion limit): a deeper body's `model`
/// cannot be read, so it is refused rather than routed as if it named none.
pub const MAX_JSON_DEPTH: usize = 128;

/// A JSON body nested deeper than `MAX_JSON_DEPTH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the JSON body nests deeper than {MAX_JSON_DEPTH} levels")]
pub struct TooDeep;

/// Prepares a request body for `endpoint` for forwarding: reads what measurement and routing
/// need (`model`, `stream`, `user`, parameters, each where that dialect keeps it) and, for a
/// streaming OpenAI chat or completions request that does not ask for usage, rewrites the body
/// to ask for it (the response's extra usage chunk is then cut out again). The other dialects
/// report their counts unasked. A body that is not a JSON object is forwarded untouched. With
/// `capture` (content capture opted in), the input messages are kept, up to that many bytes. A
/// body nested deeper than `MAX_JSON_DEPTH` is an error.
pub fn prepare_body(
    body: Bytes,
    endpoint: Endpoint,
    capture: Option<usize>,
) -> Result<Prepared, TooDeep> {
    let mut out = Prepared {
        model: None,
        user: None,
        stream: endpoint.streams_by_default(),
        strip_usage: false,
        body,
        params: RequestParams::default(),
    };
    let mut v = match serde_json::from_slice::<Value>(&out.body) {
        Ok(Value::Object(v)) => v,
        // serde_json's only way of saying it: the message (checked in the tests below).
        Err(e) if e.is_syntax() && e.to_string().starts_with("recursion limit exceeded") => {
            return Err(TooDeep)
        }
        _ => return Ok(out),
    };
    out.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
    out.user = v
        .get("user")
        .or_else(|| v.get("metadata").and_then(|m| m.get("user_id")))
        .and_then(Value::as_str)
        .map(str::to_owned);
    if endpoint.stream_in_body() {
        if let Some(s) = v.get("stream").and_then(Value::as_bool) {
            out.stream = s;
        }
    }
    let param = |names: &[&str]| crate::dialect::request_param(&v, names);
    out.params.max_tokens = param(&crate::dialect::MAX_TOKENS_PARAMS).and_then(Value::as_u64);
    out.params.temperature = param(&["temperature"]).and_then(Value::as_f64);
    out.params.top_p = param(&["top_p"]).and_then(Value::as_f64);
    if let Some(cap) = capture {
        out.params.input_content = input_messages(&v, cap);
    }
    if !(endpoint.is_openai() && out.stream) {
        return Ok(out);
    }
    match v.get_mut("stream_options") {
        Some(Value::Object(opts)) => {
            if opts.get("include_usage").and_then(Value::as_bool) == Some(true) {
                return Ok(out);
            }
            opts.insert("include_usage".into(), Value::Bool(true));
            if let Ok(b) = serde_json::to_vec(&v) {
                out.body = Bytes::from(b);
                out.strip_usage = true;
            }
        }
        Some(_) => {} // a non-object stream_options is the backend's to reject
        None => {
            // Append the option before the closing brace, keeping the client's bytes as they are.
            if let Some(end) = out.body.iter().rposition(|b| *b == b'}') {
                const ADD: &[u8] = br#","stream_options":{"include_usage":true}"#;
                let mut b = BytesMut::with_capacity(out.body.len() + ADD.len());
                b.extend_from_slice(&out.body[..end]);
                b.extend_from_slice(ADD);
                b.extend_from_slice(&out.body[end..]);
                out.body = b.freeze();
                out.strip_usage = true;
            }
        }
    }
    Ok(out)
}

/// The request's input in the GenAI conventions' `gen_ai.input.messages` shape, capped at `cap`
/// bytes (a capped value is cut at a character boundary and is then no longer valid JSON; the
/// conventions allow truncation).
fn input_messages(v: &serde_json::Map<String, Value>, cap: usize) -> Option<String> {
    let text_of = |c: &Value| -> Vec<Value> {
        match c {
            Value::String(s) => vec![serde_json::json!({"type": "text", "content": s})],
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .map(|t| serde_json::json!({"type": "text", "content": t}))
                .collect(),
            _ => Vec::new(),
        }
    };
    let messages: Vec<Value> = if let Some(Value::Array(msgs)) = v.get("messages") {
        msgs.iter()
            .map(|m| {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
                serde_json::json!({"role": role, "parts": m.get("content").map(text_of).unwrap_or_default()})
            })
            .collect()
    } else if let Some(p) = v
        .get("prompt")
        .or_else(|| v.get("inputs"))
        .or_else(|| v.get("input"))
    {
        vec![serde_json::json!({"role": "user", "parts": text_of(p)})]
    } else {
        return None;
    };
    let mut s = Value::Array(messages).to_string();
    if s.len() > cap {
        let mut end = cap;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    Some(s)
}

/// Prefix of the gateway's own headers: never taken from a client on the way upstream.
pub const OWN_PREFIX: &str = "x-inferscope-";

/// Turns a client's request headers into the upstream request's: hop-by-hop headers and `Host`
/// removed, every client-sent `x-inferscope-*` header removed (a client cannot mark its request
/// as a shadow copy or speak for the gateway; the router has read the variant override already,
/// where a route allows it), and the client's address appended to `X-Forwarded-For` and
/// `Forwarded` (RFC 7239) with `X-Forwarded-Proto`.
pub fn upstream_headers(h: &mut HeaderMap, client: Option<std::net::IpAddr>) {
    remove_hop_headers(h);
    h.remove(header::HOST);
    let own: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with(OWN_PREFIX))
        .cloned()
        .collect();
    for k in own {
        h.remove(k);
    }
    let Some(ip) = client else {
        return;
    };
    let xff = HeaderName::from_static("x-forwarded-for");
    let joined = match h.get(&xff).and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {ip}"),
        _ => ip.to_string(),
    };
    if let Ok(v) = HeaderValue::try_from(joined) {
        h.insert(xff, v);
    }
    let node = match ip {
        std::net::IpAddr::V4(v4) => format!("for={v4};proto=http"),
        std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=http"),
    };
    let forwarded = match h.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {node}"),
        _ => node,
    };
    if let Ok(v) = HeaderValue::try_from(forwarded) {
        h.insert(header::FORWARDED, v);
    }
    if !h.contains_key("x-forwarded-proto") {
        h.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those the `Connection` header names.
pub fn remove_hop_headers(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        h.remove(n);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn injects_usage_only_when_missing_and_keeps_bytes() {
        let body = Bytes::from_static(br#"{"model": "m", "stream": true, "messages": []}"#);
        let i = prepare_body(body, Endpoint::ChatCompletions, None).unwrap();
        assert!(i.strip_usage && i.stream);
        assert_eq!(i.model.as_deref(), Some("m"));
        assert_eq!(&i.body[..], &br#"{"model": "m", "stream": true, "messages": [],"stream_options":{"include_usage":true}}"#[..]);

        let asked =
            Bytes::from_static(br#"{"stream":true,"stream_options":{"include_usage":true}}"#);
        let i = prepare_body(asked.clone(), Endpoint::ChatCompletions, None).unwrap();
        assert!(!i.strip_usage);
        assert_eq!(i.body, asked);

        let off =
            Bytes::from_static(br#"{"stream":true,"stream_options":{"include_usage":false}}"#);
        let i = prepare_body(off, Endpoint::ChatCompletions, None).unwrap();
        assert!(i.strip_usage);
        let v: Value = serde_json::from_slice(&i.body).unwrap_or_default();
        assert_eq!(
            v.pointer("/stream_options/include_usage"),
            Some(&Value::Bool(true))
        );

        let plain = Bytes::from_static(br#"{"stream":false}"#);
        assert!(
            !prepare_body(plain, Endpoint::ChatCompletions, None)
                .unwrap()
                .strip_usage
        );
        assert!(
            !prepare_body(
                Bytes::from_static(b"not json"),
                Endpoint::ChatCompletions,
                None
            )
            .unwrap()
            .strip_usage
        );
        assert!(
            !prepare_body(
                Bytes::from_static(br#"{"stream":true}"#),
                Endpoint::Messages,
                None
            )
            .unwrap()
            .strip_usage
        );
    }

    #[test]
    fn each_dialect_says_stream_and_limits_where_it_keeps_them() {
        let p = |ep, b: &'static [u8]| prepare_body(Bytes::from_static(b), ep, None).unwrap();
        // Ollama streams unless told not to; TGI's endpoints decide by path alone.
        assert!(
            p(
                Endpoint::OllamaChat,
                br#"{"model":"llama3.2","messages":[]}"#
            )
            .stream
        );
        assert!(!p(Endpoint::OllamaChat, br#"{"model":"m","stream":false}"#).stream);
        assert!(
            p(
                Endpoint::GenerateStream,
                br#"{"inputs":"hi","stream":false}"#
            )
            .stream
        );
        assert!(!p(Endpoint::Generate, br#"{"inputs":"hi","stream":true}"#).stream);
        assert!(!p(Endpoint::Messages, br#"{"max_tokens":3}"#).stream);
        let tgi = p(
            Endpoint::GenerateStream,
            br#"{"inputs":"hi","parameters":{"max_new_tokens":20,"temperature":0.5}}"#,
        );
        assert_eq!(tgi.params.max_tokens, Some(20));
        assert_eq!(tgi.params.temperature, Some(0.5));
        let max = |ep, b| p(ep, b).params.max_tokens;
        assert_eq!(
            max(
                Endpoint::OllamaGenerate,
                br#"{"prompt":"hi","options":{"num_predict":7}}"#
            ),
            Some(7)
        );
        assert_eq!(
            max(
                Endpoint::Responses,
                br#"{"input":"hi","max_output_tokens":9}"#
            ),
            Some(9)
        );
        assert_eq!(
            max(
                Endpoint::LlamaCompletion,
                br#"{"prompt":"hi","n_predict":5}"#
            ),
            Some(5)
        );
        let claude = p(
            Endpoint::Messages,
            br#"{"model":"c","stream":true,"metadata":{"user_id":"u1"}}"#,
        );
        assert!(claude.stream && !claude.strip_usage);
        assert_eq!(claude.user.as_deref(), Some("u1"));
    }

    #[test]
    fn input_messages_follow_the_genai_shape_and_cap() {
        let body = Bytes::from_static(br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#);
        let i = prepare_body(body.clone(), Endpoint::ChatCompletions, Some(1000)).unwrap();
        let v: Value = serde_json::from_str(i.params.input_content.as_deref().unwrap_or(""))
            .unwrap_or_default();
        assert_eq!(v[0]["role"], "system");
        assert_eq!(v[1]["parts"][0]["content"], "hi");
        assert_eq!(
            prepare_body(body.clone(), Endpoint::ChatCompletions, Some(10))
                .unwrap()
                .params
                .input_content
                .map(|s| s.len()),
            Some(10)
        );
        assert!(prepare_body(body, Endpoint::ChatCompletions, None)
            .unwrap()
            .params
            .input_content
            .is_none());
    }

    #[test]
    fn nesting_past_the_limit_is_an_error_not_a_missing_model() {
        let deep = |n: usize| {
            let mut b = String::from(r#"{"model":"m","x":"#);
            b.push_str(&"[".repeat(n));
            b.push_str(&"]".repeat(n));
            b.push('}');
            Bytes::from(b)
        };
        assert_eq!(
            prepare_body(deep(MAX_JSON_DEPTH - 2), Endpoint::ChatCompletions, None)
                .unwrap()
                .model
                .as_deref(),
            Some("m")
        );
        assert_eq!(
            prepare_body(deep(MAX_JSON_DEPTH + 10), Endpoint::ChatCompletions, None).unwrap_err(),
            TooDeep
        );
        // Merely invalid JSON is the backend's to judge, as before.
        assert!(prepare_body(
            Bytes::from_static(b"{\"model\":"),
            Endpoint::ChatCompletions,
            None
        )
        .is_ok());
    }
}
