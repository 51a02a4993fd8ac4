//! `inferscope gpu`: this host's GPUs as NVML reports them.

use std::process::ExitCode;

pub(crate) fn exec() -> ExitCode {
    match crate::route::nvml::read() {
        Ok(g) => {
            println!("{}", g.to_json());
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("{why}");
            ExitCode::from(1)
        }
    }
}
