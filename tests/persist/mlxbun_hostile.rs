//! Hostile files of the seed's cache-file format (mlx-bun's MLXBUNKV2): overflowing sizes, caches
//! that disagree, overlapping tensors, malformed headers. Each is refused with nothing created.

use latent_cache::core::persist::mlxbun;
use latent_cache::core::persist::wyhash::{tensor_hash, wyhash};
use latent_cache::ErrorKind;

const ALIGN: usize = 16384;

/// A file from a header text and the data region (placed at the first 16 KiB boundary).
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let start = (26 + header.len()).div_ceil(ALIGN) * ALIGN;
    file_at(header, start as u32, data)
}

fn file_at(header: &str, start: u32, data: &[u8]) -> Vec<u8> {
    let mut out = b"MLXBUNKV2\n".to_vec();
    out.extend((header.len() as u32).to_le_bytes());
    out.extend(start.to_le_bytes());
    out.extend(wyhash(header.as_bytes(), 0).to_le_bytes());
    out.extend(header.as_bytes());
    out.resize((start as usize).max(out.len()), 0);
    out.extend(data);
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tensor(off: usize, shape: [u64; 3], bytes: &[u8]) -> String {
    format!(
        "{{\"off\":{off},\"bytes\":{},\"shape\":[{},{},{}],\"dtype\":10,\"hash\":\"{}\"}}",
        bytes.len(),
        shape[0],
        shape[1],
        shape[2],
        tensor_hash(bytes)
    )
}

fn cache(offset: u64, rank: u64, rope: u64, max: u64, tensors: &[String]) -> String {
    format!(
        "{{\"kind\":\"mla\",\"offset\":{offset},\"kvLoraRank\":{rank},\"ropeHeadDim\":{rope},\"maxTokens\":{max},\"tensors\":[{}]}}",
        tensors.join(",")
    )
}

fn header(caches: &[String]) -> String {
    format!(
        "{{\"formatVersion\":3,\"createdAt\":0,\"codecProvider\":\"mlx-cache-v3\",\"tokens\":[],\"caches\":[{}]}}",
        caches.join(",")
    )
}

fn load(bytes: &[u8]) -> std::thread::Result<Result<usize, ErrorKind>> {
    std::panic::catch_unwind(|| mlxbun::load_from_bytes(bytes).map(|(l, _)| l.len()).map_err(|e| e.kind))
}

/// A valid one-cache file: batch 1, offset 2, rank 2, rope 1.
fn valid() -> Vec<u8> {
    let lat = f32s(&[1., 2., 3., 4.]);
    let rope = f32s(&[5., 6.]);
    let mut data = lat.clone();
    data.resize(ALIGN, 0);
    data.extend(&rope);
    file(&header(&[cache(2, 2, 1, 16, &[tensor(0, [1, 2, 2], &lat), tensor(ALIGN, [1, 2, 1], &rope)])]), &data)
}

/// An unbounded cache (maxTokens = MAX_SAFE_INTEGER) with an offset whose byte count
/// `offset * width * 4` overflows u64: must be refused as InvalidArgument without a panic.
#[test]
fn offset_times_width_overflow() {
    let offset: u64 = 1 << 62; // * 1 * 4 = 2^64: wraps to 0
    let empty: Vec<u8> = Vec::new();
    let h = header(&[cache(
        offset,
        1,
        1,
        9_007_199_254_740_991,
        &[tensor(0, [1, offset, 1], &empty), tensor(0, [1, offset, 1], &empty)],
    )]);
    let got = load(&file(&h, &[]));
    assert_eq!(got.ok(), Some(Err(ErrorKind::InvalidArgument)), "offset 2^62 unbounded (panics on overflow in a debug build)");
}

/// Caches of one file whose batches differ (a set whose layers would disagree): refused.
#[test]
fn caches_disagreeing_in_batch() {
    let one = f32s(&[1., 2., 3., 4.]);
    let r1 = f32s(&[5., 6.]);
    let two = f32s(&[1., 2., 3., 4., 5., 6., 7., 8.]);
    let r2 = f32s(&[5., 6., 7., 8.]);
    let mut data = Vec::new();
    for (k, t) in [&one, &r1, &two, &r2].into_iter().enumerate() {
        data.resize(k * ALIGN, 0);
        data.extend(t);
    }
    let h = header(&[
        cache(2, 2, 1, 16, &[tensor(0, [1, 2, 2], &one), tensor(ALIGN, [1, 2, 1], &r1)]),
        cache(2, 2, 1, 16, &[tensor(2 * ALIGN, [2, 2, 2], &two), tensor(3 * ALIGN, [2, 2, 1], &r2)]),
    ]);
    assert_eq!(load(&file(&h, &data)).unwrap(), Err(ErrorKind::InvalidArgument), "batch 1 and batch 2 layers loaded");
}

/// Caches of one file with different offsets (a set whose layers would disagree): refused.
#[test]
fn caches_disagreeing_in_offset() {
    let a = f32s(&[1., 2., 3., 4.]);
    let ra = f32s(&[5., 6.]);
    let b = f32s(&[1., 2.]);
    let rb = f32s(&[5.]);
    let mut data = Vec::new();
    for (k, t) in [&a, &ra, &b, &rb].into_iter().enumerate() {
        data.resize(k * ALIGN, 0);
        data.extend(t);
    }
    let h = header(&[
        cache(2, 2, 1, 16, &[tensor(0, [1, 2, 2], &a), tensor(ALIGN, [1, 2, 1], &ra)]),
        cache(1, 2, 1, 16, &[tensor(2 * ALIGN, [1, 1, 2], &b), tensor(3 * ALIGN, [1, 1, 1], &rb)]),
    ]);
    assert_eq!(load(&file(&h, &data)).unwrap(), Err(ErrorKind::InvalidArgument), "offsets 2 and 1 loaded");
}

/// Tensors that overlap (every cache pointing at the same bytes, which would make a load hold
/// far more than the file): refused.
#[test]
fn overlapping_tensors() {
    let lat = f32s(&[1., 2., 3., 4.]);
    let h = header(
        &(0..64).map(|_| cache(2, 2, 1, 16, &[tensor(0, [1, 2, 2], &lat), tensor(0, [1, 2, 1], &lat[..8])])).collect::<Vec<_>>(),
    );
    assert_eq!(load(&file(&h, &lat)).unwrap(), Err(ErrorKind::InvalidArgument), "64 caches over one tensor loaded");
}

/// Edge values and malformed headers: every one an InvalidArgument, no panic.
#[test]
fn malformed_headers() {
    let good = valid();
    let text = {
        let len = u32::from_le_bytes(good[10..14].try_into().unwrap()) as usize;
        String::from_utf8(good[26..26 + len].to_vec()).unwrap()
    };
    let data = good[ALIGN..].to_vec();
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let edit = |from: &str, to: &str| file(&text.replacen(from, to, 1), &data);
    for (from, to) in [
        ("\"offset\":2", "\"offset\":-2"),
        ("\"offset\":2", "\"offset\":2.0"),
        ("\"offset\":2", "\"offset\":0"),
        ("\"offset\":2", "\"offset\":17"),
        ("\"offset\":2", "\"offset\":18446744073709551616"),
        ("\"kvLoraRank\":2", "\"kvLoraRank\":1048577"),
        ("\"kvLoraRank\":2", "\"kvLoraRank\":0"),
        ("\"maxTokens\":16", "\"maxTokens\":2147483648"),
        ("\"maxTokens\":16", "\"maxTokens\":0"),
        ("\"off\":0", "\"off\":18446744073709551615"),
        ("\"off\":0", "\"off\":18446744073709535232"),
        ("\"shape\":[1,2,2]", "\"shape\":[0,2,2]"),
        ("\"shape\":[1,2,2]", "\"shape\":[1048577,2,2]"),
        ("\"shape\":[1,2,2]", "\"shape\":[4611686018427387904,2,2]"),
        ("\"shape\":[1,2,2]", "\"shape\":[1,2,2,1]"),
        ("\"bytes\":16", "\"bytes\":18446744073709551615"),
        ("\"dtype\":10", "\"dtype\":\"10\""),
        ("\"kind\":\"mla\"", "\"kind\":7"),
        ("\"tensors\":[", "\"tensors\":{\"a\":["),
        ("\"caches\":[", "\"caches\":{\"x\":["),
    ] {
        cases.push((format!("{from} -> {to}"), edit(from, to)));
    }
    // Uppercase hash.
    let up = text.replacen(&tensor_hash(&f32s(&[1., 2., 3., 4.])), &tensor_hash(&f32s(&[1., 2., 3., 4.])).to_uppercase(), 1);
    cases.push(("uppercase hash".into(), file(&up, &data)));
    // Deep nesting.
    let deep = text.replacen("\"tokens\":[]", &format!("\"tokens\":[],\"x\":{}{}", "[".repeat(100_000), "]".repeat(100_000)), 1);
    cases.push(("deep nesting".into(), file(&deep, &data)));
    // Non-UTF-8 header.
    let mut bad = text.clone().into_bytes();
    bad[3] = 0xff;
    let h = unsafe { String::from_utf8_unchecked(bad) };
    cases.push(("non-UTF-8".into(), file(&h, &data)));
    // Header length and data start edges.
    let mut b = good.clone();
    b[10..14].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(("header length u32::MAX".into(), b));
    let mut b = good.clone();
    b[14..18].copy_from_slice(&0u32.to_le_bytes());
    cases.push(("data start 0".into(), b));
    let mut b = good.clone();
    b[14..18].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(("data start u32::MAX".into(), b));
    cases.push(("data start = end of header".into(), file_at(&text, (26 + text.len()) as u32, &data)));
    cases.push(("empty caches".into(), file(&header(&[]), &[])));
    cases.push(("no caches key".into(), file("{\"formatVersion\":3,\"tokens\":[]}", &[])));
    cases.push(("not an object".into(), file("[1,2]", &[])));
    let mut failures = Vec::new();
    for (what, bytes) in &cases {
        match load(bytes) {
            Err(_) => failures.push(format!("{what}: PANIC")),
            Ok(Ok(n)) if what != "data start = end of header" => failures.push(format!("{what}: loaded {n}")),
            Ok(Err(k)) if k != ErrorKind::InvalidArgument => failures.push(format!("{what}: {k:?}")),
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
