//! Memory given back once the node proxy turns idle. Start-up does not end at one point: after
//! the node agent's replay, pods are enrolled one by one, certificates fetched, the first
//! connections made, and each of these runs code (and allocates) that an idle proxy does not
//! run again. Whenever the process has been quiet for a while (little CPU) after it had
//! mapped pages back in (page faults since the last time), it trims ([`super::trim`]): the
//! binary's read-only pages leave the resident set ([`super::code`]), jemalloc's free pages go
//! back to the system, and each worker's thread cache is flushed as it parks.
//!
//! The process's own CPU time and fault count (`getrusage`) are read every [`CHECK`]: one
//! system call. A proxy carrying light traffic is quiet too, and maps its data path back after
//! each release: so each release that was followed by faults doubles the quiet time the next
//! one waits for (up to [`MOST_QUIET`]), and any busy interval sets it back to [`LEAST_QUIET`].

use std::time::Duration;

/// How often the process's CPU time and faults are read.
pub(crate) const CHECK: Duration = Duration::from_secs(5);
/// CPU time in one [`CHECK`] under which the process counts as quiet (0.5%).
const QUIET_CPU: Duration = Duration::from_millis(25);
/// Minor faults since the last release over which another is worth it: pages mapped back
/// (a fault on the binary's text maps 64-128 KiB around it).
const FAULTS_WORTH: u64 = 32;
/// Quiet [`CHECK`]s before the first release after activity.
const LEAST_QUIET: u32 = 2;
/// The most quiet [`CHECK`]s a release waits for (at [`CHECK`] = 5 s, 16 min).
const MOST_QUIET: u32 = 192;

/// The process's CPU time (user and system) and minor page faults so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) cpu: Duration,
    pub(crate) faults: u64,
}

impl Usage {
    /// This process's, all threads'; `None` if it cannot be read.
    pub(crate) fn now() -> Option<Self> {
        use nix::sys::resource::{UsageWho, getrusage};
        let u = getrusage(UsageWho::RUSAGE_SELF).ok()?;
        let d = |t: nix::sys::time::TimeVal| {
            Duration::new(
                u64::try_from(t.tv_sec()).unwrap_or(0),
                u32::try_from(t.tv_usec()).unwrap_or(0) * 1_000,
            )
        };
        Some(Self {
            cpu: d(u.user_time()) + d(u.system_time()),
            faults: u64::try_from(u.minor_page_faults()).unwrap_or(0),
        })
    }
}

/// When to release: fed one reading per [`CHECK`] (pure; the loop does the I/O).
#[derive(Debug)]
pub(crate) struct Idle {
    /// The previous reading.
    last: Usage,
    /// The fault count right after the last release.
    released_at: u64,
    /// Quiet checks in a row.
    quiet: u32,
    /// Quiet checks the next release waits for.
    wait: u32,
}

impl Idle {
    pub(crate) fn new(start: Usage) -> Self {
        Self {
            last: start,
            released_at: start.faults,
            quiet: 0,
            wait: LEAST_QUIET,
        }
    }

    /// Takes the reading `now`; `true` if the process should release now.
    pub(crate) fn check(&mut self, now: Usage) -> bool {
        let cpu = now.cpu.saturating_sub(self.last.cpu);
        self.last = now;
        if cpu > QUIET_CPU {
            // Busy: the next quiet spell is a new one.
            self.quiet = 0;
            self.wait = LEAST_QUIET;
            return false;
        }
        self.quiet += 1;
        let faulted = now.faults.saturating_sub(self.released_at);
        if self.quiet < self.wait || faulted < FAULTS_WORTH {
            return false;
        }
        // What was released came back while quiet: the next release waits longer.
        self.wait = (self.wait * 2).min(MOST_QUIET);
        self.quiet = 0;
        true
    }

    /// The release is done: `after` is read after it (the release faults a little itself).
    pub(crate) fn released(&mut self, after: Usage) {
        self.released_at = after.faults;
        self.last = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(cpu_ms: u64, faults: u64) -> Usage {
        Usage {
            cpu: Duration::from_millis(cpu_ms),
            faults,
        }
    }

    /// Start-up (busy, faulting) then quiet: one release after [`LEAST_QUIET`] quiet checks,
    /// none while nothing faults back.
    #[test]
    fn a_quiet_process_that_faulted_releases_once() {
        let mut idle = Idle::new(at(0, 0));
        assert!(!idle.check(at(500, 4_000)), "busy");
        assert!(!idle.check(at(510, 4_010)), "quiet once");
        assert!(idle.check(at(515, 4_012)), "quiet twice, pages came back");
        idle.released(at(520, 4_020));
        for i in 0..20 {
            assert!(!idle.check(at(520 + i, 4_030)), "nothing came back");
        }
    }

    /// Light traffic maps its pages back after each release: each later release waits twice
    /// as long, up to the most; busy time starts over.
    #[test]
    fn pages_mapped_back_while_quiet_double_the_wait() {
        let mut idle = Idle::new(at(0, 0));
        let (mut cpu, mut faults) = (0, 0);
        let mut waited = Vec::new();
        for _ in 0..10 {
            let mut n = 0;
            loop {
                n += 1;
                cpu += 5;
                faults += FAULTS_WORTH;
                if idle.check(at(cpu, faults)) {
                    break;
                }
            }
            idle.released(at(cpu, faults));
            waited.push(n);
        }
        assert_eq!(waited, [2, 4, 8, 16, 32, 64, 128, 192, 192, 192]);
        cpu += 1_000;
        assert!(!idle.check(at(cpu, faults)), "busy");
        faults += FAULTS_WORTH;
        assert!(!idle.check(at(cpu, faults)));
        assert!(idle.check(at(cpu, faults)), "back to the least wait");
    }

    /// Memory touched for the first time counts as faults.
    #[test]
    fn pages_touched_count_as_faults() {
        let a = Usage::now().expect("getrusage");
        // Larger than anything the other tests free, so it is fresh memory.
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let b = Usage::now().expect("getrusage");
        drop(v);
        // At least 16: with transparent huge pages on `always`, 64 MiB is about 32 faults (2 MiB
        // each), else 16,384.
        assert!(b.faults >= a.faults + 16, "{a:?} then {b:?}");
    }
}
