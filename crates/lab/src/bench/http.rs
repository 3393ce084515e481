//! `ferry lab bench-http`: HTTP requests through a waypoint against the L4-only Ferry path and
//! the direct path, same run, same pod; with the waypoints' CPU per 1,000 requests.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use anyhow::bail;

use crate::procs::{cpu_ticks, running};
use crate::session::netns_of;
use crate::state::State;

/// Runs `ferry lab http-bench-client` in `from` and reports the waypoints' CPU it took.
pub(crate) fn run(
    state_dir: &Path,
    from: &str,
    l4: SocketAddr,
    waypoint: SocketAddr,
    requests: usize,
) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, from)?;
    let waypoints = running(&state.pids, "waypoint");
    let before: u64 = waypoints.iter().map(|p| cpu_ticks(*p)).sum();
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args(["lab", "http-bench-client", "--l4", &l4.to_string()])
        .args(["--waypoint", &waypoint.to_string()])
        .args(["--requests", &requests.to_string()])
        .status()?;
    if !status.success() {
        bail!("the HTTP benchmark client failed");
    }
    let ticks = waypoints.iter().map(|p| cpu_ticks(*p)).sum::<u64>() - before;
    // Kernel clock ticks are 10 ms on these machines (USER_HZ = 100).
    println!(
        "waypoint CPU: {:.1} ms per 1,000 requests ({} process(es), {requests} requests)",
        ticks as f64 * 10.0 * 1000.0 / requests as f64,
        waypoints.len()
    );
    Ok(())
}

/// `ferry lab http-bench-client` (inside the lab): the three paths, side by side.
pub(crate) fn client(l4: SocketAddr, waypoint: SocketAddr, requests: usize) -> anyhow::Result<()> {
    crate::apps::http_bench(
        &[
            (
                "direct (no proxy)".into(),
                SocketAddr::new(l4.ip(), crate::apps::DIRECT_HTTP_PORT),
                true,
            ),
            ("ferry L4 (node proxy only)".into(), l4, false),
            ("ferry + waypoint (HTTP policy)".into(), waypoint, false),
        ],
        requests,
    )
}
