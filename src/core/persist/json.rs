//! The one JSON string escaper of the files we write by hand (the safetensors header, the
//! seed's `.mlxbun` header): a Rust string as a quoted JSON string literal.

/// `s` as a JSON string literal, quotes included (serde_json's escaping).
pub fn string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}
