//! Running out of file descriptors degrades instead of crashing or hanging: a connection that
//! cannot be accepted is refused at once (reset) and counted, and accepting resumes as soon as
//! descriptors are free again. One test in its own process: it lowers the process's limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_runtime::accept::Acceptor;
use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

fn open_fds() -> usize {
    // The directory handle itself is one of them while it is read.
    std::fs::read_dir("/proc/self/fd").unwrap().count() - 1
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn out_of_descriptors_refuses_and_counts_then_recovers() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    const HELD: usize = 8;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = Arc::new(Acceptor::default());
    let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    {
        let (acceptor, held) = (acceptor.clone(), held.clone());
        tokio::spawn(async move {
            loop {
                let (s, _) = acceptor.accept(&listener, "test").await;
                held.lock().push(s);
            }
        });
    }
    tokio::task::yield_now().await;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // Room for HELD client/server pairs, plus one more client socket, and no more.
    let limit = (open_fds() + 2 * HELD + 1) as u64;
    setrlimit(Resource::RLIMIT_NOFILE, limit, hard).unwrap();

    // Connect until the server runs out: the connection it cannot accept is reset at once (not
    // left hanging in the backlog) and counted. When the client side runs out first, one client
    // socket is closed, leaving exactly one descriptor free: for the next client.
    let mut clients = Vec::new();
    let mut extra = loop {
        assert!(clients.len() < 4 * HELD, "never ran out of descriptors");
        let c = match TcpStream::connect(addr).await {
            Ok(c) => c,
            Err(e) if e.raw_os_error() == Some(24) => {
                clients.pop();
                continue;
            }
            Err(e) => panic!("connect: {e}"),
        };
        let before = held.lock().len();
        until("an accept or a refusal", || {
            held.lock().len() > before || acceptor.refused_fd_limit.get() > 0
        })
        .await;
        if acceptor.refused_fd_limit.get() > 0 {
            break c;
        }
        clients.push(c);
    };
    let accepted = held.lock().len();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), extra.read(&mut buf))
        .await
        .expect("the refused client is told at once");
    assert!(
        matches!(&read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    assert_eq!(held.lock().len(), accepted);
    drop(extra);

    // Descriptors free again: accepting resumes.
    held.lock().pop();
    clients.pop();
    let _back = TcpStream::connect(addr).await.unwrap();
    until("accepting to resume", || held.lock().len() == accepted).await;
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
}
