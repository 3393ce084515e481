//! The processes a lab starts and watches: spawning them detached in a namespace, waiting on
//! them, and reading their CPU, memory and descriptors from `/proc`.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::state::State;

/// Starts `args` inside `ns`, detached, logging to `log`. Returns its pid.
pub(crate) fn spawn(state: &mut State, ns: &str, args: &[&str], log: &Path) -> anyhow::Result<u32> {
    spawn_to(state, ns, args, std::fs::File::create(log)?)
}

/// Like [`spawn`], appending to an existing `log` after a line `--- {banner} ---`.
pub(crate) fn spawn_append(
    state: &mut State,
    ns: &str,
    args: &[String],
    log: &Path,
    banner: &str,
) -> anyhow::Result<u32> {
    let mut out = std::fs::OpenOptions::new().append(true).open(log)?;
    writeln!(out, "--- {banner} ---")?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_to(state, ns, &args, out)
}

/// Starts `args` inside `ns`, detached, with stdout and stderr to `out`, and records its pid.
fn spawn_to(state: &mut State, ns: &str, args: &[&str], out: File) -> anyhow::Result<u32> {
    let child = Command::new("setsid")
        .args(["ip", "netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {args:?} in {ns}"))?;
    state.pids.push(child.id());
    state.save()?;
    Ok(child.id())
}

/// Polls `cond` every 25 ms until it holds, for at most `timeout`.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let end = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > end {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}

/// Waits, for at most `timeout`, until the log file `log` holds `line` (what a program prints
/// once it serves).
pub(crate) fn wait_for_log(
    what: &str,
    timeout: Duration,
    log: &Path,
    line: &str,
) -> anyhow::Result<()> {
    wait_for(what, timeout, || {
        std::fs::read_to_string(log).is_ok_and(|l| l.contains(line))
    })
}

/// Sends SIGTERM to `pid` and waits (reaping it if it is our child) until it is gone.
pub(crate) fn stop_and_wait(pid: u32, what: &str, max: Duration) -> anyhow::Result<()> {
    signal_and_wait(pid, Signal::SIGTERM, what, max)
}

/// Sends `signal` to `pid` and waits (reaping it if it is our child) until it is gone.
pub(crate) fn signal_and_wait(
    pid: u32,
    signal: Signal,
    what: &str,
    max: Duration,
) -> anyhow::Result<()> {
    let pid = Pid::from_raw(pid as i32);
    let _ = kill(pid, signal);
    wait_for(what, max, || {
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        kill(pid, None).is_err() || zombie(pid)
    })
}

/// `pid` has exited and waits to be reaped by a parent that is not us (its sockets and
/// listeners are gone already).
fn zombie(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("Z")
    })
}

/// The pids among `pids` whose command line is `<exe> <subcommand> ...`.
pub(crate) fn running(pids: &[u32], subcommand: &str) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(subcommand.as_bytes()))
        })
        .collect()
}

/// User plus system CPU of `pid`, in clock ticks (0 if it is gone).
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

/// Resident memory of a process, in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Open file descriptors of a process (0 if it is gone).
pub(crate) fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}
