//! Builds mlx-c against a prebuilt MLX and generates its bindings.
//!
//! Inputs (environment):
//! - `MLX_PREFIX`: a folder holding `mlx/include` and `mlx/lib` (a `pip install --target` of PyPI's
//!   `mlx-cpu` on Linux, `mlx` on macOS). Defaults to `<repo>/.deps/py`, where the Makefile puts it.
//! - `MLX_C_SRC`: an mlx-c source tree to use instead of the one inside crates.io's mlx-sys 0.7.0.
//! - `LIBCLANG_PATH`: for bindgen; defaults to PyPI libclang's folder under `MLX_PREFIX`.
//! - `LATENT_CACHE_MLX_C`: `host` builds for an engine that brings its own MLX and mlx-c (the
//!   same versions): nothing is compiled or linked, only the bindings are generated (from the same
//!   mlx-c headers), so every `mlx_*` the library calls stays an undefined reference for the
//!   engine's link to resolve. `check`: for `cargo check`/`clippy` of another platform (the
//!   Makefile's `lint-apple`): nothing compiled or linked either, and the bindings generated for
//!   the build machine (mlx-c's API uses fixed-size types, so they type-check the same). Unset
//!   (or `bundled`): the normal build.
//!
//! Outputs: a static `mlxc`, `dylib=mlx`, and `cargo:libdir` (read by dependents as
//! `DEP_MLX_LIBDIR`, for a run path); with `LATENT_CACHE_MLX_C=host`, none of them.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The crates.io package whose mlx-c sources (a pinned mlx-c release) we compile.
const UPSTREAM: &str = "mlx-sys";
const UPSTREAM_VERSION: &str = "0.7.0";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["MLX_PREFIX", "MLX_C_SRC", "LIBCLANG_PATH", "LATENT_CACHE_MLX_C"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=compat");
    println!("cargo:rerun-if-changed=shim");

    let (host_mlx, check_only) = match env::var("LATENT_CACHE_MLX_C").as_deref() {
        Ok("host") => (true, false),
        Ok("check") => (true, true),
        Ok("bundled") | Ok("") | Err(_) => (false, false),
        Ok(other) => panic!("LATENT_CACHE_MLX_C={other}: expected `host`, `check` or `bundled`"),
    };
    let prefix = env::var_os("MLX_PREFIX").map(PathBuf::from).unwrap_or_else(|| manifest.join("../../.deps/py"));
    let mlx_include = prefix.join("mlx/include");
    let mlx_lib = prefix.join("mlx/lib");
    // mlx-c is compiled against MLX's headers in both builds; the bindings alone (`check`, a
    // build machine checking another platform) need none.
    if !check_only && !mlx_include.join("mlx/mlx.h").exists() {
        panic!(
            "MLX headers not found under {}: run `make deps` (or set MLX_PREFIX to a pip --target \
             install of mlx-cpu==0.32.2)",
            prefix.display()
        );
    }
    let mlx_c = env::var_os("MLX_C_SRC").map(PathBuf::from).unwrap_or_else(|| upstream_mlx_c(&out));
    let prelude = manifest.join("compat/prelude.h");

    // Both builds compile mlx-c into the library; the shipped library and archive keep it
    // private (only latent_cache_* stays global), so it never meets an engine's own mlx-c. A
    // host build links no libmlx and records no run path: MLX's C++ runtime is the engine's,
    // the only one in the process (mlx-c's objects define no static state of MLX's, only
    // template and inline code of its headers, which the shipped files keep local).
    if !check_only {
        compile_mlx_c(&mlx_c, &mlx_include, &prelude, &manifest);
    }
    if !host_mlx {
        println!("cargo:rustc-link-search=native={}", mlx_lib.display());
        println!("cargo:rustc-link-lib=dylib=mlx");
        println!("cargo:libdir={}", mlx_lib.display());
    }

    if env::var_os("LIBCLANG_PATH").is_none() {
        let bundled = prefix.join("clang/native");
        if bundled.exists() {
            env::set_var("LIBCLANG_PATH", bundled);
        }
    }
    generate_bindings(&mlx_c, &prelude, &out, check_only);
}

