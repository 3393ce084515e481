//! Socket hygiene on the app-side legs (the pod's own connections to and from the node proxy):
//! a peer that vanished is noticed, and a half-closed connection that went quiet is ended,
//! both within the node's idle bound. And the listeners every program opens.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ferry_hbone::copy::Bounds;
use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpStream};

/// A non-blocking listener on `addr`, in the calling thread's network namespace. With
/// `one_family`, one on `[::]` takes IPv6 alone (`IPV6_V6ONLY`), so that an IPv4 listener of
/// its own can sit beside it and an IPv4 peer is never seen as an IPv4-mapped IPv6 address.
/// `SO_REUSEPORT`: a new process opens its listeners beside the old one's during a handover.
pub fn std_listener(addr: SocketAddr, one_family: bool) -> io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if one_family && addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// A listener on each of `addrs` in this process's own namespace, one family each
/// ([`std_listener`]): `0.0.0.0:15008` and `[::]:15008` may both be given. Fails naming the
/// address that could not be bound.
pub fn listen_each(addrs: &[SocketAddr]) -> io::Result<Vec<TcpListener>> {
    addrs
        .iter()
        .map(|a| {
            std_listener(*a, true)
                .and_then(TcpListener::from_std)
                .map_err(|e| io::Error::new(e.kind(), format!("binding {a}: {e}")))
        })
        .collect()
}

/// Keepalive probes start after half the bound and, three unanswered probes later, end the
/// connection; unacknowledged data gives up after the bound too. Failures only cost hygiene,
/// so they are logged and ignored.
pub fn tune_app_socket(tcp: &TcpStream, bound: Duration) {
    let _ = tcp.set_nodelay(true);
    let ka = TcpKeepalive::new()
        .with_time((bound / 2).max(Duration::from_secs(1)))
        .with_interval((bound / 6).max(Duration::from_secs(1)))
        .with_retries(3);
    let sock = SockRef::from(tcp);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "TCP keepalive on an app socket");
    }
    if let Err(e) = sock.set_tcp_user_timeout(Some(bound)) {
        tracing::debug!(error = %e, "TCP_USER_TIMEOUT on an app socket");
    }
}

/// The copy bounds of a connection: its idle bound, and its drain deadline (`finish` turns true).
pub fn bounds(idle: Duration, finish: tokio::sync::watch::Receiver<bool>) -> Bounds {
    Bounds {
        half_closed_idle: Some(idle),
        finish: Some(finish),
    }
}

/// Where a captured connection was going: its original destination, asked in the family of
/// the listener that accepted it (`SO_ORIGINAL_DST` for IPv4, `IP6T_SO_ORIGINAL_DST` for IPv6).
pub fn original_dst(tcp: &TcpStream) -> io::Result<SocketAddr> {
    let sock = SockRef::from(tcp);
    let orig = match tcp.local_addr()? {
        SocketAddr::V4(_) => sock.original_dst_v4()?,
        SocketAddr::V6(_) => sock.original_dst_v6()?,
    };
    orig.as_socket()
        .ok_or_else(|| io::Error::other("not an IP address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `0.0.0.0:P` and `[::]:P` both bind (each takes its own family), and each accepts a
    /// connection of its family; an address that cannot be bound is named in the error.
    /// (Binding a port already bound succeeds: `SO_REUSEPORT`, for handovers.)
    #[tokio::test]
    async fn listen_each_binds_one_listener_per_family_on_one_port() {
        // A port free over IPv4 a moment ago may be taken over IPv6, or again over IPv4, by
        // the time both are bound: another one is tried then.
        let (port, each) = (0..16)
            .find_map(|_| {
                let v4 = listen_each(&["0.0.0.0:0".parse().unwrap()]).unwrap();
                let port = v4[0].local_addr().unwrap().port();
                drop(v4);
                let addrs: Vec<SocketAddr> = [format!("0.0.0.0:{port}"), format!("[::]:{port}")]
                    .iter()
                    .map(|a| a.parse().unwrap())
                    .collect();
                listen_each(&addrs).ok().map(|each| (port, each))
            })
            .expect("both families on one port");
        assert!(
            SockRef::from(&each[1]).only_v6().unwrap(),
            "[::] takes IPv6 alone"
        );
        for (l, to) in each
            .iter()
            .zip([format!("127.0.0.1:{port}"), format!("[::1]:{port}")])
        {
            let to: SocketAddr = to.parse().unwrap();
            let (_c, accepted) = tokio::join!(
                TcpStream::connect(to),
                // A deadline, not a measure: the connection went to the other listener.
                tokio::time::timeout(Duration::from_secs(10), l.accept())
            );
            let (_, peer) = accepted
                .unwrap_or_else(|_| panic!("{to} was not accepted by its family's listener"))
                .unwrap();
            assert_eq!(peer.is_ipv6(), to.is_ipv6(), "{to} accepted from {peer}");
        }
        // An address no interface holds (bound, never sent to) cannot be bound.
        let absent: SocketAddr = "198.18.255.254:15008".parse().unwrap();
        let e = listen_each(&[absent]).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.starts_with("binding 198.18.255.254:15008: ")),
            "{e:?}"
        );
    }
}
