//! The lab's gRPC app and client: every pod serves `grpc.health.v1.Health` (tonic-health) on
//! [`GRPC_PORT`], with [`SERVING`] known and serving; `ferry lab grpc <pod> <ip:port>
//! [service]` makes one `Check` from a pod and prints the call's status and the metadata that
//! came back (headers and trailers), so a test sees `grpc-status` travel in the trailers.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The gRPC port every lab pod serves (HTTP/2 only, as any gRPC server).
pub(crate) const GRPC_PORT: u16 = 50051;

/// The service the pods' health server knows, and reports serving.
pub(crate) const SERVING: &str = "ferry.lab.Echo";

/// How long one call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `grpc.health.v1.Health` on `l` until the process ends.
pub(crate) async fn serve(l: tokio::net::TcpListener) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(SERVING, tonic_health::ServingStatus::Serving)
        .await;
    let served = tonic::transport::Server::builder()
        .add_service(health)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l))
        .await;
    if let Err(e) = served {
        eprintln!("grpc server on port {GRPC_PORT} ended: {e}");
    }
}

/// `ferry lab grpc-check` (inside the lab): one `Check` of `service` at `to`, on `rt`. Prints
/// `grpc-status: <code> (<name>)`, then `grpc-message: ...` for an error or `serving: <status>`
/// for an answer, then one `metadata <name>: <value>` line per header and trailer that came
/// back. Exit code 0 for `OK`, 1 for any other status, 2 when no call could be made.
pub(crate) fn check(
    rt: &tokio::runtime::Runtime,
    to: SocketAddr,
    service: &str,
) -> anyhow::Result<ExitCode> {
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{to}"))
            .context("the target")?
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect()
            .await
            .with_context(|| format!("connecting to {to}"))?;
        let asked = HealthCheckRequest {
            service: service.to_string(),
        };
        let (code, metadata) = match HealthClient::new(channel).check(asked).await {
            Ok(answer) => {
                let serving = ServingStatus::try_from(answer.get_ref().status)
                    .map_or("(unknown value)", |s| s.as_str_name());
                println!("grpc-status: 0 (OK)");
                println!("serving: {serving}");
                (tonic::Code::Ok, answer.metadata().clone())
            }
            Err(status) => {
                println!(
                    "grpc-status: {} ({:?})",
                    i32::from(status.code()),
                    status.code()
                );
                println!("grpc-message: {}", status.message());
                (status.code(), status.metadata().clone())
            }
        };
        for kv in metadata.iter() {
            if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
                println!("metadata {k}: {}", v.to_str().unwrap_or("(not text)"));
            }
        }
        Ok(ExitCode::from(u8::from(code != tonic::Code::Ok)))
    })
}
