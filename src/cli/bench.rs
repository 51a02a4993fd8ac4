//! `inferscope bench`: the load generator, measured client-side by the gateway's definitions.

use super::{fetch_json, parse_headers};
use crate::config;
use anyhow::Context as _;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Gateway (or backend) base URL, with or without `/v1` as an OpenAI SDK takes it
    /// (`http://127.0.0.1:8080`, `http://host:8000/v1`).
    #[arg(long, env = "OPENAI_BASE_URL")]
    url: String,
    /// API key, sent as `Authorization: Bearer KEY` (`x-api-key` with --endpoint messages)
    /// unless a --header sets that header.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The API spoken: chat (`/v1/chat/completions`), completions (`/v1/completions`),
    /// responses (`/v1/responses`) or messages (Anthropic `/v1/messages`).
    #[arg(long, default_value = "chat", value_parser = ["chat", "completions", "responses", "messages"])]
    endpoint: String,
    /// Model name.
    #[arg(long, default_value = "demo")]
    model: String,
    /// The workload's file, in a layout as released: ShareGPT, Alpaca, LongBench, or JSONL
    /// (see --dataset-name); default synthetic prompts (--input-words, or --dataset-name random).
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// The --dataset file's layout: `sharegpt` (first turn the prompt, the first reply's length
    /// in tokens the output length, vLLM's filters: prompt or output under 4 tokens, prompt over
    /// 1,024 or both over 2,048 dropped), `alpaca` (instruction plus input; output's length),
    /// `longbench` (LongBench's per-dataset template and output maximum), `jsonl` (strings or
    /// objects with --dataset-field); `auto` tells them apart. Without --dataset: `random`
    /// (lengths in tokens, --random-*).
    #[arg(long, default_value = "auto", value_parser = ["auto", "sharegpt", "alpaca", "longbench", "jsonl", "random"])]
    dataset_name: String,
    /// The prompt's field in a JSONL dataset.
    #[arg(long, default_value = "prompt")]
    dataset_field: String,
    /// LongBench: only rows of this `length` bucket (LongBench-E's `0-4k`, `4-8k`, `8k+`).
    #[arg(long, value_parser = ["0-4k", "4-8k", "8k+"])]
    longbench_length: Option<String>,
    /// Random workload: mean prompt length in tokens after the prefix, counted by the backend's
    /// /tokenize where it has one (special tokens included, as vLLM counts).
    #[arg(long, default_value_t = 1024)]
    random_input_len: u32,
    /// Random workload: mean output length in tokens.
    #[arg(long, default_value_t = 128)]
    random_output_len: u32,
    /// Random workload: lengths uniform in [len × (1 − r), len × (1 + r)].
    #[arg(long, default_value_t = 0.0)]
    random_range_ratio: f64,
    /// Random workload: a prefix of this many tokens shared by every prompt (prefix caching).
    #[arg(long, default_value_t = 0)]
    random_prefix_len: u32,
    /// Words per synthetic prompt, when neither --dataset nor --dataset-name random.
    #[arg(long, default_value_t = 64)]
    input_words: usize,
    /// Requests per second, open loop (Poisson arrivals unless --constant).
    #[arg(long, conflicts_with = "concurrency")]
    rate: Option<f64>,
    /// Run once per rate (open loop) and print one row per rate, e.g. --sweep 1,2,4,8.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["rate", "concurrency"])]
    sweep: Vec<f64>,
    /// Evenly spaced arrivals instead of Poisson.
    #[arg(long)]
    constant: bool,
    /// Open loop: gamma-distributed gaps of this shape, as vLLM's --burstiness: 1 is Poisson,
    /// below 1 burstier, above 1 more even (the mean rate is --rate either way).
    #[arg(long, default_value_t = 1.0, conflicts_with = "constant")]
    burstiness: f64,
    /// Open loop: at most this many requests in flight (vLLM's --max-concurrency); an arrival
    /// past it waits for a slot, its clock starting when it is sent.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Open loop: the rate rises linearly from a tenth of --rate to all of it over this long
    /// (e.g. 30s).
    #[arg(long)]
    ramp_up: Option<String>,
    /// Requests sent in this first stretch (e.g. 10s) are sent and left out of every figure
    /// (counted as `excluded`); rates are then over the measured requests' own span.
    #[arg(long)]
    warmup_time: Option<String>,
    /// Requests sent in this last stretch of the sending are left out likewise.
    #[arg(long)]
    cooldown_time: Option<String>,
    /// Sweep to saturation from this rate (open loop, needs --slo): doubling until a rate
    /// misses the SLOs, then --knee-steps bisections between the last rate that met them and
    /// the first that did not; the capacity found is printed and kept like --sweep's.
    #[arg(long, value_name = "RATE", requires = "slo", conflicts_with_all = ["rate", "concurrency", "sweep"])]
    sweep_to_knee: Option<f64>,
    /// Bisections of --sweep-to-knee between the last rate that met the SLOs and the first that
    /// did not (each halves the interval the knee is known to be in).
    #[arg(long, default_value_t = 3)]
    knee_steps: u32,
    /// With --sweep and --slo: the share of requests that must meet every SLO for a rate to
    /// count; the highest such rate is the capacity printed and kept (`capacity`).
    #[arg(long, default_value_t = 0.9)]
    slo_attainment: f64,
    /// Requests in flight, closed loop (default 1 when no --rate).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Requests to send.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Stop after this long (e.g. 60s) or --requests, whichever comes first: nothing is sent
    /// after it, and requests still in flight are cut then and counted apart (`cut_at_end`),
    /// in none of the figures.
    #[arg(long)]
    duration: Option<String>,
    /// Non-streaming requests.
    #[arg(long)]
    no_stream: bool,
    /// max_tokens of every request, overriding the output lengths a workload sets (ShareGPT's
    /// and Alpaca's replies, LongBench's maxima, random's); 128 where it sets none.
    #[arg(long)]
    max_tokens: Option<u32>,
    /// When --requests asks for more than a dataset holds after its filters, send each kept
    /// entry once instead of repeating entries drawn as `vllm bench serve` draws them (its
    /// `--no-oversample`).
    #[arg(long)]
    no_oversample: bool,
    /// A request not answered in full within this long (e.g. 30s) fails with reason `timeout`
    /// (default: no limit).
    #[arg(long)]
    timeout: Option<String>,
    /// Ask for exactly --max-tokens: vLLM's and SGLang's `ignore_eos` (with `min_tokens`), as
    /// `vllm bench serve --ignore-eos` sends, so output lengths are the workload's and TPOT and
    /// tokens/s compare across engines (chat and completions endpoints).
    #[arg(long)]
    ignore_eos: bool,
    /// SLOs for goodput, e.g. ttft=200ms,tpot=30ms.
    #[arg(long)]
    slo: Option<String>,
    /// Extra header NAME:VALUE (repeatable), e.g. x-inferscope-variant:int8.
    #[arg(long = "header")]
    headers: Vec<String>,
    /// What the requests are to the gateway: `bench` (its own groups in /stats, out of live
    /// rates and experiment comparisons, where the route has `purpose_header: true`) or
    /// `live` (standing in for users' traffic).
    #[arg(long, default_value = "bench", value_parser = ["bench", "live"])]
    purpose: String,
    /// Before the run, read what the engine says of itself into the report (`engine`): vLLM's
    /// /version, /v1/models and the cache config on /metrics, TGI's /info, SGLang's
    /// /get_server_info, llama.cpp's /props, Ollama's /api/show, trtllm-serve's /version and iteration statistics. For a --url at the engine itself: through a gateway
    /// these requests would be the gateway's traffic too.
    #[arg(long)]
    engine_info: bool,
    /// Sample the GPUs through the run: a DCGM exporter's (or nvidia_gpu_exporter's) metrics
    /// URL, or `nvml` for this host's GPUs; the report then has their utilisation, memory,
    /// power and the energy per output token (`hardware.gpu`).
    #[arg(long, value_name = "URL|nvml")]
    gpu_metrics: Option<String>,
    /// Sample this engine `/metrics` URL through the run (`hardware.engine`: its running batch,
    /// queue and KV cache; the roofline then takes the engine's batch). With --engine-info, the
    /// engine's own `/metrics` by default.
    #[arg(long, value_name = "URL")]
    engine_metrics: Option<String>,
    /// Time between hardware readings (the first is taken before the run, the last after it).
    #[arg(long, default_value = "1s")]
    sample_every: String,
    /// Write the report as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The --out file's layout: `inferscope` (the report above), `vllm` (the key names and
    /// per-request arrays of `vllm bench serve --save-result`, so what reads those reads it) or
    /// `csv` (a row per request; with --sweep, a row per rate).
    #[arg(long, default_value = "inferscope", value_parser = ["inferscope", "vllm", "csv"])]
    format: String,
    /// Keep every request in the report (`per_request`: send time, status, failure, tokens,
    /// TTFT, TTFC, TPOT, each ITL gap, E2E).
    #[arg(long)]
    per_request: bool,
    /// Percentiles reported besides p50/p90/p99, e.g. 95,99.9: in the report's `percentiles`
    /// by the gateway's rule; with --format vllm as `p95_ttft_ms` …, vLLM's
    /// --metric-percentiles.
    #[arg(long, value_delimiter = ',', default_value = "99")]
    percentiles: Vec<f64>,
    /// What to say of the run in the report, KEY=VALUE (repeatable): `--label quant=int8
    /// --label gpu=h100`.
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Exit with status 1 when more than this share of the requests failed (0.01: 1%), or when
    /// none succeeded; the report is printed and written first.
    #[arg(long, default_value_t = 0.01)]
    max_error_rate: f64,
    /// Gateway admin URL: print its /stats next to the client's figures.
    #[arg(long)]
    compare_gateway: Option<String>,
    /// Seed of arrivals and synthetic prompts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// HTTP/2 with prior knowledge (h2c) over this many connections instead of HTTP/1.1 (one
    /// connection per request in flight): holds many thousands of streams on a few sockets.
    #[arg(long)]
    http2_connections: Option<usize>,
    /// Send this many requests at once first, left out of the report (opens the connections
    /// the run will use).
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// For an https:// URL: a PEM CA bundle trusted besides the bundled Mozilla roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Roofline: the served model's parameters, in billions (with --gpu, or --hbm-gb-s and
    /// --tflops): decode bandwidth, MBU and prefill MFU next to the latencies.
    #[arg(long)]
    params_b: Option<f64>,
    /// Roofline: bytes per parameter as served (2: FP16/BF16, 1: INT8/FP8, 0.5: INT4).
    #[arg(long, default_value_t = 2.0)]
    bytes_per_param: f64,
    /// Roofline: KV-cache bytes per token (absent: KV traffic left out, a lower bound).
    #[arg(long)]
    kv_bytes_per_token: Option<f64>,
    /// Roofline: GPU preset (a100, h100, h200, l4, l40s).
    #[arg(long)]
    gpu: Option<String>,
    /// Roofline: HBM bandwidth of one GPU, GB/s (overrides the preset's).
    #[arg(long)]
    hbm_gb_s: Option<f64>,
    /// Roofline: dense FP16/BF16 TFLOP/s of one GPU (overrides the preset's).
    #[arg(long)]
    tflops: Option<f64>,
    /// Roofline: GPUs serving the model.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
}

