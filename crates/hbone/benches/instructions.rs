//! The data-path cost gate (issue 21): instructions per unit of tunnel work, counted by callgrind
//! (exact, and the same on a busy machine as on an idle one), against the committed baseline
//! `benches/instructions.baseline`. A figure more than [`MARGIN_PERCENT`] over its baseline
//! fails, so the data path's speed cannot rot silently; one that far under it is reported, so the
//! baseline can be lowered.
//!
//! Run: `cargo bench -p ferry-hbone --bench instructions` (needs `valgrind`, the Debian package).
//! `FERRY_INSTRUCTIONS_UPDATE=1` writes the figures measured as the new baseline.
//!
//! The figures, on loopback with real TLS 1.3 (aws-lc-rs), HTTP/2 and sockets:
//! - `bulk_per_mib`: a TCP connection relayed into a pooled tunnel as a node proxy's outbound
//!   does, through the HBONE server and its relay to a sink (both proxies' work, per MiB);
//! - `rr_1kib`: a 1 KiB round trip through a pooled tunnel to an echo target;
//! - `pooled_stream`: a new stream on a warm pooled connection: open, one byte there and back,
//!   clean close (the server's TCP connect to the target included);
//! - `new_connection`: the same on a new HBONE connection (TCP, mutual TLS 1.3, HTTP/2).
//!
//! What is counted, and what is not. Every end (the senders, both tunnel ends, the targets)
//! runs on one single-threaded tokio runtime inside the figure's function, so what each figure
//! sets off is counted, in user space, but for what is still pending when its loop ends (the
//! server's side of the last close, a few frames: counted in the next figure, or not at all;
//! every tunnel here is closed cleanly). This gate sees code, not the kernel's work in the
//! system calls (which `ferry lab bench` measures as CPU time). A figure that makes more system
//! calls costs more instructions around them, so a change in how often the data path calls
//! the kernel shows here too. The allocator is jemalloc, as in the `ferry` binary. Each figure's
//! work is warmed first (the pooled connection open, the first-use allocations made).
//!
//! The counts depend on the compiler, aws-lc's code paths (chosen by the CPU features valgrind
//! reports) and the dependencies' versions; a toolchain or dependency change may move them, and
//! the baseline is rewritten then. Runs differ by a little: the pool's maps hash with random
//! keys and a read may find a different number of bytes ready.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use ferry_gate::{Figure, Gate};
use ferry_hbone::client::{Connection, DirectDialer};
use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::pool::{Pool, PoolKey};
use ferry_hbone::settings::Settings;
use ferry_tls::config::{Credentials, TrustBundle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;

mod support;
use support::rig::{Env, echo, echo_once, outbound, send_all, sink, tunnel};
use support::{SERVER, id};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How far over its baseline a figure may go before the gate fails (the margin).
const MARGIN_PERCENT: u64 = 25;

/// Relayed connections in the bulk figure, and MiB each carries.
const BULK_CONNS: u64 = 2;
const BULK_MIB: u64 = 16;
const ROUND_TRIPS: u64 = 1_000;
const STREAMS: u64 = 200;
const CONNECTIONS: u64 = 20;

const FIGURES: [Figure; 4] = [
    Figure {
        name: "bulk_per_mib",
        function: "instructions::count_bulk",
        units: BULK_CONNS * BULK_MIB,
    },
    Figure {
        name: "rr_1kib",
        function: "instructions::count_round_trips",
        units: ROUND_TRIPS,
    },
    Figure {
        name: "pooled_stream",
        function: "instructions::count_streams",
        units: STREAMS,
    },
    Figure {
        name: "new_connection",
        function: "instructions::count_connections",
        units: CONNECTIONS,
    },
];

fn main() -> ExitCode {
    if ferry_gate::is_child() {
        tunnel_work();
        return ExitCode::SUCCESS;
    }
    let gate = Gate {
        title: "instructions per unit of tunnel work (loopback, TLS 1.3, HTTP/2; every end on one thread)".into(),
        figures: &FIGURES,
        baseline: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/instructions.baseline"),
        how: "Instructions per unit of tunnel work: `cargo bench -p ferry-hbone --bench instructions`.\nWritten with FERRY_INSTRUCTIONS_UPDATE=1; see benches/instructions.rs.",
        margin_percent: MARGIN_PERCENT,
    };
    gate.exit_code()
}

/// Everything a figure's work needs, set up outside the counted functions.
struct Rig {
    env: Env,
    pool: Pool,
    key: PoolKey,
    creds: Credentials,
    bundle: TrustBundle,
    /// The outbound relay into tunnels to the sink.
    relay: SocketAddr,
    echo: SocketAddr,
}

/// The child: sets the rig up once, warms each figure's work, then does it inside its counted
/// function.
fn tunnel_work() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let rig = rt.block_on(async {
        let env = Env::new().await;
        let (pool, key, creds) = env.pool(1_000_000);
        let bundle = env.ca.bundle();
        let relay = outbound(&env, sink().await).await;
        let echo = echo().await;
        Rig {
            env,
            pool,
            key,
            creds,
            bundle,
            relay,
            echo,
        }
    });
    rt.block_on(async {
        bulk(&rig, 1, 4).await;
        round_trips(&rig, 20).await;
        streams(&rig, 20).await;
        connections(&rig, 2).await;
    });
    count_bulk(&rt, &rig);
    count_round_trips(&rt, &rig);
    count_streams(&rt, &rig);
    count_connections(&rt, &rig);
}

