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
