//! Request-side helpers: what the gateway reads from an inference request's JSON body (and the
//! `stream_options.include_usage` it adds), and hop-by-hop header removal.

use crate::dialect::Endpoint;
use crate::meter::RequestParams;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
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
    // A borrowed view of only the fields read (nothing else is kept or allocated), parsed by
    // the same rules as a `Value`: it accepts and refuses the same bodies, nests as deep, and
    // a key given twice means its last value.
    let v = match serde_json::from_slice::<BodyView<'_>>(&out.body) {
        Ok(v) if v.object => v,
        Ok(_) => return Ok(out),
        // serde_json's only way of saying it: the message (checked in the tests below).
        Err(e) if e.is_syntax() && e.to_string().starts_with("recursion limit exceeded") => {
            return Err(TooDeep)
        }
        Err(_) => return Ok(out),
    };
    out.model = v.top[TOP_MODEL]
        .as_ref()
        .and_then(Val::as_str)
        .map(str::to_owned);
    out.user = match &v.top[TOP_USER] {
        Some(user) => user.as_str(),
        None => v
            .metadata
            .as_ref()
            .and_then(|m| m.get(NESTED_USER_ID)?.as_str()),
    }
    .map(str::to_owned);
    if endpoint.stream_in_body() {
        if let Some(s) = v.top[TOP_STREAM].as_ref().and_then(Val::as_bool) {
            out.stream = s;
        }
    }
    out.params.max_tokens = v.param(&MAX_TOKENS_SLOTS).and_then(Val::as_u64);
    out.params.temperature = v
        .param(&[(TOP_TEMPERATURE, NESTED_TEMPERATURE)])
        .and_then(Val::as_f64);
    out.params.top_p = v.param(&[(TOP_TOP_P, NESTED_TOP_P)]).and_then(Val::as_f64);
    // Rare paths read the body once more as a `Value`: content capture (opted in), and an
    // options object to add `include_usage` to.
    let whole = || match serde_json::from_slice::<Value>(&out.body) {
        Ok(Value::Object(v)) => Some(v),
        _ => None,
    };
    if let Some(cap) = capture {
        out.params.input_content = whole().and_then(|v| input_messages(&v, cap));
    }
    if !(endpoint.is_openai() && out.stream) {
        return Ok(out);
    }
    match &v.stream_options {
        Some(opts) if opts.object => {
            if opts.get(NESTED_INCLUDE_USAGE).and_then(Val::as_bool) == Some(true) {
                return Ok(out);
            }
            let Some(mut whole) = whole() else {
                return Ok(out);
            };
            if let Some(Value::Object(opts)) = whole.get_mut("stream_options") {
                opts.insert("include_usage".into(), Value::Bool(true));
            }
            if let Ok(b) = serde_json::to_vec(&whole) {
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

/// The top-level keys the inspector reads as values (the objects it reads into are apart).
const TOP_KEYS: [&str; 11] = [
    "model",
    "user",
    "stream",
    "max_completion_tokens",
    "max_tokens",
    "max_output_tokens",
    "max_new_tokens",
    "num_predict",
    "n_predict",
    "temperature",
    "top_p",
];
const TOP_MODEL: usize = 0;
const TOP_USER: usize = 1;
const TOP_STREAM: usize = 2;
const TOP_TEMPERATURE: usize = 9;
const TOP_TOP_P: usize = 10;

/// The keys read inside `metadata`, `stream_options`, `parameters` and `options`.
const NESTED_KEYS: [&str; 10] = [
    "user_id",
    "include_usage",
    "max_completion_tokens",
    "max_tokens",
    "max_output_tokens",
    "max_new_tokens",
    "num_predict",
    "n_predict",
    "temperature",
    "top_p",
];
const NESTED_USER_ID: usize = 0;
const NESTED_INCLUDE_USAGE: usize = 1;
const NESTED_TEMPERATURE: usize = 8;
const NESTED_TOP_P: usize = 9;

/// `dialect::MAX_TOKENS_PARAMS` as (top-level, nested) slots, in its order.
const MAX_TOKENS_SLOTS: [(usize, usize); 6] = [(3, 2), (4, 3), (5, 4), (6, 5), (7, 6), (8, 7)];

/// One JSON value as far as the inspector reads it.
#[derive(Debug)]
enum Val<'a> {
    Str(std::borrow::Cow<'a, str>),
    Bool(bool),
    PosInt(u64),
    NegInt(i64),
    Float(f64),
    /// Null, an array or an object.
    Other,
}

impl Val<'_> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Val::Str(s) => Some(s),
            _ => None,
        }
    }
    fn as_bool(&self) -> Option<bool> {
        match self {
            Val::Bool(b) => Some(*b),
            _ => None,
        }
    }
    /// As `Value::as_u64`: non-negative integers only.
    fn as_u64(&self) -> Option<u64> {
        match self {
            Val::PosInt(n) => Some(*n),
            _ => None,
        }
    }
    /// As `Value::as_f64`: any number.
    fn as_f64(&self) -> Option<f64> {
        match self {
            Val::PosInt(n) => Some(*n as f64),
            Val::NegInt(n) => Some(*n as f64),
            Val::Float(f) => Some(*f),
            _ => None,
        }
    }
}

