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
    /// `None`: the request cannot make one (its `Host` or path,
    /// [`ferry_core::model::RequestRedirect::location`]).
    pub location: Option<String>,
}

/// The response for `r`; a `400` when the request made no `Location`, or one that is no valid
/// header value (never a panic).
pub(crate) fn response(r: &Redirect) -> Result<Response<Body>, Response<Body>> {
    let (Ok(status), Some(Ok(location))) = (
        StatusCode::from_u16(r.status),
        r.location.as_deref().map(HeaderValue::from_str),
    ) else {
        return Err(plain(StatusCode::BAD_REQUEST, "bad redirect location\n"));
    };
    let mut resp = plain(status, "");
    resp.headers_mut().remove(header::CONTENT_TYPE);
    resp.headers_mut().insert(header::LOCATION, location);
    Ok(resp)
}
