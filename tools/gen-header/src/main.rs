//! `gen-header <crate dir> <output header>`: runs the pinned cbindgen with the crate's
//! cbindgen.toml. `make header` writes include/latent_cache.h; `make test` writes a scratch copy
//! and fails if it differs from the checked-in one by a byte. The version macros come from the
//! crate's Cargo.toml, so a version bump cannot leave the header behind.
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: gen-header <crate dir> <output header>");
        return ExitCode::from(2);
    }
    let crate_dir = PathBuf::from(&args[1]);
    let mut config = match cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("gen-header: {err}");
            return ExitCode::FAILURE;
        }
    };
    let version = match package_version(&crate_dir) {
        Some(version) => version,
        None => {
            eprintln!("gen-header: no version in {}/Cargo.toml", crate_dir.display());
            return ExitCode::FAILURE;
        }
    };
    config.after_includes = Some(version_macros(&version) + config.after_includes.as_deref().unwrap_or(""));
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

/// The `version = "..."` of the `[package]` table of the crate's Cargo.toml.
fn package_version(crate_dir: &std::path::Path) -> Option<String> {
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).ok()?;
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(value) = line.strip_prefix("version").map(str::trim_start).and_then(|l| l.strip_prefix('=')) {
                return Some(value.trim().trim_matches('"').to_string());
            }
        }
    }
    None
}

/// `#define LATENT_CACHE_VERSION_MAJOR ...` and friends for `version` ("MAJOR.MINOR.PATCH").
fn version_macros(version: &str) -> String {
    let mut parts = version.split('.').chain(std::iter::repeat("0"));
    let mut out = String::from("\n");
    for name in ["MAJOR", "MINOR", "PATCH"] {
        let part = parts.next().unwrap_or("0");
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        out += &format!("#define LATENT_CACHE_VERSION_{name} {digits}\n");
    }
    out += &format!("#define LATENT_CACHE_VERSION \"{version}\"\n");
    out
}
