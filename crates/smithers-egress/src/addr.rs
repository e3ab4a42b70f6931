//! Special-use address space: where an allowed name must not lead unless a rule names the
//! range (a name that resolves to the host's loopback, the cloud metadata address or a
//! private network is how an allow-list is turned into a pivot).

use std::net::{IpAddr, Ipv4Addr};

/// IPv4 ranges that are not the public internet (RFC 6890 and its updates), with what each
/// is, for the reason of a refusal.
const SPECIAL_V4: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"this network\" (0.0.0.0/8)"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10.0.0.0/8)"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "shared CGNAT (100.64.0.0/10)",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback (127.0.0.0/8)"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "link-local, cloud metadata included (169.254.0.0/16)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16.0.0/12)"),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        "documentation (192.0.2.0/24)",
    ),
    (
        Ipv4Addr::new(192, 88, 99, 0),
        24,
        "6to4 relay (192.88.99.0/24)",
    ),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        "private (192.168.0.0/16)",
    ),
    (
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        "benchmarking (198.18.0.0/15)",
    ),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        "documentation (198.51.100.0/24)",
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        "documentation (203.0.113.0/24)",
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast (224.0.0.0/4)"),
    (
        Ipv4Addr::new(240, 0, 0, 0),
        4,
        "reserved and broadcast (240.0.0.0/4)",
    ),
];

/// What special-use range `ip` is in, if any. IPv6 is not carried at all (see
/// [`crate::Policy::decide`]), so every IPv6 address is named here too: an IPv4-mapped one
/// by its IPv4 range, any other as IPv6.
pub fn special_use(ip: IpAddr) -> Option<&'static str> {
    let v4 = match ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4,
            None => return Some("IPv6 (not carried: names are dialed over IPv4)"),
        },
    };
    let bits = u32::from(v4);
    SPECIAL_V4.iter().find_map(|(net, len, what)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
        (bits & mask == u32::from(*net) & mask).then_some(*what)
    })
}

/// Whether `ip` is where other machines live, public space or a special-use range that
/// holds them (private networks, CGNAT, the documentation and benchmarking ranges a test
/// network uses): where a cidr rule is the everyday fix for a denial. Loopback, link-local
/// (cloud metadata), "this network", multicast and the reserved ranges are the host's own
/// or nobody's: a rule may still name them, but a denial does not suggest one.
pub fn other_machines(ip: Ipv4Addr) -> bool {
    let Some(what) = special_use(IpAddr::V4(ip)) else {
        return true;
    };
    ["private", "shared CGNAT", "documentation", "benchmarking"]
        .iter()
        .any(|kind| what.starts_with(kind))
}

/// The host's own addresses (every interface, up or not): a name resolving to one of them
/// would reach the host's services from the sandbox.
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points to a sockaddr whose family says which struct it is.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
            if family == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.push(IpAddr::V6(sin6.sin6_addr.s6_addr.into()));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let special = [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "172.31.255.255",
            "192.168.0.1",
            "100.100.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.251",
            "::1",
            "::ffff:127.0.0.1",
            "fd00::1",
        ];
        for a in special {
            assert!(special_use(a.parse().unwrap()).is_some(), "{a}");
        }
        for a in [
            "93.184.216.34",
            "11.0.0.1",
            "172.32.0.1",
            "100.128.0.1",
            "8.8.8.8",
        ] {
            assert_eq!(special_use(a.parse().unwrap()), None, "{a}");
        }
        assert!(special_use("::ffff:8.8.8.8".parse().unwrap()).is_none());
    }

    #[test]
    fn other_machines_are_where_a_fix_is_offered() {
        for a in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "198.18.0.1",
            "93.184.216.34",
        ] {
            assert!(other_machines(a.parse().unwrap()), "{a}");
        }
        for a in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!other_machines(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn host_addresses_include_loopback() {
        assert!(host_addresses().contains(&"127.0.0.1".parse().unwrap()));
    }
}
