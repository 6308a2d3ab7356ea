//! `latent-cache-bench [--quick] [--gpu] [--modes | --rounds | --persist | --segments | --store | --attention | --model-step | --prefill] [--points BxT,...] [--no-concat] [--c-first] [--no-earlier] [--out FILE]`:
//! decode steps, speculative rounds and chunked prefill for this library (Rust API, C ABI) and
//! the seed's concatenate strategy, on a GLM-5.2-shaped model, in one process. Writes one JSON
//! record per (system, scenario, batch, context) to FILE (default target/bench/rust.json).
//!
//! - `--quick`: three small points and fewer steps (`make bench-quick`).
//! - `--gpu`: sizes for a GPU with room to spare (an H200): a 128K point, the seed strategy up to
//!   64K stored positions, and the Rust API and C ABI always stepped side by side.
//! - `--points 1x16384,8x1024`: replaces the (batch x context) points.
//! - `--no-concat`: skips the seed strategy (its O(history) copies dominate a run's time).
//! - `--no-earlier`: with `--model-step` on a GPU, skips the labelled earlier-path variant.
//! - `--c-first`: steps the C ABI before the Rust API in each side-by-side pair, to show that
//!   the order does not decide their ratio.
//! - `--modes`: the storage modes instead (see `modes.rs`): decode and uniform rounds per mode
//!   side by side, memory held per position, and accuracy; batch 1 from 1K to 64K (128K with
//!   `--gpu`).
//! - `--persist`: saving and loading the model's state beside `cp` of the same file, and the
//!   decode step through one `latent_cache_set` beside 78 separate handles (see `persist.rs`).
//! - `--segments`: a small turn's segment saved after a long context, beside a whole-set save of
//!   the same state, and the chain restored beside reading its files (see `segments.rs`); 16K
//!   positions (2K with `--quick`, the first of `--points` when given), turns of 64.
//! - `--store`: the prefix store: puts, restores from RAM and from the SSD beside reading the
//!   files' bytes, attaches, and lookups and a restart's scan among 10,000 blocks (see
//!   `store.rs`); 4K positions (1K with `--quick`, the first of `--points` when given).
//! - `--prefill`: a prompt through GLM-5.2's whole schedule in chunks (appends, the indexer's
//!   causal scores and top-k, causal selected attention on every layer; see `prefill.rs`): on a
//!   GPU 32K and 128K in chunks of 2048 with top-2048 (32K with `--quick`), on the CPU 512 in
//!   chunks of 64 with top-64; `--points 1xP,...` sets the prompts. mlx-lm's peer is
//!   bench/mlx_lm_prefill.py.
//! - `--rounds`: the two row layouts instead (right-justified and ragged, Rust API), side by
//!   side: decode, uniform rounds and rounds where rows keep different counts, at batch 8 with
//!   1K and 4K positions per row (and 16K with `--gpu`: 25 GB per system).
//! - `--attention`: one layer's decode attention through the read path per storage mode, and
//!   DSA's sparse step (see `attention.rs`); mlx-lm's peer is bench/mlx_lm_attention_bench.py.
//!   `--only NAME` runs one of its parts.
//! - `--model-step`: the whole decode step as GLM-5.2 runs it, its 78 layers' appends and
//!   attention in one graph, DSA-sparse (the indexer on 21 layers, the others reusing its
//!   selection) beside dense, in bfloat16 and float32 (with `--gpu` also Q8, FP8 and composed
//!   storage; see `model_step.rs`); batch 1 at 4K and 16K (1K in bfloat16 with `--quick`, 4K
//!   with `--quick --gpu`; 16K to 128K and
//!   batch 8 at 16K with `--gpu`), or `--points`; each
//!   timed as single steps, pipelined (the next step built while the device runs this one) and
//!   its graph build alone, beside the MLX operations of its graph and MLX's own time for that
//!   many operations (`ops_floor.rs`; `--only ops`: the counts alone;
//!   `--only NAME`: the storage modes whose name contains NAME).
//!   mlx-lm's peer is bench/mlx_lm_model_step.py.
//! - `--shared-prefix`: one prompt forked into 8 continuations beside copies of it (the fork,
//!   memory held, dense and DSA decode attention), and today's join and leave of a running batch
//!   (see `shared_prefix.rs`); 4K and 16K positions (4K with `--quick`; to 64K with `--gpu`).
//!   `--only fork` or `--only join` runs one of the two (`--only churn`: requests churning through
//!   a running batch first-in-first-out, last-in-first-out and from anywhere, alone; with `--gpu`
//!   also attention over the churned rows beside one run).
//! - `--help`: this usage. An unknown flag is refused with it (exit status 2) before anything runs.
mod attention;
mod model_step;
mod modes;
mod ops_floor;
mod persist;
mod prefill;
mod segments;
mod store;
mod shared_prefix;
mod systems;

