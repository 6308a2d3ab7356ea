//! The systems under test, behind one trait so every scenario drives them identically:
//! this library through its Rust API and through its C ABI (the mlx_array path), and the seed's
//! reference strategy (concatenate every family on every append, copy on every trim).
use latent_cache::core::mlx::eval::eval;

use latent_cache::core::mlx::ops;
use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::set::*;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_config, latent_cache_status};
use latent_cache::{Geometry, LatentCache, LayoutKind};
use mlx_rs::Array;
use mlx_sys::mlx_array;

/// GLM-5.2: 78 layers, kv_lora_rank 512, rope 64, index keys 128 on the 21 that run the indexer.
pub const LAYERS: usize = 78;
pub const WIDTHS: [usize; 3] = [512, 64, 128];

/// Whether layer `l` carries DSA index keys (spread evenly over the stack).
pub fn is_dsa(l: usize) -> bool {
    latent_cache::core::model::presets::glm52_selects(l)
}

/// Bytes one position costs the whole model in f32.
pub fn model_bytes_per_token() -> usize {
    (0..LAYERS).map(|l| 4 * (WIDTHS[0] + WIDTHS[1] + if is_dsa(l) { WIDTHS[2] } else { 0 })).sum()
}

/// `[batch, tokens, width]` inputs for every family (index keys only where needed).
pub struct Inputs {
    pub arrays: [Array; 3],
}

impl Inputs {
    pub fn new(batch: usize, tokens: usize, seed: f32) -> Inputs {
        let make = |w: usize| {
            let n = batch * tokens * w;
            let data: Vec<f32> = (0..n).map(|i| seed + (i % 97) as f32 * 0.25).collect();
            Array::from_slice(&data, &[batch as i32, tokens as i32, w as i32])
        };
        let arrays = [make(WIDTHS[0]), make(WIDTHS[1]), make(WIDTHS[2])];
        eval(arrays.iter()).unwrap();
        Inputs { arrays }
    }
}

/// What one forward over the layers reads and keeps, before its single evaluation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Filling the cache: append, evaluate everything stored.
    Fill,
    /// The DSA decode pattern: on DSA layers read the index keys stored before the append (to
    /// select positions), append, keep the latent and rope views.
    Decode,
    /// As `Decode`, and also keep the index keys view the append returns.
    DecodeAllViews,
}

impl Step {
    fn reads_index_keys(self) -> bool {
        self != Step::Fill
    }

    fn keeps_index_keys_view(self) -> bool {
        self != Step::Decode
    }
}

pub trait System {
    fn name(&self) -> &'static str;
    /// Appends `inputs` to every layer, keeping what `step` says, and evaluates it all once.
    fn forward(&mut self, inputs: &Inputs, step: Step);
    fn spec_begin(&mut self);
    /// Every row keeps `keep` of the positions appended in the round.
    fn spec_rollback(&mut self, keep: usize);
    /// Row `b` keeps `keep[b]` of the positions it appended in the round; `false` when the
    /// system has no per-row rollback.
    fn spec_rollback_rows(&mut self, _keep: &[usize]) -> bool {
        false
    }
    /// Makes room for `tokens` positions where the system supports it.
    fn reserve(&mut self, _tokens: usize) {}
    /// Bytes the last per-row rollback moved, where the system knows it.
    fn bytes_moved(&self) -> Option<usize> {
        None
    }
    /// Bytes one position costs the whole model.
    fn bytes_per_token(&self) -> usize {
        model_bytes_per_token()
    }
}

pub fn geometry(l: usize) -> Geometry {
    Geometry {
        kv_lora_rank: WIDTHS[0],
        rope_head_dim: WIDTHS[1],
        index_head_dim: if is_dsa(l) { WIDTHS[2] } else { 0 },
        ..Geometry::default()
    }
}

/// The model's layers as plain caches, for the save / load measurement.
pub fn model_layers() -> Vec<LatentCache> {
    (0..LAYERS).map(|l| LatentCache::new(geometry(l)).unwrap()).collect()
}

