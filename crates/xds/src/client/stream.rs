//! The delta ADS stream over a tonic `Channel`, without tonic's `Streaming` on the way in.
//!
//! The requests are framed as tonic frames them ([`framing::frame`]); the responses are read a
//! message at a time ([`framing::Deframer`]), each in a buffer of its own that is dropped once
//! decoded, so that a node does not keep its largest push's size for the stream's life (tonic's
//! decoder does: see the framing module). The rest is gRPC's as tonic's client does it: the
//! method's path, `te: trailers`, `application/grpc`, a trailers-only status in the response's
//! headers, and the status in its trailers.

use std::convert::Infallible;

use bytes::Bytes;
use ferry_api::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue, TE};
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::GrpcService;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::framing::{self, Deframer};

/// The delta ADS method.
const PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The largest response a node accepts (what its tonic client was given).
pub(super) const MAX_MESSAGE: usize = 200 << 20;

/// The credentials a stream is opened with.
pub(super) struct Metadata<'a> {
    pub token: &'a str,
    pub cluster: &'a str,
}

/// Opens the stream on `channel`, sending each request from `requests`; returns the responses'
/// reader, or the status the control plane refused it with.
pub(super) async fn open(
    mut channel: Channel,
    requests: mpsc::Receiver<DeltaDiscoveryRequest>,
    metadata: Metadata<'_>,
) -> Result<Inbound, Status> {
    let frames = ReceiverStream::new(requests).filter_map(|r| match framing::frame(&r) {
        Some(bytes) => Some(Ok::<_, Infallible>(Frame::data(bytes))),
        None => {
            tracing::error!(type_url = %r.type_url, "a request over gRPC's 4 GiB limit is not sent");
            None
        }
    });
    let mut request = http::Request::new(tonic::body::Body::new(StreamBody::new(frames)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static(PATH);
    *request.version_mut() = http::Version::HTTP_2;
    let headers = request.headers_mut();
    headers.insert(TE, HeaderValue::from_static("trailers"));
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    if let Ok(v) = HeaderValue::try_from(format!("Bearer {}", metadata.token)) {
        headers.insert("authorization", v);
    }
    if let Ok(v) = HeaderValue::try_from(metadata.cluster) {
        headers.insert("clusterid", v);
    }
    std::future::poll_fn(|cx| GrpcService::<tonic::body::Body>::poll_ready(&mut channel, cx))
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let response = GrpcService::call(&mut channel, request)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let (parts, body) = response.into_parts();
    let mut inbound = Inbound {
        body,
        deframer: Deframer::new(MAX_MESSAGE),
        pending: Bytes::new(),
        done: false,
    };
    // Trailers-only: the stream is over before it began.
    if let Some(status) = status_of(&parts.headers) {
        if status.code() != Code::Ok {
            return Err(status);
        }
        inbound.done = true;
        return Ok(inbound);
    }
    if parts.status != http::StatusCode::OK {
        return Err(from_http(parts.status));
    }
    let content_type = parts.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
    if !content_type.is_some_and(|t| t.starts_with(b"application/grpc")) {
        return Err(Status::unknown(format!(
            "the response's content-type is {:?}, not application/grpc",
            content_type.map(String::from_utf8_lossy)
        )));
    }
    Ok(inbound)
}

/// The responses of one stream.
pub(super) struct Inbound {
    body: tonic::body::Body,
    deframer: Deframer,
    /// What is left of the last data frame.
    pending: Bytes,
    /// The stream ended with status OK.
    done: bool,
}

impl Inbound {
    /// The next response; `None` once the control plane ended the stream with status OK.
    pub(super) async fn message(&mut self) -> Result<Option<DeltaDiscoveryResponse>, Status> {
        loop {
            if self.done {
                return Ok(None);
            }
            let next = self.deframer.next_message(&mut self.pending);
            if let Some(message) = next.map_err(|e| Status::new(e.code(), e.to_string()))? {
                // The message's buffer is dropped here, decoded.
                return DeltaDiscoveryResponse::decode(message)
                    .map(Some)
                    .map_err(|e| Status::internal(e.to_string()));
            }
            let frame = match self.body.frame().await {
                Some(frame) => frame?,
                None => {
                    self.ended()?;
                    return Err(missing_status());
                }
            };
            match frame.into_data() {
                Ok(data) => self.pending = data,
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    self.ended()?;
                    match status_of(&trailers) {
                        Some(s) if s.code() == Code::Ok => self.done = true,
                        Some(s) => return Err(s),
                        None => return Err(missing_status()),
                    }
                }
            }
        }
    }

    /// The body ended: it must have ended between messages.
    fn ended(&self) -> Result<(), Status> {
        self.deframer
            .finish()
            .map_err(|e| Status::new(e.code(), e.to_string()))
    }
}

/// The status in `headers`' `grpc-status` and `grpc-message`, if any (the binary details are
/// left out: tonic panics on ones that are not base64).
fn status_of(headers: &HeaderMap) -> Option<Status> {
    let mut only = HeaderMap::new();
    for name in ["grpc-status", "grpc-message"] {
        if let Some(v) = headers.get(name) {
            only.insert(name, v.clone());
        }
    }
    Status::from_header_map(&only)
}

fn missing_status() -> Status {
    Status::unknown(
        "protocol error: missing grpc-status trailer, stream was terminated without a final status",
    )
}

/// A response with no gRPC status, by its HTTP status (gRPC's mapping, as tonic does it).
fn from_http(status: http::StatusCode) -> Status {
    let code = match status {
        http::StatusCode::BAD_REQUEST => Code::Internal,
        http::StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        http::StatusCode::FORBIDDEN => Code::PermissionDenied,
        http::StatusCode::NOT_FOUND => Code::Unimplemented,
        http::StatusCode::TOO_MANY_REQUESTS
        | http::StatusCode::BAD_GATEWAY
        | http::StatusCode::SERVICE_UNAVAILABLE
        | http::StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(
        code,
        format!(
            "grpc-status header missing, mapped from HTTP status code {}",
            status.as_u16()
        ),
    )
}