/// Finds the mlx-c tree inside crates.io's mlx-sys package: a throwaway manifest that depends on
/// it, resolved by `cargo metadata`, which downloads the package into cargo's registry cache.
fn upstream_mlx_c(out: &Path) -> PathBuf {
    let dir = out.join("upstream-source");
    fs::create_dir_all(dir.join("src")).unwrap();
    fs::write(dir.join("src/lib.rs"), "").unwrap();
    fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"mlx-c-source\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\n{UPSTREAM} = {{ version = \"={UPSTREAM_VERSION}\", default-features = false }}\n\
             [workspace]\n"
        ),
    )
    .unwrap();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("running cargo metadata to locate mlx-c");
    if !output.status.success() {
        panic!("cargo metadata failed while locating {UPSTREAM} {UPSTREAM_VERSION}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let json = String::from_utf8(output.stdout).unwrap();
    let suffix = format!("{UPSTREAM}-{UPSTREAM_VERSION}/Cargo.toml");
    let manifest = json
        .split("\"manifest_path\":\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap_or(0)])
        .find(|path| path.replace('\\', "/").ends_with(&suffix))
        .unwrap_or_else(|| panic!("{UPSTREAM} {UPSTREAM_VERSION} not in cargo metadata output"));
    let root = Path::new(manifest).parent().unwrap().join("src/mlx-c");
    assert!(root.join("mlx/c/mlx.h").exists(), "no mlx-c under {}", root.display());
    root
}

/// mlx-c's files with the given extension in `mlx/c` (not `private/`), sorted.
fn mlx_c_files(mlx_c: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

/// mlx-c's sources and ours (`shim/`: what mlx-c does not expose of an array), compiled
/// together.
fn compile_mlx_c(mlx_c: &Path, mlx_include: &Path, prelude: &Path, manifest: &Path) {
    let mut sources = mlx_c_files(mlx_c, "cpp");
    sources.push(manifest.join("shim/holders.cpp"));
    let compat = manifest.join("compat");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2)
        .debug(false)
        .warnings(false)
        .pic(true)
        .include(mlx_c)
        .include(mlx_include)
        .flag("-include")
        .flag(prelude.to_str().unwrap())
        .files(&sources);
    if !has_std_format(&build) {
        build.include(&compat);
    }
    build.compile("mlxc");
}

/// Whether the C++ compiler's standard library provides <format>.
fn has_std_format(build: &cc::Build) -> bool {
    let compiler = build.get_compiler();
    let probe = PathBuf::from(env::var("OUT_DIR").unwrap()).join("format_probe.cpp");
    fs::write(&probe, "#include <format>\nint main() { return (int)std::format(\"{}\", 1).size(); }\n").unwrap();
    compiler
        .to_command()
        .args(["-std=c++20", "-fsyntax-only"])
        .arg(&probe)
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false)
}

/// Same bindgen settings as crates.io's mlx-sys 0.7.0, plus the prelude and the C compiler's
/// builtin headers (PyPI's libclang ships none).
fn generate_bindings(mlx_c: &Path, prelude: &Path, out: &Path, for_build_machine: bool) {
    let headers = mlx_c_files(mlx_c, "h");
    let mut builder = bindgen::Builder::default();
    if for_build_machine {
        // The build machine's own C headers, whatever platform cargo checks for.
        builder = builder.clang_arg(format!("--target={}", env::var("HOST").unwrap()));
    }
    builder = builder
        .rust_target("1.73.0".parse().expect("rust-version"))
        .clang_arg(format!("-I{}", mlx_c.display()))
        .clang_arg("-include")
        .clang_arg(prelude.display().to_string())
        .blocklist_function("malloc")
        .blocklist_function("realloc");
    if let Some(builtin) = c_builtin_include() {
        builder = builder.clang_arg("-idirafter").clang_arg(builtin);
    }
    for header in &headers {
        builder = builder.header(header.to_string_lossy());
    }
    builder
        .generate()
        .expect("generating mlx-c bindings")
        .write_to_file(out.join("bindings.rs"))
        .expect("writing mlx-c bindings");
}

fn c_builtin_include() -> Option<String> {
    let compiler = cc::Build::new().get_compiler();
    let output = compiler.to_command().arg("-print-file-name=include").output().ok()?;
    let path = String::from_utf8(output.stdout).ok()?.trim().to_string();
    Path::new(&path).is_dir().then_some(path)
}
