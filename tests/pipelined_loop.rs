//! The decode loop engines run (mlx-lm's `generate_step`, mlx-swift-lm's): step n + 1's appends,
//! attention and the engine's own work after it are built and handed to MLX (`eval_async`)
//! before the wait for step n. Step n's kernels still read the layers' buffers when step n + 1's
//! appends are built; an append that wrote then would copy its layer's whole history (MLX copies
//! a buffer something else holds). The library waits inside the append for that layer's reads
//! to finish instead, so MLX's peak memory above the loop's start stays within what the steps
//! themselves allocate, in every storage mode, both layouts and composed storage; with
//! `LATENT_CACHE_WAIT_FOR_READERS=0` the same loop copies and this test fails. The stored values
//! are checked against the reference model (plain vectors) bit for bit, and the last step's
//! attention against the float64 reference. A loop that builds each step on a short-lived thread
//! and keeps the previous step's views (so its appends copy, as documented) stores exactly too.
//! Its own binary: MLX's counters are process-wide.
mod common;

use common::attention_ref;
use common::composed_ref::Reference;
use common::core_check::assert_matches;
use common::mlx_helpers::{array, geometry_in, host, released};
use common::model::Rng;
use latent_cache::core::attention::MaskMode;
use latent_cache::core::mlx::eval::{eval, eval_async};
use latent_cache::core::mlx::{math, memory, ops};
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};
use mlx_rs::Array;

const WIDTHS: [usize; 3] = [256, 32, 128];
const LAYERS: usize = 4;
const BATCH: usize = 2;
const HISTORY: usize = 3072;
const STEPS: usize = 6;
const HEADS: usize = 4;
/// The engine's work after each layer's attention (its projections, its MLP): a chain of
/// matmuls over `[WORK, WORK]`, long enough that step n still runs when step n + 1 is built.
const WORK: usize = 128;
const WORK_CHAIN: usize = 12;

/// MLX's counters are process-wide: the tests here measure one at a time.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The most memory MLX held while `f` ran, above what it held at its start.
fn peak_above(f: impl FnOnce()) -> usize {
    let start = released();
    memory::reset_peak().unwrap();
    f();
    memory::info().peak.saturating_sub(start)
}

struct Loop {
    layers: Vec<LatentCache>,
    /// Each layer's reference: what it stores (`compact`), and with composed storage what it
    /// reads.
    references: Vec<Reference>,
    rng: Rng,
    work: Array,
    q: [Array; 2],
    q_host: [Vec<f32>; 2],
}

