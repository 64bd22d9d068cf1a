//! The `fastmlx` binary: see `fastmlx --help`.

fn main() -> std::process::ExitCode {
    fastmlx::cli::main()
}
