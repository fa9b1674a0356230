//! The `weft` binary: parses arguments and hands over to weft's CLI module.
use clap::Parser;

/// mimalloc, not the system allocator: a tree of 10⁴ threads allocates from every worker at once,
/// and glibc's arenas spent a third of its CPU in malloc and its locks (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    weft::prefer_small_pages();
    let cli = weft::Cli::parse();
    cli.apply_database();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weft: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let telemetry = weft::init_telemetry(rt.handle().clone());
    let code = rt.block_on(weft::cli_main(cli));
    // The span exporter posts on this runtime: flush before it stops.
    telemetry.shutdown();
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    std::process::exit(code);
}
