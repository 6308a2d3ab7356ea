//! Reading the seed's format's frame: the magic, the header length and data start, the JSON
//! header checked against its wyhash, and the info it carries (tokens, identity strings).
use std::io::Read;
use std::path::Path;

use serde_json::Value;

use super::{MlxbunInfo, MAGIC, MAX_HEADER, PREFIX_LEN};
use crate::core::error::{error, fail, Result};
use crate::core::persist::file::open_regular;
use crate::core::persist::wyhash::wyhash;

/// A verified header: the JSON and where the data starts.
pub(super) struct Header {
    pub(super) json: Value,
    pub(super) text: String,
    pub(super) data_start: u64,
}

pub(super) fn read_header(r: &mut impl Read, file_len: u64) -> Result<Header> {
    let mut prefix = [0u8; PREFIX_LEN as usize];
    r.read_exact(&mut prefix).map_err(|_| error!(InvalidArgument, "too short to be a cache file of the seed's format"))?;
    if &prefix[..10] != MAGIC {
        return fail!(
            InvalidArgument,
            "not a cache file of the seed's format (magic {:?})",
            String::from_utf8_lossy(&prefix[..10])
        );
    }
    let header_len = u64::from(u32::from_le_bytes(prefix[10..14].try_into().unwrap()));
    let data_start = u64::from(u32::from_le_bytes(prefix[14..18].try_into().unwrap()));
    let hash = u64::from_le_bytes(prefix[18..26].try_into().unwrap());
    let text_len = usize::try_from(header_len).ok();
    let Some(text_len) = text_len
        .filter(|_| header_len <= MAX_HEADER && data_start >= PREFIX_LEN + header_len && PREFIX_LEN + header_len <= file_len)
    else {
        return fail!(InvalidArgument, "damaged header fields (length {header_len}, data start {data_start})");
    };
    let mut text = vec![0u8; text_len];
    r.read_exact(&mut text).map_err(|_| error!(InvalidArgument, "the file ends inside its header"))?;
    if wyhash(&text, 0) != hash {
        return fail!(InvalidArgument, "the header does not match its hash (the file is damaged)");
    }
    let text = String::from_utf8(text).map_err(|_| error!(InvalidArgument, "the header is not UTF-8"))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| error!(InvalidArgument, "the header is not JSON: {e}"))?;
    if !json.is_object() {
        return fail!(InvalidArgument, "the header is not a JSON object");
    }
    Ok(Header { json, text, data_start })
}

pub(super) fn uint(v: &Value, what: &str) -> Result<u64> {
    v.as_u64().ok_or_else(|| error!(InvalidArgument, "{what} is not a non-negative integer"))
}

pub(super) fn field<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a Value> {
    v.get(key).ok_or_else(|| error!(InvalidArgument, "{what}: {key} is missing"))
}

/// The header's info (tokens and identity strings).
pub(super) fn info(h: &Value) -> Result<MlxbunInfo> {
    let tokens = field(h, "tokens", "header")?
        .as_array()
        .ok_or_else(|| error!(InvalidArgument, "tokens is not an array"))?
        .iter()
        .map(|t| {
            uint(t, "a token").and_then(|t| u32::try_from(t).map_err(|_| error!(InvalidArgument, "token {t} exceeds 32 bits")))
        })
        .collect::<Result<Vec<u32>>>()?;
    let text = |key: &str| -> Result<Option<String>> {
        match h.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => fail!(InvalidArgument, "{key} is not a string"),
        }
    };
    Ok(MlxbunInfo {
        tokens,
        model_id: text("modelId")?,
        config_fingerprint: text("configFingerprint")?,
        tokenizer_hash: text("tokenizerHash")?,
        ns: text("ns")?,
    })
}

/// The verified JSON header of a file, and its info, without reading any tensor (the file
/// opened once, a regular file: `file::open_regular`).
pub fn read_info(path: &Path) -> Result<(String, MlxbunInfo)> {
    let (mut file, len) = open_regular(path)?;
    let header = read_header(&mut file, len)?;
    let info = info(&header.json)?;
    Ok((header.text, info))
}
