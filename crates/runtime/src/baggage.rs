//! Ferry's own baggage keys on HBONE CONNECT requests.

/// Baggage key with which a node proxy says a tunnel carries plain TCP from outside the mesh
/// (sent under the destination's identity; honoured only from that identity).
pub const PLAINTEXT_KEY: &str = "ferry.source.plaintext";

/// Baggage key with which a waypoint tells the destination the original source's identity
/// (`none` for plain TCP from outside the mesh); read only from the destination's own waypoint.
pub const SOURCE_PRINCIPAL_KEY: &str = "ferry.source.principal";