pub struct OursRust {
    name: &'static str,
    layers: Vec<LatentCache>,
    /// Bytes the last per-row rollback moved (copied out and written back), every layer.
    moved: usize,
}

impl OursRust {
    pub fn new() -> Self {
        Self::with_layout("latent-cache (Rust API)", LayoutKind::RightJustified)
    }

    /// The same model with rows laid out as `layout` says, reported as `name`.
    pub fn with_layout(name: &'static str, layout: LayoutKind) -> Self {
        let layers = (0..LAYERS).map(|l| LatentCache::new(Geometry { layout, ..geometry(l) }).unwrap()).collect();
        OursRust { name, layers, moved: 0 }
    }
}

impl System for OursRust {
    fn name(&self) -> &'static str {
        self.name
    }

    fn forward(&mut self, inputs: &Inputs, step: Step) {
        let mut outputs = Vec::with_capacity(LAYERS * 4);
        for (l, cache) in self.layers.iter_mut().enumerate() {
            if step.reads_index_keys() && is_dsa(l) {
                outputs.push(cache.stored_index_keys().unwrap());
            }
            let keys = is_dsa(l).then_some(&inputs.arrays[2]);
            let state = cache.append_latent(&inputs.arrays[0], &inputs.arrays[1], keys).unwrap();
            outputs.push(state.latent);
            outputs.push(state.rope);
            if step.keeps_index_keys_view() {
                outputs.extend(state.index_keys);
            }
        }
        eval(outputs.iter()).unwrap();
    }

    fn spec_begin(&mut self) {
        self.layers.iter_mut().for_each(|c| c.spec_round_begin().unwrap());
    }

    fn spec_rollback(&mut self, keep: usize) {
        self.layers.iter_mut().for_each(|c| c.spec_round_rollback_all(keep).unwrap());
    }

    fn spec_rollback_rows(&mut self, keep: &[usize]) -> bool {
        self.moved = self.layers.iter().map(|c| moved_positions(c, keep) * c.bytes_per_token() * 2).sum();
        self.layers.iter_mut().for_each(|c| c.spec_round_rollback(keep).unwrap());
        true
    }

    fn reserve(&mut self, tokens: usize) {
        self.layers.iter_mut().for_each(|c| c.reserve(tokens).unwrap());
    }

    fn bytes_moved(&self) -> Option<usize> {
        Some(self.moved)
    }
}

/// Positions a rollback keeping `keep[b]` of the 4 positions each row appended in the round
/// moves: none in the ragged layout; in the right-justified one, every kept position of each row
/// whose end shifts (the documented layout arithmetic: rows stay right-justified to the longest).
fn moved_positions(cache: &LatentCache, keep: &[usize]) -> usize {
    if cache.geometry().layout == LayoutKind::Ragged {
        return 0;
    }
    let drops: Vec<usize> = keep.iter().map(|k| 4 - k).collect();
    let lengths: Vec<usize> = cache.row_offsets().iter().zip(&drops).map(|(len, d)| len - d).collect();
    let (offset, new_offset) = (cache.offset(), lengths.iter().copied().max().unwrap_or(0));
    lengths.iter().zip(&drops).filter(|(_, &d)| offset - d != new_offset).map(|(len, _)| len).sum()
}

pub struct OursC {
    name: &'static str,
    layers: Vec<*mut Handle>,
    /// The set that owns `layers` when they are a set's lent layers (rounds are then set-wide).
    set: Option<*mut latent_cache_set>,
}

fn ok(status: latent_cache_status) {
    assert_eq!(status, latent_cache_status::Ok);
}

impl OursC {
    pub fn new() -> Self {
        let layers = (0..LAYERS)
            .map(|l| {
                let mut cfg: latent_cache_config = latent_cache_config_default();
                cfg.index_head_dim = if is_dsa(l) { WIDTHS[2] } else { 0 };
                let mut handle = std::ptr::null_mut();
                ok(unsafe { latent_cache_new(&cfg, &mut handle) });
                handle
            })
            .collect();
        OursC { name: "latent-cache (C ABI)", layers, set: None }
    }

