//! Block keys: a hash chain over fixed blocks of tokens. The chain starts at a root that names
//! everything that must never mix (the caller's namespace, the block size, each layer's widths,
//! storage modes and role), and block `k`'s key is SHA-256 of block `k - 1`'s key and block
//! `k`'s tokens (`Geometry::stored_form` names a layer), so a key stands for every token
//! before it: two sequences share a block's key exactly where they share every token up to its
//! end, whoever stored it first. SHA-256, not a fast hash, because a stored block is restored
//! on a key match alone: a collision would be a wrong restore.
use crate::core::model::geometry::Geometry;
use crate::core::persist::sha256::sha256;

/// A block's (or a root's) key.
pub type Key = [u8; 32];

/// Longest namespace the store takes, in bytes.
pub(crate) const MAX_NAMESPACE: usize = 1024;
/// The largest block, in tokens.
pub(crate) const MAX_BLOCK: usize = 1 << 16;

/// The chain's root for `namespace`, blocks of `block` tokens and these layers.
pub fn root(namespace: &[u8], block: usize, geometries: &[Geometry]) -> Key {
    let mut text = format!("latent-cache prefix store 1\nblock {block}\nnamespace {}\n", namespace.len()).into_bytes();
    text.extend_from_slice(namespace);
    for g in geometries {
        text.push(b'\n');
        text.extend_from_slice(g.stored_form().as_bytes());
    }
    sha256(&text)
}

/// The key of the block of `tokens` after the block (or root) keyed `parent`.
pub fn next(parent: &Key, tokens: &[u32]) -> Key {
    let mut text = Vec::with_capacity(32 + 4 * tokens.len());
    text.extend_from_slice(parent);
    tokens.iter().for_each(|t| text.extend_from_slice(&t.to_le_bytes()));
    sha256(&text)
}

/// The keys of every whole block of `tokens`, in order.
pub fn chain(root: &Key, tokens: &[u32], block: usize) -> Vec<Key> {
    let mut keys: Vec<Key> = Vec::with_capacity(tokens.len() / block);
    for chunk in tokens.chunks_exact(block) {
        let key = next(keys.last().unwrap_or(root), chunk);
        keys.push(key);
    }
    keys
}

pub fn hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key from 64 lowercase hex digits (as `hex` writes it).
pub fn parse_hex(s: &str) -> Option<Key> {
    if s.len() != 64 || !s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_every_token_before_them() {
        let root = [7u8; 32];
        let a = chain(&root, &[1, 2, 3, 4, 5, 6, 7], 2);
        let b = chain(&root, &[1, 2, 3, 9, 5, 6], 2);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2], "a block after a difference differs even where its own tokens agree");
        assert_ne!(chain(&[8u8; 32], &[1, 2], 2)[0], a[0]);
        assert_eq!(parse_hex(&hex(&a[2])), Some(a[2]));
        assert_eq!(parse_hex("zz"), None);
    }
}
