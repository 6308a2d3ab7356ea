//! The Metal kernels' sources (`src/core/kernels/metal/src/*.metal`, the very files the library
//! ships, included by path), as MLX would assemble them, run in a C++ emulation of Metal's
//! threadgroups and SIMD groups (`tests/metal_emulation/`): the split-K decode against a float64
//! computation (padded, ragged and causal rows, strided views, empty splits, every float storage
//! dtype, GLM-5.2's widths, selected positions read through their indices within each row's
//! bounds, a prefill chunk's queries each a row over one broadcast buffer), DSA's top-k against
//! the host's selection (ties, unseen positions, strided scores), its index scores against a
//! float64 computation (padded rows, causal queries, strided keys), and the index scores that
//! count the top-k's histogram against the scores kernel and the histogram kernel. These
//! machines have no Apple GPU; this is the kernels' logic checked, not Metal's compiler
//! (`tests/decode_kernel.rs` runs them on an Apple GPU).
use std::path::Path;
use std::process::Command;

/// A kernel function as MLX's `metal_kernel` writes one: the template arguments, then each
/// input's pointer with its shape and strides, the outputs, and the body. (MLX passes shapes
/// and strides only where the body names them; the emulation passes them always.) The body is
/// the kernel's `.metal` file, included where MLX puts it.
fn function(name: &str, template: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)], body: &Path) -> String {
    let mut params: Vec<String> = inputs
        .iter()
        .flat_map(|(n, t)| [format!("const {t}* {n}"), format!("const int* {n}_shape"), format!("const int64_t* {n}_strides")])
        .collect();
    params.extend(outputs.iter().map(|(n, t)| format!("{t}* {n}")));
    params.push("const Attributes& lc_attributes".into());
    let body = body.display();
    let template = if template.is_empty() { String::new() } else { format!("template <{template}>\n") };
    format!("{template}void {name}({}) {{\n  LC_ATTRIBUTES(lc_attributes)\n#include \"{body}\"\n}}\n", params.join(", "))
}

#[test]
fn metal_decode_kernels_agree_with_float64_in_emulation() {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core/kernels/metal/src");
    let dir = std::env::temp_dir().join(format!("latent-cache-metal-emulation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = format!(
        "#include \"metal_shim.h\"\n#include \"{}\"\n{}\n{}",
        sources.join("mla_decode.h.metal").display(),
        function(
            "lc_partial",
            "int R, int P, int H, int LQ, bool CAUSAL, bool GATHER, typename TS",
            &[
                ("q_latent", "TS"),
                ("q_rope", "TS"),
                ("latent", "TS"),
                ("rope", "TS"),
                ("ranges", "int"),
                ("scale", "float"),
                ("sel", "int"),
            ],
            &[("o_part", "float"), ("ml", "float")],
            &sources.join("mla_decode_partial.metal")
        ),
        function(
            "lc_combine",
            "int R, int H, int MAX_SPLITS",
            &[("o_part", "float"), ("ml", "float")],
            &[("out", "float")],
            &sources.join("mla_decode_combine.metal")
        ),
    ) + &format!(
        "#include \"{}\"\n{}\n",
        sources.join("dsa_topk.h.metal").display(),
        function("lc_topk_hist", "", &[("scores", "float")], &[("hist", "uint")], &sources.join("dsa_topk_hist.metal")),
    ) + &function(
        "lc_topk",
        "int K, int CAP",
        &[("scores", "float"), ("hist", "uint")],
        &[("top", "int"), ("bits", "uint")],
        &sources.join("dsa_topk.metal"),
    ) + &function(
        "lc_scores",
        "int HI, int W, int LQ, bool RANGES, bool CAUSAL, typename TQ, typename TW, typename TK",
        &[("q_index", "TQ"), ("weights", "TW"), ("keys", "TK"), ("ranges", "int")],
        &[("scores", "float")],
        &sources.join("dsa_scores.metal"),
    ) + "#define LC_SCORES_COUNT 1\n"
        + &function(
            "lc_scores_counted",
            "int HI, int W, int LQ, bool RANGES, bool CAUSAL, typename TQ, typename TW, typename TK",
            &[("q_index", "TQ"), ("weights", "TW"), ("keys", "TK"), ("ranges", "int")],
            &[("scores", "float"), ("hist", "uint")],
            &sources.join("dsa_scores.metal"),
        )
        + "#undef LC_SCORES_COUNT\n";
    std::fs::write(dir.join("kernels.inc"), source).unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/metal_emulation");
    let binary = dir.join("driver");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unused-variable", "-Wno-unused-but-set-variable"])
        .arg(format!("-I{}", here.display()))
        .arg(format!("-I{}", dir.display()))
        .arg(here.join("driver.cpp"))
        .arg("-o")
        .arg(&binary)
        .output()
        .expect("a C++ compiler (CXX, else c++) runs");
    assert!(built.status.success(), "the emulation builds:\n{}", String::from_utf8_lossy(&built.stderr));
    let ran = Command::new(&binary).output().unwrap();
    let report = String::from_utf8_lossy(&ran.stdout);
    println!("{report}");
    assert!(ran.status.success(), "every case agrees with float64:\n{report}{}", String::from_utf8_lossy(&ran.stderr));
    assert_eq!(report.lines().filter(|l| l.starts_with("ok:")).count(), 18, "eighteen cases ran:\n{report}");
    std::fs::remove_dir_all(&dir).ok();
}
