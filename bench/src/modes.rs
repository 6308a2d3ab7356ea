//! Storage modes side by side (`latent-cache-bench --modes`): the same GLM-5.2-shaped model with
//! each family stored as a mode names it, stepped as an engine that attends over the stored
//! parts would step it: on DSA layers read the stored index keys' parts, append one position
//! (no values built), take the latent's and rope's stored parts, evaluate once. For float32 the
//! parts are the plain views, so the f32 row is the library's usual decode step. Plus each
//! mode's accuracy on Gaussian and heavy-tailed values.
use latent_cache::core::mlx::eval::eval;

use latent_cache::{Family, Geometry, LatentCache, StorageMode};
use mlx_rs::Array;

use crate::systems::{geometry, is_dsa, Inputs, Step, System, LAYERS};
use latent_cache::core::kernels::cuda;

/// A configuration of the three families' modes, named as the report shows it.
pub struct ModeSet {
    pub name: &'static str,
    pub storage: [StorageMode; 3],
    /// Composed storage: the newest positions per row kept in bfloat16 (0: not composed).
    pub hot_window: usize,
}

/// The configurations measured: exact; the checkpoint's precision; the 8-bit layouts serving
/// engines use (affine as mlx-lm, FP8 with block scales as FlashMLA / SGLang), the rope key in
/// bfloat16 (64 wide, too narrow for FP8's blocks); the smallest; and the 8-bit layout composed
/// with the newest 1024 positions of every row in bfloat16 (its step reads the packed parts, as
/// the other quantized rows do: the hot values are written, not read).
pub const MODE_SETS: [ModeSet; 6] = [
    ModeSet { name: "latent-cache f32", storage: [StorageMode::F32; 3], hot_window: 0 },
    ModeSet { name: "latent-cache bf16", storage: [StorageMode::Bf16; 3], hot_window: 0 },
    ModeSet {
        name: "latent-cache q8 (rope bf16)",
        storage: [StorageMode::Q8, StorageMode::Bf16, StorageMode::Q8],
        hot_window: 0,
    },
    ModeSet {
        name: "latent-cache fp8 (rope bf16)",
        storage: [StorageMode::Fp8, StorageMode::Bf16, StorageMode::Fp8],
        hot_window: 0,
    },
    ModeSet {
        name: "latent-cache q4 (rope bf16, index q8)",
        storage: [StorageMode::Q4, StorageMode::Bf16, StorageMode::Q8],
        hot_window: 0,
    },
    ModeSet {
        name: "latent-cache q8 (rope bf16) composed, 1024 hot bf16",
        storage: [StorageMode::Q8, StorageMode::Bf16, StorageMode::Q8],
        hot_window: 1024,
    },
];

fn layer(l: usize, set: &ModeSet) -> Geometry {
    let [latent_storage, rope_storage, index_storage] = set.storage;
    let (hot_window, hot_storage) = (set.hot_window, StorageMode::Bf16);
    Geometry { latent_storage, rope_storage, index_storage, hot_window, hot_storage, ..geometry(l) }
}

pub struct OursMode {
    name: &'static str,
    layers: Vec<LatentCache>,
    /// A labelled variant's input dtype: the step's inputs converted once (as an engine whose
    /// activations are already in that dtype passes them), keyed by the inputs they came from.
    inputs: Option<(mlx_rs::Dtype, Option<Converted>)>,
    /// A labelled variant: FP8 encoded with MLX's ops even where the library's kernel applies.
    fp8_ops: bool,
}

/// Inputs converted to a variant's dtype, keyed by the inputs they came from.
type Converted = (usize, [Array; 3]);

/// The variant: FP8 storage encoded by MLX's ops instead of the library's CUDA kernel.
pub const FP8_OPS: &str = "latent-cache fp8 (rope bf16), MLX-ops encoding (variant)";

/// The variant: bfloat16 storage fed bfloat16 inputs (GLM-5.2 computes its state in bfloat16).
pub const BF16_INPUTS: &str = "latent-cache bf16, bf16 inputs (variant)";

impl OursMode {
    pub fn new(set: &ModeSet) -> Self {
        let layers = (0..LAYERS).map(|l| LatentCache::new(layer(l, set)).unwrap()).collect();
        OursMode { name: set.name, layers, inputs: None, fp8_ops: false }
    }

