//! End to end in the lab: real namespaces, real capture, real HBONE. Needs root (CI runs as
//! root); elsewhere each test says why it did nothing.
//!
//! One test binary. Read-only scenarios share one lab ([`harness::MESH`]) and run in parallel;
//! scenarios that change a lab run one at a time on a lab of their group, or on their own lab.

mod bench;
mod crash;
mod dns;
mod drain;
mod dual_stack;
mod explain;
mod failover;
mod gateway;
mod grpc;
mod harness;
mod idle;
mod kill;
mod kubernetes;
mod l4;
mod lifecycle;
mod mtls;
mod observe;
mod origin;
mod origin_address;
mod outlier;
mod policy;
mod retry;
mod rollout;
mod terminate;
mod trust;
mod ui;
mod waypoint;
