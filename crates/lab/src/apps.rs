//! The lab's small apps: an echo server that says who it is and whom it saw, a sink, a client,
//! and the benchmark client.

use std::net::SocketAddr;

use anyhow::Context as _;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The echo port every lab pod serves (and every example's services target).
pub(crate) const ECHO_PORT: u16 = 8080;
/// The sink port: reads everything, answers EOF with the byte count (8 bytes, little endian).
pub(crate) const SINK_PORT: u16 = 7777;
/// The benchmark's direct baseline ports: an echo server and a sink like those above, on ports
/// the lab enrolls every pod with left out of inbound capture (ZDS's `ferry_uncaptured_ports`),
/// so a marked connection to them crosses no proxy at either end.
pub(crate) const DIRECT_ECHO_PORT: u16 = 18080;
pub(crate) const DIRECT_SINK_PORT: u16 = 17778;
/// The HTTP server of [`HTTP_PORT`] again, on a port left out of capture like those above.
pub(crate) const DIRECT_HTTP_PORT: u16 = 18081;
/// Every port the lab enrolls its pods with left out of inbound capture.
pub(crate) const DIRECT_PORTS: [u16; 3] = [DIRECT_SINK_PORT, DIRECT_ECHO_PORT, DIRECT_HTTP_PORT];
/// A server that reads to EOF and then never answers nor closes: a peer that never finishes.
pub(crate) const STUBBORN_PORT: u16 = 7171;

/// The HTTP port: HTTP/1.1, every request answered `200` with
/// `"<name> http <method> <path> saw <peer>\n"` (for the waypoint's per-request policy).
pub(crate) const HTTP_PORT: u16 = 8081;

/// Serves every port in `ports` and [`DIRECT_ECHO_PORT`] (each connection gets `"<name> port
/// <p> saw <peer>\n"`, then its own bytes back until it closes its side), the sink on
/// [`SINK_PORT`] and [`DIRECT_SINK_PORT`], HTTP on [`HTTP_PORT`] and [`DIRECT_HTTP_PORT`] and
/// gRPC's health service on [`crate::grpc::GRPC_PORT`].
pub(crate) fn echo(name: &str, ports: &[u16]) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut tasks = Vec::new();
        let mut ports = ports.to_vec();
        if !ports.contains(&DIRECT_ECHO_PORT) {
            ports.push(DIRECT_ECHO_PORT);
        }
        let mut listeners = Vec::new();
        for &port in &ports {
            listeners.push((port, TcpListener::bind(("0.0.0.0", port)).await?));
            // And on IPv6 where the pod has it (a dual-stack pod's app answers both families).
            listeners.extend(bind_v6_only(port).map(|l| (port, l)));
        }
        for (port, l) in listeners {
            let name = name.to_string();
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((mut s, peer)) = l.accept().await else {
                        continue;
                    };
                    let name = name.clone();
                    tokio::spawn(async move {
                        let _ = s.set_nodelay(true);
                        let _ = s
                            .write_all(format!("{name} port {port} saw {peer}\n").as_bytes())
                            .await;
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                        let _ = w.shutdown().await;
                    });
                }
            }));
        }
        for port in [SINK_PORT, DIRECT_SINK_PORT] {
            let sink = TcpListener::bind(("0.0.0.0", port)).await?;
            tasks.push(tokio::spawn(serve_sink(sink)));
        }
        // (Unless the topology gave this port to the echo server.)
        let stubborn = match ports.contains(&STUBBORN_PORT) {
            true => None,
            false => Some(TcpListener::bind(("0.0.0.0", STUBBORN_PORT)).await?),
        };
        tasks.extend(stubborn.map(|stubborn| {
            tokio::spawn(async move {
                loop {
                    let Ok((mut s, _)) = stubborn.accept().await else {
                        continue;
                    };
                    tokio::spawn(async move {
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = s.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                        }
                        // Half-closed by the client; this side never finishes.
                        std::future::pending::<()>().await;
                        drop(s);
                    });
                }
            })
        }));
        for port in [HTTP_PORT, DIRECT_HTTP_PORT] {
            let http = TcpListener::bind(("0.0.0.0", port)).await?;
            tasks.push(tokio::spawn(serve_http(name.to_string(), http)));
        }
        let grpc = TcpListener::bind(("0.0.0.0", crate::grpc::GRPC_PORT)).await?;
        tasks.push(tokio::spawn(crate::grpc::serve(grpc)));
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    })
}

