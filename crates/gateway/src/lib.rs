//! `ferry gateway`: the east-west gateway. It terminates the outer HBONE tunnel of double
//! HBONE and carries the inner one to the destination on its own network.
//!
//! # Layout
//! - `hop`: the HBONE handler, its admin endpoint (optional) and `run`.

mod hop;

pub use hop::{Config, run};