use std::time::Instant;

use latent_cache::LayoutKind;
use systems::{CallerThreadEval, Concat, Inputs, OursC, OursRust, Step, System};

/// The row layouts as `--rounds` names them.
const RIGHT_JUSTIFIED: &str = "latent-cache right-justified";
const RAGGED: &str = "latent-cache ragged";

/// Positions a single fill append writes (bounded so fill inputs stay small).
const FILL_CHUNK: usize = 4096;
/// The seed strategy holds two copies of everything during an append; beyond this many stored
/// positions (batch x context) it would not fit a 24 GiB machine next to the process itself.
const CONCAT_LIMIT: usize = 16 * 1024;

struct Config {
    quick: bool,
    out: String,
    /// (batch, context) points for the decode and speculative scenarios.
    points: Vec<(usize, usize)>,
    steps: usize,
    prefill_to: usize,
    concat_limit: usize,
    /// Largest batch x context at which the Rust API and the C ABI are held in memory together
    /// and stepped alternately.
    side_by_side_limit: usize,
    modes: bool,
    rounds: bool,
}

fn config() -> Config {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out =
        args.iter().position(|a| a == "--out").map(|i| args[i + 1].clone()).unwrap_or_else(|| "target/bench/rust.json".into());
    let gpu = args.iter().any(|a| a == "--gpu");
    let modes = args.iter().any(|a| a == "--modes");
    let rounds = args.iter().any(|a| a == "--rounds");
    let mut points: Vec<(usize, usize)> = if quick {
        vec![(1, 1024), (1, 4096), (8, 1024)]
    } else if rounds && gpu {
        vec![(8, 1024), (8, 4096), (8, 16384)]
    } else if rounds {
        vec![(8, 1024), (8, 4096)]
    } else if modes && gpu {
        vec![(1, 1024), (1, 4096), (1, 32768), (1, 65536), (1, 131072)]
    } else if modes {
        vec![(1, 1024), (1, 4096), (1, 32768), (1, 65536)]
    } else if gpu {
        vec![(1, 1024), (1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 1024), (8, 4096), (8, 8192)]
    } else {
        vec![(1, 1024), (1, 4096), (1, 16384), (1, 65536), (8, 1024), (8, 4096), (8, 8192)]
    };
    // `--points 1x16384,8x1024` replaces the (batch x context) points.
    if let Some(i) = args.iter().position(|a| a == "--points") {
        points = args[i + 1]
            .split(',')
            .map(|p| {
                let (b, c) = p.split_once('x').expect("--points wants BATCHxCONTEXT,...");
                (b.parse().unwrap(), c.parse().unwrap())
            })
            .collect();
    }
    let concat_limit = match args.iter().any(|a| a == "--no-concat") {
        true => 0,
        false if gpu => 4 * CONCAT_LIMIT,
        false => CONCAT_LIMIT,
    };
    // A GPU has room for both of our systems at every point; 24 GiB of host memory does not.
    // The five storage modes at 32K positions hold 14 GB together: still side by side here.
    let side_by_side_limit = match (gpu, modes || rounds) {
        (true, _) => usize::MAX,
        (false, true) => 2 * CONCAT_LIMIT,
        (false, false) => CONCAT_LIMIT,
    };
    let steps = if quick { 20 } else { 60 };
    let concat_limit = if modes || rounds { 0 } else { concat_limit };
    let prefill_to = if quick { 4096 } else { 32768 };
    Config { quick, out, points, steps, prefill_to, concat_limit, side_by_side_limit, modes, rounds }
}