/// A listener on `[::]:port` for IPv6 alone (beside the IPv4 one on the same port), if the
/// namespace has IPv6.
fn bind_v6_only(port: u16) -> Option<TcpListener> {
    let open = || -> std::io::Result<std::net::TcpListener> {
        let s = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
        s.set_only_v6(true)?;
        s.set_reuse_address(true)?;
        s.set_nonblocking(true)?;
        s.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
        s.listen(1024)?;
        Ok(s.into())
    };
    open().ok().and_then(|l| TcpListener::from_std(l).ok())
}

/// Reads each connection to its end, then answers with the byte count (8 bytes, little endian).
async fn serve_sink(sink: TcpListener) {
    loop {
        let Ok((mut s, _)) = sink.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            let _ = s.write_all(&total.to_le_bytes()).await;
        });
    }
}

async fn serve_http(name: String, l: TcpListener) {
    use http_body_util::Full;
    loop {
        let Ok((s, peer)) = l.accept().await else {
            continue;
        };
        let name = name.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    let text = format!(
                        "{name} http {} {} saw {peer}\n",
                        req.method(),
                        req.uri().path()
                    );
                    // `Upgrade: <anything>` is agreed to: then every byte is echoed.
                    let upgrade = req.headers().get(http::header::UPGRADE).cloned();
                    let upgraded = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
                    async move {
                        let mut resp = http::Response::new(Full::new(bytes::Bytes::from(text)));
                        if let (Some(proto), Some(upgraded)) = (upgrade, upgraded) {
                            *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
                            resp.headers_mut().insert(http::header::UPGRADE, proto);
                            resp.headers_mut().insert(
                                http::header::CONNECTION,
                                http::HeaderValue::from_static("upgrade"),
                            );
                            tokio::spawn(async move {
                                if let Ok(u) = upgraded.await {
                                    let mut u = hyper_util::rt::TokioIo::new(u);
                                    let (mut r, mut w) = tokio::io::split(&mut u);
                                    let _ = tokio::io::copy(&mut r, &mut w).await;
                                }
                            });
                        }
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .with_upgrades()
                .await;
        });
    }
}

/// Connects to `to`, sends `data`, closes its side, and returns everything received.
pub(crate) fn connect(to: SocketAddr, data: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    connect_then(to, data, timeout, |_| {})
}

/// [`connect`], telling `connected` the connection's local address once it is up.
pub(crate) fn connect_then(
    to: SocketAddr,
    data: &[u8],
    timeout: Duration,
    connected: impl FnOnce(SocketAddr),
) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&to, timeout)?;
    connected(s.local_addr()?);
    s.set_read_timeout(Some(timeout))?;
    s.write_all(data)?;
    match s.shutdown(std::net::Shutdown::Write) {
        // A reset that came before the half-close leaves the socket unconnected: the reset is
        // what happened.
        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection reset before the half-close",
            ));
        }
        r => r?,
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

/// A connection from this pod: through Ferry (captured) or direct (marked, so the pod's
/// outbound capture lets it pass; it must go to a port the destination leaves uncaptured, such
/// as [`DIRECT_ECHO_PORT`], to reach the app without its node proxy: the same wire, no proxy).
pub(crate) async fn dial(to: SocketAddr, direct: bool) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM,
        None,
    )?;
    if direct {
        s.set_mark(0x539)?;
    }
    s.set_nonblocking(true)?;
    let stream = TcpSocket::from_std_stream(std::net::TcpStream::from(s))
        .connect(to)
        .await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

