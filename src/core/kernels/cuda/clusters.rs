//! Whether our kernels may run in thread block clusters here: the one-pass decode and the
//! clustered partial pass (`mla_decode_wgmma`) fix their cluster at compile time
//! (`__cluster_dims__`), since MLX's custom-kernel launch sets none.
//!
//! With its CUDA graphs on (the default), MLX caches the graphs it launches under a key of their
//! nodes' kinds and dependencies alone, every kernel node the same "K", and runs the next graph
//! with the same key by updating the cached one in place (`cudaGraphExecUpdate`). CUDA does not
//! update a kernel node correctly from a kernel with one cluster shape to a kernel with another
//! (MLX's own notes on its graph keys say so, for the clusters it can see). A kernel of ours in
//! clusters could then run with another kernel's launch in its place, or leave its own in
//! another's: an H100 ran a float16 decode's mma.sync pass right after the clustered pass in a
//! graph of the same shape and got a wrong attention (the likely cause; not yet confirmed by a
//! run without MLX's graphs). So the clustered forms run only where MLX
//! launches kernels one by one, without graphs (`MLX_USE_CUDA_GRAPHS=0`, read as MLX reads it),
//! and `LATENT_CACHE_ONE_PASS=0` turns them off there too.
use once_cell::sync::Lazy;

/// Whether the environment allows our kernels in clusters (read once, as MLX reads its own
/// setting once: set both before the process starts).
pub(crate) fn allowed() -> bool {
    *ALLOWED
}

static ALLOWED: Lazy<bool> = Lazy::new(|| {
    let var = |name| std::env::var(name).ok();
    allowed_by(var("LATENT_CACHE_ONE_PASS").as_deref(), var("MLX_USE_CUDA_GRAPHS").as_deref())
});

/// `allowed` for these settings of `LATENT_CACHE_ONE_PASS` and `MLX_USE_CUDA_GRAPHS`.
fn allowed_by(one_pass: Option<&str>, graphs: Option<&str>) -> bool {
    one_pass.map(str::trim) != Some("0") && graphs.is_some_and(|v| atoi(v) == 0)
}

/// C's `atoi`, as MLX reads its integer settings (a value that is not a number reads 0): leading
/// white space, a sign, then digits up to the first that is not one.
fn atoi(s: &str) -> i64 {
    let s = s.trim_start();
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let n =
        digits.bytes().take_while(u8::is_ascii_digit).fold(0i64, |n, d| n.saturating_mul(10).saturating_add(i64::from(d - b'0')));
    if negative {
        -n
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::allowed_by;

    /// Clusters need MLX's graphs off, as MLX reads `MLX_USE_CUDA_GRAPHS` (0, or anything C's
    /// `atoi` reads as 0); `LATENT_CACHE_ONE_PASS=0` (spaces aside) turns them off even then.
    #[test]
    fn clusters_need_mlx_without_graphs_and_not_the_one_pass_form_turned_off() {
        for graphs in [Some("0"), Some(" 0"), Some("false"), Some(""), Some("-0"), Some("0x1")] {
            assert!(allowed_by(None, graphs), "{graphs:?}");
            assert!(allowed_by(Some("1"), graphs), "{graphs:?}");
            assert!(allowed_by(Some(""), graphs), "{graphs:?}");
            assert!(!allowed_by(Some("0"), graphs), "{graphs:?}");
            assert!(!allowed_by(Some(" 0 "), graphs), "{graphs:?}");
        }
        for graphs in [None, Some("1"), Some(" 2"), Some("-1"), Some("10"), Some("+3abc")] {
            assert!(!allowed_by(None, graphs), "{graphs:?}");
            assert!(!allowed_by(Some("1"), graphs), "{graphs:?}");
        }
    }
}
