//! The ADS route as served: requests decoded by tonic, responses framed by
//! [`super::framing`] and sent as the stream's task hands them over, a chunk at a time (see
//! there for why not tonic's encoder). Any other method of the service is `UNIMPLEMENTED`, as
//! tonic's generated server answers it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use ferry_api::discovery::DeltaDiscoveryRequest;
use http_body::Frame;
use tokio::sync::mpsc;
use tonic::Status;
use tonic::codec::{BufferSettings, Streaming};
use tonic::server::NamedService;

use super::{MAX_REQUEST_BYTES, XdsServer};

/// The one method of the service Ferry serves.
pub const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The aggregated discovery service: `DeltaAggregatedResources` on [`XdsServer`].
#[derive(Debug, Clone)]
pub struct AdsService {
    pub(super) xds: XdsServer,
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> tower_service::Service<http::Request<B>> for AdsService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        std::future::ready(Ok(self.answer(request).unwrap_or_else(Status::into_http)))
    }
}

impl AdsService {
    fn answer<B>(
        &self,
        request: http::Request<B>,
    ) -> Result<http::Response<tonic::body::Body>, Status>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if request.uri().path() != DELTA_PATH {
            return Err(Status::unimplemented(format!(
                "{} is not served; Ferry serves {DELTA_PATH}",
                request.uri().path()
            )));
        }
        // Nothing is compressed: this server accepts no compression (as tonic's server did
        // when none was enabled).
        if let Some(e) = request.headers().get("grpc-encoding")
            && e.as_bytes() != b"identity"
        {
            return Err(Status::unimplemented(format!(
                "grpc-encoding {} is not accepted (only identity)",
                String::from_utf8_lossy(e.as_bytes())
            )));
        }
        let (parts, body) = request.into_parts();
        let inbound = Streaming::new_request(
            tonic_prost::ProstDecoder::<DeltaDiscoveryRequest>::new(BufferSettings::default()),
            body,
            None,
            Some(MAX_REQUEST_BYTES),
        );
        let request = tonic::Request::from_http(http::Request::from_parts(parts, inbound));
        let chunks = self.xds.open(request)?;
        let mut response = http::Response::new(tonic::body::Body::new(GrpcBody {
            chunks,
            ended: false,
        }));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        Ok(response)
    }
}

/// A response stream's body: the framed chunks the stream's task sends, then `grpc-status: 0`
/// once it ends (the node hung up, or the server is shutting down).
struct GrpcBody {
    chunks: mpsc::Receiver<Bytes>,
    ended: bool,
}

impl http_body::Body for GrpcBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match self.chunks.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            Poll::Ready(None) => {
                self.ended = true;
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
