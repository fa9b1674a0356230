//! The `weft` binary: parses arguments and hands over to weft's CLI module.
use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = weft::Cli::parse();
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
    let code = rt.block_on(weft::cli_main(cli));
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    std::process::exit(code);
}
