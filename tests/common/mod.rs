//! Shared by the integration tests.
pub mod api_driver;
pub mod check;
pub mod model;
