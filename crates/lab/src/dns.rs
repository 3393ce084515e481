//! DNS in the lab: `ferry lab dig` (a query from a pod, as a stub resolver sends it) and the
//! upstream resolver it reaches for names outside the mesh (`ferry lab dns-upstream`, which the
//! lab starts in each pod labelled [`UPSTREAM_LABEL`]).
//!
//! A pod whose workload says `dns_capture: true` has its queries answered by its node proxy for
//! mesh names and forwarded to the node's `--dns-upstream` for others; in a pod without it, the
//! same query reaches the server it is sent to, which knows only [`ZONE`].

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::session::netns_of;
use crate::state::State;

/// The label of a workload whose pod runs the lab's upstream resolver (besides its echo app).
pub(crate) const UPSTREAM_LABEL: (&str, &str) = ("ferry.dev/lab-app", "dns-upstream");

/// The zone the lab's upstream resolver serves: names outside the mesh. Its addresses are
/// answers only; nothing in the lab connects to them.
pub(crate) const ZONE: &str = "\
$ORIGIN outside.test.
@    60 IN SOA ns.outside.test. admin.outside.test. 1 3600 600 86400 60
@    60 IN NS  ns
ns   60 IN A   198.18.200.53
www  60 IN A   198.18.200.80
www  60 IN AAAA 2001:db8::80
_http._tcp 60 IN SRV 10 5 80 www
";

/// How long `dig` waits for each answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// One `dig`: what to ask, where, how, and how many times.
#[derive(Debug)]
pub(crate) struct Ask {
    pub(crate) name: String,
    pub(crate) record_type: String,
    pub(crate) server: SocketAddr,
    /// Over TCP from the start.
    pub(crate) tcp: bool,
    /// Asked this many times, one after another (more than one: the round trips' percentiles
    /// are printed instead of the records).
    pub(crate) count: u32,
}

/// `ferry lab dig <pod> <name>`: `query` inside `pod`'s namespace.
pub(crate) fn dig(state_dir: &Path, pod: &str, ask: &Ask) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, pod)?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args(["lab", "dns-query", &ask.name, "--type", &ask.record_type])
        .args(["--server", &ask.server.to_string()])
        .args(["--count", &ask.count.to_string()])
        .args(ask.tcp.then_some("--tcp"))
        .status()?;
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

/// `ferry lab dns-query` (inside a pod): a query as a stub resolver sends it (a fresh id,
/// recursion desired, EDNS with a 1232-byte payload) over UDP to the server, from a socket of
/// its own, and again over TCP if the answer comes back truncated (with `tcp`, over TCP at
/// once). Prints `rcode <RCODE> via <udp|tcp>`, then each answer record on its own line; asked
/// `count` times, prints the round trips' percentiles and the last answer code instead.
pub(crate) fn query(ask: &Ask) -> anyhow::Result<ExitCode> {
    let ty: RecordType = ask
        .record_type
        .to_ascii_uppercase()
        .parse()
        .with_context(|| format!("record type {:?}", ask.record_type))?;
    let name = Name::from_ascii(&ask.name).with_context(|| format!("name {:?}", ask.name))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut took = Vec::new();
    let mut last = None;
    for _ in 0..ask.count {
        let mut m = Message::new(rand_id(), MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(name.clone(), ty));
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        m.set_edns(edns);
        let bytes = m.to_vec()?;
        let started = Instant::now();
        let (answer, via) = rt.block_on(exchange(ask.server, &bytes, ask.tcp))?;
        took.push(started.elapsed());
        if answer.metadata.id != m.metadata.id {
            bail!(
                "the answer's id {} is not the query's {}",
                answer.metadata.id,
                m.metadata.id
            );
        }
        last = Some((answer, via));
    }
    let Some((answer, via)) = last else {
        bail!("no query asked");
    };
    println!("rcode {} via {via}", answer.metadata.response_code);
    if ask.count == 1 {
        for r in &answer.answers {
            println!("{r}");
        }
    } else {
        took.sort_unstable();
        let at = |q: usize| took[(took.len() - 1) * q / 100].as_micros();
        println!(
            "{} queries one after another: p50 {} us, p90 {} us, p99 {} us, max {} us",
            took.len(),
            at(50),
            at(90),
            at(99),
            at(100)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One query and its answer: over UDP, then TCP if truncated; over TCP at once with `tcp`.
async fn exchange(
    server: SocketAddr,
    bytes: &[u8],
    tcp: bool,
) -> anyhow::Result<(Message, &'static str)> {
    if !tcp {
        let a = over_udp(server, bytes).await?;
        if !a.metadata.truncation {
            return Ok((a, "udp"));
        }
    }
    Ok((over_tcp(server, bytes).await?, "tcp"))
}

fn rand_id() -> u16 {
    // The low bits of the clock and the pid: a fresh id per query, as a stub picks one.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id()) as u16
}

async fn over_udp(server: SocketAddr, query: &[u8]) -> anyhow::Result<Message> {
    let unspecified: IpAddr = match server {
        SocketAddr::V4(_) => [0, 0, 0, 0].into(),
        SocketAddr::V6(_) => [0u16; 8].into(),
    };
    let s = UdpSocket::bind((unspecified, 0)).await?;
    s.connect(server).await?;
    s.send(query).await?;
    let mut buf = vec![0u8; 65_535];
    let n = tokio::time::timeout(ANSWER_TIMEOUT, s.recv(&mut buf))
        .await
        .with_context(|| format!("no answer from {server} over UDP"))??;
    Ok(Message::from_vec(&buf[..n])?)
}

async fn over_tcp(server: SocketAddr, query: &[u8]) -> anyhow::Result<Message> {
    let exchange = async {
        let mut s = TcpStream::connect(server).await?;
        let len = u16::try_from(query.len())?.to_be_bytes();
        s.write_all(&[&len[..], query].concat()).await?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await?;
        let mut a = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut a).await?;
        anyhow::Ok(Message::from_vec(&a)?)
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .with_context(|| format!("no answer from {server} over TCP"))?
}

/// `ferry lab dns-upstream` (inside a pod): serves [`ZONE`] on `listen`, UDP and TCP, until
/// stopped.
pub(crate) fn upstream(listen: SocketAddr) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let server = ferry_runtime::dns_server::ZoneServer::start(&[ZONE], listen).await?;
        eprintln!("serving outside.test on {} (UDP and TCP)", server.addr);
        server.run().await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
