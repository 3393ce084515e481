//! A route's redirect (the Gateway API's `RequestRedirect`): the waypoint answers an authorized
//! request itself with a 301 or 302 and its `Location`, and connects to no backend. The answer
//! is the waypoint's own, like its 403 and 503: the route's response header edits do not apply
//! (they edit a backend's response).

use http::{HeaderValue, Response, StatusCode, header};

use crate::upstream::{Body, plain};

/// A decided redirect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// 301 or 302.
    pub status: u16,
    pub location: String,
}

/// The response for `r`; a `400` when its `Location` is no valid header value (a request
/// path the waypoint took in that is not one: never a panic).
pub(crate) fn response(r: &Redirect) -> Result<Response<Body>, Response<Body>> {
    let (Ok(status), Ok(location)) = (
        StatusCode::from_u16(r.status),
        HeaderValue::from_str(&r.location),
    ) else {
        return Err(plain(StatusCode::BAD_REQUEST, "bad redirect location\n"));
    };
    let mut resp = plain(status, "");
    resp.headers_mut().remove(header::CONTENT_TYPE);
    resp.headers_mut().insert(header::LOCATION, location);
    Ok(resp)
}
