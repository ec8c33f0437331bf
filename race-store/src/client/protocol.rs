//! # The client protocol, its invariants and its assumptions
//!
//! Everything here is done with one-sided operations through a
//! [`crate::remote::Transport`]; "doorbell" = one round trip (RTT). The only
//! two-sided message is the coarse block allocation.
//!
//! ## Remote state
//! * **Node 0**: superblock, split log, directory (header word + entries) at
//!   the fixed [`crate::layout::table::DIR_PTR`]; see [`crate::layout::table`].
//!   The directory header word is also the table's **resize lock** (lock
//!   bit, owner, lease expiry; [`crate::layout::dir_header`]).
//! * **Subtables** anywhere: `groups` bucket groups, every bucket header
//!   holding the subtable's `(local depth, suffix)`.
//! * **KV blocks** anywhere, 64 B aligned, written once before they are
//!   published and never written again until reused after a grace period.
//! * **Slot words** change only by CAS. Besides empty and occupied, a slot
//!   can be *frozen* (bit 0, [`crate::layout::slot::SLOT_FROZEN`]): no writer
//!   ever CASes from a frozen word, so a frozen slot never changes again.
//! * A subtable is **live** (pointed to by the directory, headers valid),
//!   **splitting** (live, some or all slots frozen), or **retired** (every
//!   header is [`crate::layout::bucket::RETIRED_LOCAL_DEPTH`]).
//!
//! ## Invariants
//! 1. A live subtable with suffix `(d, s)` holds only keys whose directory
//!    hash ends in `s`, each in one of its two candidate buckets or their
//!    overflow bucket; its headers say `(d, s)` and never change while it is
//!    live.
//! 2. Subtables are copy-on-split: a subtable's memory is written whole
//!    before the directory first points to it, and is never reused (a
//!    retired subtable stays retired). So a client that follows any
//!    directory entry, however stale, reaches either the subtable that owns
//!    the key now (headers cover the key) or a retired one (headers say so),
//!    never garbage.
//! 3. Once a subtable has a frozen slot, every slot gets frozen and none is
//!    ever unfrozen: its content is final. It is retired only after both new
//!    halves are written in full, and the directory points to the halves
//!    only after it is retired.
//! 4. A slot points to a KV block whose WRITE completed before the CAS that
//!    installed the slot was posted (or, when both are in one doorbell, the
//!    block is on the slot's node and ordered before it).
//! 5. A published block is retired only by the client whose CAS unlinked it
//!    (update, delete, withdrawal of its own tentative copy, removal of a
//!    rival's), exactly once, and is reused only after the grace period.
//! 6. A key's value is its committed copy at the lowest slot address; only
//!    committed copies are read, updated or deleted. A tentative copy
//!    (an insert settling, or left by a dead inserter) is never the key's
//!    value. Splits keep every slot where it was, tentative or not.
//!
//! ## Search (get): 2 RTTs on a hit
//! 1. From the cached directory entry: READ both combined buckets (2 x 128 B,
//!    one READ if both hashes chose the same bucket), one doorbell.
//! 2. Check the headers: both buckets of each combined bucket equal, not
//!    retired, covering the key's hash. Not covering: the cache is stale,
//!    re-read the directory and retry. Retired or torn: the key's subtable
//!    is between retirement and publication of a split: wait (see
//!    "Waiting") and retry. Frozen slots are read like any other (masking
//!    the bit): a splitting subtable is still exact until it is retired.
//! 3. READ every KV block whose slot fingerprint matches, one doorbell.
//!    Verify magic, CRC, length and key; a block of another key is skipped,
//!    a block that fails its checks (torn or reused) restarts the attempt.
//! 4. Return the value of the matching copy at the lowest slot address.
//!
//! Linearizability of a read that sees a non-retired header: the header word
//! was read before retirement, hence before publication of the halves,
//! hence before any write to the key in the halves; the slot word read is
//! either unfrozen (current when read) or frozen (current from its freeze to
//! the publication). Either way there is an instant within the READ where it
//! was the key's value.
//!
//! ## Insert: 3 RTTs (4 with a fingerprint match)
//! 1. Allocate a block and **WRITE it + READ both combined buckets** in one
//!    doorbell (the block is on the subtable's node when possible).
//! 2. Check headers (as for search; a frozen slot means "splitting": wait).
//!    READ fingerprint-matching blocks of committed slots: if the key is
//!    there, `insert` fails with [`crate::Error::KeyExists`] (the
//!    unpublished block is recycled at once), `put` CASes the lowest copy
//!    to its new slot.
//! 3. Choose an empty slot ([`crate::layout::bucket::choose_insert_slot`]:
//!    less loaded main bucket, then overflow). None: split (below), retry.
//! 4. **CAS the empty slot to a tentative copy + READ both combined buckets
//!    again** in one doorbell: same node, so the READs execute after the
//!    CAS. A tentative word ([`crate::layout::slot::SLOT_TENTATIVE`]) is
//!    a claim, not the key's value: readers, updates, deletes and scans
//!    skip it. A failed CAS retries from 1 (the block is already written).
//! 5. **Settle** (`Client::settle`): read the blocks of the other
//!    fingerprint matches in the re-read, tentative or not, and act on the
//!    other copies of the key:
//!    * a committed copy: the key exists. Withdraw (CAS the own copy back
//!      to empty, retiring its block) and search again: `insert` fails with
//!      [`crate::Error::KeyExists`], `put` updates it (or, if it was
//!      deleted meanwhile, inserts anew);
//!    * tentative rivals at higher addresses: remove them (CAS to empty;
//!      the remover retires their blocks); their owners see their copies
//!      gone and search again;
//!    * a tentative rival at a lower address: wait for it (it commits,
//!      and this copy withdraws; or it removes this copy); one seen
//!      unchanged for longer than its owner may take to commit (below) was
//!      left by a dead inserter: remove it;
//!    * no other copy: **commit**, one more doorbell: CAS the own copy from
//!      its tentative word to the committed one. The insert takes effect
//!      there. A failed commit: the copy was removed by a rival (search
//!      again), or frozen by a split (settle on in the new subtable).
//!
//!    An inserter commits only within `max_op_ticks` of the CAS that
//!    placed its copy; past that it withdraws and starts over. So a rival
//!    seen unchanged for `grace_ticks - max_op_ticks` (the deadline and the
//!    skew margin) is dead, and removing it never races its commit (and if
//!    it did, one of the two CASes would fail). If the subtable got frozen
//!    meanwhile, the client waits for the split and continues in the new
//!    subtable, where its slot and every other copy of the key sit at the
//!    same positions, tentative or not.
//!
//! At most one of several concurrent inserts of a key commits while a
//! committed copy exists: of two commits, take the copy placed last (B);
//! B's re-read came after A's copy was placed, so it saw A's copy, unless
//! it was removed (then A never commits). Committed then, B withdraws;
//! tentative and lower, B waits and does not commit; tentative and higher,
//! B removes it, and that CAS or A's commit fails (whichever comes
//! second). A copy is read only once it is committed, so no reader sees the
//! value of an insert that does not take effect, and a delete (which
//! removes committed copies only) cannot turn a losing insert into a
//! winner. A crashed inserter's tentative copy is not the key's: the next
//! insert of the key removes it (waiting `grace_ticks - max_op_ticks` if
//! it is at a lower address), or a sweep does (`Client::sweep_tentative`,
//! after the same wait); a split carries it along until then. The
//! price is the commit's round trip on every insert: RACE instead makes a
//! copy visible at its CAS and lets the lowest copy's owner remove the
//! others, which can remove the copy of an insert that already returned
//! success (two successes, one lost).
//!
//! ## Update, delete, read-modify-write: 3 RTTs
//! Search (2 RTTs), then one doorbell with the WRITE of the new block (same
//! node as the slot; else a doorbell before) and the CAS of the lowest copy
//! from the word read to the new word. A delete instead CASes every
//! committed copy to empty, highest address first, so that no older copy
//! surfaces.
//! A failed CAS re-searches (and calls the rmw function again). A
//! read-modify-write on an absent key inserts with the insert protocol and
//! starts over if the insert finds the key.
//!
//! ## Resize: client-driven, copy-on-split, under a leased lock
//! A writer whose two combined buckets are full splits the key's subtable
//! `X = (d, s)`:
//! 1. **Lock**: CAS the directory header word to "locked by me until
//!    now + lease" ([`crate::layout::dir_header::DirHeader::try_lock`]). Busy:
//!    back off and retry the write (the split may happen meanwhile).
//! 2. **Recover**: if the split log holds a split, finish it first (below).
//! 3. Re-read the directory; if the key's entry no longer points to `X`,
//!    someone split it: unlock, retry. If `d` is the maximum depth:
//!    [`crate::Error::OutOfMemory`], nothing changed.
//! 4. Allocate the two halves `Y0 = (d+1, s)`, `Y1 = (d+1, s | 1 << d)`; out
//!    of memory: unlock, `OutOfMemory`, nothing changed.
//! 5. **Log** `{X, Y0, Y1}` in the split log (one WRITE, CRC-sealed).
//! 6. **Freeze** `X`: CAS every slot to its frozen form, re-READ, repeat
//!    until all are frozen. From now on no writer's CAS on `X` succeeds.
//! 7. READ the key of every block of `X` (header and key, not the value:
//!    the block cannot change while its frozen slot points to it), hash
//!    the keys, and build both halves: each
//!    key at the **same slot position** in the half its hash bit `d`
//!    selects, every slot included, tentative or not (invariant 6). WRITE both
//!    halves in full.
//! 8. **Retire** `X`: rewrite its image with retired headers.
//! 9. **Double** if `d` equals the global depth: WRITE the upper half of the
//!    directory (a copy of the lower half), then CAS the header to depth
//!    `g + 1` (still locked by me).
//! 10. **Publish**: WRITE the `2^(g-d)` entries of `(d, s)` to point to `Y0`
//!     or `Y1` with depth `d + 1`.
//! 11. Clear the log, unlock (CAS).
//!
//! Before steps 5, 7, 8 and 9 the holder checks that at least half its lease
//! is left and renews it with a CAS if not; a failed renewal means another
//! client took over, and the holder stops touching the table.
//!
//! **Concurrent clients during a split.** Readers keep reading `X` through
//! steps 1-7 and wait only between 8 and 10 (for keys of `X` only). Writers
//! to `X` fail their CAS once the slot is frozen, see frozen slots on the
//! re-read, and wait until the directory points elsewhere; writers to every
//! other subtable are unaffected. A client with a stale directory cache that
//! reaches a retired or foreign subtable sees it in the headers and re-reads
//! the directory (invariant 2). Only one split runs at a time (the lock is
//! table-wide): simple, and correct because steps 6-10 touch only `X`, the
//! halves and the directory.
//!
//! **A splitter that dies** leaves the lock held. Its lease expires; the
//! next client that needs the lock, or that waits on `X`, breaks it with one
//! CAS from the exact expired word (so only one breaker wins) and finishes
//! the logged split. Finishing is idempotent: freezing an already frozen
//! slot is skipped; the halves are rebuilt from `X`'s final frozen image,
//! which is identical; if any entry of `(d, s)` already points to a half,
//! the halves may have been written to by others, so they are *not*
//! rebuilt, only the directory steps are completed; doubling writes the
//! same upper half again and is skipped once the header depth is raised. A
//! log torn by a crash during its WRITE fails its CRC and is discarded (no
//! step after it had run). A splitter that dies before step 5 leaks its two
//! new subtables (they are reused by the same client if it lives).
//!
//! **Memory cost**: retired subtables are never reused (invariant 2), so
//! subtable memory is at most twice the live subtables' (each split retires
//! one subtable and creates two).
//!
//! ## Waiting
//! A client that meets a frozen (writer) or retired (anyone) subtable
//! re-reads the directory. If the key's entry moved on, it retries at once.
//! Otherwise: if the lock is held under a live lease, it backs off
//! ([`crate::clock::Clock::backoff`]) and retries; if the lease expired, or
//! nobody holds the lock (the splitter gave up after an error), it takes the
//! lock and finishes the logged split itself.
//!
//! ## Reclamation: grace period with bounded attempts
//! Every operation runs in *attempts*; an attempt starts with the READ of
//! the buckets and may use the words and blocks it read only while
//! `now <= start + max_op_ticks`: the client checks after each READ of
//! blocks completes (a late result is discarded) and before it posts a CAS.
//! A block unlinked at `t` (by the retiring client's clock) is reused only
//! after `t + grace_ticks`, with `grace_ticks > 2 * max_op_ticks` (the
//! factor 2 covers a block read in one attempt and reused from the
//! operation's block cache in the next).
//!
//! * **Primary guarantee: the grace period.** A reader that saw a slot
//!   pointing to block `B` read it after its attempt started, so `B` was
//!   unlinked after that; its attempt ends (or restarts) before
//!   `start + max_op_ticks < unlink + grace`, so it never reads `B` reused,
//!   and no CAS of it can succeed on a word that reappeared by reuse (ABA).
//! * **Backstop: the reader's checks.** Every block is verified (magic,
//!   CRC, length, key) before use, so even if the timing assumptions below
//!   are broken (a client stalled past its deadline, clock skew beyond the
//!   margin) a reader never returns a torn block or another key's value. The
//!   checks cannot tell a block reused for the *same* key (an older or not
//!   yet committed value, or the ABA case where reuse brings back the exact
//!   slot word a CAS expects), nor a block reused for another key from a
//!   genuine fingerprint collision (skipped: the key could look absent).
//!   That is why the grace period is the primary guarantee; the tests in
//!   `tests/reclaim.rs` build both races and show the deadline catching
//!   them.
//! * **Bounded memory** ([`super::KvMemoryStats`]): under an update-heavy load
//!   each client's KV memory is its live blocks, the blocks retired during
//!   one grace period, and at most one partly carved coarse block per
//!   (node, size class).
//!
//! ## Timing assumptions
//! Time-based protocols need bounded clock skew and bounded stalls; here
//! they are:
//! 1. Clients' clocks ([`crate::clock::Clock`]) agree to within a skew that
//!    is small against `lease_ticks` and against
//!    `grace_ticks - 2 * max_op_ticks`.
//! 2. A client does not stall, between checking its deadline (or its lease)
//!    and the execution of the doorbell it then posts, for longer than that
//!    same margin.
//!
//! Under these, a lease holder never overlaps with the client that breaks
//! its lease, and no block is reused under a reader or a CAS. Transport
//! failures need no assumption: an operation that fails with a transport
//! error may or may not have taken effect (its block is then leaked, never
//! reused).
