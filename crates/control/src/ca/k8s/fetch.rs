//! One HTTP(S) GET of a small JSON document (a discovery document, a key set), bounded in
//! time and size. Redirects are not followed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The largest document read.
pub const MAX_BYTES: usize = 1 << 20;

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: not an http:// or https:// URL")]
    Url { url: String },
    #[error("{url}: {what}")]
    Io { url: String, what: String },
    #[error("{url}: answered {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
}

/// GETs `url`; `tls` verifies an `https://` server.
pub async fn get(
    url: &str,
    tls: &Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<Bytes, FetchError> {
    tokio::time::timeout(timeout, get_unbounded(url, tls))
        .await
        .unwrap_or_else(|_| {
            Err(FetchError::Timeout {
                url: url.to_string(),
                timeout,
            })
        })
}

async fn get_unbounded(url: &str, tls: &Arc<rustls::ClientConfig>) -> Result<Bytes, FetchError> {
    let bad = || FetchError::Url {
        url: url.to_string(),
    };
    let io_err = |what: String| FetchError::Io {
        url: url.to_string(),
        what,
    };
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad()),
    };
    let host = uri.host().ok_or_else(bad)?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| io_err(format!("connect: {e}")))?;
    let authority = uri.authority().map(ToString::to_string).ok_or_else(bad)?;
    let path = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), ToString::to_string);
    if https {
        let name =
            ServerName::try_from(host.trim_matches(['[', ']']).to_string()).map_err(|_| bad())?;
        let io = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| io_err(format!("TLS: {e}")))?;
        request(io, &authority, &path, url).await
    } else {
        request(tcp, &authority, &path, url).await
    }
}

async fn request<IO>(io: IO, authority: &str, path: &str, url: &str) -> Result<Bytes, FetchError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io_err = |what: String| FetchError::Io {
        url: url.to_string(),
        what,
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| io_err(format!("HTTP: {e}")))?;
    let conn = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "key fetch connection");
        }
    });
    let req = http::Request::get(path)
        .header(http::header::HOST, authority)
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| io_err(format!("request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| io_err(format!("HTTP: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        conn.abort();
        return Err(FetchError::Status {
            url: url.to_string(),
            status: status.as_u16(),
        });
    }
    let body = Limited::new(resp.into_body(), MAX_BYTES)
        .collect()
        .await
        .map_err(|e| io_err(format!("body: {e}")))?
        .to_bytes();
    conn.abort();
    Ok(body)
}

/// The TLS client configuration for `https://` key sources: roots from `ca` (PEM), else the
/// system's bundle (`SSL_CERT_FILE`, or `/etc/ssl/certs/ca-certificates.crt`).
pub fn tls_config(ca: Option<&std::path::Path>) -> std::io::Result<Arc<rustls::ClientConfig>> {
    let path = match ca {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os("SSL_CERT_FILE").map_or_else(
            || std::path::PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            std::path::PathBuf::from,
        ),
    };
    let mut roots = rustls::RootCertStore::empty();
    match std::fs::read(&path) {
        Ok(pem) => {
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                // A bundle may hold a certificate rustls cannot use; the others still serve.
                let _ = roots.add(cert?);
            }
        }
        // Without a bundle only `http://` and file sources work; an `https://` fetch says why.
        Err(e) if ca.is_none() && e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ));
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
