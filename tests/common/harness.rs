//! EleutherAI's lm-evaluation-harness as a referee: the shipped MMLU-layout set and a GSM8K split
//! written as the harness's own tasks (its MMLU template and GSM8K task `include:`d from the
//! installed package, the data local), its run, and its logged samples.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The harness's `lm_eval`: `INFERSCOPE_LM_EVAL`, else `target/lmeval-venv/bin/lm_eval` (which
/// `.ci/run` installs), else on PATH.
pub fn lm_eval() -> PathBuf {
    if let Ok(p) = std::env::var("INFERSCOPE_LM_EVAL") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/lmeval-venv/bin/lm_eval");
    if venv.is_file() {
        return venv;
    }
    super::program(&["lm_eval"], "pip install \"lm-eval[api]\"")
}

/// MMLU's subjects in `data/mmlu`.
pub const SUBJECTS: [&str; 2] = ["single_digit_sums", "two_digit_sums"];

/// The tasks written for one referee run.
pub struct Tasks {
    /// Where the task definitions are (`--include_path`).
    pub dir: PathBuf,
    /// Each subject's first item's index in inferscope's reading of `data/mmlu`.
    pub offsets: Vec<usize>,
    /// The GSM8K split: `train.jsonl` (5 items) beside `test.jsonl` (35).
    pub gsm8k: PathBuf,
    /// The tasks' names, for `--tasks`.
    pub names: String,
}

/// Writes the tasks under `dir` for the harness installed beside `lm_eval`.
pub fn write_tasks(lm_eval: &Path, dir: &Path) -> Tasks {
    let python = lm_eval.with_file_name("python");
    let out = super::succeeds(std::process::Command::new(&python).args([
        "-c",
        "import lm_eval, os; print(os.path.join(os.path.dirname(lm_eval.__file__), 'tasks'))",
    ]));
    let tasks = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mmlu = PathBuf::from(super::data_file_path("mmlu"));
    let (mut offsets, mut at) = (Vec::new(), 0);
    for s in SUBJECTS {
        let mut files = Vec::new();
        for split in ["test", "dev"] {
            let items = inferscope::lab::eval::load_mmlu_csv(
                &std::fs::read_to_string(mmlu.join(split).join(format!("{s}_{split}.csv")))
                    .unwrap(),
                "",
                s,
            )
            .unwrap();
            if split == "test" {
                offsets.push(at);
                at += items.len();
            }
            // The harness's layout: the answer as an index.
            let lines: Vec<String> = items
                .iter()
                .map(|i| {
                    serde_json::json!({"question": i.question, "subject": s, "choices": i.choices,
                        "answer": "ABCD".find(i.answer.as_str()).unwrap()})
                    .to_string()
                })
                .collect();
            let file = dir.join(format!("{s}_{split}.jsonl"));
            std::fs::write(&file, lines.join("\n") + "\n").unwrap();
            files.push(file);
        }
        std::fs::write(
            dir.join(format!("isc_mmlu_{s}.yaml")),
            format!(
                "include: {tasks}/mmlu/default/_default_template_yaml\ntask: isc_mmlu_{s}\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n    test: {:?}\n    dev: {:?}\ndescription: \"The following are multiple choice questions (with answers) about {}.\\n\\n\"\n",
                files[0],
                files[1],
                s.replace('_', " ")
            ),
        )
        .unwrap();
    }
    let gsm = dir.join("gsm8k");
    std::fs::create_dir_all(&gsm).unwrap();
    let sample = std::fs::read_to_string(super::data_file_path("gsm8k-sample.jsonl")).unwrap();
    let lines: Vec<&str> = sample.lines().collect();
    std::fs::write(gsm.join("train.jsonl"), lines[..5].join("\n") + "\n").unwrap();
    std::fs::write(gsm.join("test.jsonl"), lines[5..].join("\n") + "\n").unwrap();
    // GSM8K's shots: the first five of train, as inferscope takes them (the stock task samples
    // five at random).
    std::fs::write(
        dir.join("isc_gsm8k.yaml"),
        format!(
            "include: {tasks}/gsm8k/gsm8k.yaml\ntask: isc_gsm8k\ntag: null\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n    train: {:?}\n    test: {:?}\nfewshot_config:\n  sampler: first_n\n",
            gsm.join("train.jsonl"),
            gsm.join("test.jsonl")
        ),
    )
    .unwrap();
    let mut names: Vec<String> = SUBJECTS.iter().map(|s| format!("isc_mmlu_{s}")).collect();
    names.push("isc_gsm8k".into());
    Tasks {
        dir: dir.to_path_buf(),
        offsets,
        gsm8k: gsm.join("test.jsonl"),
        names: names.join(","),
    }
}

/// Runs the harness on `tasks`, 5-shot, its samples logged under `out`: `model_args` for
/// `local-completions`, or `None` for its `dummy` model (no server: the prompts are what is
/// compared). Its printed table.
pub fn run(lm_eval: &Path, tasks: &Tasks, out: &Path, model_args: Option<&str>) -> String {
    let mut cmd = std::process::Command::new(lm_eval);
    cmd.env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_DATASETS_CACHE", out.join("hf-datasets"));
    match model_args {
        Some(a) => cmd.args(["--model", "local-completions", "--model_args", a]),
        None => cmd.args(["--model", "dummy"]),
    };
    let run = cmd
        .args(["--include_path", tasks.dir.to_str().unwrap()])
        .args([
            "--tasks",
            &tasks.names,
            "--num_fewshot",
            "5",
            "--log_samples",
        ])
        .args(["--output_path", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "lm_eval: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

/// The logged samples of `task` below `out` (whatever folder the harness named after the model).
pub fn samples(out: &Path, task: &str) -> Vec<Value> {
    fn find(dir: &Path, prefix: &str) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                if let Some(f) = find(&p, prefix) {
                    return Some(f);
                }
            } else if p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            {
                return Some(p);
            }
        }
        None
    }
    let file = find(out, &format!("samples_{task}_"))
        .unwrap_or_else(|| panic!("no samples of {task} below {}", out.display()));
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A sample's `doc_id` (a number, or a number as text).
pub fn doc_id(sample: &Value) -> usize {
    let d = &sample["doc_id"];
    d.as_u64()
        .map(|n| n as usize)
        .or_else(|| d.as_str().and_then(|s| s.parse().ok()))
        .unwrap()
}
