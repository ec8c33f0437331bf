//! The shape of a new table ([`TableConfig`]) and where its initial
//! subtables live ([`TableConfig::initial_subtable`]).

use super::{BLOCK_ALIGN, RESERVED_PREFIX};
use crate::error::Error;
use crate::layout::slot::{RemotePtr, MAX_OFFSET};
use crate::layout::subtable::SubtableGeometry;
use crate::layout::table::node0_heap_start;
use crate::layout::MAX_GLOBAL_DEPTH;

/// The shape of a new table.
///
/// (De)serializable for configuration files: any subset of fields (the
/// rest keep their defaults), unknown keys refused. The geometry is written
/// as its bucket-group count under `geometry_groups`; a count out of
/// `1..=SubtableGeometry::MAX_GROUPS` is a deserialize error. Depths are
/// not checked on reading: the table's format checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TableConfig {
    /// Geometry of every subtable. In a file: `geometry_groups`, the
    /// number of bucket groups ([`SubtableGeometry::new`]).
    #[serde(rename = "geometry_groups")]
    pub geometry: SubtableGeometry,
    /// Global depth of the initial directory (`2^depth` initial subtables).
    pub initial_global_depth: u8,
    /// Largest global depth; node 0 reserves the directory for it.
    pub max_global_depth: u8,
}

impl Default for TableConfig {
    fn default() -> Self {
        Self {
            geometry: SubtableGeometry::DEFAULT,
            initial_global_depth: 0,
            max_global_depth: 16,
        }
    }
}

impl TableConfig {
    /// The fill a presized table is made for: half its slots, so that
    /// subtables, which hold hash-uniform shares of the keys, are far from
    /// full (a subtable splits once a key finds no free slot in its
    /// buckets: at about 60% fill in a YCSB load).
    pub const PRESIZE_FILL: (u64, u64) = (1, 2);

    /// Initial subtables per memory node a presized table has at least
    /// (in a store of more than one node), so that every node holds a
    /// share of the index and, with it, of the data: with `2^depth >= 4 n`
    /// subtables, a node holds at most `1 + n / 2^depth <= 1.25` times the
    /// mean share.
    pub const PRESIZE_PER_NODE: u64 = 4;

    /// This table with enough initial subtables for `keys` keys
    /// without a split ([`Self::PRESIZE_FILL`]) in a store of `nodes`
    /// memory nodes: `initial_global_depth` is the smallest depth whose
    /// `2^depth` subtables hold them and, for more than one node, number at
    /// least [`Self::PRESIZE_PER_NODE`] per node; at most
    /// `max_global_depth`. `keys` 0: depth 0 (one subtable, grown by
    /// splits).
    ///
    /// A split freezes, reads and rewrites a whole subtable (about 100 ms
    /// for the default geometry's 86,016 slots on `sim`), and while it runs
    /// the writers of that subtable wait: a table presized for its keys
    /// never splits to hold them. The initial subtables are spread over
    /// the memory nodes ([`Self::initial_subtable`]): each node holds
    /// about `2^depth / nodes` times [`SubtableGeometry::bytes`] of them.
    pub fn presized_for(self, keys: u64, nodes: u8) -> TableConfig {
        if keys == 0 {
            return TableConfig {
                initial_global_depth: 0,
                ..self
            };
        }
        let (num, den) = Self::PRESIZE_FILL;
        let per_subtable = (self.geometry.slots() * num / den).max(1);
        let spread = match nodes {
            0 | 1 => 1,
            n => Self::PRESIZE_PER_NODE * u64::from(n),
        };
        let subtables = keys.div_ceil(per_subtable).max(spread);
        let depth = subtables
            .checked_next_power_of_two()
            .map_or(u64::BITS, u64::trailing_zeros);
        TableConfig {
            initial_global_depth: u8::try_from(depth)
                .unwrap_or(u8::MAX)
                .min(self.max_global_depth),
            ..self
        }
    }

    /// Where initial subtable `bits` (suffix `bits` of the initial depth)
    /// lives in a store of `nodes` memory nodes: on node `bits % nodes`,
    /// where a split would place it, as that node's `bits / nodes`-th
    /// subtable from the start of its heap (after the directory area on
    /// node 0, after [`RESERVED_PREFIX`] on the others), each taking
    /// [`SubtableGeometry::bytes`] rounded up to [`BLOCK_ALIGN`]. Node 0
    /// writes these addresses into the directory when it formats the table
    /// ([`MemoryNode::format`](super::MemoryNode::format)) and every other node lays out its own share
    /// there before it serves ([`MemoryNode::lay_out_share`](super::MemoryNode::lay_out_share)), so the
    /// directory and the subtables agree without a message between them.
    ///
    /// # Errors
    /// [`Error::BadTable`] for 0 nodes, a suffix beyond the initial depth or
    /// bad depths; [`Error::OutOfMemory`] for an offset past what a
    /// [`RemotePtr`] can address.
    pub fn initial_subtable(&self, bits: u32, nodes: u8) -> Result<RemotePtr, Error> {
        if nodes == 0 {
            return Err(Error::BadTable {
                reason: "a table needs at least one memory node",
            });
        }
        self.check_depths()?;
        if u64::from(bits) >> self.initial_global_depth != 0 {
            return Err(Error::BadTable {
                reason: "initial subtable suffix beyond the initial depth",
            });
        }
        let node = (bits % u32::from(nodes)) as u8;
        let index = u64::from(bits / u32::from(nodes));
        let offset = index
            .checked_mul(self.stride())
            .and_then(|o| o.checked_add(Self::heap_start(node, self.max_global_depth).ok()?))
            .filter(|&o| o <= MAX_OFFSET)
            .ok_or(Error::OutOfMemory {
                what: "initial subtables beyond the addressable offsets",
            })?;
        Ok(RemotePtr::new(node, offset)?)
    }

