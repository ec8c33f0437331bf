//! Choosing the port and the GID index of a device when the caller does not
//! name them: pure rules, separate from the verbs calls that gather their
//! inputs (in `device`), so that they are tested without a device.
//!
//! - Port: the first ACTIVE port; an explicit port must exist and be ACTIVE.
//! - GID: on an Ethernet (RoCE) port, the first entry whose type (sysfs
//!   `/sys/class/infiniband/DEV/ports/P/gid_attrs/types/I`) is `RoCE v2`
//!   and whose address is IPv4-mapped (`::ffff:a.b.c.d`), the entry every
//!   RoCE peer on an IPv4 network can route to; on an InfiniBand port,
//!   index 0 (the port GID).

use crate::types::Gid;
use std::path::Path;

/// `enum ibv_port_state::IBV_PORT_ACTIVE`.
pub(crate) const PORT_ACTIVE: u32 = 4;

/// `IBV_LINK_LAYER_INFINIBAND` (`IBV_LINK_LAYER_UNSPECIFIED`, 0, also
/// means InfiniBand: old kernels did not report a link layer). Every link
/// layer but Ethernet is treated as InfiniBand.
#[cfg(test)]
const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// The name of an `enum ibv_port_state` value, as `ibv_devinfo` prints it.
pub(crate) fn port_state_name(state: u32) -> &'static str {
    match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    }
}

/// What sysfs says a GID table entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GidType {
    /// `IB/RoCE v1`: an InfiniBand GID, or RoCE v1 on Ethernet.
    IbOrRoceV1,
    /// `RoCE v2`: routable over UDP/IP.
    RoceV2,
    /// Anything else (or unreadable), verbatim.
    Other(String),
}

impl std::fmt::Display for GidType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GidType::IbOrRoceV1 => f.write_str("IB/RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Other(s) => write!(f, "{s:?}"),
        }
    }
}

/// Parses the content of a sysfs `gid_attrs/types/I` file.
pub(crate) fn parse_gid_type(content: &str) -> GidType {
    match content.trim() {
        "RoCE v2" => GidType::RoceV2,
        "IB/RoCE v1" => GidType::IbOrRoceV1,
        other => GidType::Other(other.to_string()),
    }
}

/// Reads the type of GID `index` of `port` of `device` from sysfs (under
/// `root`, normally `/sys/class/infiniband`).
pub(crate) fn read_gid_type(root: &Path, device: &str, port: u8, index: u8) -> GidType {
    let path = root
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs/types")
        .join(index.to_string());
    match std::fs::read_to_string(&path) {
        Ok(s) => parse_gid_type(&s),
        Err(e) => GidType::Other(format!("unreadable: {e}")),
    }
}

/// Whether a GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
pub(crate) fn is_ipv4_mapped(gid: &Gid) -> bool {
    let b = gid.as_bytes();
    b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff
}

/// One non-empty entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GidEntry {
    pub index: u8,
    pub gid: Gid,
    pub kind: GidType,
}

impl std::fmt::Display for GidEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.gid.as_bytes();
        if is_ipv4_mapped(&self.gid) {
            write!(
                f,
                "{}: {} ::ffff:{}.{}.{}.{}",
                self.index, self.kind, b[12], b[13], b[14], b[15]
            )
        } else {
            write!(f, "{}: {} {}", self.index, self.kind, self.gid)
        }
    }
}

/// The default GID index among a port's non-empty `entries` (see the module
/// docs), or `None` when none fits.
pub(crate) fn choose_gid(entries: &[GidEntry], link_layer: u8) -> Option<u8> {
    if link_layer != LINK_LAYER_ETHERNET {
        return entries.iter().find(|e| e.index == 0).map(|e| e.index);
    }
    entries
        .iter()
        .find(|e| e.kind == GidType::RoceV2 && is_ipv4_mapped(&e.gid))
        .map(|e| e.index)
}

/// Why no port could be chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PortChoice {
    /// This port.
    Port(u8),
    /// The requested port does not exist.
    NoSuchPort,
    /// The requested port exists but is not ACTIVE (its state).
    Down(u32),
    /// No port is ACTIVE.
    NoneActive,
}