/// What a body is to the inspector: whether it is an object, and the fields it reads (each
/// key's last value, as a `Map` keeps it).
#[derive(Default)]
struct BodyView<'a> {
    object: bool,
    top: [Option<Val<'a>>; TOP_KEYS.len()],
    metadata: Option<Nested<'a>>,
    stream_options: Option<Nested<'a>>,
    parameters: Option<Nested<'a>>,
    options: Option<Nested<'a>>,
}

impl<'a> BodyView<'a> {
    /// As `dialect::request_param`: the first of the slots set at the top level or in the
    /// nested parameters (`parameters`, else `options`, when that is an object).
    fn param(&self, slots: &[(usize, usize)]) -> Option<&Val<'a>> {
        let nested = match (&self.parameters, &self.options) {
            (Some(p), _) => Some(p),
            (None, o) => o.as_ref(),
        }
        .filter(|n| n.object);
        slots.iter().find_map(|&(top, inner)| {
            self.top[top]
                .as_ref()
                .or_else(|| nested.and_then(|n| n.get(inner)))
        })
    }
}

/// An object's fields among `NESTED_KEYS` (`object` false: the value was something else).
#[derive(Default)]
struct Nested<'a> {
    object: bool,
    vals: [Option<Val<'a>>; NESTED_KEYS.len()],
}

impl<'a> Nested<'a> {
    fn get(&self, slot: usize) -> Option<&Val<'a>> {
        self.vals[slot].as_ref()
    }
}

/// Any value, read and dropped through `deserialize_any` (so serde_json's recursion limit and
/// string checks apply as they do to a `Value`), allocating nothing.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Skip;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
                while seq.next_element::<Skip>()?.is_some() {}
                Ok(Skip)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
                while map.next_entry::<Skip, Skip>()?.is_some() {}
                Ok(Skip)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Val<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValVisitor(std::marker::PhantomData))
    }
}

struct ValVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ValVisitor<'a> {
    type Value = Val<'a>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Val<'a>, E> {
        Ok(Val::Bool(b))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Val<'a>, E> {
        Ok(Val::PosInt(n))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Val<'a>, E> {
        Ok(Val::NegInt(n))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Val<'a>, E> {
        Ok(Val::Float(f))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Val<'a>, E> {
        Ok(Val::Str(std::borrow::Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Val<'a>, E> {
        Ok(Val::Str(std::borrow::Cow::Owned(s.to_owned())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Val<'a>, E> {
        Ok(Val::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Val<'a>, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Val::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Val<'a>, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Val::Other)
    }
}

/// A key, borrowed unless it holds escapes (then compared unescaped, as a `Map` would).
struct Key<'a>(std::borrow::Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Val::deserialize(d)? {
            Val::Str(s) => Ok(Key(s)),
            _ => Err(de::Error::custom("a key that is not a string")),
        }
    }
}

