//! Files exchanged with mlx-lm 0.32.2 itself: the library saves a GLM-5-shaped state that mlx-lm's
//! `load_prompt_cache` reads (every value checked on its side), and loads the prompt cache
//! mlx-lm's `save_prompt_cache` writes (every value checked here). Needs Python with mlx and
//! mlx-lm: `make test` installs them and runs this with `--ignored`, pointing
//! `LATENT_CACHE_MLX_LM_PYTHONPATH` at them.

use latent_cache::core::persist;
use latent_cache::{Family, Geometry, LatentCache};

/// The values both sides write and expect (tests/interop/mlx_lm_exchange.py `value`).
fn value(layer: usize, row: usize, pos: usize, family: usize, width: usize) -> Vec<f32> {
    let base = (layer * 131 + row * 17 + pos * 7 + family * 3) % 997;
    (0..width).map(|c| ((c + base) % 1000) as f32 * 0.125).collect()
}

fn block(layer: usize, family: usize, batch: usize, tokens: usize, width: usize) -> Vec<f32> {
    (0..batch).flat_map(|r| (0..tokens).flat_map(move |p| value(layer, r, p, family, width))).collect()
}

#[test]
#[ignore = "needs mlx-lm: run by `make test` (test-interop) with LATENT_CACHE_MLX_LM_PYTHONPATH"]
fn files_cross_between_this_library_and_mlx_lm() {
    let pythonpath = std::env::var("LATENT_CACHE_MLX_LM_PYTHONPATH").expect("LATENT_CACHE_MLX_LM_PYTHONPATH");
    let dir = std::env::temp_dir().join(format!("latent-cache-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ours, theirs) = (dir.join("ours.safetensors"), dir.join("mlx-lm.safetensors"));
    // Two GLM-5 layers: one with index keys, one without.
    let layers: Vec<LatentCache> = (0..2)
        .map(|l| {
            let index = if l == 0 { 128 } else { 0 };
            let mut c =
                LatentCache::new(Geometry { kv_lora_rank: 512, rope_head_dim: 64, index_head_dim: index, ..Geometry::default() })
                    .unwrap();
            let keys = block(l, 2, 2, 5, 128);
            c.append_host(2, 5, &block(l, 0, 2, 5, 512), &block(l, 1, 2, 5, 64), (index > 0).then_some(keys.as_slice())).unwrap();
            c
        })
        .collect();
    persist::save(&layers.iter().collect::<Vec<_>>(), &ours).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mlx_lm_exchange.py");
    let status = std::process::Command::new("python3")
        .arg(script)
        .arg(&ours)
        .arg(&theirs)
        .env("PYTHONPATH", pythonpath)
        .status()
        .expect("python3");
    assert!(status.success(), "mlx-lm's side failed");
    let loaded = persist::load(&theirs).unwrap();
    assert_eq!(loaded.len(), 2);
    for (l, cache) in loaded.iter().enumerate() {
        assert_eq!(cache.signature(), "kv:mla:target:dsa", "mlx-lm gives every GLM-5 layer index keys");
        assert_eq!(cache.row_offsets(), vec![4, 4, 4]);
        for row in 0..3 {
            for (f, family, width) in [(0, Family::Latent, 512), (1, Family::Rope, 64), (2, Family::IndexKeys, 128)] {
                let want: Vec<f32> = (0..4).flat_map(|p| value(l, row, p, f, width)).collect();
                assert_eq!(cache.read_row(family, row).unwrap(), want, "layer {l} row {row} {}", family.name());
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The values both sides feed a prefill (tests/interop/mlx_lm_prefill.py `value`).
fn prefill_value(row: usize, pos: usize, family: usize, width: usize) -> Vec<f32> {
    let base = row * 37 + pos * 11 + family * 5;
    (0..width).map(|c| ((c + base) % 251) as f32 * 0.25).collect()
}

fn list(part: &str) -> Vec<usize> {
    part.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect()
}

/// This library running a scenario (`lengths;left;right;chunks;decode`) as the script does.
fn prefill_ours(scenario: &str, layout: latent_cache::LayoutKind) -> LatentCache {
    let parts: Vec<Vec<usize>> = scenario.split(';').map(list).collect();
    let (lengths, left, right, chunks, decode) = (&parts[0], &parts[1], &parts[2], &parts[3], &parts[4]);
    let batch = lengths.len();
    let mut cache = LatentCache::new(Geometry { kv_lora_rank: 8, rope_head_dim: 4, layout, ..Geometry::default() }).unwrap();
    fn opt(v: &[usize]) -> Option<&[usize]> {
        (!v.is_empty()).then_some(v)
    }
    cache.prefill_prepare(Some(lengths), opt(left), opt(right)).unwrap();
    let mut pos = 0;
    for (i, &tokens) in chunks.iter().chain(decode).enumerate() {
        if i == chunks.len() {
            cache.prefill_finalize().unwrap();
        }
        let data = |f: usize, w: usize| -> Vec<f32> {
            (0..batch).flat_map(|r| (0..tokens).flat_map(move |p| prefill_value(r, pos + p, f, w))).collect()
        };
        cache.append_host(batch, tokens, &data(0, 8), &data(1, 4), None).unwrap();
        pos += tokens;
    }
    cache.prefill_finalize().unwrap();
    cache
}

#[test]
#[ignore = "needs mlx-lm: run by `make test` (test-interop) with LATENT_CACHE_MLX_LM_PYTHONPATH"]
fn padded_prefills_keep_the_rows_mlx_lm_keeps() {
    let pythonpath = std::env::var("LATENT_CACHE_MLX_LM_PYTHONPATH").expect("LATENT_CACHE_MLX_LM_PYTHONPATH");
    // lengths; left padding; right padding; prefill chunks; decode steps after finalize.
    let scenarios = ["5,2,7;;2,5,0;4,3;1", "3,6,1;3,0,5;;6;2", "4,1,3;1,2,0;2,4,4;3,4;1,1", "2,9;;7,0;9;"];
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mlx_lm_prefill.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(scenarios)
        .env("PYTHONPATH", pythonpath)
        .output()
        .expect("python3");
    assert!(out.status.success(), "mlx-lm's side failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = 0;
    for layout in [latent_cache::LayoutKind::RightJustified, latent_cache::LayoutKind::Ragged] {
        let ours: Vec<LatentCache> = scenarios.iter().map(|s| prefill_ours(s, layout)).collect();
        for line in text.lines() {
            let mut fields = line.split(' ');
            let mut next = || fields.next().unwrap().parse::<usize>().unwrap();
            let (s, row, family) = (next(), next(), next());
            let theirs: Vec<f32> = line.split(' ').skip(3).filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect();
            let family = [Family::Latent, Family::Rope][family];
            let got = ours[s].read_row(family, row).unwrap();
            assert_eq!(got, theirs, "scenario {} row {row} {} ({layout:?})", scenarios[s], family.name());
            lines += 1;
        }
        for (s, cache) in ours.iter().enumerate() {
            let rows = list(scenarios[s].split(';').next().unwrap()).len();
            assert_eq!(cache.batch_size(), rows, "scenario {}", scenarios[s]);
        }
    }
    assert_eq!(lines, 2 * 2 * (3 + 3 + 3 + 2), "every row of every scenario compared");
}
