//! `ferry lab bench-paths`: two paths from one pod through Ferry, in the same run (e.g.
//! same-network HBONE against double HBONE through a gateway).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitCode};

use crate::session::netns_of;
use crate::state::State;

/// Runs `ferry lab paths-client` in `from`; exits with its code.
pub(crate) fn run(
    state_dir: &Path,
    from: &str,
    near: SocketAddr,
    far: SocketAddr,
    bulk_mib: usize,
    round_trips: usize,
) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, from)?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args(["lab", "paths-client", &near.to_string(), &far.to_string()])
        .args([
            "--bulk-mib",
            &bulk_mib.to_string(),
            "--round-trips",
            &round_trips.to_string(),
        ])
        .status()?;
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

/// `ferry lab paths-client` (inside the lab): measures both paths and prints the comparison.
pub(crate) fn client(
    near: SocketAddr,
    far: SocketAddr,
    bulk_mib: usize,
    round_trips: usize,
) -> anyhow::Result<()> {
    let [n, f] = crate::apps::paths(near, far, bulk_mib, round_trips)?;
    println!("paths through Ferry from this pod, {bulk_mib} MiB echoed, {round_trips} round trips");
    println!(
        "near {near}: {:.2} GB/s, 1 KiB p50 {:.0} us p99 {:.0} us",
        n.0, n.1, n.2
    );
    println!(
        "far  {far}: {:.2} GB/s, 1 KiB p50 {:.0} us p99 {:.0} us",
        f.0, f.1, f.2
    );
    println!(
        "far / near: throughput {:.2}x, p50 {:.2}x, p99 {:.2}x",
        f.0 / n.0,
        f.1 / n.1,
        f.2 / n.2
    );
    Ok(())
}
