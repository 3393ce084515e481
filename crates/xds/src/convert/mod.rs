//! The model in Istio's wire types and back.
//!
//! `to_wire` is total: everything in a validated snapshot has a wire form. `from_wire` checks
//! every field and names what is wrong; its errors become NACK details.

mod fields;
mod from_wire;
mod intern;
mod project;
mod to_wire;
mod wire;

pub(crate) use from_wire::share;
pub use from_wire::{
    Decoded, InvalidResource, decode_address, decode_address_with, decode_authorization,
};
pub(crate) use intern::Adopted;
pub use intern::{Interner, Labels, ServiceMap};
pub(crate) use to_wire::{
    gateway_address, gateway_name, policy_reads_workloads, policy_resource, service_address,
    workload_address,
};

/// The xDS resource name of a service: `namespace/hostname`.
pub(crate) fn service_name(ns: &str, hostname: &str) -> String {
    format!("{ns}/{hostname}")
}
