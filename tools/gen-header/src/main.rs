//! `gen-header <crate dir> <output header>`: runs the pinned cbindgen with the crate's
//! cbindgen.toml. `make header` writes include/latent_cache.h; `make test` writes a scratch copy
//! and fails if it differs from the checked-in one by a byte.
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: gen-header <crate dir> <output header>");
        return ExitCode::from(2);
    }
    let crate_dir = PathBuf::from(&args[1]);
    let config = match cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("gen-header: {err}");
            return ExitCode::FAILURE;
        }
    };
    match cbindgen::generate_with_config(&crate_dir, config) {
        Ok(bindings) => {
            bindings.write_to_file(&args[2]);
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("gen-header: {err}");
            ExitCode::FAILURE
        }
    }
}