pub(crate) async fn greeted(to: SocketAddr, direct: bool) -> std::io::Result<BufReader<TcpStream>> {
    let mut s = BufReader::new(dial(to, direct).await?);
    let mut line = String::new();
    s.read_line(&mut line).await?;
    Ok(s)
}

/// Sends `ping\n` every `every` and waits for its echo, printing `ping <k>`, until the far
/// side ends the connection: `None` for a clean end (FIN), the error otherwise.
async fn pinged(c: &mut BufReader<TcpStream>, every: Duration) -> Option<std::io::Error> {
    for k in 1.. {
        if let Err(e) = c.get_mut().write_all(b"ping\n").await {
            return Some(e);
        }
        let mut line = String::new();
        match c.read_line(&mut line).await {
            Ok(0) => return None,
            Ok(_) => println!("ping {k}"),
            Err(e) => return Some(e),
        }
        // Waiting for the next ping, the far side may end the connection: seen at once.
        let mut more = String::new();
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            r = c.read_line(&mut more) => match r {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(e),
            },
        }
    }
    None
}

/// An HTTP/1.1 connection switched to echoing bytes (`GET /ws` with `Upgrade: echo`), after
/// its `101`.
async fn upgraded(to: SocketAddr) -> std::io::Result<BufReader<TcpStream>> {
    let mut s = BufReader::new(dial(to, false).await?);
    s.get_mut()
        .write_all(b"GET /ws HTTP/1.1\r\nHost: app\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
        .await?;
    let mut status = String::new();
    s.read_line(&mut status).await?;
    if !status.starts_with("HTTP/1.1 101") {
        return Err(std::io::Error::other(format!("no upgrade: {status:?}")));
    }
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
    }
    Ok(s)
}

/// The two-thread runtime every lab client runs on.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

pub(crate) fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)].as_secs_f64() * 1e6
}

/// Times `n` round trips of `size` bytes on `s` (write, then read the echo back); returns the
/// p50 and p99 in microseconds.
pub(crate) async fn timed_round_trips<S>(
    s: &mut S,
    n: usize,
    size: usize,
) -> std::io::Result<(f64, f64)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let msg = vec![0x42u8; size];
    let mut back = vec![0u8; size];
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&msg).await?;
        s.read_exact(&mut back).await?;
        lat.push(t.elapsed());
    }
    if lat.is_empty() {
        return Ok((0.0, 0.0));
    }
    Ok((pct(&mut lat, 0.5), pct(&mut lat, 0.99)))
}

/// Opens `n` connections through Ferry to `target` and holds them until stdin closes, or, with
/// `until_closed`, until the first of them is closed by the other side (then prints `closed`
/// for a FIN, `closed by reset (<error>)` otherwise).
pub(crate) fn hold(
    target: SocketAddr,
    n: usize,
    until_closed: bool,
    upgrade: bool,
    ping: Option<Duration>,
) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let mut held = Vec::with_capacity(n);
        for _ in 0..n {
            held.push(if upgrade {
                upgraded(target).await?
            } else {
                greeted(target, false).await?
            });
        }
        println!("held {n}");
        if until_closed {
            let mut set = tokio::task::JoinSet::new();
            for mut c in held {
                set.spawn(async move {
                    if let Some(every) = ping {
                        return pinged(&mut c, every).await;
                    }
                    let mut b = [0u8; 1024];
                    loop {
                        match c.read(&mut b).await {
                            Ok(0) => return None,
                            Err(e) => return Some(e),
                            Ok(_) => {}
                        }
                    }
                });
            }
            match set.join_next().await {
                Some(Ok(Some(e))) => println!("closed by reset ({e})"),
                _ => println!("closed"),
            }
            return Ok(());
        }
        let mut stdin = tokio::io::stdin();
        let mut b = [0u8; 1];
        let _ = stdin.read(&mut b).await;
        drop(held);
        Ok(())
    })
}