    /// `MODE_SETS[3]` (FP8) encoded by MLX's ops where the library's kernel would apply:
    /// `FP8_OPS`, measured only where it differs (MLX's CUDA backend).
    pub fn fp8_ops() -> Self {
        OursMode { name: FP8_OPS, fp8_ops: true, ..OursMode::new(&MODE_SETS[3]) }
    }

    /// `MODE_SETS[1]` (bfloat16) fed bfloat16 inputs: `BF16_INPUTS`.
    pub fn bf16_inputs() -> Self {
        OursMode { name: BF16_INPUTS, inputs: Some((mlx_rs::Dtype::Bfloat16, None)), ..OursMode::new(&MODE_SETS[1]) }
    }

    /// The step's inputs in the variant's dtype (converted on first use), or as given.
    fn inputs<'a>(&'a mut self, given: &'a Inputs) -> &'a [Array; 3] {
        let Some((dtype, converted)) = &mut self.inputs else {
            return &given.arrays;
        };
        let key = given.arrays[0].as_ptr().ctx as usize;
        if converted.as_ref().map(|(k, _)| *k) != Some(key) {
            let arrays = given.arrays.each_ref().map(|a| latent_cache::core::mlx::ops::astype(a, *dtype).unwrap());
            eval(arrays.iter()).unwrap();
            *converted = Some((key, arrays));
        }
        &converted.as_ref().unwrap().1
    }
}

impl System for OursMode {
    fn name(&self) -> &'static str {
        self.name
    }

    fn forward(&mut self, given: &Inputs, step: Step) {
        let outputs = self.step_outputs(given, step);
        eval(outputs.iter()).unwrap();
    }

    fn spec_begin(&mut self) {
        self.layers.iter_mut().for_each(|c| c.spec_round_begin().unwrap());
    }

    fn spec_rollback(&mut self, keep: usize) {
        self.layers.iter_mut().for_each(|c| c.spec_round_rollback_all(keep).unwrap());
    }

    fn reserve(&mut self, tokens: usize) {
        self.layers.iter_mut().for_each(|c| c.reserve(tokens).unwrap());
    }

    fn bytes_per_token(&self) -> usize {
        self.layers.iter().map(LatentCache::bytes_per_token).sum()
    }
}

impl OursMode {
    /// One forward's appends and the parts it keeps, unevaluated.
    fn step_outputs(&mut self, given: &Inputs, step: Step) -> Vec<Array> {
        cuda::fp8_encode::KERNEL.set_enabled(!self.fp8_ops);
        let outputs = self.appended(given, step);
        cuda::fp8_encode::KERNEL.set_enabled(true);
        outputs
    }

    fn appended(&mut self, given: &Inputs, step: Step) -> Vec<Array> {
        let inputs = self.inputs(given).clone();
        let mut outputs = Vec::with_capacity(LAYERS * 8);
        for (l, cache) in self.layers.iter_mut().enumerate() {
            if step != Step::Fill && is_dsa(l) {
                outputs.extend(cache.stored_parts(Family::IndexKeys).unwrap());
            }
            let keys = is_dsa(l).then_some(&inputs[2]);
            cache.append(&inputs[0], &inputs[1], keys).unwrap();
            outputs.extend(cache.stored_parts(Family::Latent).unwrap());
            outputs.extend(cache.stored_parts(Family::Rope).unwrap());
            if step == Step::Fill && is_dsa(l) {
                outputs.extend(cache.stored_parts(Family::IndexKeys).unwrap());
            }
        }
        outputs
    }
}

