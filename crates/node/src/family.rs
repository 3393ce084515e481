//! The two IP families of a pod's namespace, with the tools and addresses each one's rules use.
//! A pod's IPv4 rules are `iptables`' and `ip -4`'s, its IPv6 rules the same rules written with
//! `ip6tables` and `ip -6`.

use std::net::IpAddr;

/// An IP family of a pod's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    V4,
    V6,
}

// === impl Family ===

impl Family {
    /// The family of `ip`.
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// `IPv4` or `IPv6`, for logs and errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    /// The iptables front end of this family.
    pub(crate) fn iptables(self) -> &'static str {
        match self {
            Self::V4 => "iptables",
            Self::V6 => "ip6tables",
        }
    }

    pub(crate) fn iptables_save(self) -> &'static str {
        match self {
            Self::V4 => "iptables-save",
            Self::V6 => "ip6tables-save",
        }
    }

    pub(crate) fn iptables_restore(self) -> &'static str {
        match self {
            Self::V4 => "iptables-restore",
            Self::V6 => "ip6tables-restore",
        }
    }

    /// The family's flag of `ip` (`ip -4 rule`, `ip -6 route`).
    pub(crate) fn ip_flag(self) -> &'static str {
        match self {
            Self::V4 => "-4",
            Self::V6 => "-6",
        }
    }

    /// The loopback range, as the iptables of the family print it (`-d <this>`).
    pub(crate) fn loopback(self) -> &'static str {
        match self {
            Self::V4 => "127.0.0.0/8",
            Self::V6 => "::1/128",
        }
    }

    /// Every address of the family (`ip route ... local <this>`).
    pub(crate) fn any(self) -> &'static str {
        match self {
            Self::V4 => "0.0.0.0/0",
            Self::V6 => "::/0",
        }
    }

    /// The unspecified address the node's listeners in a pod bind (`0.0.0.0`, `::`).
    pub(crate) fn unspecified(self) -> IpAddr {
        match self {
            Self::V4 => IpAddr::from([0u8; 4]),
            Self::V6 => IpAddr::from([0u8; 16]),
        }
    }
}
