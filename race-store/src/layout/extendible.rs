//! Extendible-hashing arithmetic on directory indexes: which entries point to
//! a subtable, which entries a split rewrites, and what a doubling copies.
//!
//! A subtable of local depth `d` and suffix `s` is pointed to by the
//! `2^(g-d)` entries `s + k * 2^d` of a directory of global depth `g`. A
//! split of it ([`SplitPlan`]) gives both halves depth `d + 1`: the entries
//! whose bit `d` is 1 are repointed to the new subtable. When `d == g` the
//! directory first doubles: entries `2^g..2^(g+1)` become copies of entries
//! `0..2^g`, then the header's depth is raised.
//!
//! Write order for a client (not enforced here): build the new subtable, then
//! rewrite the entries, then the old subtable's bucket headers, so that a
//! reader with a stale directory cache that lands in the old subtable sees a
//! header that no longer covers its key and refreshes its cache.

use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{DirEntry, DirectoryRepr};
use crate::layout::error::{LayoutError, Result};
use crate::layout::slot::RemotePtr;
use crate::layout::subtable::{SplitPlan, Suffix};
use crate::layout::MAX_GLOBAL_DEPTH;

/// The directory indexes that point to the subtable `suffix` in a directory
/// of `global_depth`: `suffix.bits() + k * 2^suffix.depth()`, ascending.
///
/// # Errors
/// [`LayoutError::LocalDepthExceedsGlobal`] if the suffix is deeper than the
/// directory (it must double first), or [`LayoutError::DepthOutOfRange`].
pub const fn entries_of(suffix: Suffix, global_depth: u8) -> Result<DirIndexes> {
    if global_depth > MAX_GLOBAL_DEPTH {
        return Err(LayoutError::DepthOutOfRange {
            depth: global_depth as u32,
            max: MAX_GLOBAL_DEPTH,
        });
    }
    if suffix.depth() > global_depth {
        return Err(LayoutError::LocalDepthExceedsGlobal {
            local: suffix.depth(),
            global: global_depth,
        });
    }
    Ok(DirIndexes {
        next: suffix.bits() as usize,
        step: 1 << suffix.depth(),
        remaining: 1 << (global_depth - suffix.depth()),
    })
}

/// Iterator over the directory indexes of one subtable (see [`entries_of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirIndexes {
    next: usize,
    step: usize,
    remaining: usize,
}

impl Iterator for DirIndexes {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let i = self.next;
        self.remaining -= 1;
        self.next = self.next.saturating_add(self.step);
        Some(i)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for DirIndexes {}

/// Whether splitting a subtable of `local_depth` needs the directory to double
/// first (its depth equals the global depth).
pub const fn needs_doubling(local_depth: u8, global_depth: u8) -> bool {
    local_depth >= global_depth
}

/// The entry words to write for `plan` in a directory of `global_depth`: every
/// entry of the old subtable gets depth `d + 1`; those of the moved half point
/// to `new_ptr`, the others keep `old_ptr`. Ascending index order, unlocked.
///
/// # Errors
/// [`LayoutError::LocalDepthExceedsGlobal`] if `global_depth` is not above the
/// old depth ([`needs_doubling`]), or [`LayoutError::DepthOutOfRange`].
pub fn split_rewrites(
    plan: &SplitPlan,
    global_depth: u8,
    old_ptr: RemotePtr,
    new_ptr: RemotePtr,
) -> Result<Vec<(usize, DirEntry)>> {
    let depth = plan.stay().depth();
    let stay = DirEntry::new(depth, old_ptr)?;
    let moved = DirEntry::new(depth, new_ptr)?;
    let mut out: Vec<(usize, DirEntry)> = entries_of(plan.stay(), global_depth)?
        .map(|i| (i, stay))
        .chain(entries_of(plan.moved(), global_depth)?.map(|i| (i, moved)))
        .collect();
    out.sort_unstable_by_key(|&(i, _)| i);
    Ok(out)
}

/// The upper half of a directory doubled from `global_depth` to
/// `global_depth + 1`: a copy of the `2^global_depth` current entries, to be
/// written at indexes `2^global_depth..2^(global_depth+1)` before the header's
/// depth is raised. Lock bits are cleared in the copy.
///
/// # Errors
/// [`LayoutError::DepthOutOfRange`] if the directory is already at the maximum
/// depth, [`LayoutError::Truncated`] if `entries` is not `2^global_depth` long.
pub fn doubled_upper_half(global_depth: u8, entries: &[DirEntry]) -> Result<Vec<DirEntry>> {
    if global_depth >= MAX_GLOBAL_DEPTH {
        return Err(LayoutError::DepthOutOfRange {
            depth: u32::from(global_depth) + 1,
            max: MAX_GLOBAL_DEPTH,
        });
    }
    let need = 1usize << global_depth;
    if entries.len() != need {
        return Err(LayoutError::Truncated {
            what: "directory entries",
            need,
            got: entries.len(),
        });
    }
    Ok(entries.iter().map(|e| e.with_lock(false)).collect())
}

/// The directory's changes that follow a split or a doubling (here, beside
/// their index arithmetic, so that the directory's layout does not import
/// it).
impl DirectoryRepr {
    /// Doubles the directory in place (upper half copied, depth + 1).
    ///
    /// # Errors
    /// As [`doubled_upper_half`].
    pub fn double(&mut self) -> Result<()> {
        let g = self.global_depth();
        let upper = doubled_upper_half(g, &self.entries)?;
        self.entries.extend(upper);
        let h = self.header;
        self.header = if h.is_locked() {
            DirHeader::locked(g + 1, h.owner(), h.lease_expiry())?
        } else {
            DirHeader::unlocked(g + 1)?
        };
        Ok(())
    }

