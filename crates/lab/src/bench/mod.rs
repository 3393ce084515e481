//! `ferry lab bench*`: measurements of a running lab, each against a baseline in the same run.
//! The runner here drives a client inside a pod (a hidden `ferry lab` subcommand) and reports.

pub(crate) mod handover;
pub(crate) mod http;
pub(crate) mod memory;
pub(crate) mod paths;

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use crate::state::State;

/// What `ferry lab bench` measures with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// MiB echoed in the bulk transfer.
    pub(crate) bulk_mib: usize,
    /// 1 KiB request/response round trips.
    pub(crate) round_trips: usize,
    /// Connections opened one after another.
    pub(crate) conns: usize,
    /// Idle proxied connections held while measuring node proxy memory (0: no memory run).
    pub(crate) idle: usize,
}

/// `ferry lab bench`: A -> B through Ferry against A -> B direct; then node proxy memory with
/// `idle` idle proxied connections, as `bench-memory` measures it.
pub(crate) fn run(state_dir: &Path, from: &str, to: &str, sizes: Sizes) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let (src, dst) = state.pod_pair(from, to)?;
    let exe = std::env::current_exe()?;
    let status = Command::new("ip")
        .args(["netns", "exec", &src.netns])
        .arg(&exe)
        .args([
            "lab",
            "bench-client",
            "--target",
            &dst.ip,
            "--bulk-mib",
            &sizes.bulk_mib.to_string(),
        ])
        .args([
            "--round-trips",
            &sizes.round_trips.to_string(),
            "--conns",
            &sizes.conns.to_string(),
        ])
        .status()?;
    if !status.success() {
        bail!("the benchmark client failed");
    }
    if sizes.idle == 0 {
        return Ok(());
    }
    // Memory with many idle proxied connections, as `bench-memory` measures it.
    memory::run(state_dir, from, to, &[sizes.idle])
}
