//! Shared by the integration tests.
pub mod model;