pub(crate) async fn exec(args: Args) -> anyhow::Result<()> {
    let Args {
        url,
        api_key,
        endpoint,
        model,
        dataset,
        dataset_name,
        dataset_field,
        longbench_length,
        random_input_len,
        random_output_len,
        random_range_ratio,
        random_prefix_len,
        input_words,
        rate,
        sweep,
        constant,
        burstiness,
        max_concurrency,
        ramp_up,
        warmup_time,
        cooldown_time,
        slo_attainment,
        sweep_to_knee,
        knee_steps,
        concurrency,
        requests,
        duration,
        no_stream,
        max_tokens,
        no_oversample,
        timeout,
        ignore_eos,
        slo,
        headers,
        purpose,
        engine_info,
        gpu_metrics,
        engine_metrics,
        sample_every,
        out,
        format,
        per_request,
        percentiles,
        labels,
        max_error_rate,
        compare_gateway,
        seed,
        http2_connections,
        warmup,
        ca_file,
        params_b,
        bytes_per_param,
        kv_bytes_per_token,
        gpu,
        hbm_gb_s,
        tflops,
        gpus,
    } = args;
    use crate::lab::loadgen::{self, Arrivals, BenchOptions};
    let roof = match params_b {
        None => None,
        Some(params_b) => {
            let model = crate::config::ModelSpec {
                params_b,
                bytes_per_param,
                kv_bytes_per_token,
            };
            let spec = crate::config::GpuSpec {
                preset: gpu,
                hbm_gb_s,
                tflops,
                count: gpus,
            };
            let peak = crate::stats::roofline::Peak::of(&spec).context(
                "--params-b needs --gpu (a100, h100, h200, l4, l40s) or both --hbm-gb-s and --tflops",
            )?;
            Some((model, peak))
        }
    };
    let alpn: &[&[u8]] = if http2_connections.is_some() {
        &[b"h2"]
    } else {
        &[b"http/1.1"]
    };
    let connector = crate::tls::Connector::for_url(&url, ca_file, alpn).context("--ca-file")?;
    let labels = labels
        .iter()
        .map(|l| {
            l.split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .with_context(|| format!("--label {l}: expected KEY=VALUE"))
        })
        .collect::<anyhow::Result<std::collections::BTreeMap<_, _>>>()?;
    let dataset_text = match &dataset {
        Some(p) => Some(
            crate::util::fs::read_to_string(p, crate::util::fs::DATA_CAP)
                .with_context(|| format!("reading {}", p.display()))?,
        ),
        None => None,
    };
    let arrivals = match (rate, concurrency) {
        (Some(r), _) if r > 0.0 => {
            if constant {
                Arrivals::Constant(r)
            } else {
                Arrivals::Poisson(r)
            }
        }
        (Some(r), _) => anyhow::bail!("--rate {r}: must be above 0"),
        (None, c) => Arrivals::Concurrency(c.unwrap_or(1)),
    };
    anyhow::ensure!(
        format != "vllm" || (sweep.is_empty() && sweep_to_knee.is_none()),
        "--format vllm writes one run: not with --sweep"
    );
    anyhow::ensure!(
        burstiness > 0.0,
        "--burstiness {burstiness}: must be above 0"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&slo_attainment),
        "--slo-attainment {slo_attainment}: a share between 0 and 1"
    );
    anyhow::ensure!(
        percentiles.iter().all(|p| (0.0..=100.0).contains(p)),
        "--percentiles: each between 0 and 100"
    );
    let endpoint = loadgen::Endpoint::parse(&endpoint).context("--endpoint")?;
    let gpu_source = gpu_metrics
        .as_deref()
        .map(|g| {
            loadgen::hardware::GpuSource::parse(g)
                .with_context(|| format!("--gpu-metrics {g}: a metrics URL (http://…) or nvml"))
        })
        .transpose()?;
    let engine_metrics = engine_metrics.or_else(|| {
        engine_info.then(|| {
            let base = url.trim_end_matches('/');
            format!("{}/metrics", base.strip_suffix("/v1").unwrap_or(base))
        })
    });
    let sample_every = config::parse_duration(&sample_every).context("--sample-every")?;
    let sampling = (gpu_source.is_some() || engine_metrics.is_some()).then(|| Sampling {
        engine: engine_metrics.clone(),
        gpu: gpu_source.clone(),
        every: sample_every,
    });
    let mut headers = parse_headers(&headers)?;
    if let Some(key) = api_key.filter(|k| !k.is_empty()) {
        let (name, value) = match endpoint {
            loadgen::Endpoint::Messages => ("x-api-key", key),
            _ => ("authorization", format!("Bearer {key}")),
        };
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
            headers.push((name.into(), value));
        }
    }
    if purpose != "live" {
        headers.push((crate::meter::PURPOSE_HEADER.into(), purpose.clone()));
    }
    // The run's id, which a gateway tallies its requests under (`--compare-gateway`).
    headers.push((crate::stats::runs::RUN_HEADER.into(), loadgen::new_run_id()));
    anyhow::ensure!(
        (dataset.is_some() && dataset_name != "random")
            || (dataset.is_none() && matches!(dataset_name.as_str(), "auto" | "random")),
        "--dataset-name {dataset_name}: {}",
        if dataset.is_some() {
            "random takes no --dataset"
        } else {
            "needs a --dataset file"
        }
    );
    let mut opts = BenchOptions {
        url,
        model,
        endpoint,
        prompts: Vec::new(),
        arrivals,
        pacing: loadgen::Pacing {
            burstiness,
            max_concurrency,
            ramp_up: ramp_up
                .map(|d| config::parse_duration(&d))
                .transpose()
                .context("--ramp-up")?,
            warmup_time: warmup_time
                .map(|d| config::parse_duration(&d))
                .transpose()
                .context("--warmup-time")?
                .unwrap_or_default(),
            cooldown_time: cooldown_time
                .map(|d| config::parse_duration(&d))
                .transpose()
                .context("--cooldown-time")?
                .unwrap_or_default(),
        },
        requests,
        duration: duration
            .map(|d| config::parse_duration(&d))
            .transpose()
            .context("--duration")?,
        stream: !no_stream,
        max_tokens: max_tokens.unwrap_or(128),
        timeout: timeout
            .map(|d| config::parse_duration(&d))
            .transpose()
            .context("--timeout")?,
        ignore_eos,
        slo: slo
            .map(|s| loadgen::parse_slo(&s))
            .transpose()
            .context("--slo")?
            .unwrap_or_default(),
        headers,
        seed,
        progress: true,
        http2_connections,
        warmup,
        connector,
    };
    // The requests, in tokens where the workload says.
    let sampled = match (&dataset, &dataset_text) {
        (Some(path), Some(text)) => {
            let layout = loadgen::dataset::Layout::parse(&dataset_name);
            let (layout, mut entries) = loadgen::dataset::load(text, layout, &dataset_field)
                .with_context(|| path.display().to_string())?;
            let mut other_length = 0;
            if let Some(bucket) = &longbench_length {
                anyhow::ensure!(
                    layout == loadgen::dataset::Layout::LongBench,
                    "--longbench-length: {} is a {} file",
                    path.display(),
                    layout.name()
                );
                let range =
                    loadgen::dataset::longbench_bucket(bucket).context("--longbench-length")?;
                let before = entries.len();
                entries.retain(|e| e.length.is_some_and(|l| range.contains(&l)));
                other_length = before - entries.len();
            }
            let counter = counter(&opts).await;
            let (prompts, mut info) = loadgen::workload::sample(
                layout.name(),
                entries,
                requests,
                seed,
                &counter,
                max_tokens,
                no_oversample,
            )
            .await
            .with_context(|| path.display().to_string())?;
            info.other_length = other_length;
            anyhow::ensure!(
                !prompts.is_empty(),
                "{}: no entry is left after the filters ({} too short, {} too long, {} of another length; lengths by {})",
                path.display(),
                info.too_short,
                info.too_long,
                info.other_length,
                info.counted_by
            );
            opts.prompts = prompts;
            Some(info)
        }
        _ if dataset_name == "random" => {
            let shape = loadgen::workload::RandomShape {
                input_len: random_input_len,
                output_len: random_output_len,
                range_ratio: random_range_ratio,
                prefix_len: random_prefix_len,
            };
            let counter = counter(&opts).await;
            let (mut prompts, info) =
                loadgen::workload::random(requests.min(10_000), shape, seed, &counter).await;
            if let Some(m) = max_tokens {
                prompts.iter_mut().for_each(|p| p.output_tokens = Some(m));
            }
            opts.prompts = prompts;
            Some(info)
        }
        _ => {
            opts.prompts = loadgen::synthetic_prompts(requests.min(1000), input_words, seed);
            None
        }
    };
    if let Some(s) = &sampled {
        eprintln!(
            "workload: {} of {} {} entries{}; lengths by {}",
            s.kept,
            s.entries,
            s.layout,
            dropped(s),
            s.counted_by
        );
        if s.oversampled > 0 {
            eprintln!(
                "warning: --requests {requests} asks for more than the {} entries kept: {} requests repeat kept entries, drawn as vllm bench serve draws them (--no-oversample sends each once)",
                s.kept, s.oversampled
            );
        }
    }
    let dataset_path = dataset.as_ref().map(|p| p.display().to_string());
    let run_info = |o: &BenchOptions| {
        let mut info = loadgen::RunInfo::of(
            o,
            dataset_path
                .as_deref()
                .zip(dataset_text.as_deref().map(str::as_bytes)),
            env!("CARGO_PKG_VERSION"),
        );
        info.labels = labels.clone();
        info.workload = sampled.clone();
        info
    };
    let engine = match engine_info {
        true => {
            let engine = loadgen::engine_info(&opts).await;
            if engine.is_empty() {
                eprintln!("engine: nothing answered /version, /v1/models, /metrics, /info, /get_server_info or /props");
            } else {
                eprintln!("engine: {}", engine.summary());
            }
            (!engine.is_empty()).then_some(engine)
        }
        false => None,
    };
    if !sweep.is_empty() || sweep_to_knee.is_some() {
        anyhow::ensure!(
            sweep_to_knee.is_none_or(|r| r > 0.0),
            "--sweep-to-knee: a rate above 0"
        );
        // The rates: the list given, or each chosen from what the last run showed.
        let mut knee = sweep_to_knee.map(|r| loadgen::KneeSearch::new(r, knee_steps));
        let mut fixed = sweep.iter().copied();
        let mut rows = Vec::new();
        while let Some(r) = match &knee {
            Some(k) => k.next(),
            None => fixed.next(),
        } {
            let r = &r;
            let mut o = opts.clone();
            // Each rate's requests under an id of their own.
            for (k, v) in &mut o.headers {
                if k == crate::stats::runs::RUN_HEADER {
                    *v = loadgen::new_run_id();
                }
            }
            o.arrivals = if constant {
                Arrivals::Constant(*r)
            } else {
                Arrivals::Poisson(*r)
            };
            let info = run_info(&o);
            let sampler = sampling.as_ref().map(|s| s.start(&o));
            let (samples, wall) = loadgen::run(&o).await;
            let mut report = loadgen::summarize(&samples, wall, &o.slo);
            if let Some(s) = sampler {
                report.hardware = Some(s.finish(report.total_output_tokens).await);
            }
            report.percentiles = loadgen::percentiles(&samples, &percentiles);
            report.rate = Some(*r);
            report.run = Some(info);
            if per_request {
                report.per_request = samples;
            }
            report.engine = engine.clone();
            if let Some(k) = &mut knee {
                let attained = report.slo_attainment.unwrap_or(0.0);
                eprintln!(
                    "\nrate {r:.2} req/s: {:.0}% of requests met the SLOs",
                    attained * 100.0
                );
                k.record(*r, attained >= slo_attainment);
            }
            rows.push(report);
        }
        // Rows by rate, as a curve reads.
        rows.sort_by(|a, b| a.rate.unwrap_or(0.0).total_cmp(&b.rate.unwrap_or(0.0)));
        print!("{}", loadgen::render_sweep(&rows));
        let capacity = loadgen::capacity(&rows, slo_attainment);
        match &capacity {
            Some(c) => println!("{}", c.words()),
            None => println!("capacity: give --slo (e.g. ttft=500ms,tpot=50ms) for the highest rate that meets it"),
        }
        let judged = judge(&rows, max_error_rate);
        if let Some(path) = out {
            let text = match format.as_str() {
                "csv" => loadgen::csv_sweep(&rows),
                _ => serde_json::to_string_pretty(&loadgen::SweepReport {
                    runs: rows,
                    capacity,
                })?,
            };
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        return judged;
    }
    let info = run_info(&opts);
    let sampler = sampling.as_ref().map(|s| s.start(&opts));
    let (samples, wall) = loadgen::run(&opts).await;
    let mut report = loadgen::summarize(&samples, wall, &opts.slo);
    if let Some(s) = sampler {
        report.hardware = Some(s.finish(report.total_output_tokens).await);
    }
    report.percentiles = loadgen::percentiles(&samples, &percentiles);
    report.run = Some(info);
    report.engine = engine;
    let taken = samples.iter().any(|s| s.purpose_taken);
    // (Said only where a gateway answered: not of a backend benchmarked directly.)
    let gateway_answered = samples.iter().any(|s| s.via_gateway);
    if purpose != "live" && !taken && gateway_answered {
        eprintln!("note: the gateway did not take x-inferscope-purpose: {purpose} (the route has no `purpose_header: true`), so these requests count as live traffic in its statistics and experiments");
    }
    let gateway = match &compare_gateway {
        // The gateway's figures over exactly this run's requests.
        Some(admin) => {
            let id = report
                .run
                .as_ref()
                .and_then(|r| r.run_id.clone())
                .unwrap_or_default();
            if report.excluded > 0 {
                eprintln!("note: the gateway's figures include the {} requests sent in the warm-up and cool-down stretches, which the client's leave out", report.excluded);
            }
            run_figures(
                admin,
                &id,
                report.successful + report.failed + report.excluded,
            )
            .await
        }
        None => None,
    };
    print!("{}", loadgen::render(&report, gateway.as_ref()));
    for w in report.hardware.iter().flat_map(|h| h.words()) {
        println!("{w}");
    }
    if let Some((model, peak)) = &roof {
        let v = crate::stats::roofline::assess(model, *peak, bench_measured(&report));
        for w in v.words() {
            println!("roofline: {w}");
        }
        report.roofline = Some(v);
    }
    if let Some(path) = out {
        report.gateway = gateway;
        let text = match format.as_str() {
            "vllm" => serde_json::to_string_pretty(&loadgen::vllm_result(
                &samples,
                &report,
                &percentiles,
            ))?,
            "csv" => loadgen::csv(&samples),
            _ => {
                if per_request {
                    report.per_request = samples;
                }
                serde_json::to_string_pretty(&report)?
            }
        };
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    judge(std::slice::from_ref(&report), max_error_rate)
}

/// What to sample through a run.
struct Sampling {
    engine: Option<String>,
    gpu: Option<crate::lab::loadgen::hardware::GpuSource>,
    every: std::time::Duration,
}

impl Sampling {
    fn start(
        &self,
        o: &crate::lab::loadgen::BenchOptions,
    ) -> crate::lab::loadgen::hardware::Sampler {
        // The engine's reads are the benchmark's too (its purpose), not the run's requests.
        crate::lab::loadgen::hardware::Sampler::start(
            self.engine.clone(),
            self.gpu.clone(),
            self.every,
            o.connector.clone(),
            crate::lab::loadgen::without_run(&o.headers),
        )
    }
}

/// The backend's tokenizer for the workload's lengths, or the estimate (said on standard error).
async fn counter(o: &crate::lab::loadgen::BenchOptions) -> crate::lab::loadgen::workload::Counter {
    // Counting is not the run: its requests go untagged.
    let headers = crate::lab::loadgen::without_run(&o.headers);
    crate::lab::loadgen::workload::Counter::probe(&o.url, &o.model, o.connector.clone(), &headers)
        .await
}

/// ", dropped: 3 too short, 1 too long" (empty when nothing was dropped).
fn dropped(s: &crate::lab::loadgen::workload::Sampled) -> String {
    let parts: Vec<String> = [
        (s.too_short, "too short"),
        (s.too_long, "too long"),
        (s.other_length, "of another length"),
        (s.length_misses, "off their length"),
        (s.tokenizer_failed, "not counted (the tokenizer failed)"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// The run's verdict on itself: an error (exit status 1) when no request succeeded or more than
/// `max_error_rate` of them failed, naming the most frequent reason.
fn judge(reports: &[crate::lab::loadgen::BenchReport], max_error_rate: f64) -> anyhow::Result<()> {
    let requests: usize = reports.iter().map(|r| r.requests).sum();
    let failed: usize = reports.iter().map(|r| r.failed).sum();
    let top = reports
        .iter()
        .flat_map(|r| &r.failures)
        .max_by_key(|c| c.count)
        .map(|c| format!(" (most: {} × {})", c.count, c.reason))
        .unwrap_or_default();
    let successful: usize = reports.iter().map(|r| r.successful).sum();
    if successful == 0 {
        let cut: usize = reports.iter().map(|r| r.cut_at_end).sum();
        anyhow::bail!(
            "no request succeeded: {failed} of {requests} failed{top}{}",
            if cut > 0 {
                format!(", {cut} cut when --duration ended")
            } else {
                String::new()
            }
        );
    }
    let rate = failed as f64 / requests.max(1) as f64;
    if rate > max_error_rate {
        anyhow::bail!(
            "{failed} of {requests} requests failed ({:.1}%), above --max-error-rate {max_error_rate}{top}",
            rate * 100.0
        );
    }
    Ok(())
}

/// What a bench run says for the roofline: its median TPOT and TTFT, mean tokens, and as the
/// batch the engine's own (its running requests while busy, where `--engine-metrics` or
/// `--engine-info` sampled them), else the mean number of the run's requests in flight (Little's
/// law: throughput × mean E2E; the engine's batch only when this run is its only load and it
/// queues nothing). The engine's prefill time, where sampled, is the prefill's.
fn bench_measured(r: &crate::lab::loadgen::BenchReport) -> crate::stats::roofline::Measured {
    let ok = (r.successful > 0).then_some(r.successful as f64);
    let per_request = |throughput: f64| Some(throughput * r.duration_s / ok?);
    let output = per_request(r.output_token_throughput);
    let input = per_request(r.total_token_throughput)
        .zip(output)
        .map(|(t, o)| t - o);
    // The engine's own batch where it was sampled; else the run's requests in flight.
    let engine_batch = r
        .hardware
        .as_ref()
        .and_then(|h| h.engine.as_ref())
        .and_then(|e| e.running_mean_busy);
    let in_flight =
        engine_batch.or_else(|| r.e2e_ms.map(|e2e| r.request_throughput * e2e.mean / 1e3));
    crate::stats::roofline::Measured {
        tpot_s: r.tpot_ms.map(|d| d.median / 1e3),
        ttft_s: r.ttft_ms.map(|d| d.median / 1e3),
        prompt_tokens: input.filter(|n| *n > 0.0),
        output_tokens: output,
        batch: in_flight.filter(|b| *b > 0.0),
        engine_prefill_s: r
            .hardware
            .as_ref()
            .and_then(|h| h.engine.as_ref())
            .and_then(|e| e.prefill_seconds),
    }
}

/// The gateway's figures over the requests tagged `run` (`GET {admin}/stats/runs/{run}`), once
/// it has recorded the `sent` requests the client finished (a record lands just after the
/// response's end: polled for up to two seconds). `None`, said on standard error, where the
/// gateway has no such run: its route does not take the tag (`purpose_header: true`), or it is
/// not an inferscope gateway.
async fn run_figures(admin: &str, run: &str, sent: usize) -> Option<crate::stats::TallyStats> {
    let path = format!("/stats/runs/{run}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match fetch_json(admin, &path, None, None).await {
            Ok(doc) => {
                let t: Option<crate::stats::TallyStats> = serde_json::from_value(doc).ok();
                let done = t.as_ref().is_some_and(|t| t.requests >= sent as u64);
                if done || tokio::time::Instant::now() >= deadline {
                    return t;
                }
            }
            Err(e) => {
                eprintln!("note: {admin}{path}: {e:#}; the gateway columns are left out (the gateway tallies a run's requests where their route has `purpose_header: true`)");
                return None;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
