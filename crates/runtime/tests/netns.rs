//! A namespace handed over as a descriptor (`Netns::from_fd`): entered, named by a path that
//! other processes can open for as long as it is held. Sockets opened in a namespace on the
//! calling thread (`Netns::tcp_socket`, `connect`, `connect_from`): in the namespace, with the
//! thread back in its own. Needs root (entering a namespace needs CAP_SYS_ADMIN); skipped
//! otherwise.

use std::fs::File;

use ferry_runtime::netns::Netns;
use support::namespace::{INSIDE, fresh_namespace};

mod support {
    pub(crate) mod namespace;
}

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

fn own_namespace() -> (u64, u64) {
    Netns::id_of(&File::open("/proc/thread-self/ns/net").unwrap()).unwrap()
}

fn bind_inside(s: &socket2::Socket) -> std::io::Result<()> {
    s.bind(&std::net::SocketAddr::from((INSIDE, 0)).into())
}

#[test]
fn a_socket_is_created_in_the_namespace_and_the_calling_thread_stays_in_its_own() {
    if !is_root() {
        eprintln!("skipping: entering a network namespace needs root");
        return;
    }
    let ns = fresh_namespace();
    let to = std::net::SocketAddr::from((INSIDE, 80));
    // The address is the namespace's alone: a socket of this thread's namespace cannot bind it.
    let here = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    assert!(
        bind_inside(&here).is_err(),
        "{INSIDE} is also this namespace's"
    );
    let home = own_namespace();
    for _ in 0..3 {
        let s = ns.tcp_socket(to).unwrap();
        assert!(s.nonblocking().unwrap());
        bind_inside(&s).expect("the socket is not in the namespace");
        assert_eq!(
            own_namespace(),
            home,
            "the thread was left in the namespace"
        );
        // Sockets this thread creates itself are still in its own namespace.
        let after =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        assert!(
            bind_inside(&after).is_err(),
            "the thread opens sockets in the namespace"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_from_the_namespace_reaches_its_listener_from_the_address_asked() {
    if !is_root() {
        eprintln!("skipping: entering a network namespace needs root");
        return;
    }
    let ns = fresh_namespace();
    let listener = ns
        .listen(std::net::SocketAddr::from((INSIDE, 0)))
        .await
        .unwrap();
    let to = listener.local_addr().unwrap();
    let home = own_namespace();
    let plain = ns.connect(Some(INSIDE.into()), to).await.unwrap();
    let (_, peer) = listener.accept().await.unwrap();
    assert_eq!(peer, plain.local_addr().unwrap());
    // IP_TRANSPARENT, from a client's address and never its port.
    let client = std::net::SocketAddr::from((INSIDE, peer.port()));
    let from = ns.connect_from(client, to).await.unwrap();
    let (_, peer) = listener.accept().await.unwrap();
    assert_eq!(peer, from.local_addr().unwrap());
    assert_eq!(peer.ip(), client.ip());
    assert!(
        plain.nodelay().unwrap() && from.nodelay().unwrap(),
        "Nagle is on"
    );
    assert_eq!(
        own_namespace(),
        home,
        "the thread was left in the namespace"
    );
}

/// From a client's address with no port to step around (a tunnel's client), the port is the
/// connect's pick by the four addresses (`IP_BIND_ADDRESS_NO_PORT`): connections to several
/// destinations share the namespace's ports. With two ephemeral ports, three connections from
/// one address to three destinations are all made; with the port reserved at bind, the third
/// found none (EADDRINUSE).
#[tokio::test]
async fn connections_from_one_address_to_several_destinations_share_source_ports() {
    if !is_root() {
        eprintln!("skipping: entering a network namespace needs root");
        return;
    }
    let ns = fresh_namespace();
    ns.run(|| std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "40000 40001"))
        .await
        .unwrap()
        .unwrap();
    let mut listeners = Vec::new();
    for port in [8001, 8002, 8003] {
        listeners.push(
            ns.listen(std::net::SocketAddr::from((INSIDE, port)))
                .await
                .unwrap(),
        );
    }
    let client = std::net::SocketAddr::from((INSIDE, 0));
    let mut held = Vec::new();
    for l in &listeners {
        let to = l.local_addr().unwrap();
        let c = ns
            .connect_from(client, to)
            .await
            .unwrap_or_else(|e| panic!("connection {} to {to}: {e}", held.len() + 1));
        let port = c.local_addr().unwrap().port();
        assert!((40000..=40001).contains(&port), "port {port}");
        held.push(c);
    }
}
