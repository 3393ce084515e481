//! `ferry lab craft` (hidden, inside the lab): a hand-made HBONE request. It gets a
//! certificate for an identity with a node credential, then CONNECTs to an authority through a
//! chosen address, and prints the outcome. The lab tests use it to knock on doors that the node
//! proxies would never open.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// One crafted request.
#[derive(Debug, clap::Args)]
pub struct Request {
    /// The control plane's CA (`https://...`).
    #[arg(long)]
    pub(crate) control: String,
    /// The node credential.
    #[arg(long)]
    pub(crate) token_file: PathBuf,
    #[arg(long)]
    pub(crate) bundle_file: PathBuf,
    /// The identity to get a certificate for.
    #[arg(long)]
    pub(crate) identity: String,
    /// Where to open the HBONE connection.
    #[arg(long)]
    pub(crate) to: SocketAddr,
    /// The identity the peer must present.
    #[arg(long)]
    pub(crate) peer_identity: String,
    /// The CONNECT authority.
    #[arg(long)]
    pub(crate) authority: String,
    /// The cluster the request claims in its baggage (sent as `clusterid` to the CA too, which
    /// ignores it: the certificate carries the cluster of the node whose credential asked).
    #[arg(long)]
    pub(crate) cluster: String,
    /// Dial the tunnel from this network namespace (a name under /run/netns) instead of the
    /// one the credential is fetched from.
    #[arg(long)]
    pub(crate) dial_netns: Option<String>,
}

/// Sends the request; prints `status 200: tunnel open` or `refused: <why>`.
pub(crate) fn run(req: Request) -> anyhow::Result<()> {
    let token = std::fs::read_to_string(&req.token_file)?;
    let bundle = std::fs::read_to_string(&req.bundle_file)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(send(req, token, bundle))
}

async fn send(req: Request, token: String, bundle: String) -> anyhow::Result<()> {
    use ferry_tls::ca_client::CertificateSource;
    let Request {
        control,
        identity,
        to,
        peer_identity,
        authority,
        cluster,
        dial_netns,
        ..
    } = req;
    let ca = ferry_tls::ca_client::GrpcCa::new(
        &control,
        &bundle,
        "ferry-control",
        token.trim().to_string(),
        cluster.clone(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let creds = ca
        .sign(&identity.parse()?, Duration::from_secs(3600))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let trust = ferry_tls::config::TrustBundle::from_pem(&bundle)?;
    let dialer: Box<dyn ferry_hbone::client::Dialer> = match dial_netns {
        Some(name) => Box::new(ferry_runtime::netns::NetnsDialer(std::sync::Arc::new(
            ferry_runtime::netns::Netns::open(&PathBuf::from("/run/netns").join(name))?,
        ))),
        None => Box::new(ferry_hbone::client::DirectDialer),
    };
    let conn = ferry_hbone::client::Connection::connect(
        dialer.as_ref(),
        None,
        to,
        &creds,
        &trust,
        vec![peer_identity.parse()?],
        &ferry_hbone::settings::Settings::default(),
    )
    .await?;
    let headers = ferry_hbone::headers::ConnectHeaders {
        baggage: vec![("k8s.cluster.name".into(), cluster)],
        ..Default::default()
    };
    match conn.open(&authority, &headers).await {
        Ok(_) => println!("status 200: tunnel open"),
        Err(e) => println!("refused: {e}"),
    }
    Ok(())
}
