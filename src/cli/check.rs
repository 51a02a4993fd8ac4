//! `inferscope check`: a config validated, and what `serve` would need of this machine.

use crate::config;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// YAML config file.
    #[arg(required_unless_present = "schema")]
    file: Option<PathBuf>,
    /// Print the config's JSON Schema instead (for editors: `# yaml-language-server:
    /// $schema=FILE` at the top of a config file).
    #[arg(long, conflicts_with = "file")]
    schema: bool,
}

pub(crate) fn exec(args: &Args) -> ExitCode {
    let Some(file) = args.file.as_ref().filter(|_| !args.schema) else {
        println!("{:#}", config::json_schema());
        return ExitCode::SUCCESS;
    };
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