/// Opens `n` connections to `target`, prints `open <n>`, and waits for a line on stdin; then
/// half-closes each (one byte, then FIN) and waits up to `max` for the far side to end them,
/// printing `closed <k> of <n> in <ms> ms`.
pub(crate) fn half_close(target: SocketAddr, n: usize, max: Duration) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(TcpStream::connect(target).await?);
        }
        println!("open {n}");
        let mut line = String::new();
        let _ = BufReader::new(tokio::io::stdin())
            .read_line(&mut line)
            .await;
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for mut c in conns {
            set.spawn(async move {
                c.write_all(b"x").await?;
                c.shutdown().await?;
                let mut b = [0u8; 64];
                loop {
                    match c.read(&mut b).await {
                        Ok(0) | Err(_) => return Ok::<_, std::io::Error>(()),
                        Ok(_) => {}
                    }
                }
            });
        }
        let mut closed = 0;
        let _ = tokio::time::timeout(max, async {
            while let Some(r) = set.join_next().await {
                if matches!(r, Ok(Ok(()))) {
                    closed += 1;
                }
            }
        })
        .await;
        println!(
            "closed {closed} of {n} in {} ms",
            started.elapsed().as_millis()
        );
        Ok(())
    })
}

/// Opens `n` connections to the echo port `target`, prints `held <n>`, then keeps each busy
/// (a line every 100 ms, its echo read back) until every one has ended or `max` passes. Prints
/// one summary line: `fin=<a> reset=<b> open=<c> first_end_ms=<t> last_end_ms=<t>` (times since
/// `held`).
pub(crate) fn streams(target: SocketAddr, n: usize, max: Duration) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(greeted(target, false).await?);
        }
        println!("held {n}");
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for mut c in conns {
            set.spawn(async move {
                let mut line = String::new();
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    line.clear();
                    let r = async {
                        c.get_mut().write_all(b"ping\n").await?;
                        c.read_line(&mut line).await
                    }
                    .await;
                    match r {
                        Ok(0) => return (true, started.elapsed()),
                        Ok(_) => {}
                        Err(_) => return (false, started.elapsed()),
                    }
                }
            });
        }
        let (mut fin, mut reset, mut times) = (0, 0, Vec::new());
        let _ = tokio::time::timeout(max, async {
            while let Some(Ok((clean, at))) = set.join_next().await {
                if clean {
                    fin += 1;
                } else {
                    reset += 1;
                }
                times.push(at.as_millis());
            }
        })
        .await;
        println!(
            "fin={fin} reset={reset} open={} first_end_ms={} last_end_ms={}",
            n - fin - reset,
            times.iter().min().copied().unwrap_or(0),
            times.iter().max().copied().unwrap_or(0)
        );
        Ok(())
    })
}

/// How `churn` paces and reports its connections.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pace {
    /// New connections per second at most (`None`: one after another).
    pub(crate) rate: Option<u32>,
    /// Print `ok <name>` for each connection (the first word of its greeting: the pod's name).
    pub(crate) each: bool,
}

/// Opens short connections to `to` one after another (connect, read the greeting, close) until
/// `stop` exists or `max` passes; returns (succeeded, failed) and prints each failure.
pub(crate) fn churn(
    to: SocketAddr,
    stop: &std::path::Path,
    max: Duration,
    pace: Pace,
) -> (u64, u64) {
    use std::io::BufRead;
    let start = Instant::now();
    let end = start + max;
    let (mut ok, mut failed) = (0u64, 0u64);
    while !stop.exists() && Instant::now() < end {
        if let Some(rate) = pace.rate.filter(|r| *r > 0) {
            // The next connection is due at (connections so far) / rate after the start.
            let due = start + Duration::from_secs_f64((ok + failed) as f64 / f64::from(rate));
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if Instant::now() >= end {
                break;
            }
        }
        let attempt = (|| -> std::io::Result<String> {
            let s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut line = String::new();
            std::io::BufReader::new(&s).read_line(&mut line)?;
            if line.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed before the greeting",
                ));
            }
            Ok(line)
        })();
        match attempt {
            Ok(line) => {
                ok += 1;
                if pace.each {
                    println!("ok {}", line.split_whitespace().next().unwrap_or("?"));
                }
            }
            Err(e) => {
                failed += 1;
                eprintln!("attempt {} failed: {e}", ok + failed);
            }
        }
    }
    (ok, failed)
}

