//! The `inferscope` binary: see `inferscope --help`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    inferscope::cli::main()
}
