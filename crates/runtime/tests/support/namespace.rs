//! A fresh network namespace for the runtime crate's tests and benches (a bench takes it with
//! `#[path = "../tests/support/namespace.rs"]`).

use std::fs::File;
use std::net::Ipv4Addr;

use ferry_runtime::netns::Netns;

/// An address that only the namespace has (on its loopback; a test network).
pub(crate) const INSIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 254, 1);

/// A fresh network namespace with its loopback up and [`INSIDE`] on it. It has no name: it
/// goes away with the last descriptor or thread in it, also when a test or bench fails.
pub(crate) fn fresh_namespace() -> Netns {
    let file = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        // A child process starts in the namespace of the thread that forks it: this one.
        let inside = format!("{INSIDE}/32");
        for args in [
            &["link", "set", "lo", "up"][..],
            &["addr", "add", &inside, "dev", "lo"][..],
        ] {
            let st = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap();
            assert!(st.success(), "ip {args:?}");
        }
        File::open("/proc/thread-self/ns/net").unwrap()
    })
    .join()
    .unwrap();
    Netns::from_fd(file.into()).unwrap()
}
