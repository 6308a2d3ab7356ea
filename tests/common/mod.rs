//! Shared by the integration tests.
pub mod api_driver;
pub mod attention_ref;
pub mod check;
pub mod codec_ref;
pub mod composed_ref;
pub mod composed_rule;
pub mod core_check;
pub mod mlx_helpers;
pub mod model;
pub mod ranks;