/// The visitor methods of a value that is not an object: read through all the same (its errors
/// and its depth are a `Value`'s), then the default (`object: false`).
macro_rules! not_an_object {
    ($t:ident) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<$t<'a>, A::Error> {
            while seq.next_element::<Skip>()?.is_some() {}
            Ok($t::default())
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<$t<'a>, E> {
            Ok($t::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$t<'a>, E> {
            Ok($t::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<$t<'a>, E> {
            Ok($t::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<$t<'a>, E> {
            Ok($t::default())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<$t<'a>, E> {
            Ok($t::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<$t<'a>, E> {
            Ok($t::default())
        }
    };
}

impl<'de: 'a, 'a> Deserialize<'de> for BodyView<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = BodyView<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON body")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BodyView<'a>, A::Error> {
                let mut v = BodyView {
                    object: true,
                    ..BodyView::default()
                };
                while let Some(Key(k)) = map.next_key::<Key<'a>>()? {
                    let nested = match &*k {
                        "metadata" => &mut v.metadata,
                        "stream_options" => &mut v.stream_options,
                        "parameters" => &mut v.parameters,
                        "options" => &mut v.options,
                        _ => {
                            match TOP_KEYS.iter().position(|t| *t == k) {
                                Some(i) => v.top[i] = Some(map.next_value()?),
                                None => {
                                    map.next_value::<Skip>()?;
                                }
                            }
                            continue;
                        }
                    };
                    *nested = Some(map.next_value()?);
                }
                Ok(v)
            }
            not_an_object!(BodyView);
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Nested<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Nested<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Nested<'a>, A::Error> {
                let mut n = Nested {
                    object: true,
                    ..Nested::default()
                };
                while let Some(Key(k)) = map.next_key::<Key<'a>>()? {
                    match NESTED_KEYS.iter().position(|t| *t == k) {
                        Some(i) => n.vals[i] = Some(map.next_value()?),
                        None => {
                            map.next_value::<Skip>()?;
                        }
                    }
                }
                Ok(n)
            }
            not_an_object!(Nested);
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
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
    // One look at the names first: most requests carry nothing to remove but `Host`, and each
    // removal is a lookup.
    if h.keys()
        .any(|k| HOP_HEADERS.contains(k) || k.as_str().starts_with(OWN_PREFIX))
    {
        remove_hop_headers(h);
        let own: Vec<HeaderName> = h
            .keys()
            .filter(|k| k.as_str().starts_with(OWN_PREFIX))
            .cloned()
            .collect();
        for k in own {
            h.remove(k);
        }
    }
    h.remove(header::HOST);
    let Some(ip) = client else {
        return;
    };
    // Names built at compile time: a `&str` key, or `from_static` at run time, is parsed at
    // every use.
    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
    const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
    let mut joined = String::with_capacity(64);
    if let Some(prior) = h.get(&XFF).and_then(|v| v.to_str().ok()) {
        if !prior.trim().is_empty() {
            joined.push_str(prior);
            joined.push_str(", ");
        }
    }
    push_ip(&mut joined, ip);
    if let Ok(v) = HeaderValue::try_from(joined) {
        h.insert(XFF, v);
    }
    let mut forwarded = String::with_capacity(64);
    if let Some(prior) = h.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        if !prior.trim().is_empty() {
            forwarded.push_str(prior);
            forwarded.push_str(", ");
        }
    }
    match ip {
        std::net::IpAddr::V4(_) => {
            forwarded.push_str("for=");
            push_ip(&mut forwarded, ip);
        }
        std::net::IpAddr::V6(_) => {
            forwarded.push_str("for=\"[");
            push_ip(&mut forwarded, ip);
            forwarded.push_str("]\"");
        }
    }
    forwarded.push_str(";proto=http");
    if let Ok(v) = HeaderValue::try_from(forwarded) {
        h.insert(header::FORWARDED, v);
    }
    if !h.contains_key(&XFP) {
        h.insert(XFP, HeaderValue::from_static("http"));
    }
}

