//! The ports a node proxy owns inside every enrolled pod's network namespace, and the guard that
//! keeps a connection from being sent back into them.

use std::net::{IpAddr, SocketAddr};

pub use crate::model::HBONE_PORT;

/// Where capture redirects a pod's outbound TCP.
pub const OUTBOUND_PORT: u16 = 15001;
/// Where capture redirects plain TCP arriving for a pod.
pub const INBOUND_PORT: u16 = 15006;

/// Every port the proxy listens on in a pod's namespace.
pub(crate) const PROXY_PORTS: [u16; 3] = [OUTBOUND_PORT, INBOUND_PORT, HBONE_PORT];

/// Is `port` one of the proxy's own?
pub(crate) fn is_proxy_port(port: u16) -> bool {
    PROXY_PORTS.contains(&port)
}

/// A connection that would land on one of the proxy's own ports in the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("attempted recursive call to the proxy's own port {0}")]
pub struct RecursiveCall(pub SocketAddr);

/// Refuses `target` if it is one of the proxy's own ports on the pod at `pod_ip`. Both directions
/// call it: outbound with the original destination, inbound with the resolved tunnel target.
pub fn refuse_recursion(pod_ip: IpAddr, target: SocketAddr) -> Result<(), RecursiveCall> {
    if target.ip() == pod_ip && is_proxy_port(target.port()) {
        Err(RecursiveCall(target))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_ports_of_the_pod_itself_are_refused() {
        let pod: IpAddr = "198.18.1.10".parse().unwrap();
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let table = [
            ("198.18.1.10:15001", false),
            ("198.18.1.10:15006", false),
            ("198.18.1.10:15008", false),
            ("198.18.1.10:8080", true),
            // Another pod's HBONE port is where tunnels go: not a recursion.
            ("198.18.1.11:15008", true),
        ];
        for (target, ok) in table {
            let got = refuse_recursion(pod, at(target));
            assert_eq!(got.is_ok(), ok, "{target}: {got:?}");
            if !ok {
                assert_eq!(got, Err(RecursiveCall(at(target))));
            }
        }
    }
}
