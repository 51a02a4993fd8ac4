//! `inferscope check`: a config validated, and what `serve` would need of this machine.

use crate::config;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// YAML config file.
    file: PathBuf,
}

pub(crate) fn exec(args: &Args) -> ExitCode {
    let file = &args.file;
    let checked = config::load(file)
        .and_then(|c| config::check_environment(file, &c, |k| std::env::var(k).ok()).map(|()| c));
    match checked {
        Ok(c) => {
            println!(
                "ok: {} ({} backends, {} routes)",
                file.display(),
                c.backends.len(),
                c.routes.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