#[inline(never)]
fn count_bulk(rt: &Runtime, rig: &Rig) {
    rt.block_on(bulk(rig, BULK_CONNS, BULK_MIB));
}

#[inline(never)]
fn count_round_trips(rt: &Runtime, rig: &Rig) {
    rt.block_on(round_trips(rig, ROUND_TRIPS));
}

#[inline(never)]
fn count_streams(rt: &Runtime, rig: &Rig) {
    rt.block_on(streams(rig, STREAMS));
}

#[inline(never)]
fn count_connections(rt: &Runtime, rig: &Rig) {
    rt.block_on(connections(rig, CONNECTIONS));
}

/// `conns` connections to the outbound relay, one after another, each carrying `mib` MiB to
/// the sink.
async fn bulk(rig: &Rig, conns: u64, mib: u64) {
    for _ in 0..conns {
        let mut s = TcpStream::connect(rig.relay).await.expect("the relay");
        s.set_nodelay(true).expect("nodelay");
        send_all(&mut s, (mib << 20) as usize).await;
    }
}

async fn round_trips(rig: &Rig, n: u64) {
    let mut t = tunnel(&rig.pool, &rig.key, &rig.creds, &rig.bundle, rig.echo).await;
    let msg = [0x42u8; 1024];
    let mut back = [0u8; 1024];
    for _ in 0..n {
        t.write_all(&msg).await.expect("write");
        t.read_exact(&mut back).await.expect("read");
    }
    t.shutdown().await.expect("shutdown");
    assert_eq!(t.read(&mut back).await.expect("read the end"), 0, "the end");
}

async fn streams(rig: &Rig, n: u64) {
    for _ in 0..n {
        let mut t = tunnel(&rig.pool, &rig.key, &rig.creds, &rig.bundle, rig.echo).await;
        echo_once(&mut t).await;
    }
}

async fn connections(rig: &Rig, n: u64) {
    let target = rig.echo.to_string();
    for _ in 0..n {
        let c = Connection::connect(
            &DirectDialer,
            None,
            rig.env.hbone,
            &rig.creds,
            &rig.bundle,
            vec![id(SERVER)],
            &Settings::default(),
        )
        .await
        .expect("a new HBONE connection");
        let mut t = c
            .open(&target, &ConnectHeaders::default())
            .await
            .expect("a tunnel");
        echo_once(&mut t).await;
    }
}