impl Loop {
    fn new(g: Geometry) -> Loop {
        let mut rng = Rng::new(7);
        let pads = [0, 37];
        let (mut layers, mut references) = (Vec::new(), Vec::new());
        for _ in 0..LAYERS {
            let mut cache = LatentCache::new(g).unwrap();
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.uniform(BATCH * HISTORY * WIDTHS[f], 1.0));
            cache.append_host_padded(BATCH, HISTORY, &pads, &data[0], &data[1], Some(&data[2])).unwrap();
            cache.reserve(HISTORY + 4 * STEPS).unwrap();
            cache.eval().unwrap();
            let mut reference = Reference::new(g);
            reference.both(|m| m.append_padded(BATCH, HISTORY, &pads, &data));
            reference.settle();
            layers.push(cache);
            references.push(reference);
        }
        // Entries of about 1.7 / sqrt(WORK): the work keeps the hidden state's scale.
        let scale = 1.7 / (WORK as f32).sqrt();
        let work =
            ops::from_host(&rng.uniform(WORK * WORK, 1.0).iter().map(|v| v * scale).collect::<Vec<_>>(), &[WORK, WORK], "work")
                .unwrap();
        let q_host = [rng.uniform(BATCH * HEADS * WIDTHS[0], 1.0), rng.uniform(BATCH * HEADS * WIDTHS[1], 1.0)];
        let q = [array(&q_host[0], &[BATCH, HEADS, 1, WIDTHS[0]]), array(&q_host[1], &[BATCH, HEADS, 1, WIDTHS[1]])];
        eval([&work, &q[0], &q[1]]).unwrap();
        Loop { layers, references, rng, work, q, q_host }
    }

    /// One step's graph, shaped as a model's: every layer appends one position per row, the
    /// engine's work (its projections) runs on the hidden state, the layer's queries depend on
    /// it, and the attention's output feeds the next layer's work. The step's outputs lead with a
    /// read of each layer's new position, so MLX runs the appends first: the next step's appends
    /// then meet the previous step's last attentions still reading their buffers.
    fn build(&mut self) -> Vec<Array> {
        let mut written = Vec::new();
        let mut outs = Vec::new();
        let mut hidden = self.work.clone();
        for (cache, reference) in self.layers.iter_mut().zip(&mut self.references) {
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| self.rng.uniform(BATCH * WIDTHS[f], 1.0));
            reference.both(|m| m.append(BATCH, 1, &data));
            reference.settle();
            let [latent, rope, index_keys] =
                std::array::from_fn(|f| ops::from_host(&data[f], &[BATCH, 1, WIDTHS[f]], "positions").unwrap());
            cache.append(&latent, &rope, Some(&index_keys)).unwrap();
            let parts = cache.stored_parts(Family::Latent).unwrap();
            let newest = ops::slice(&parts[0], &[0, cache.offset() - 1, 0], &[BATCH, cache.offset(), 1]).unwrap();
            written.push(
                math::sum(&ops::reshape(&ops::astype(&newest, mlx_rs::Dtype::Float32).unwrap(), &[BATCH]).unwrap(), 0).unwrap(),
            );
            for _ in 0..WORK_CHAIN {
                hidden = math::matmul(&hidden, &self.work).unwrap();
            }
            // The queries as the work leaves them (its values times zero: the reference stays exact).
            let zero = ops::multiply(&math::sum(&ops::reshape(&hidden, &[WORK * WORK]).unwrap(), 0).unwrap(), &ops::scalar(0.0))
                .unwrap();
            let q = [math::add(&self.q[0], &zero).unwrap(), math::add(&self.q[1], &zero).unwrap()];
            let donor = cache.capture_donor_rows().unwrap();
            let attended = donor.attend(&q[0], &q[1], 0.1, MaskMode::None, None).unwrap();
            drop(donor);
            let back = math::sum(&ops::reshape(&attended, &[BATCH * HEADS * WIDTHS[0]]).unwrap(), 0).unwrap();
            hidden = math::add(&hidden, &ops::multiply(&back, &ops::scalar(0.0)).unwrap()).unwrap();
            outs.push(attended);
        }
        outs.push(math::sum(&ops::reshape(&hidden, &[WORK * WORK]).unwrap(), 0).unwrap());
        written.extend(outs);
        written
    }

    /// `pipelined`, each step built on a thread of its own that ends with it, the views of every
    /// layer's window (`state`) kept until the step after next is built: the appends then find
    /// their buffers held by views, not only by work in flight, and copy them.
    fn pipelined_keeping_views(&mut self, steps: usize) -> Vec<Array> {
        let mut kept: Vec<Array> = Vec::new();
        let mut prev: Vec<Array> = Vec::new();
        for _ in 0..steps {
            let (next, views) = std::thread::scope(|s| {
                s.spawn(|| {
                    let next = self.build();
                    let views: Vec<Array> = self.layers.iter().map(|c| c.state().unwrap().latent).collect();
                    (next, views)
                })
                .join()
                .unwrap()
            });
            eval_async(next.iter().chain(&views)).unwrap();
            eval(prev.iter()).unwrap();
            kept = views;
            prev = next;
        }
        eval(prev.iter().chain(&kept)).unwrap();
        prev
    }

    /// `steps` steps one at a time: build, evaluate, wait.
    fn single(&mut self, steps: usize) -> Vec<Array> {
        let mut outs = Vec::new();
        for _ in 0..steps {
            outs = self.build();
            eval(outs.iter()).unwrap();
        }
        outs
    }

    /// `steps` steps pipelined: build step n + 1, hand it to MLX, then wait for step n.
    fn pipelined(&mut self, steps: usize) -> Vec<Array> {
        let mut prev = self.build();
        eval_async(prev.iter()).unwrap();
        for _ in 1..steps {
            let next = self.build();
            eval_async(next.iter()).unwrap();
            eval(prev.iter()).unwrap();
            prev = next;
        }
        eval(prev.iter()).unwrap();
        prev
    }

    /// Every layer's stored values equal the reference's, and the last step's attention
    /// (`outs`) the float64 reference over the values each row reads.
    fn check(&self, outs: &[Array], what: &str) {
        for (l, cache) in self.layers.iter().enumerate() {
            let step = format!("{what}, layer {l}");
            match cache.geometry().hot_window {
                0 => assert_matches(cache, &self.references[l].compact, &step),
                _ => self.references[l].check(cache, &step),
            }
            let got = host(&outs[LAYERS + l]);
            let r = WIDTHS[0];
            for b in 0..BATCH {
                let (latent, rope) = (cache.read_row(Family::Latent, b).unwrap(), cache.read_row(Family::Rope, b).unwrap());
                let positions = attention_ref::visible(latent.len() / r, 1, 0, false);
                for h in 0..HEADS {
                    let at = (b * HEADS + h) * r;
                    let q_rope = &self.q_host[1][(b * HEADS + h) * WIDTHS[1]..][..WIDTHS[1]];
                    let want =
                        attention_ref::attention(&latent, &rope, &self.q_host[0][at..at + r], q_rope, 0.1, &positions, |_| 0.0);
                    for (c, w) in want.iter().enumerate() {
                        let g = got[at + c] as f64;
                        assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "{step}: row {b} head {h} [{c}]: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// Bytes the smallest layer's buffers hold: what one copied append would add.
    fn layer_bytes(&self) -> usize {
        self.layers.iter().map(LatentCache::bytes_in_use).min().unwrap_or(0)
    }
}

/// Tries at the peak comparison: MLX's peak for the same steps varies by the timing of frees
/// (a single-step loop's peak was seen 0.7 MB under its usual value on a loaded machine), while
/// an append that copies does so at every try.
const TRIES: usize = 3;

fn run(g: Geometry, what: &str) {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let mut engine = Loop::new(g);
    let mut outs = engine.single(2);
    // The steps' own transients (on the CPU, MLX's attention reads the window through a copy
    // per layer, in either loop), and a quarter of a layer: an append that copied would add the
    // layer's latent and rope buffers, which step n's attention reads (most of the layer).
    let layer = engine.layer_bytes();
    let (mut single, mut seen) = (0, Vec::new());
    for _ in 0..TRIES {
        single = single.max(peak_above(|| outs = engine.single(STEPS)));
        engine.check(&outs, &format!("{what}, single steps"));
        let pipelined = peak_above(|| outs = engine.pipelined(STEPS));
        engine.check(&outs, &format!("{what}, pipelined steps"));
        seen.push(pipelined);
        if pipelined <= single + layer / 4 {
            return;
        }
    }
    panic!(
        "{what}: pipelined steps peaked {seen:?} B above their start in {TRIES} tries (single steps: at most {single} B; \
         one layer's buffers: {layer} B): an append copied its layer's history"
    );
}

#[test]
fn pipelined_steps_write_in_place_in_every_storage_mode_and_layout() {
    use StorageMode::*;
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        for modes in [[F32, F32, F32], [Bf16, Bf16, Bf16], [F16, F16, F16], [Q8, Bf16, Q8], [Q4, Bf16, Q4], [Fp8, Bf16, Fp8]] {
            run(geometry_in(WIDTHS, modes, layout), &format!("{modes:?}, {layout:?}"));
        }
    }
}

#[test]
fn pipelined_steps_write_in_place_with_composed_storage() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = Geometry {
            hot_window: 128,
            hot_storage: StorageMode::F32,
            ..geometry_in(WIDTHS, [StorageMode::Q8, StorageMode::Bf16, StorageMode::Q8], layout)
        };
        run(g, &format!("composed Q8, {layout:?}"));
    }
}

#[test]
fn pipelined_steps_on_short_lived_threads_keeping_views_store_exactly() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = geometry_in(WIDTHS, [StorageMode::Bf16; 3], layout);
        let mut engine = Loop::new(g);
        let outs = engine.pipelined_keeping_views(STEPS);
        engine.check(&outs, &format!("views kept, {layout:?}"));
    }
}
