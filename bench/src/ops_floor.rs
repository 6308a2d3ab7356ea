//! MLX's own floor for a step of so many operations (`--model-step`, beside each sparse step):
//! a plain graph of as many slice updates, each writing one position of a small buffer in place
//! (as an append does), and as many other operations, each a product of a few elements (as a
//! kernel's launch stands in the graph), with next to no device work. What it costs is about what
//! MLX charges per operation, building, encoding and launching it: the share of a step of that
//! many operations its count costs on this machine, whatever its kernels do (a kernel's launch
//! may cost MLX a little more than a product's). Timed single and pipelined as the step is.
use latent_cache::core::mlx::eval::{eval, eval_async};
use latent_cache::core::mlx::ops;
use mlx_rs::{Array, Dtype};

use crate::attention::time;
use crate::model_step::pipelined_loop;

/// Positions per buffer: the updates cycle through them (each write in place, as appends are).
const SLOTS: usize = 16;
/// Elements per position and per product.
const WIDTH: usize = 8;

/// The floor's graphs: `updates` buffers written a position a step, `others` products.
struct Floor {
    buffers: Vec<Array>,
    row: Array,
    factor: Array,
    others: usize,
    at: usize,
}

impl Floor {
    fn new(updates: usize, others: usize) -> Floor {
        let buffers: Vec<Array> = (0..updates).map(|_| ops::zeros(&[1, SLOTS, WIDTH], Dtype::Float32).unwrap()).collect();
        let row = ops::from_host(&[1.0; WIDTH], &[1, 1, WIDTH], "floor row").unwrap();
        let factor = ops::scalar(1.0);
        eval(buffers.iter().chain([&row, &factor])).unwrap();
        Floor { buffers, row, factor, others, at: 0 }
    }

    /// One step's graph: every buffer's update (the buffers replaced by their results, so the
    /// next step writes in place), and the products, each of the one before (a chain, as a
    /// step's layers are). Returns the arrays to evaluate.
    fn build(&mut self) -> Vec<Array> {
        let at = self.at % SLOTS;
        self.at += 1;
        for buffer in self.buffers.iter_mut() {
            *buffer = ops::slice_update(buffer, &self.row, &[0, at, 0], &[1, at + 1, WIDTH]).unwrap();
        }
        let mut product = self.row.clone();
        for _ in 0..self.others {
            product = ops::multiply(&product, &self.factor).unwrap();
        }
        self.buffers.iter().cloned().chain([product]).collect()
    }
}

/// Records of the floor for a step of `updates` slice updates and `others` other operations,
/// under the step's `mode` and point `at` (batch, context), as the step's records say them.
pub(crate) fn records(
    updates: usize,
    others: usize,
    mode: &str,
    at: (usize, usize),
    warmup: usize,
    samples: usize,
) -> Vec<String> {
    let mut floor = Floor::new(updates, others);
    let single = time(warmup, samples, || {
        let outs = floor.build();
        eval(outs.iter()).unwrap();
    });
    let overlapped = pipelined_loop(warmup, samples, || {
        let outs = floor.build();
        eval_async(outs.iter()).unwrap();
        outs
    });
    let ops = updates + others;
    [("single", single), ("pipelined", overlapped)]
        .into_iter()
        .map(|(timing, t)| {
            let line = format!(
                "{{\"system\": \"MLX floor, {ops} operations\", \"mode\": \"{mode}\", \"timing\": \"{timing}\", \
                 \"batch\": {}, \"context\": {}, \"ops\": {ops}, \"slice_updates\": {updates}, \"median_us\": {:.1}, \
                 \"p10_us\": {:.1}, \"p90_us\": {:.1}, \"samples\": {samples}}}",
                at.0, at.1, t[0], t[1], t[2]
            );
            eprintln!("{line}");
            line
        })
        .collect()
}
