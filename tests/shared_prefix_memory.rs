//! Memory of shared prefixes, as MLX counts it (its active memory, not the library's
//! arithmetic): one prompt forked into 8 continuations holds one prompt plus 8 tails, and a
//! request attached to a stored prefix adds its own positions only. Its own binary: MLX's
//! counters are process-wide.
use latent_cache::core::mlx::eval::eval;
use latent_cache::core::mlx::memory;
use latent_cache::core::mlx::ops;
use latent_cache::{Geometry, LatentCache};

const PROMPT: usize = 8192;
const WIDTHS: [usize; 2] = [512, 64];

fn positions(batch: usize, n: usize, seed: f32) -> [mlx_rs::Array; 2] {
    let make =
        |w: usize| ops::multiply(&ops::zeros(&[batch, n, w], mlx_rs::Dtype::Float32).unwrap(), &ops::scalar(seed)).unwrap();
    let out = [make(WIDTHS[0]), make(WIDTHS[1])];
    eval(out.iter()).unwrap();
    out
}

fn active() -> usize {
    memory::clear_cache().unwrap();
    memory::info().active
}

#[test]
fn forks_and_attached_requests_hold_their_own_positions_only() {
    let geometry = Geometry { kv_lora_rank: WIDTHS[0], rope_head_dim: WIDTHS[1], ..Geometry::default() };
    let prompt_bytes = PROMPT * geometry.bytes_per_token();
    let before = active();
    let mut cache = LatentCache::new(geometry).unwrap();
    {
        let [latent, rope] = positions(1, PROMPT, 1.0);
        cache.append(&latent, &rope, None).unwrap();
        cache.eval().unwrap();
    }
    let prompt = active() - before;
    assert!(prompt >= prompt_bytes && prompt < prompt_bytes + prompt_bytes / 8, "the prompt holds {prompt} bytes");
    // Eight continuations of 16 positions each.
    cache.fork_row(0, 8).unwrap();
    let [latent, rope] = positions(8, 16, 2.0);
    cache.append(&latent, &rope, None).unwrap();
    cache.eval().unwrap();
    drop((latent, rope));
    let tails = cache.bytes_in_use();
    let forked = active() - before;
    assert_eq!(cache.row_offsets(), vec![PROMPT + 16; 8]);
    assert!(
        forked <= prompt + tails + prompt_bytes / 16,
        "8 continuations hold {forked} bytes: more than one prompt ({prompt}) and their own buffers ({tails})"
    );
    // A new request attached to the stored prompt adds its own buffers only.
    let prefix = cache.share_prefix(3, PROMPT).unwrap();
    let mut request = LatentCache::new(geometry).unwrap();
    request.attach_prefix(&prefix, 1).unwrap();
    let [latent, rope] = positions(1, 32, 3.0);
    request.append(&latent, &rope, None).unwrap();
    request.eval().unwrap();
    drop((latent, rope));
    let attached = active() - before;
    assert!(
        attached <= forked + request.bytes_in_use() + prompt_bytes / 16,
        "the attached request holds {} bytes beyond its own {}",
        attached - forked,
        request.bytes_in_use()
    );
    // Against the copies a merge makes: each row holds the prompt again.
    let copy = cache.extract_row(0).unwrap().materialized().unwrap().unwrap();
    copy.eval().unwrap();
    assert!(active() - attached >= prompt_bytes, "a copied row holds the prompt again");
}