/// Through Ferry from this pod: bulk (echoed) throughput and 1 KiB round trips to `near` and to
/// `far`, in the same run. Returns ((GB/s, p50 us, p99 us) near, the same far).
pub(crate) fn paths(
    near: SocketAddr,
    far: SocketAddr,
    mib: usize,
    round_trips: usize,
) -> anyhow::Result<[(f64, f64, f64); 2]> {
    runtime()?.block_on(async move {
        let mut out = [(0.0, 0.0, 0.0); 2];
        for (i, to) in [near, far].into_iter().enumerate() {
            let s = greeted(to, false).await?;
            let (mut r, mut w) = tokio::io::split(s);
            let total = mib << 20;
            let start = Instant::now();
            let reader = tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut got = 0;
                while got < total {
                    let n = r.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                Ok::<_, std::io::Error>((r, got))
            });
            let chunk = vec![0x5au8; 256 * 1024];
            for _ in 0..(total / chunk.len()) {
                w.write_all(&chunk).await?;
            }
            let (r, got) = reader.await??;
            let gbps = got as f64 / start.elapsed().as_secs_f64() / 1e9;
            let (p50, p99) = timed_round_trips(&mut r.unsplit(w), round_trips, 1024).await?;
            out[i] = (gbps, p50, p99);
        }
        Ok(out)
    })
}

/// Sends `requests` keep-alive `GET`s on one connection to each of `paths` (label, target,
/// direct) in turn and prints requests per second and p50/p99 latency, each against the first
/// path (the baseline) in the same run.
pub(crate) fn http_bench(
    paths: &[(String, SocketAddr, bool)],
    requests: usize,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut base: Option<(f64, f64, f64)> = None;
        for (label, to, direct) in paths {
            let mut s = BufReader::new(dial(*to, *direct).await?);
            let req = format!("GET /bench HTTP/1.1\r\nHost: {to}\r\n\r\n");
            let mut lat = Vec::with_capacity(requests);
            let start = Instant::now();
            for _ in 0..requests {
                let t = Instant::now();
                s.get_mut().write_all(req.as_bytes()).await?;
                let status = read_response(&mut s).await?;
                anyhow::ensure!(status == 200, "{label}: status {status}");
                lat.push(t.elapsed());
            }
            let rps = requests as f64 / start.elapsed().as_secs_f64();
            let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
            let (b_rps, b50, b99) = *base.get_or_insert((rps, p50, p99));
            println!(
                "{label:<34} {rps:>9.0} req/s ({:.2}x)  p50 {p50:>7.1} us (+{:.1})  p99 {p99:>7.1} us (+{:.1})",
                rps / b_rps,
                p50 - b50,
                p99 - b99
            );
        }
        Ok(())
    })
}

/// Reads one HTTP/1.1 response with a `content-length` body; returns its status.
async fn read_response(s: &mut BufReader<TcpStream>) -> anyhow::Result<u16> {
    let mut line = String::new();
    s.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP status line: {line:?}"))?;
    let mut len = 0usize;
    loop {
        line.clear();
        if s.read_line(&mut line).await? == 0 {
            anyhow::bail!("the connection closed mid-response");
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().context("content-length")?;
        }
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(status)
}
