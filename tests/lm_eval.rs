//! The prompts `eval --scoring loglikelihood` sends are lm-evaluation-harness's own: the harness
//! (`lm_eval`, installed by `.ci/run` in `target/lmeval-venv`) builds its contexts for the shipped
//! MMLU-layout set and a GSM8K split with its own MMLU template and GSM8K task and its `dummy`
//! model (no server), and each must equal inferscope's, character for character, with the same
//! continuations and stop sequences. (The scores themselves are compared against a real vLLM in
//! `tests/vllm.rs`, opt-in.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::lab::{eval, harness as scoring};

#[test]
#[ignore = "needs lm-evaluation-harness (lm_eval): .ci/run installs it in target/lmeval-venv"]
fn loglikelihood_prompts_are_the_harness_prompts() {
    let lm_eval = harness::lm_eval();
    let dir = temp_dir();
    let tasks = harness::write_tasks(&lm_eval, &dir);
    let out = dir.join("out");
    harness::run(&lm_eval, &tasks, &out, None);

    // MMLU: the harness asks each item once per choice, " A" to " D", after the same context.
    let ours = eval::load_path(std::path::Path::new(&data_file_path("mmlu")), 5).unwrap();
    let mut compared = 0;
    for (s, offset) in harness::SUBJECTS.iter().zip(&tasks.offsets) {
        for t in harness::samples(&out, &format!("isc_mmlu_{s}")) {
            let doc = harness::doc_id(&t);
            let prompt = ours[offset + doc].prompt(eval::Scoring::Loglikelihood);
            let args = t["arguments"].as_object().unwrap();
            assert_eq!(args.len(), 4, "{s} item {doc}");
            for (i, letter) in ["A", "B", "C", "D"].iter().enumerate() {
                let a = &args[&format!("gen_args_{i}")];
                assert_eq!(
                    a["arg_0"].as_str().unwrap(),
                    prompt,
                    "{s} item {doc}: the harness's context, then ours"
                );
                let (_, continuation) = scoring::split_pair(&prompt, &format!(" {letter}"));
                assert_eq!(a["arg_1"].as_str().unwrap(), continuation);
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 60);

    // GSM8K: the same context after train's first five solutions, and the same stop sequences.
    let ours = eval::load_path(&tasks.gsm8k, 5).unwrap();
    let samples = harness::samples(&out, "isc_gsm8k");
    assert_eq!(samples.len(), 70, "35 items, once per filter");
    for t in samples {
        let doc = harness::doc_id(&t);
        let a = &t["arguments"]["gen_args_0"];
        assert_eq!(
            a["arg_0"].as_str().unwrap(),
            ours[doc].prompt(eval::Scoring::Loglikelihood),
            "GSM8K item {doc}"
        );
        assert_eq!(a["arg_1"]["until"], serde_json::json!(scoring::GSM8K_STOP));
    }
}
