//! Sockets inside a pod's network namespace.
//!
//! A socket belongs to the namespace of the thread that created it. Each enrolled pod gets one
//! long-lived thread that has entered the pod's namespace; the node proxy asks it for listeners
//! (and anything else that must run there), then drives them from its own runtime. Outgoing
//! sockets, one per connection, are created on the calling thread instead, which enters the
//! pod's namespace for the `socket()` call alone ([`here`]): no hop to the namespace's thread
//! and back. Every socket the proxy opens in a pod carries [`MARK`], which the pod's capture
//! rules let through untouched.

mod here;

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use socket2::{Domain, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The packet mark on every socket the node proxy opens in a pod (Istio's 0x539).
pub const MARK: u32 = 0x539;

type Job = Box<dyn FnOnce() + Send>;

/// A worker thread living in one network namespace.
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    /// The namespace's identity (device and inode of its nsfs file) when it was entered.
    id: (u64, u64),
    /// For a namespace handed over as a descriptor ([`Netns::from_fd`]): that descriptor, held
    /// for as long as this value lives, so that [`Netns::path`] (its `/proc/<pid>/fd/<n>` link)
    /// names this namespace and no other descriptor that might reuse the number.
    held: Option<File>,
    /// The namespace, for creating sockets in it on the calling thread ([`here`]).
    ns: File,
    jobs: std::sync::mpsc::Sender<Job>,
}

impl Netns {
    /// Enters the namespace at `path` (e.g. `/var/run/netns/NAME` or `/proc/PID/ns/net`).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        Self::enter(file, path.to_path_buf(), None)
    }

    /// Enters the namespace that `fd` refers to (one a node agent passed over a Unix socket),
    /// and keeps `fd` open for as long as this value lives. Its [`Netns::path`] is
    /// `/proc/<this pid>/fd/<fd>`, which other processes (`nsenter`) can open meanwhile.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> io::Result<Self> {
        use std::os::fd::AsRawFd;
        let held = File::from(fd);
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            held.as_raw_fd()
        ));
        let entered = held.try_clone()?;
        Self::enter(entered, path, Some(held))
    }

    /// The identity (device and inode of its nsfs file) of the namespace `file` refers to.
    pub fn id_of(file: &File) -> io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok((m.dev(), m.ino()))
    }

    /// The identity of the namespace entered (see [`Netns::id_of`]).
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// Whether this namespace was handed over as a descriptor ([`Netns::from_fd`]).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Starts the namespace's thread in the namespace `file` refers to.
    fn enter(file: File, path: PathBuf, held: Option<File>) -> io::Result<Self> {
        let id = Self::id_of(&file)?;
        let ns = file.try_clone()?;
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ferry-netns".into())
            .spawn(move || {
                let entered = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if ok {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("the namespace thread died"))??;
        Ok(Self {
            path,
            id,
            held,
            ns,
            jobs,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path now names another namespace than the one entered (the pod's namespace
    /// was deleted and created again under the same name). `false` if the path is gone.
    pub fn replaced(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        // A `/proc/<pid>/ns/net` path names another namespace once the pid is reused: that is
        // not the pod's namespace created again.
        !self.path.starts_with("/proc")
            && std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) != self.id)
    }

    /// Runs `f` on the namespace's thread.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| io::Error::other("the namespace thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("the namespace thread dropped the job"))
    }

    /// A listener on `addr` inside the namespace (`[::]` takes IPv4 too, as the system's
    /// default says).
    pub async fn listen(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        self.listen_with(addr, false).await
    }

    /// A listener on `addr` that takes `addr`'s family only: on `[::]`, IPv6 alone
    /// (`IPV6_V6ONLY`), beside an IPv4 listener of its own, so that an IPv4 peer is never seen
    /// as an IPv4-mapped IPv6 address.
    pub async fn listen_one_family(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        self.listen_with(addr, true).await
    }

    async fn listen_with(&self, addr: SocketAddr, one_family: bool) -> io::Result<TcpListener> {
        let l = self
            .run(move || crate::sockets::std_listener(addr, one_family))
            .await??;
        TcpListener::from_std(l)
    }

    /// A non-blocking TCP socket of `dst`'s family in this namespace, created on the calling
    /// thread (which is back in its own namespace when this returns).
    pub fn tcp_socket(&self, dst: SocketAddr) -> io::Result<Socket> {
        here::in_namespace(&self.ns, || {
            Socket::new(Domain::for_address(dst), Type::STREAM.nonblocking(), None)
        })
    }

    /// A marked connection from inside the namespace, optionally bound to `src`.
    pub async fn connect(&self, src: Option<IpAddr>, dst: SocketAddr) -> io::Result<TcpStream> {
        let s = self.tcp_socket(dst)?;
        s.set_mark(MARK)?;
        s.set_tcp_nodelay(true)?;
        if let Some(ip) = src {
            bind_port_at_connect(&s, ip)?;
        }
        // TCP_NODELAY, set before, holds on the connected socket.
        TcpSocket::from_std_stream(s.into()).connect(dst).await
    }

    /// A marked connection from inside the namespace whose source address is `src.ip()`,
    /// which need not be the namespace's own (`IP_TRANSPARENT`): a connection to the pod's
    /// app from the original client's address. The port is the kernel's pick, never
    /// `src.port()` (the client's own port, unless 0): plain TCP captured on its way to the same
    /// destination holds a conntrack entry for that pair, which a new connection with the same
    /// four addresses would be taken for. The pod's namespace must route the replies back to
    /// the socket (the node's original-source rules), or the connect times out.
    pub async fn connect_from(&self, src: SocketAddr, dst: SocketAddr) -> io::Result<TcpStream> {
        let open = || -> io::Result<Socket> {
            let s = self.tcp_socket(dst)?;
            s.set_mark(MARK)?;
            match dst {
                SocketAddr::V4(_) => s.set_ip_transparent_v4(true)?,
                SocketAddr::V6(_) => s.set_ip_transparent_v6(true)?,
            }
            s.set_tcp_nodelay(true)?;
            if src.port() == 0 {
                // No client port to step around: connect picks one.
                bind_port_at_connect(&s, src.ip())?;
            } else {
                s.bind(&SocketAddr::new(src.ip(), 0).into())?;
            }
            Ok(s)
        };
        let port = |s: &Socket| s.local_addr().ok().and_then(|a| a.as_socket());
        let first = open()?;
        let s = match port(&first) {
            // The first keeps its port until the second is bound: another one.
            Some(a) if src.port() != 0 && a.port() == src.port() => open()?,
            _ => first,
        };
        // TCP_NODELAY, set before, holds on the connected socket.
        TcpSocket::from_std_stream(s.into()).connect(dst).await
    }
}

/// Binds `s` to `ip` and leaves its port to `connect` (`IP_BIND_ADDRESS_NO_PORT`), which takes
/// one unused by the same four addresses. Bound to port 0 without it, the socket took a port
/// no other socket on `ip` held, whatever the destination: with many connections from one
/// client address (each left in TIME_WAIT for a minute by the proxy's close) the kernel's search
/// for a free port cost 14% of the node proxies' CPU in the lab's new-connection arm, and one
/// client address could hold no more connections than the ephemeral range has ports.
fn bind_port_at_connect(s: &Socket, ip: IpAddr) -> io::Result<()> {
    nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::IpBindAddressNoPort, &true)?;
    s.bind(&SocketAddr::new(ip, 0).into())
}

/// Dials tunnels from inside one network namespace (a waypoint's or a gateway's pod).
#[derive(Debug)]
pub struct NetnsDialer(pub std::sync::Arc<Netns>);

impl ferry_hbone::client::Dialer for NetnsDialer {
    fn dial(
        &self,
        _src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<tokio::net::TcpStream>> + Send + '_>,
    > {
        Box::pin(self.0.connect(None, dst))
    }
}
