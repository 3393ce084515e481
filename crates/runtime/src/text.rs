//! A field of a connection's access-log line and record, held as it was found (an address, a
//! name shared with the snapshot, a fixed word) and written out as text only when the line is.
//!
//! A connection keeps its log fields for as long as it lives: held as `String`s they were a
//! dozen small allocations per idle connection (issue 21), for text nobody reads until the
//! connection ends.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use ferry_core::identity::Identity;
use ferry_core::model::{ClusterId, WorkloadUid};

/// A log field's text. Displays as the text it stands for; [`Text::Empty`] as nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Text {
    /// Not known, or not applicable: written as an empty string.
    #[default]
    Empty,
    /// A fixed word ("hbone", "outbound").
    Static(&'static str),
    /// A string shared with what it came from (a snapshot's name or identity): a reference
    /// count, not a copy.
    Shared(Arc<str>),
    /// Text built for this connection (a waypoint's path, a decision's summary).
    Owned(Box<str>),
    /// A socket address, written as `ip:port` (`[ip]:port` for IPv6).
    Addr(SocketAddr),
    /// A W3C trace id, written as 32 lower-case hex digits (high and low halves: two `u64`s
    /// keep the field 8-byte aligned, where a `u128` would make every field 48 bytes).
    Trace(u64, u64),
}

// === impl Text ===

impl Text {
    /// A trace id as the field of one.
    pub fn trace(id: u128) -> Self {
        Self::Trace((id >> 64) as u64, id as u64)
    }

    /// `s` as an address when it is one (a tunnel's `ip:port` authority), else its own copy.
    pub fn addr_or_owned(s: &str) -> Self {
        match s.parse::<SocketAddr>() {
            Ok(a) => Self::Addr(a),
            Err(_) => Self::from(s.to_string()),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Static(s) => s.is_empty(),
            Self::Shared(s) => s.is_empty(),
            Self::Owned(s) => s.is_empty(),
            Self::Addr(_) | Self::Trace(..) => false,
        }
    }

    /// The heap bytes this field holds of its own (shared strings, addresses and fixed words
    /// hold none).
    pub fn owned_bytes(&self) -> usize {
        match self {
            Self::Owned(s) => s.len(),
            _ => 0,
        }
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => Ok(()),
            Self::Static(s) => f.write_str(s),
            Self::Shared(s) => f.write_str(s),
            Self::Owned(s) => f.write_str(s),
            Self::Addr(a) => a.fmt(f),
            Self::Trace(hi, lo) => write!(f, "{hi:016x}{lo:016x}"),
        }
    }
}

impl From<&'static str> for Text {
    fn from(s: &'static str) -> Self {
        Self::Static(s)
    }
}

impl From<String> for Text {
    /// Its own copy (empty when `s` is).
    fn from(s: String) -> Self {
        if s.is_empty() {
            Self::Empty
        } else {
            Self::Owned(s.into_boxed_str())
        }
    }
}

impl From<std::borrow::Cow<'static, str>> for Text {
    fn from(s: std::borrow::Cow<'static, str>) -> Self {
        match s {
            std::borrow::Cow::Borrowed(s) => Self::Static(s),
            std::borrow::Cow::Owned(s) => Self::from(s),
        }
    }
}

impl From<SocketAddr> for Text {
    fn from(a: SocketAddr) -> Self {
        Self::Addr(a)
    }
}

impl From<&Identity> for Text {
    fn from(id: &Identity) -> Self {
        Self::Shared(id.shared())
    }
}

impl From<&ClusterId> for Text {
    fn from(c: &ClusterId) -> Self {
        Self::Shared(c.shared())
    }
}

impl From<&WorkloadUid> for Text {
    fn from(u: &WorkloadUid) -> Self {
        Self::Shared(u.shared())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_writes_the_text_it_stands_for() {
        let id: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
            .parse()
            .unwrap();
        let cases: [(Text, &str); 9] = [
            (Text::Empty, ""),
            (Text::from("hbone"), "hbone"),
            (Text::from(String::new()), ""),
            (Text::from("via waypoint".to_string()), "via waypoint"),
            (
                Text::from(&id),
                "spiffe://cluster.local/ns/default/sa/sleep",
            ),
            (
                Text::from("198.18.1.10:40000".parse::<SocketAddr>().unwrap()),
                "198.18.1.10:40000",
            ),
            (
                Text::addr_or_owned("[2001:2::1]:15008"),
                "[2001:2::1]:15008",
            ),
            (Text::addr_or_owned("echo.default:80"), "echo.default:80"),
            (
                Text::trace(0x4bf92f3577b34da6a3ce929d0e0e4736),
                "4bf92f3577b34da6a3ce929d0e0e4736",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(text.to_string(), want, "{text:?}");
            assert_eq!(text.is_empty(), want.is_empty(), "{text:?}");
        }
        assert_eq!(Text::trace(1).to_string(), format!("{:032x}", 1));
    }

    #[test]
    fn names_and_addresses_are_held_without_a_copy() {
        let id: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
            .parse()
            .unwrap();
        let cluster = ClusterId::new("alpha");
        let uid = WorkloadUid::new("alpha//v1/Pod/default/sleep-1");
        for (text, shared) in [
            (Text::from(&id), id.shared()),
            (Text::from(&cluster), cluster.shared()),
            (Text::from(&uid), uid.shared()),
        ] {
            let Text::Shared(held) = &text else {
                panic!("{text:?} is not shared");
            };
            assert!(Arc::ptr_eq(held, &shared), "{text:?} is a copy");
            assert_eq!(text.owned_bytes(), 0);
        }
        let addr = Text::addr_or_owned("198.18.2.20:15008");
        assert!(matches!(addr, Text::Addr(_)), "{addr:?}");
        assert_eq!(addr.owned_bytes(), 0);
        // A field is no larger than the String it replaces plus one word.
        assert!(std::mem::size_of::<Text>() <= 32);
    }
}