    /// Bytes between two initial subtables of a node: a subtable rounded
    /// up to [`BLOCK_ALIGN`] (the geometry bounds a subtable far below
    /// `u64::MAX`).
    fn stride(&self) -> u64 {
        self.geometry.bytes().next_multiple_of(BLOCK_ALIGN)
    }

    /// Where node `node`'s heap, and so its first initial subtable, starts:
    /// after the directory area (reserved up to `max_global_depth`) on node
    /// 0, after [`RESERVED_PREFIX`] on the others; 64-byte aligned.
    fn heap_start(node: u8, max_global_depth: u8) -> Result<u64, Error> {
        let start = match node {
            0 => node0_heap_start(max_global_depth)?,
            _ => RESERVED_PREFIX,
        };
        Ok(start.next_multiple_of(BLOCK_ALIGN))
    }

    /// How many of the initial subtables node `node` of `nodes` holds
    /// ([`Self::initial_subtable`]), and the offset where its share ends
    /// (its heap's start for an empty share): a region of at least that
    /// many bytes holds the share, and node 0's the directory too.
    ///
    /// # Errors
    /// As [`Self::initial_subtable`]; [`Error::BadTable`] for a node not
    /// below `nodes`.
    pub fn share(&self, node: u8, nodes: u8) -> Result<(u64, u64), Error> {
        if node >= nodes {
            return Err(Error::BadTable {
                reason: "memory node id not below the number of memory nodes",
            });
        }
        self.check_depths()?;
        let total = 1u64 << self.initial_global_depth;
        let count = total
            .saturating_sub(u64::from(node))
            .div_ceil(u64::from(nodes));
        let end = match count.checked_sub(1) {
            None => Self::heap_start(node, self.max_global_depth)?,
            Some(last) => {
                let bits = u64::from(node) + last * u64::from(nodes);
                let at = self.initial_subtable(u32::try_from(bits).unwrap_or(u32::MAX), nodes)?;
                at.offset() + self.stride()
            }
        };
        Ok((count, end))
    }

    pub(super) fn check_depths(&self) -> Result<(), Error> {
        if self.max_global_depth > MAX_GLOBAL_DEPTH
            || self.initial_global_depth > self.max_global_depth
        {
            return Err(Error::BadTable {
                reason: "initial depth above max depth, or max depth above 20",
            });
        }
        Ok(())
    }
}

/// [`TableConfig`] as a configuration file's type.
#[cfg(test)]
mod tests {
    use super::{SubtableGeometry, TableConfig};

    #[test]
    fn default_round_trips_through_toml() {
        let text = toml::to_string_pretty(&TableConfig::default()).expect("serializes");
        println!("{text}");
        assert!(text.contains("geometry_groups = 4096"), "{text}");
        let back: TableConfig = toml::from_str(&text).expect("its own output parses");
        assert_eq!(back, TableConfig::default());
        assert_eq!(
            toml::from_str::<TableConfig>("").ok(),
            Some(TableConfig::default())
        );
    }

    #[test]
    fn partial_file_overrides_only_what_it_names() {
        let c: TableConfig = toml::from_str("geometry_groups = 2\n").expect("parses");
        let want = TableConfig {
            geometry: SubtableGeometry::new(2).expect("in range"),
            ..TableConfig::default()
        };
        assert_eq!(c, want);
        let c: TableConfig = toml::from_str("max_global_depth = 9\n").expect("parses");
        assert_eq!(c.max_global_depth, 9);
        assert_eq!(c.geometry, SubtableGeometry::DEFAULT);
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        for (text, key) in [
            ("geometry = 2\n", "geometry"),
            ("max_depth = 3\n", "max_depth"),
        ] {
            let err = toml::from_str::<TableConfig>(text)
                .expect_err(text)
                .to_string();
            assert!(err.contains(&format!("unknown field `{key}`")), "{err}");
        }
    }

    #[test]
    fn invalid_geometry_is_a_deserialize_error() {
        let max = SubtableGeometry::MAX_GROUPS;
        for groups in [0, max + 1] {
            let text = format!("geometry_groups = {groups}\n");
            let err = toml::from_str::<TableConfig>(&text)
                .expect_err(&text)
                .to_string();
            assert!(err.contains("out of range"), "{err}");
        }
        let err = toml::from_str::<TableConfig>("geometry_groups = -1\n")
            .expect_err("negative")
            .to_string();
        assert!(err.contains("geometry_groups"), "{err}");
    }
}