/// `ip` as `Display` writes it; an IPv4 address without the formatter.
fn push_ip(out: &mut String, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(digits.format(octet));
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), and those of the same kind HTTP/1.0 peers send.
static HOP_HEADERS: [HeaderName; 8] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

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
    for n in &HOP_HEADERS {
        h.remove(n);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn upstream_headers_drop_hop_and_own_headers_and_name_the_client() {
        // Nothing to remove but Host: only the forwarding headers are added.
        let mut h = headers(&[("host", "gw"), ("content-type", "application/json")]);
        upstream_headers(&mut h, Some("10.1.2.3".parse().unwrap()));
        assert_eq!(h.len(), 4, "{h:?}");
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        assert_eq!(h["forwarded"], "for=10.1.2.3;proto=http");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert!(h.get("host").is_none());
        // Hop-by-hop, the ones Connection names, the gateway's own; prior forwarding kept.
        let mut h = headers(&[
            ("connection", "keep-alive, x-trace-hop"),
            ("x-trace-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("x-inferscope-shadow", "1"),
            ("x-forwarded-for", "203.0.113.7"),
            ("forwarded", "for=203.0.113.7"),
            ("x-forwarded-proto", "https"),
            ("accept", "*/*"),
        ]);
        upstream_headers(&mut h, Some("2001:db8::1".parse().unwrap()));
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "accept",
                "forwarded",
                "x-forwarded-for",
                "x-forwarded-proto"
            ]
        );
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 2001:db8::1");
        assert_eq!(
            h["forwarded"],
            "for=203.0.113.7, for=\"[2001:db8::1]\";proto=http"
        );
        assert_eq!(h["x-forwarded-proto"], "https");
        // Every IPv4 address as `Display` writes it.
        for ip in ["0.0.0.0", "255.255.255.255", "127.0.0.1", "10.200.3.45"] {
            let mut s = String::new();
            push_ip(&mut s, ip.parse().unwrap());
            assert_eq!(s, ip);
        }
        // No client address: nothing added.
        let mut h = headers(&[("host", "gw")]);
        upstream_headers(&mut h, None);
        assert!(h.is_empty());
    }

    #[test]
    fn a_response_loses_its_hop_headers_and_those_connection_names_only() {
        let mut h = headers(&[
            ("content-type", "text/event-stream"),
            ("transfer-encoding", "chunked"),
            ("connection", "close, x-hop"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("proxy-connection", "keep-alive"),
            ("x-request-id", "r1"),
        ]);
        h.append("transfer-encoding", HeaderValue::from_static("gzip"));
        remove_hop_headers(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "x-request-id"]);
        // Named by no `Connection`: a header of that name stays.
        let mut h = headers(&[("x-hop", "1"), ("upgrade", "websocket")]);
        remove_hop_headers(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-hop"]);
        let mut h = headers(&[("content-type", "application/json")]);
        remove_hop_headers(&mut h);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn the_slot_tables_name_the_dialects_parameters() {
        let top: Vec<&str> = MAX_TOKENS_SLOTS.iter().map(|s| TOP_KEYS[s.0]).collect();
        let nested: Vec<&str> = MAX_TOKENS_SLOTS.iter().map(|s| NESTED_KEYS[s.1]).collect();
        assert_eq!(top, crate::dialect::MAX_TOKENS_PARAMS);
        assert_eq!(nested, crate::dialect::MAX_TOKENS_PARAMS);
        assert_eq!(
            [
                TOP_KEYS[TOP_MODEL],
                TOP_KEYS[TOP_USER],
                TOP_KEYS[TOP_STREAM]
            ],
            ["model", "user", "stream"]
        );
        assert_eq!(
            [TOP_KEYS[TOP_TEMPERATURE], TOP_KEYS[TOP_TOP_P]],
            [NESTED_KEYS[NESTED_TEMPERATURE], NESTED_KEYS[NESTED_TOP_P]]
        );
        assert_eq!(
            [
                NESTED_KEYS[NESTED_USER_ID],
                NESTED_KEYS[NESTED_INCLUDE_USAGE]
            ],
            ["user_id", "include_usage"]
        );
    }

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
