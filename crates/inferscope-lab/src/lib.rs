//! inferscope's lab tools: what measures a gateway or a backend from outside, and what reads the
//! gateway's records after the fact. None of it runs inside a serving gateway.
//!
//! | module | owns |
//! |---|---|
//! | [`loadgen`] | `inferscope bench`: open- and closed-loop load, measured by the gateway's definitions; datasets |
//! | [`eval`] | `inferscope eval`: a dataset through the gateway once per variant, scored; quiz, choice and code tasks |
//! | [`sandbox`] | where model-written code runs for HumanEval-style tasks (bubblewrap or a subprocess with limits) |
//! | [`perplexity`] | token-level perplexity of a reference text per variant |
//! | [`report`] | `inferscope report`: an access log grouped, each group against a control, the verdict |
//! | [`html`] | `inferscope report --html`: one self-contained page of CDFs, load curves with the knee, tables and each run's metadata |

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod eval;
pub mod harness;
pub mod html;
pub mod loadgen;
pub mod perplexity;
pub mod report;
pub mod sandbox;

// The layers below under the names the modules use.
use inferscope_config as config;
use inferscope_gateway::{accesslog, experiment, route, stats};
use inferscope_meter as meter;
use inferscope_server::{tls, util};
use inferscope_sim as sim;
use inferscope_wire::{dialect, sse};