struct Stats {
    median: f64,
    p10: f64,
    p90: f64,
}

fn stats(us: Vec<f64>) -> Stats {
    let [median, p10, p90] = attention::summary(us);
    Stats { median, p10, p90 }
}

/// Where a record was measured: alone, or stepped alternately with the other systems of its group.
#[derive(Clone, Copy)]
struct Point {
    batch: usize,
    context: usize,
    side_by_side: bool,
}

fn record(out: &mut Vec<String>, system: &dyn System, scenario: &str, at: Point, s: &Stats, samples: usize, held: Option<f64>) {
    let (bytes_per_token, system) = (system.bytes_per_token(), system.name());
    let held = held.map_or("null".to_string(), |h| format!("{h:.1}"));
    let Point { batch, context, side_by_side } = at;
    let line = format!(
        "{{\"system\": \"{system}\", \"scenario\": \"{scenario}\", \"batch\": {batch}, \"context\": {context}, \
         \"median_us\": {:.1}, \"p10_us\": {:.1}, \"p90_us\": {:.1}, \"samples\": {samples}, \
         \"bytes_per_token\": {}, \"bytes_held_per_token\": {held}, \"side_by_side\": {side_by_side}}}",
        s.median, s.p10, s.p90, bytes_per_token
    );
    eprintln!("{line}");
    out.push(line);
}

fn active_memory() -> f64 {
    mlx_rs::memory::active_memory().unwrap() as f64
}

/// Fills every layer of `system` to `context` positions per row, in at least two appends: one
/// input array serves every layer, and a system that stores its first input as is (the seed
/// strategy; mlx-lm when the first chunk fills its whole allocation) would otherwise share one
/// buffer across the layers and under-report its memory.
fn fill(system: &mut dyn System, batch: usize, context: usize) {
    let chunk = FILL_CHUNK.min(context.div_ceil(2)).max(1);
    let mut done = 0;
    while done < context {
        let n = chunk.min(context - done);
        let inputs = Inputs::new(batch, n, done as f32);
        system.forward(&inputs, Step::Fill);
        done += n;
    }
}

/// Waits for the machine to settle: right after gigabytes are freed (the previous system) or
/// written (the fill), the kernel is still reclaiming pages on the other core, which showed up as
/// a 1.5-3x slower first system in an otherwise identical pair.
fn settle() {
    std::thread::sleep(std::time::Duration::from_secs(3));
}

fn timed(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64() * 1e6
}

/// Decode and speculative rounds at one (batch, context) point for a group of systems that are
/// filled side by side and then stepped in turn, so a noisy moment on a shared machine lands on
/// every system's samples alike instead of on one system's whole run.
fn measure(out: &mut Vec<String>, systems: &mut [Box<dyn System>], cfg: &Config, batch: usize, context: usize) {
    let warmup = 3;
    let at = Point { batch, context, side_by_side: systems.len() > 1 };
    let mut held = Vec::new();
    for system in systems.iter_mut() {
        let base = active_memory();
        // Memory is measured for a cache reserved to its context plus one growth chunk (256
        // positions); then, untimed, room for the ~320 positions the measured steps append.
        system.reserve(context + 256);
        fill(system.as_mut(), batch, context);
        held.push((active_memory() - base) / (batch * context) as f64);
        system.reserve(context + 512);
    }
    settle();
    let one = Inputs::new(batch, 1, 0.5);
    let four = Inputs::new(batch, 4, 0.75);
    for (scenario, step) in [("decode", Step::Decode), ("decode_all_views", Step::DecodeAllViews), ("spec_round", Step::Decode)] {
        // Keeping every view copies the index keys each step: shown up to a bounded size only
        // (and not for the storage modes, whose step takes the stored parts).
        if step == Step::DecodeAllViews && (batch * context > CONCAT_LIMIT || cfg.modes || cfg.rounds) {
            continue;
        }
        let mut samples = vec![Vec::new(); systems.len()];
        for i in 0..cfg.steps + warmup {
            for (system, samples) in systems.iter_mut().zip(samples.iter_mut()) {
                let us = match scenario {
                    "spec_round" => timed(|| {
                        system.spec_begin();
                        system.forward(&four, step);
                        system.spec_rollback(2);
                    }),
                    _ => timed(|| system.forward(&one, step)),
                };
                if i >= warmup {
                    samples.push(us);
                }
            }
        }
        for (k, (system, samples)) in systems.iter().zip(samples).enumerate() {
            let held = (scenario == "decode").then_some(held[k]);
            record(out, system.as_ref(), scenario, at, &stats(samples), cfg.steps, held);
        }
    }
    // Each uneven right-justified round rebuilds every layer's buffers: bounded like the
    // all-views scenario, except when the layouts are compared.
    if batch > 1 && (batch * context <= CONCAT_LIMIT || cfg.rounds) {
        spec_uneven(out, systems, cfg, at, &four);
    }
}

