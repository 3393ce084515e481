//! The binary's own pages. A node proxy runs from the one `ferry` binary, every component in
//! it (control plane, Kubernetes client, lab, CLI): tens of MB of code and read-only data.
//! Start-up (arguments, configuration, the first snapshot, TLS set-up, enrolling pods) and a
//! load spike run code an idle proxy does not run again, and the kernel maps each page touched
//! with its neighbours (fault-around), so those pages stay in the process's resident set
//! though only the page cache holds them, shared with every process of the same file.
//!
//! The same holds for the shared libraries it loaded (libc, libm, the dynamic loader: about
//! 2 MB resident after start-up), which are released alike.
//!
//! [`release`] unmaps the executable's read-only pages from this process (`MADV_DONTNEED`);
//! those it runs again are mapped back at their next touch, a minor fault from the page cache,
//! so what stays resident is what it runs. The page cache is not touched. Only mappings that
//! are not writable and hold no page of their own are released: a written page of a private
//! mapping (the relocated RELRO pages, a debugger's breakpoint) is anonymous and would be lost,
//! where a page that is the file's is read again as it was.

use std::ops::Range;

/// The ranges of the mappings of `exe` and of shared libraries (`*.so*` files) in `smaps`
/// (`/proc/self/smaps`) that can be released: not writable, with pages resident, none of them
/// anonymous.
pub(crate) fn releasable(smaps: &str, exe: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut current: Option<Mapping<'_>> = None;
    for line in smaps.lines() {
        if let Some(m) = Mapping::parse(line) {
            out.extend(current.take().and_then(|c| c.releasable(exe)));
            current = Some(m);
        } else if let Some(m) = current.as_mut() {
            m.field(line);
        }
    }
    out.extend(current.and_then(|c| c.releasable(exe)));
    out
}

/// One mapping of `/proc/<pid>/smaps`: its header line and the fields read after it.
struct Mapping<'a> {
    range: Range<usize>,
    writable: bool,
    path: &'a str,
    rss_kib: Option<u64>,
    anonymous_kib: Option<u64>,
}

impl<'a> Mapping<'a> {
    /// A header line: `start-end perms offset dev inode [path]` (the path may hold spaces).
    fn parse(line: &'a str) -> Option<Self> {
        let mut words = line.splitn(6, ' ');
        let (start, end) = words.next()?.split_once('-')?;
        let range = usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?;
        let perms = words.next()?;
        if perms.len() != 4 {
            return None;
        }
        let (_offset, _dev, _inode) = (words.next()?, words.next()?, words.next()?);
        let path = words.next().unwrap_or("").trim_start();
        Some(Self {
            range,
            writable: perms.as_bytes()[1] == b'w',
            path,
            rss_kib: None,
            anonymous_kib: None,
        })
    }

    /// A `Name:   N kB` line after the header.
    fn field(&mut self, line: &str) {
        let Some((name, value)) = line.split_once(':') else {
            return;
        };
        let kib = || value.split_whitespace().next()?.parse().ok();
        match name {
            "Rss" => self.rss_kib = kib(),
            "Anonymous" => self.anonymous_kib = kib(),
            _ => {}
        }
    }

    fn releasable(self, exe: &str) -> Option<Range<usize>> {
        let own = (self.path == exe || is_shared_library(self.path)) && !self.writable;
        // Both fields read, or nothing is known for sure.
        (own && self.anonymous_kib? == 0 && self.rss_kib? > 0).then_some(self.range)
    }
}

/// A shared object's path (`/usr/lib/x86_64-linux-gnu/libc.so.6`, `/lib64/ld-linux-x86-64.so.2`):
/// an absolute path whose file name has `.so` at its end or before a version.
fn is_shared_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    path.starts_with('/') && (name.ends_with(".so") || name.contains(".so."))
}

/// Unmaps this process's resident pages of its executable's and shared libraries' read-only
/// mappings; returns how many mappings were released. Best effort: what cannot be read or released stays.
#[allow(unsafe_code)]
pub(crate) fn release() -> usize {
    let (Ok(exe), Ok(smaps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/smaps"),
    ) else {
        return 0;
    };
    let Some(exe) = exe.to_str() else {
        return 0;
    };
    releasable(&smaps, exe)
        .into_iter()
        .filter(|r| {
            // SAFETY: the range is a whole mapping of the executable or of a shared library
            // that is not writable and holds no anonymous page: every page of it is the file's,
            // unchanged, so dropping it from the page tables only makes the next access read it
            // again from the page cache, as any page not yet touched is (the executable cannot
            // change while it runs; a library is replaced by a new file, not written over).
            // Nothing is unmapped.
            unsafe {
                nix::libc::madvise(
                    r.start as *mut nix::libc::c_void,
                    r.end - r.start,
                    nix::libc::MADV_DONTNEED,
                ) == 0
            }
        })
        .count()
}

#[cfg(test)]
#[path = "code_tests.rs"]
mod tests;
