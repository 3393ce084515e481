//! The processes a lab starts and watches: spawning them detached in a namespace, waiting on
//! them, reading their CPU and memory from `/proc`, and pinning them to a CPU.

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
    status_kib(pid, "VmRSS:")
}

/// The anonymous part of a process's resident memory (its heap, stacks and written data), in
/// KiB: what is its own, where the rest (`RssFile`) is the binary's pages, shared with every
/// process running the same file.
pub(crate) fn anon_kib(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:")
}

/// A `kB` field of `/proc/<pid>/status` (0 if the process or the field is gone).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Kernel clock ticks per second (`USER_HZ`), the unit of [`cpu_ticks`].
pub(crate) fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// The pid of the lab app `ferry lab echo --name <name>` among `pids` (a pod's server), the
/// most recently started first.
pub(crate) fn app_of(pids: &[u32], name: &str) -> Option<u32> {
    running(pids, "lab").into_iter().rev().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.get(2) == Some(&b"echo".as_slice())
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--name" && w[1] == name.as_bytes())
        })
    })
}

/// The threads of `pid` (its tasks), by thread id.
fn threads(pid: u32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Processes pinned to one CPU (every thread of each), until dropped: then every thread gets
/// back the affinity it had, and a thread started meanwhile that of its process's first thread.
#[derive(Debug)]
pub(crate) struct Pinned {
    saved: Vec<(u32, Vec<(i32, nix::sched::CpuSet)>)>,
}

/// Pins every thread of each of `pids` to `cpu` (`sched_setaffinity`).
pub(crate) fn pin(pids: &[u32], cpu: usize) -> anyhow::Result<Pinned> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    let mut one = CpuSet::new();
    one.set(cpu).with_context(|| format!("no CPU {cpu}"))?;
    let mut pinned = Pinned { saved: Vec::new() };
    for &pid in pids {
        let mut saved = Vec::new();
        for tid in threads(pid) {
            let t = Pid::from_raw(tid);
            // A thread that has just exited is no error.
            let Ok(before) = sched_getaffinity(t) else {
                continue;
            };
            match sched_setaffinity(t, &one) {
                Ok(()) => saved.push((tid, before)),
                Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => {
                    pinned.saved.push((pid, saved));
                    return Err(e)
                        .with_context(|| format!("pinning thread {tid} of {pid} to CPU {cpu}"));
                }
            }
        }
        pinned.saved.push((pid, saved));
    }
    Ok(pinned)
}

impl Drop for Pinned {
    fn drop(&mut self) {
        use nix::sched::sched_setaffinity;
        for (pid, saved) in &self.saved {
            let Some((_, first)) = saved.first() else {
                continue;
            };
            for tid in threads(*pid) {
                let mask = saved
                    .iter()
                    .find(|(t, _)| *t == tid)
                    .map_or(first, |(_, m)| m);
                let _ = sched_setaffinity(Pid::from_raw(tid), mask);
            }
        }
    }
}

/// The CPUs `pid`'s first thread may run on (for a test that the pinning is undone).
#[cfg(test)]
fn cpus_of(pid: u32) -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(Pid::from_raw(pid as i32)) else {
        return Vec::new();
    };
    (0..nix::sched::CpuSet::count())
        .filter(|c| set.is_set(*c).unwrap_or(false))
        .collect()
}

/// Whether a process is quiet over a window of samples (oldest first) of its CPU ticks and
/// resident KiB: at most `max_ticks` of CPU over the window and RSS within
/// `max_rss_kib` of its lowest. Fewer than two samples is no window yet.
pub(crate) fn quiet(window: &[(u64, u64)], max_ticks: u64, max_rss_kib: u64) -> bool {
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return false;
    };
    if window.len() < 2 {
        return false;
    }
    let lo = window.iter().map(|s| s.1).min().unwrap_or(0);
    let hi = window.iter().map(|s| s.1).max().unwrap_or(0);
    last.0.saturating_sub(first.0) <= max_ticks && hi - lo <= max_rss_kib
}

/// Waits, for at most `max`, until each of `pids` is quiet over the last `window` (samples 250
/// ms apart): at most one clock tick of CPU per two seconds of it (at least one; a node proxy
/// counts itself quiet under 25 ms per 5 s) and its RSS steady within 256 KiB. Returns whether
/// they were, and after how long.
pub(crate) fn wait_quiet(pids: &[u32], max: Duration, window: Duration) -> (bool, Duration) {
    const EVERY: Duration = Duration::from_millis(250);
    let start = Instant::now();
    let samples = (window.as_millis() / EVERY.as_millis()).max(1) as usize + 1;
    let max_ticks = (window.as_secs() / 2).max(1);
    let sample = || {
        pids.iter()
            .map(|p| (cpu_ticks(*p), rss_kib(*p)))
            .collect::<Vec<_>>()
    };
    let mut recent = std::collections::VecDeque::from([sample()]);
    loop {
        let each_quiet = (0..pids.len()).all(|i| {
            let one: Vec<(u64, u64)> = recent.iter().map(|s| s[i]).collect();
            quiet(&one, max_ticks, 256)
        });
        if recent.len() == samples && each_quiet {
            return (true, start.elapsed());
        }
        if start.elapsed() >= max {
            return (false, start.elapsed());
        }
        std::thread::sleep(EVERY);
        recent.push_back(sample());
        if recent.len() > samples {
            recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_needs_a_window_with_little_cpu_and_a_steady_rss() {
        assert!(!quiet(&[], 1, 256));
        assert!(!quiet(&[(10, 1000)], 1, 256));
        assert!(quiet(&[(10, 1000), (10, 1100), (11, 1000)], 1, 256));
        assert!(
            !quiet(&[(10, 1000), (11, 1000), (12, 1000)], 1, 256),
            "2 ticks"
        );
        assert!(
            !quiet(&[(10, 1000), (10, 1400), (10, 1400)], 1, 256),
            "RSS grew"
        );
    }

    #[test]
    fn this_process_is_found_pinned_and_given_its_cpus_back() {
        let me = std::process::id();
        let before = cpus_of(me);
        assert!(!before.is_empty());
        {
            let _pinned = pin(&[me], before[0]).expect("pins");
            assert_eq!(cpus_of(me), vec![before[0]]);
        }
        assert_eq!(cpus_of(me), before);
        assert!(ticks_per_second() > 0);
        assert!(pin(&[me], 100_000).is_err(), "no such CPU");
        assert_eq!(cpus_of(me), before);
    }
}
