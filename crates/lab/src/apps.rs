//! The lab's small apps: an echo server that says who it is and whom it saw, and a client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Serves every port in `ports`: each connection gets `"<name> port <p> saw <peer>\n"`, then its
/// own bytes back until it closes its side.
pub fn echo(name: &str, ports: &[u16]) -> anyhow::Result<()> {
    let mut threads = Vec::new();
    for &port in ports {
        let l = TcpListener::bind(("0.0.0.0", port))?;
        let name = name.to_string();
        threads.push(std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut s) = conn else { continue };
                let name = name.clone();
                std::thread::spawn(move || {
                    let peer = s
                        .peer_addr()
                        .map_or_else(|_| "?".to_string(), |p| p.to_string());
                    let _ = s.write_all(format!("{name} port {port} saw {peer}\n").as_bytes());
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = s.shutdown(std::net::Shutdown::Write);
                });
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// Connects to `to`, sends `data`, closes its side, and returns everything received.
pub fn connect(to: SocketAddr, data: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&to, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(data)?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}