    /// Applies `plan` (see [`split_rewrites`]).
    ///
    /// # Errors
    /// As [`split_rewrites`].
    pub fn apply_split(&mut self, plan: &SplitPlan, old: RemotePtr, new: RemotePtr) -> Result<()> {
        for (i, e) in split_rewrites(plan, self.global_depth(), old, new)? {
            if let Some(slot) = self.entries.get_mut(i) {
                *slot = e;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(n: u64) -> RemotePtr {
        RemotePtr::new((n % 3) as u8, n * 4096).unwrap()
    }

    #[test]
    fn entries_of_suffix() {
        let s = Suffix::new(0b01, 2).unwrap();
        let v: Vec<_> = entries_of(s, 4).unwrap().collect();
        assert_eq!(v, vec![1, 5, 9, 13]);
        assert_eq!(entries_of(s, 4).unwrap().len(), 4);
        assert_eq!(entries_of(s, 2).unwrap().collect::<Vec<_>>(), vec![1]);
        assert_eq!(
            entries_of(Suffix::ROOT, 2).unwrap().collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            entries_of(s, 1),
            Err(LayoutError::LocalDepthExceedsGlobal {
                local: 2,
                global: 1
            })
        );
        assert!(entries_of(s, 21).is_err());
        assert!(needs_doubling(2, 2) && !needs_doubling(1, 2));
    }

    #[test]
    fn split_rewrites_list() {
        let plan = SplitPlan::new(Suffix::new(1, 1).unwrap()).unwrap();
        let (a, b) = (ptr(1), ptr(2));
        let w = split_rewrites(&plan, 3, a, b).unwrap();
        let ea = DirEntry::new(2, a).unwrap();
        let eb = DirEntry::new(2, b).unwrap();
        assert_eq!(w, vec![(1, ea), (3, eb), (5, ea), (7, eb)]);
        assert!(matches!(
            split_rewrites(&plan, 1, a, b),
            Err(LayoutError::LocalDepthExceedsGlobal {
                local: 2,
                global: 1
            })
        ));
    }

    #[test]
    fn doubled_upper_half_copies() {
        let e = [
            DirEntry::new(1, ptr(1)).unwrap(),
            DirEntry::new(1, ptr(2)).unwrap().with_lock(true),
        ];
        let up = doubled_upper_half(1, &e).unwrap();
        assert_eq!(up, vec![e[0], e[1].with_lock(false)]);
        assert!(matches!(
            doubled_upper_half(2, &e),
            Err(LayoutError::Truncated {
                need: 4,
                got: 2,
                ..
            })
        ));
        assert!(doubled_upper_half(MAX_GLOBAL_DEPTH, &e).is_err());
    }
}
