//! C ABI
