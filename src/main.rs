//! The `inferscope` binary: see `inferscope --help`.

fn main() -> std::process::ExitCode {
    inferscope::cli::main()
}
