//! A route's redirect (the Gateway API's `RequestRedirect`): the waypoint answers an authorized
//! request itself with a 301 or 302 and its `Location`, and connects to no backend. The answer
//! is the waypoint's own, like its 403 and 503: the route's response header edits do not apply
//! (they edit a backend's response).

/// A decided redirect (answered by [`crate::upstream::redirect_response`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// 301 or 302.
    pub status: u16,
    /// `None`: the request cannot make one (its `Host` or path,
    /// [`ferry_core::model::RequestRedirect::location`]).
    pub location: Option<String>,
}
