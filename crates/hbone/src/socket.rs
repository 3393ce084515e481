//! Socket helpers shared by the client, the server and what a tunnel forwards to.

use tokio::net::TcpStream;

/// Makes the connection end with RST instead of FIN when it is closed (SO_LINGER 0): the
/// reset happens when `tcp` is dropped.
pub fn reset_tcp(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_linger(Some(std::time::Duration::ZERO));
}