    /// The same model as one `latent_cache_set`: forwards go through its lent layer handles,
    /// rounds through the set-wide calls.
    pub fn from_set() -> Self {
        let configs: Vec<latent_cache_config> = (0..LAYERS)
            .map(|l| {
                let mut cfg = latent_cache_config_default();
                cfg.index_head_dim = if is_dsa(l) { WIDTHS[2] } else { 0 };
                cfg
            })
            .collect();
        let mut set = std::ptr::null_mut();
        ok(unsafe { latent_cache_set_new(configs.as_ptr(), configs.len(), &mut set) });
        let layers = (0..LAYERS)
            .map(|l| {
                let mut handle = std::ptr::null_mut();
                ok(unsafe { latent_cache_set_layer(set, l, &mut handle) });
                handle
            })
            .collect();
        OursC { name: "latent-cache (C ABI, one set)", layers, set: Some(set) }
    }
}

impl Drop for OursC {
    fn drop(&mut self) {
        match self.set {
            Some(set) => unsafe { latent_cache_set_free(set) },
            None => self.layers.iter().for_each(|&h| unsafe { latent_cache_free(h) }),
        }
    }
}

impl System for OursC {
    fn name(&self) -> &'static str {
        self.name
    }

    fn forward(&mut self, inputs: &Inputs, step: Step) {
        let none = mlx_array { ctx: std::ptr::null_mut() };
        let mut outputs: Vec<mlx_array> = Vec::with_capacity(LAYERS * 4);
        for (l, &handle) in self.layers.iter().enumerate() {
            unsafe {
                if step.reads_index_keys() && is_dsa(l) {
                    let mut keys = none;
                    ok(latent_cache_stored_index_keys(handle, &mut keys));
                    outputs.push(keys);
                }
                let keys = if is_dsa(l) { inputs.arrays[2].as_ptr() } else { none };
                let mut views = [none; 3];
                let [a, b, c] = &mut views;
                // A NULL output skips the index keys view.
                let c: *mut mlx_array = if step.keeps_index_keys_view() { c } else { std::ptr::null_mut() };
                ok(latent_cache_append_latent(handle, inputs.arrays[0].as_ptr(), inputs.arrays[1].as_ptr(), keys, a, b, c));
                outputs.extend(views.into_iter().filter(|v| !v.ctx.is_null()));
            }
        }
        unsafe {
            ok(latent_cache_eval(outputs.as_ptr(), outputs.len()));
            outputs.into_iter().for_each(|a| latent_cache_array_free(a));
        }
    }

    fn spec_begin(&mut self) {
        match self.set {
            Some(set) => ok(unsafe { latent_cache_set_spec_round_begin(set) }),
            None => self.layers.iter().for_each(|&h| ok(unsafe { latent_cache_spec_round_begin(h) })),
        }
    }

    fn spec_rollback(&mut self, keep: usize) {
        match self.set {
            Some(set) => ok(unsafe { latent_cache_set_spec_round_rollback(set, keep) }),
            None => self.layers.iter().for_each(|&h| ok(unsafe { latent_cache_spec_round_rollback(h, keep) })),
        }
    }

    fn spec_rollback_rows(&mut self, keep: &[usize]) -> bool {
        match self.set {
            Some(set) => ok(unsafe { latent_cache_set_spec_round_rollback_rows(set, keep.as_ptr(), keep.len()) }),
            None => self
                .layers
                .iter()
                .for_each(|&h| ok(unsafe { latent_cache_spec_round_rollback_rows(h, keep.as_ptr(), keep.len()) })),
        }
        true
    }

    fn reserve(&mut self, tokens: usize) {
        match self.set {
            Some(set) => ok(unsafe { latent_cache_set_reserve(set, tokens) }),
            None => self.layers.iter().for_each(|&h| ok(unsafe { latent_cache_reserve(h, tokens) })),
        }
    }
}

/// The seed's reference strategy: every append concatenates the stored array with the new
/// positions (a new O(T) array per family and layer), every trim copies the kept prefix.
pub struct Concat {
    layers: Vec<[Option<Array>; 3]>,
    round_start: usize,
    offset: usize,
}

