//! Gives the library, its tests and examples a run path to the MLX they were linked against, so a
//! C program linked with liblatent_cache.so runs without LD_LIBRARY_PATH. (Link arguments do not
//! propagate from dependencies, so mlx-sys cannot do this for us.)
fn main() {
    // Only this file and MLX's folder decide the output: without these lines cargo reruns the
    // script, and rebuilds the library, whenever any file of the package changes (docs, tests).
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}