/// A batched speculative round where rows accept different counts (append 4, row b keeps
/// b % 3 + 1): the right-justified layout moves the rows that dropped more, so this step costs
/// O(stored positions) where the uniform round is a trim; the ragged layout moves row ends.
/// Systems are stepped in turn; those without per-row rollback skip.
fn spec_uneven(out: &mut Vec<String>, systems: &mut [Box<dyn System>], cfg: &Config, at: Point, four: &Inputs) {
    let keep: Vec<usize> = (0..at.batch).map(|b| b % 3 + 1).collect();
    // A right-justified round takes about a second at 8 x 1K on one CPU core here: `--quick` takes
    // five (at 20, its three systems took a third of the default run with `--quick`).
    let steps = cfg.steps.min(if cfg.quick { 5 } else { 20 });
    let mut samples: Vec<Option<Vec<f64>>> = vec![Some(Vec::new()); systems.len()];
    for i in 0..steps + 2 {
        for (system, slot) in systems.iter_mut().zip(samples.iter_mut()) {
            if slot.is_none() {
                continue;
            }
            system.spec_begin();
            let mut per_row = true;
            let us = timed(|| {
                system.forward(four, Step::Decode);
                per_row = system.spec_rollback_rows(&keep);
            });
            match (per_row, slot.as_mut()) {
                (false, _) => {
                    system.spec_rollback(1);
                    *slot = None;
                }
                (true, Some(samples)) if i >= 2 => samples.push(us),
                _ => {}
            }
        }
    }
    let moved: Vec<Option<usize>> = systems.iter().map(|s| s.bytes_moved()).collect();
    for (k, (system, samples)) in systems.iter().zip(samples).enumerate() {
        if let Some(samples) = samples {
            record(out, system.as_ref(), "spec_round_uneven", at, &stats(samples), steps, None);
            if let Some(bytes) = moved[k] {
                // The bytes the last measured round moved, as one more field of that record.
                let line = out.pop().unwrap();
                let line = format!("{}, \"bytes_moved_per_round\": {bytes}}}", &line[..line.len() - 1]);
                out.push(line);
            }
        }
    }
}

/// Append-only cost per position during a chunked prefill (chunks of 512), batch 1, no
/// reservation: the growth copies are part of the cost.
fn prefill(out: &mut Vec<String>, system: &mut dyn System, cfg: &Config) {
    const CHUNK: usize = 512;
    let inputs = Inputs::new(1, CHUNK, 0.25);
    let checkpoints = [1024, 4096, 16384, 32768];
    let mut window = Vec::new();
    let mut done = 0;
    while done < cfg.prefill_to {
        window.push(timed(|| system.forward(&inputs, Step::Fill)) / CHUNK as f64);
        done += CHUNK;
        if checkpoints.contains(&done) {
            let n = window.len();
            let at = Point { batch: 1, context: done, side_by_side: false };
            record(out, system, "prefill_per_position", at, &stats(std::mem::take(&mut window)), n, None);
        }
    }
}