impl Concat {
    pub fn new() -> Self {
        Concat { layers: (0..LAYERS).map(|_| [None, None, None]).collect(), round_start: 0, offset: 0 }
    }

    fn families(l: usize) -> usize {
        if is_dsa(l) {
            3
        } else {
            2
        }
    }
}

impl System for Concat {
    fn name(&self) -> &'static str {
        "seed strategy (concatenate)"
    }

    #[allow(clippy::needless_range_loop)] // layers hold one slot per family, indexed alike
    fn forward(&mut self, inputs: &Inputs, step: Step) {
        let mut outputs = Vec::new();
        for (l, layer) in self.layers.iter_mut().enumerate() {
            if step.reads_index_keys() && is_dsa(l) {
                if let Some(keys) = &layer[2] {
                    outputs.push(keys.clone());
                }
            }
            for f in 0..Concat::families(l) {
                let next = match &layer[f] {
                    Some(stored) => mlx_rs::ops::concatenate(&[stored, &inputs.arrays[f]], 1).unwrap(),
                    None => inputs.arrays[f].clone(),
                };
                outputs.push(next.clone());
                layer[f] = Some(next);
            }
        }
        self.offset += inputs.arrays[0].shape()[1] as usize;
        // The seed's strategy is MLX's ops on the caller's own stream: evaluated there, as an
        // engine running it would (the library's evaluation thread cannot evaluate that stream).
        mlx_rs::transforms::eval(outputs.iter()).unwrap();
    }

    fn spec_begin(&mut self) {
        self.round_start = self.offset;
    }

    #[allow(clippy::needless_range_loop)] // layers hold one slot per family, indexed alike
    fn spec_rollback(&mut self, keep: usize) {
        let new_offset = self.round_start + keep;
        let mut outputs = Vec::new();
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for f in 0..Concat::families(l) {
                let stored = layer[f].as_ref().unwrap();
                let shape = stored.shape();
                let kept = ops::slice(stored, &[0, 0, 0], &[shape[0] as usize, new_offset, shape[2] as usize]).unwrap();
                // The seed copies on trim: materialize the prefix as a new array.
                let copy = mlx_rs::ops::add(&kept, Array::from_f32(0.0)).unwrap();
                outputs.push(copy.clone());
                layer[f] = Some(copy);
            }
        }
        self.offset = new_offset;
        mlx_rs::transforms::eval(outputs.iter()).unwrap();
    }
}

/// A labelled variant: the C ABI with the library's evaluations on the calling thread
/// (`latent_cache_set_evaluation_thread(false)`) instead of its evaluation thread, switched on
/// around each of its own calls only, so the systems beside it run with the default.
pub struct CallerThreadEval(pub OursC);

impl CallerThreadEval {
    fn on_caller<T>(f: impl FnOnce() -> T) -> T {
        latent_cache::ffi::eval_lock::latent_cache_set_evaluation_thread(false);
        let out = f();
        latent_cache::ffi::eval_lock::latent_cache_set_evaluation_thread(true);
        out
    }
}

impl System for CallerThreadEval {
    fn name(&self) -> &'static str {
        "latent-cache (C ABI, evaluating on the calling thread)"
    }

    fn forward(&mut self, inputs: &Inputs, step: Step) {
        Self::on_caller(|| self.0.forward(inputs, step))
    }

    fn spec_begin(&mut self) {
        Self::on_caller(|| self.0.spec_begin())
    }

    fn spec_rollback(&mut self, keep: usize) {
        Self::on_caller(|| self.0.spec_rollback(keep))
    }

    fn spec_rollback_rows(&mut self, keep: &[usize]) -> bool {
        Self::on_caller(|| self.0.spec_rollback_rows(keep))
    }

    fn reserve(&mut self, tokens: usize) {
        Self::on_caller(|| self.0.reserve(tokens))
    }

    fn bytes_moved(&self) -> Option<usize> {
        self.0.bytes_moved()
    }
}
