//! `ferry control`: serve the mesh CA from a topology file; issue node credentials.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_ca::service::{CaService, Lifetimes};
use ferry_ca::signer::Ca;
use ferry_ca::token::NodeTokens;
use ferry_core::store::Store;

/// The name node proxies expect in the control plane's certificate.
pub(crate) const SERVER_NAME: &str = "ferry-control";

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ControlCommand {
    /// Serve the CA (gRPC over TLS) for the mesh a topology file describes.
    Serve(ServeArgs),
    /// Print the bootstrap credential of a node (give it to that node's proxy only).
    Token {
        #[arg(long, default_value = "ferry-state")]
        state_dir: PathBuf,
        #[arg(long)]
        node: String,
    },
    /// Print the trust bundle (PEM) node proxies verify peers and the control plane against.
    Bundle {
        #[arg(long, default_value = "ferry-state")]
        state_dir: PathBuf,
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Topology file: the mesh's source of truth.
    #[arg(long, short)]
    topology: PathBuf,
    /// Where the CA root, its key and the node-token secret live (created on first start).
    #[arg(long, default_value = "ferry-state")]
    state_dir: PathBuf,
    /// Address to serve on (port 0 picks one; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:15012")]
    listen: SocketAddr,
    /// Use this CA certificate and key instead of the state directory's own root.
    #[arg(long, requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// Extra roots (PEM) to keep trusting, e.g. the previous root during a rotation.
    #[arg(long)]
    extra_roots: Option<PathBuf>,
    /// Longest certificate lifetime granted, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    max_lifetime: u64,
    /// Where to serve Prometheus metrics (xDS pushes, ACKs, NACKs, refused streams).
    #[arg(long, default_value = "127.0.0.1:15014")]
    metrics_listen: SocketAddr,
    /// LOCAL EXPERIMENTS ONLY: serve without TLS, and xDS without node authentication.
    #[arg(long)]
    plaintext: bool,
}

pub(crate) fn run(cmd: ControlCommand) -> ExitCode {
    let result = match cmd {
        ControlCommand::Serve(args) => serve(&args),
        ControlCommand::Token { state_dir, node } => token(&state_dir, &node),
        ControlCommand::Bundle {
            state_dir,
            trust_domain,
        } => Ca::load_or_create(&state_dir, &trust_domain)
            .map(|ca| print!("{}", ca.bundle().concat()))
            .map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry control: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn token(state_dir: &Path, node: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let tokens = NodeTokens::load_or_create(&state_dir.join("node-token.key"))
        .context("node-token secret")?;
    println!("{}", tokens.issue(&node.into()));
    Ok(())
}

fn load_ca(args: &ServeArgs, trust_domain: &str) -> anyhow::Result<Ca> {
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(c), Some(k)) => {
            let cert =
                std::fs::read_to_string(c).with_context(|| format!("reading {}", c.display()))?;
            let key =
                std::fs::read_to_string(k).with_context(|| format!("reading {}", k.display()))?;
            Ca::from_pem(&cert, &key).map_err(|e| anyhow::anyhow!("{}: {e}", c.display()))?
        }
        _ => Ca::load_or_create(&args.state_dir, trust_domain)?,
    };
    Ok(match &args.extra_roots {
        Some(p) => {
            let pem =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            ca.with_extra_roots([pem])
        }
        None => ca,
    })
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let topology = ferry_topology::load_file(&args.topology)?;
    let ca = Arc::new(load_ca(args, &topology.trust_domain)?);
    std::fs::create_dir_all(&args.state_dir)?;
    let tokens = Arc::new(
        NodeTokens::load_or_create(&args.state_dir.join("node-token.key"))
            .context("node-token secret")?,
    );
    let store = Arc::new(Store::new(topology.snapshot));
    let lifetimes = Lifetimes {
        default: Duration::from_secs(args.max_lifetime),
        max: Duration::from_secs(args.max_lifetime),
    };
    let resources = Arc::new(ferry_xds::resources::ResourceSet::from_snapshot(
        &store.load(),
    ));
    let (res_tx, res_rx) = tokio::sync::watch::channel(resources);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        let (reload_tx, _reloads) =
            tokio::sync::watch::channel(ferry_xds::source::Reloads::default());
        tokio::spawn(ferry_xds::source::watch_file(
            args.topology.clone(),
            store.clone(),
            res_tx,
            Duration::from_millis(250),
            reload_tx,
        ));
        let xds =
            ferry_xds::server::XdsServer::new(res_rx, (!args.plaintext).then(|| tokens.clone()));
        let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
            .await
            .with_context(|| format!("binding the metrics address {}", args.metrics_listen))?;
        let metrics_addr = metrics_listener.local_addr()?;
        tokio::spawn(ferry_xds::metrics_http::serve(
            metrics_listener,
            xds.metrics(),
        ));
        let ca_service = CaService::new(ca.clone(), tokens, store, lifetimes).into_server();
        let mut builder = tonic::transport::Server::builder();
        if args.plaintext {
            tracing_warn_plaintext();
        } else {
            let ips = if addr.ip().is_unspecified() {
                vec![]
            } else {
                vec![addr.ip()]
            };
            let (chain, key) = ca
                .issue_server_cert(
                    &[SERVER_NAME.to_string()],
                    &ips,
                    Duration::from_secs(365 * 24 * 3600),
                )
                .map_err(|e| anyhow::anyhow!("control-plane certificate: {e}"))?;
            let tls = tonic::transport::ServerTlsConfig::new()
                .identity(tonic::transport::Identity::from_pem(chain, key));
            builder = builder.tls_config(tls)?;
        }
        if addr.port() == 0 {
            bail!("the kernel gave port 0");
        }
        let mode = if args.plaintext { "PLAINTEXT" } else { "TLS" };
        println!(
            "ferry control: serving the CA and xDS on {addr} ({mode}, server name {SERVER_NAME}); metrics on http://{metrics_addr}/metrics"
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        builder
            .add_service(ca_service)
            .add_service(xds.into_server())
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown_signal(),
            )
            .await?;
        Ok(())
    })
}

fn tracing_warn_plaintext() {
    eprintln!(
        "ferry control: WARNING: --plaintext: no TLS; xDS is served without node authentication. \
         Anyone who can reach this port can read the mesh's configuration, and node credentials \
         travel in clear. Use only for local experiments."
    );
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::future::pending().await;
    };

    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