type Make = Box<dyn Fn() -> Box<dyn System>>;

/// A system under test: how to make it, and whether it runs alone (the seed strategy, whose
/// O(history) copies would slow whatever shares the machine with it) rather than side by side.
struct Maker {
    make: Make,
    runs_alone: bool,
}

/// Flags the driver takes, and whether each is followed by a value.
const FLAGS: [(&str, bool); 17] = [
    ("--quick", false),
    ("--gpu", false),
    ("--modes", false),
    ("--rounds", false),
    ("--persist", false),
    ("--segments", false),
    ("--store", false),
    ("--prefill", false),
    ("--attention", false),
    ("--model-step", false),
    ("--shared-prefix", false),
    ("--no-concat", false),
    ("--c-first", false),
    ("--no-earlier", false),
    ("--points", true),
    ("--out", true),
    ("--only", true),
];

const USAGE: &str =
    "usage: latent-cache-bench [--quick] [--gpu] [--modes | --rounds | --persist | --segments | --store | --attention [--only NAME]
                          | --model-step | --shared-prefix]
                          [--points BxT,...] [--no-concat] [--c-first] [--no-earlier] [--out FILE]
(see the top of bench/src/main.rs for what each flag does)";

/// Refuses what the driver does not know before anything runs: an unknown flag, a flag without
/// its value, or `--points` that are not `BATCHxCONTEXT,...`. `--help` prints the usage.
/// `Ok(true)` when the usage was asked for.
fn check_args(args: &[String]) -> Result<bool, String> {
    let mut i = 1;
    while i < args.len() {
        let arg = args[i].as_str();
        if arg == "--help" || arg == "-h" {
            return Ok(true);
        }
        let Some(&(_, takes_value)) = FLAGS.iter().find(|(flag, _)| *flag == arg) else {
            return Err(format!("unknown argument {arg:?}"));
        };
        if takes_value {
            let Some(value) = args.get(i + 1).filter(|v| !v.starts_with("--")) else {
                return Err(format!("{arg} needs a value"));
            };
            let point =
                |p: &str| p.split_once('x').is_some_and(|(b, c)| b.parse::<usize>().is_ok() && c.parse::<usize>().is_ok());
            if arg == "--points" && !value.split(',').all(point) {
                return Err(format!("--points wants BATCHxCONTEXT,..., got {value:?}"));
            }
            i += 1;
        }
        i += 1;
    }
    Ok(false)
}

