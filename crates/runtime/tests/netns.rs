//! A namespace handed over as a descriptor (`Netns::from_fd`): entered, named by a path that
//! other processes can open for as long as it is held. Needs root (entering a namespace needs
//! CAP_SYS_ADMIN); skipped otherwise.

use std::fs::File;

use ferry_runtime::netns::Netns;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn a_namespace_from_a_descriptor_is_entered_and_named_by_its_held_descriptor() {
    if !is_root() {
        eprintln!("skipping: entering a network namespace needs root");
        return;
    }
    let own = File::open("/proc/self/ns/net").unwrap();
    let want = Netns::id_of(&own).unwrap();
    let ns = Netns::from_fd(own.into()).unwrap();
    assert!(ns.is_held());
    assert_eq!(ns.id(), want);
    let path = ns.path().to_path_buf();
    assert!(
        path.starts_with(format!("/proc/{}/fd/", std::process::id())),
        "{}",
        path.display()
    );
    // The path names the same namespace while it is held, and it is never "replaced".
    assert_eq!(Netns::id_of(&File::open(&path).unwrap()).unwrap(), want);
    assert!(!ns.replaced());
    // The namespace's thread runs jobs (it entered the namespace).
    let entered = ns
        .run(|| Netns::id_of(&File::open("/proc/thread-self/ns/net").unwrap()).unwrap())
        .await
        .unwrap();
    assert_eq!(entered, want);
    drop(ns);
    // The descriptor was closed with it: the path no longer names that namespace.
    let after = File::open(&path).ok().and_then(|f| Netns::id_of(&f).ok());
    assert_ne!(after, Some(want), "the held descriptor outlived its Netns");
}