/// The MLX operations one decode step evaluates (batch 1, after 64 positions reserved to 1K),
/// counted from MLX's own printed graph of the step's outputs: one JSON record per mode set and
/// the bfloat16-inputs variant, with the count per primitive.
pub fn op_counts() -> Vec<String> {
    let mut sets: Vec<OursMode> = MODE_SETS.iter().map(OursMode::new).collect();
    sets.push(OursMode::bf16_inputs());
    if cuda::fp8_encode::applies(1) {
        sets.push(OursMode::fp8_ops());
    }
    let fill = Inputs::new(1, 64, 0.5);
    let one = Inputs::new(1, 1, 0.25);
    let mut out = Vec::new();
    for mut mode in sets {
        mode.reserve(1024);
        mode.forward(&fill, Step::Fill);
        mode.forward(&one, Step::Decode);
        let outputs = mode.step_outputs(&one, Step::Decode);
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for line in printed_graph(&outputs).lines().skip(2).collect::<std::collections::BTreeSet<_>>() {
            *counts.entry(line.split(' ').next().unwrap_or("").to_string()).or_default() += 1;
        }
        eval(outputs.iter()).unwrap();
        let total: usize = counts.values().sum();
        let by: Vec<String> = counts.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
        out.push(format!(
            "{{\"system\": \"{}\", \"scenario\": \"ops_per_step\", \"batch\": 1, \"context\": 66, \"ops\": {total}, \"by_primitive\": {{{}}}}}",
            mode.name,
            by.join(", ")
        ));
    }
    out
}

/// MLX's printout of the graph behind `outputs` (one line per operation after two header lines;
/// an operation with several outputs prints one identical line per output).
pub(crate) fn printed_graph(outputs: &[Array]) -> String {
    let path = std::env::temp_dir().join(format!("latent-cache-graph-{}.txt", std::process::id()));
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a file opened and closed here; the vector and namer are freed after the call, and
    // the arrays are borrowed for it.
    unsafe {
        let file = libc::fopen(c_path.as_ptr(), c"w".as_ptr());
        assert!(!file.is_null(), "opening {path:?}");
        let vector = mlx_sys::mlx_vector_array_new();
        for a in outputs {
            mlx_sys::mlx_vector_array_append_value(vector, a.as_ptr());
        }
        let namer = mlx_sys::mlx_node_namer_new();
        let rc = mlx_sys::mlx_print_graph(file.cast(), namer, vector);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vector);
        libc::fclose(file);
        assert_eq!(rc, 0, "MLX printed no graph");
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    text
}

/// Standard normal samples (Box-Muller over a fixed xorshift stream), and heavy-tailed ones
/// (a normal times e^normal: rare values tens of times the typical scale, as outlier channels).
fn samples(n: usize, heavy: bool, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        ((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut normal = move || ((-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos()) as f32;
    (0..n).map(|_| if heavy { normal() * normal().exp() } else { normal() }).collect()
}

/// One JSON record per (mode set, distribution, family): the largest absolute error and the
/// largest error relative to the value among values of magnitude at least 0.1 (inputs have unit
/// scale), over 256 positions read back through the host path.
pub fn accuracy() -> Vec<String> {
    let mut out = Vec::new();
    let tokens = 256;
    // A composed set's 256 positions are all hot: its accuracy is its hot mode's (bf16 above).
    for set in MODE_SETS.iter().filter(|s| s.hot_window == 0) {
        for (distribution, heavy) in [("gaussian", false), ("heavy-tailed", true)] {
            let g = layer(0, set);
            let g = Geometry { index_head_dim: 128, ..g };
            let mut cache = LatentCache::new(g).unwrap();
            let data: Vec<Vec<f32>> = [g.kv_lora_rank, g.rope_head_dim, 128]
                .iter()
                .enumerate()
                .map(|(f, w)| samples(tokens * w, heavy, f as u64 + 1))
                .collect();
            cache.append_host(1, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
            for (f, family) in Family::ALL.into_iter().enumerate() {
                let back = cache.read_row(family, 0).unwrap();
                let (mut abs, mut rel) = (0f32, 0f32);
                for (x, y) in data[f].iter().zip(&back) {
                    let err = (x - y).abs();
                    abs = abs.max(err);
                    if x.abs() >= 0.1 {
                        rel = rel.max(err / x.abs());
                    }
                }
                let line = format!(
                    "{{\"system\": \"{}\", \"scenario\": \"accuracy\", \"distribution\": \"{distribution}\", \
                     \"family\": \"{}\", \"storage\": \"{}\", \"max_abs\": {abs:e}, \"max_rel\": {rel:e}}}",
                    set.name,
                    family.name(),
                    g.storage(family).name()
                );
                eprintln!("{line}");
                out.push(line);
            }
        }
    }
    out
}