fn main() {
    match check_args(&std::env::args().collect::<Vec<_>>()) {
        Ok(false) => {}
        Ok(true) => {
            println!("{USAGE}");
            return;
        }
        Err(why) => {
            eprintln!("latent-cache-bench: {why}\n{USAGE}");
            std::process::exit(2);
        }
    }
    let cfg = config();
    let mut out = Vec::new();
    if std::env::args().any(|a| a == "--attention") {
        let args: Vec<String> = std::env::args().collect();
        let only = args.iter().position(|a| a == "--only").map(|i| args[i + 1].clone());
        let points = args.iter().any(|a| a == "--points").then_some(cfg.points.as_slice());
        let out = attention::run(cfg.quick, args.iter().any(|a| a == "--gpu"), points, only.as_deref());
        std::fs::create_dir_all(std::path::Path::new(&cfg.out).parent().unwrap()).unwrap();
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    if std::env::args().any(|a| a == "--model-step") {
        let given = std::env::args().any(|a| a == "--points").then_some(cfg.points.clone());
        let gpu = std::env::args().any(|a| a == "--gpu");
        // `--quick` on the CPU: one small point in bfloat16 (a 78-layer step at 4K takes 5-16 s on
        // one core; `make bench-quick` is meant to take minutes).
        let points = given.unwrap_or_else(|| match (cfg.quick, gpu) {
            (true, false) => vec![(1, 1024)],
            (true, true) => vec![(1, 4096)],
            (false, true) => vec![(1, 16384), (1, 65536), (1, 131072), (8, 16384)],
            (false, false) => vec![(1, 4096), (1, 16384)],
        });
        // `--only ops`: the operation counts alone, no timing; `--only NAME`: the mode sets whose
        // name contains it.
        let only = std::env::args().collect::<Vec<_>>().windows(2).find(|w| w[0] == "--only").map(|w| w[1].clone());
        let ops_only = only.as_deref() == Some("ops");
        let chosen = |s: &&modes::ModeSet| ops_only || only.as_deref().is_none_or(|o| s.name.contains(o));
        // bf16 and f32 everywhere; the 8-bit modes and composed storage where our kernels read
        // them (on a GPU; on the CPU they run MLX's ops over decoded copies, minutes a step).
        let sets: Vec<&modes::ModeSet> = match gpu {
            true => modes::MODE_SETS.iter().filter(|s| s.storage[0] != latent_cache::StorageMode::Q4).collect(),
            false if cfg.quick => modes::MODE_SETS[1..2].iter().collect(),
            false => modes::MODE_SETS[..2].iter().collect(),
        };
        let earlier = !std::env::args().any(|a| a == "--no-earlier");
        for set in sets.into_iter().filter(chosen) {
            out.extend(model_step::run(set, &points, cfg.quick, ops_only, earlier));
        }
        if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    if std::env::args().any(|a| a == "--shared-prefix") {
        let (contexts, batches): (&[usize], &[usize]) = match (cfg.quick, std::env::args().any(|a| a == "--gpu")) {
            (true, _) => (&[4096], &[2, 16]),
            (false, false) => (&[4096, 16384], &[2, 8, 16]),
            (false, true) => (&[4096, 16384, 65536], &[2, 8, 16]),
        };
        let only = std::env::args().collect::<Vec<_>>().windows(2).find(|w| w[0] == "--only").map(|w| w[1].clone());
        let gpu = std::env::args().any(|a| a == "--gpu");
        out.extend(shared_prefix::run(contexts, 8, batches, if cfg.quick { 5 } else { 10 }, only.as_deref(), gpu));
        if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    if std::env::args().any(|a| a == "--prefill") {
        // `--points 1xP,...` sets the prompts; a GPU runs GLM-5.2's chunk and top-k (2048).
        let given = std::env::args().any(|a| a == "--points").then_some(cfg.points.as_slice());
        let gpu = std::env::args().any(|a| a == "--gpu");
        // Three runs on a GPU (its goals are judged run by run), one on the CPU (minutes a run).
        out.extend(prefill::run(&prefill::points(gpu, cfg.quick, given), if cfg.quick || !gpu { 1 } else { 3 }));
        if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    if std::env::args().any(|a| a == "--store") {
        let given = std::env::args().any(|a| a == "--points").then(|| cfg.points[0].1);
        let context = given.unwrap_or(if cfg.quick { 1024 } else { 4096 });
        out.extend(store::run(std::path::Path::new("target/bench/store"), context, if cfg.quick { 2 } else { 5 }));
        if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    if std::env::args().any(|a| a == "--segments") {
        // `--points 1xC` sets the context (its first point's).
        let given = std::env::args().any(|a| a == "--points").then(|| cfg.points[0].1);
        let context = given.unwrap_or(if cfg.quick { 2048 } else { 16384 });
        out.extend(segments::run(std::path::Path::new("target/bench/segments"), context, 64, if cfg.quick { 3 } else { 5 }));
        if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    if std::env::args().any(|a| a == "--persist") {
        let positions = if cfg.quick { 1024 } else { 4096 };
        out.extend(persist::run(std::path::Path::new("target/bench/persist"), positions, if cfg.quick { 2 } else { 5 }));
        // The same decode step through one set's lent layers and through separate handles.
        let mut systems: Vec<Box<dyn System>> = vec![Box::new(OursC::new()), Box::new(OursC::from_set())];
        measure(&mut out, &mut systems, &cfg, 1, positions);
        if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
        return;
    }
    eprintln!("bench: {} mode, MLX device {:?}", if cfg.quick { "quick" } else { "full" }, mlx_rs::Device::default());
    let mut makers: Vec<Maker> = match (cfg.modes, cfg.rounds) {
        (true, _) => (0..modes::MODE_SETS.len())
            .map(|i| Maker { make: Box::new(move || Box::new(modes::OursMode::new(&modes::MODE_SETS[i]))), runs_alone: false })
            .chain(std::iter::once(Maker { make: Box::new(|| Box::new(modes::OursMode::bf16_inputs())), runs_alone: false }))
            .chain(
                latent_cache::core::kernels::cuda::fp8_encode::applies(1)
                    .then(|| Maker { make: Box::new(|| Box::new(modes::OursMode::fp8_ops())), runs_alone: false }),
            )
            .collect(),
        (false, true) => vec![
            Maker {
                make: Box::new(|| Box::new(OursRust::with_layout(RIGHT_JUSTIFIED, LayoutKind::RightJustified))),
                runs_alone: false,
            },
            Maker { make: Box::new(|| Box::new(OursRust::with_layout(RAGGED, LayoutKind::Ragged))), runs_alone: false },
        ],
        (false, false) => vec![
            Maker { make: Box::new(|| Box::new(OursRust::new())), runs_alone: false },
            Maker { make: Box::new(|| Box::new(OursC::new())), runs_alone: false },
            Maker { make: Box::new(|| Box::new(CallerThreadEval(OursC::new()))), runs_alone: false },
            Maker { make: Box::new(|| Box::new(Concat::new())), runs_alone: true },
        ],
    };
    if std::env::args().any(|a| a == "--c-first") {
        makers.swap(0, 1);
    }
    for &(batch, context) in &cfg.points {
        // The Rust API and the C ABI run side by side while both fit in memory, one at a time
        // beyond that. The seed strategy always runs alone: its O(history) copies would slow
        // whatever shares the machine's caches with it.
        let ours: Vec<&Make> = makers.iter().filter(|m| !m.runs_alone).map(|m| &m.make).collect();
        let mut groups: Vec<Vec<&Make>> = match batch * context <= cfg.side_by_side_limit {
            true => vec![ours],
            false => ours.into_iter().map(|m| vec![m]).collect(),
        };
        if batch * context <= cfg.concat_limit {
            groups.extend(makers.iter().filter(|m| m.runs_alone).map(|m| vec![&m.make]));
        }
        for group in groups {
            mlx_rs::memory::clear_cache().unwrap();
            let mut systems: Vec<Box<dyn System>> = group.iter().map(|make| make()).collect();
            measure(&mut out, &mut systems, &cfg, batch, context);
        }
    }
    if cfg.modes {
        out.extend(modes::accuracy());
        out.extend(modes::op_counts());
    }
    for maker in &makers {
        if (maker.runs_alone && cfg.concat_limit == 0) || cfg.modes || cfg.rounds {
            continue;
        }
        mlx_rs::memory::clear_cache().unwrap();
        let mut system = (maker.make)();
        prefill(&mut out, system.as_mut(), &cfg);
    }
    if let Some(dir) = std::path::Path::new(&cfg.out).parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&cfg.out, format!("[\n{}\n]\n", out.join(",\n"))).unwrap();
}

#[cfg(test)]
mod tests {
    use super::check_args;

    fn check(line: &str) -> Result<bool, String> {
        check_args(&std::iter::once("bench").chain(line.split_whitespace()).map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn known_flags_pass_and_help_is_usage() {
        assert_eq!(check(""), Ok(false));
        assert_eq!(check("--attention --only bf16 --quick --out x.json"), Ok(false));
        assert_eq!(check("--points 1x1024,8x4096 --no-concat --c-first --gpu"), Ok(false));
        assert_eq!(check("--help"), Ok(true));
        assert_eq!(check("--quick -h"), Ok(true));
    }

    #[test]
    fn unknown_flags_and_missing_values_are_refused() {
        for line in ["--bogus", "--quick extra", "--out", "--out --quick", "--points 1x", "--points 8", "--only"] {
            assert!(check(line).is_err(), "{line:?} was accepted");
        }
    }
}