/// The port to use: `requested`, when given, must be in `states` (every
/// port's `(number, state)`) and ACTIVE; otherwise the first ACTIVE port.
pub(crate) fn choose_port(requested: Option<u8>, states: &[(u8, u32)]) -> PortChoice {
    match requested {
        Some(p) => match states.iter().find(|(n, _)| *n == p) {
            None => PortChoice::NoSuchPort,
            Some((_, PORT_ACTIVE)) => PortChoice::Port(p),
            Some((_, s)) => PortChoice::Down(*s),
        },
        None => states
            .iter()
            .find(|(_, s)| *s == PORT_ACTIVE)
            .map_or(PortChoice::NoneActive, |(n, _)| PortChoice::Port(*n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(bytes: &[u8]) -> Gid {
        let mut g = [0u8; 16];
        g[16 - bytes.len()..].copy_from_slice(bytes);
        Gid(g)
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Gid {
        gid(&[0xff, 0xff, a, b, c, d])
    }

    fn link_local() -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55]);
        Gid(g)
    }

    #[test]
    fn gid_types_from_sysfs_strings() {
        assert_eq!(parse_gid_type("RoCE v2\n"), GidType::RoceV2);
        assert_eq!(parse_gid_type("IB/RoCE v1\n"), GidType::IbOrRoceV1);
        assert_eq!(parse_gid_type("  RoCE v2  "), GidType::RoceV2);
        assert_eq!(parse_gid_type("RoCE v3"), GidType::Other("RoCE v3".into()));
        assert_eq!(parse_gid_type(""), GidType::Other(String::new()));
    }

    #[test]
    fn gid_type_read_from_a_sysfs_like_tree() {
        let root = tempfile::tempdir().unwrap();
        let types = root.path().join("rxe0/ports/1/gid_attrs/types");
        std::fs::create_dir_all(&types).unwrap();
        std::fs::write(types.join("0"), "IB/RoCE v1\n").unwrap();
        std::fs::write(types.join("1"), "RoCE v2\n").unwrap();
        assert_eq!(
            read_gid_type(root.path(), "rxe0", 1, 0),
            GidType::IbOrRoceV1
        );
        assert_eq!(read_gid_type(root.path(), "rxe0", 1, 1), GidType::RoceV2);
        assert!(matches!(
            read_gid_type(root.path(), "rxe0", 1, 2),
            GidType::Other(s) if s.starts_with("unreadable")
        ));
    }

    #[test]
    fn ipv4_mapped() {
        assert!(is_ipv4_mapped(&v4(127, 0, 0, 1)));
        assert!(is_ipv4_mapped(&v4(0, 0, 0, 0)));
        assert!(!is_ipv4_mapped(&link_local()));
        assert!(!is_ipv4_mapped(&gid(&[0xff, 0xfe, 1, 2, 3, 4])));
        let mut g = v4(10, 0, 0, 1).0;
        g[0] = 1;
        assert!(!is_ipv4_mapped(&Gid(g)));
    }

    #[test]
    fn gid_choice() {
        let e = |index, gid, kind| GidEntry { index, gid, kind };
        // A typical RoCE table: v1 and v2 link-local, then v1 and v2 IPv4.
        let table = [
            e(0, link_local(), GidType::IbOrRoceV1),
            e(1, link_local(), GidType::RoceV2),
            e(2, v4(192, 168, 1, 5), GidType::IbOrRoceV1),
            e(3, v4(192, 168, 1, 5), GidType::RoceV2),
        ];
        assert_eq!(choose_gid(&table, LINK_LAYER_ETHERNET), Some(3));
        // Soft-RoCE on lo: only a v2 IPv4 entry after the link-local ones.
        assert_eq!(choose_gid(&table[..2], LINK_LAYER_ETHERNET), None);
        assert_eq!(choose_gid(&[], LINK_LAYER_ETHERNET), None);
        // InfiniBand (or unspecified): index 0.
        assert_eq!(choose_gid(&table, LINK_LAYER_INFINIBAND), Some(0));
        assert_eq!(choose_gid(&table, 0), Some(0));
        assert_eq!(choose_gid(&table[1..], LINK_LAYER_INFINIBAND), None);
        assert_eq!(
            table[3].to_string(),
            "3: RoCE v2 ::ffff:192.168.1.5",
            "entries print readably in NoUsableGid"
        );
    }

    #[test]
    fn port_choice() {
        let down = 1;
        let ports = [(1, down), (2, PORT_ACTIVE)];
        assert_eq!(choose_port(None, &ports), PortChoice::Port(2));
        assert_eq!(choose_port(Some(2), &ports), PortChoice::Port(2));
        assert_eq!(choose_port(Some(1), &ports), PortChoice::Down(down));
        assert_eq!(choose_port(Some(3), &ports), PortChoice::NoSuchPort);
        assert_eq!(choose_port(None, &[(1, down)]), PortChoice::NoneActive);
        assert_eq!(choose_port(None, &[]), PortChoice::NoneActive);
        assert_eq!(port_state_name(PORT_ACTIVE), "ACTIVE");
        assert_eq!(port_state_name(down), "DOWN");
        assert_eq!(port_state_name(99), "UNKNOWN");
    }
}
