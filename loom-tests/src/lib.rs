//! loom models of KRCore-rs's lock-free protocols.
//!
//! The models live in `tests/` and compile only under the project-specific
//! cfg `krcore_loom` (never bare `cfg(loom)`), which also switches the crates'
//! `sync` shims to loom's primitives so the models exercise the real code:
//!
//! ```sh
//! ci/loom.sh        # RUSTFLAGS="--cfg krcore_loom" LOOM_MAX_PREEMPTIONS=2, release
//! ```
//!
//! # Models
//!
//! | file | protocol | invariant |
//! |------|----------|-----------|
//! | `tests/dccache.rs` | DCCache insert / invalidate / read (per-bucket seqlocks) | no torn or stale entry |
//! | `tests/shared_qp.rs` | completion routing and send-queue credits on a shared physical QP (kmod's `SendQueueCredits` with one record per WR, staged/committed as the engine does, user slots beside it, per-VQP counts; host locking modeled) | no lost, duplicate or misrouted completion; no double credit; all credits free at the end |
//! | `tests/upgrade_switch.rs` | the VQP switch from DC to RC with in-flight work and the way back on eviction (kmod's `SendQueueCredits` with one record per WR and the user slots beside it per QP, the VQP's state (its count of WRs in flight, its ring of unpolled completions) moving between a modeled DCI and RC pair; binding lock, `detach_drained`, `close_if_idle`, downgrade and the pickup of a pair built in the background modeled after `engine/upgrade.rs`) | every completion delivered once, in post order across the switch; nothing posted on one QP while the VQP has WRs in flight on the other; both accounts empty and the VQP's count 0 at the end |
//! | `tests/race.rs` | the RACE client (race-store, unmodified) over memory whose words are loom atomics: racing inserts + duplicate removal, update/delete with a leftover duplicate, KV block reclamation | one copy visible after inserts settle; no stale read; a reclaimed block is never read reused |
//!
//! Each model fails when the step it protects is removed. `shared_qp.rs`
//! and `upgrade_switch.rs` keep their mutations as `mutation_*` models that
//! must fail (`should_panic`):
//!
//! | mutation model (`should_panic`) | step removed | what loom reports |
//! |---------------------------------|--------------|-------------------|
//! | `shared_qp::mutation_recording_after_the_doorbell_loses_completions` | account updated in the doorbell's critical section | account refused a completion |
//! | `shared_qp::mutation_draining_outside_the_qp_lock_routes_out_of_order` | CQ drained and routed under the QP lock | account refused a completion |
//! | `upgrade_switch::mutation_drain_check_and_move_under_two_locks` | `detach_drained` checks and takes under one DCI lock | posted on the RC pair while WRs of the VQP are in flight on the DCI (a DCI post slipped in between check and move); without the later RC post: a WR never completed |
//! | `upgrade_switch::mutation_switching_without_waiting_for_drain` | the switch waits for the VQP's DCI WRs | posted on the RC pair while WRs of the VQP are in flight on the DCI |
//! | `upgrade_switch::mutation_background_switch_without_waiting_for_drain` | a pair built in the background is taken only once the VQP's DCI WRs drained | posted on the RC pair while WRs of the VQP are in flight on the DCI |
//! | `upgrade_switch::mutation_switch_leaves_unpolled_completions_behind` | unpolled completions move with the state | lost completion (`[0, 2]` delivered) |
//! | `upgrade_switch::mutation_evicting_a_pair_with_work_in_flight` | `close_if_idle` closes only with nothing in flight | posted on the DCI while WRs of the VQP are in flight on the RC pair |
//!
//! The RACE steps live in library code, so their
//! mutations were applied as temporary edits, each caught by loom:
//!
//! | mutation (temporary edit) | model that failed | what it reported |
//! |---------------------------|-------------------|------------------|
//! | `insert_loop` skips `dedup` (client/write.rs) | `racing_inserts_of_one_key_leave_one_copy` | both inserts `Ok` |
//! | `replace` CASes the lowest copy before removing the others (delete) | `reads_racing_update_and_delete_are_never_stale` | stale read after the update returned |
//! | `reclaim` ignores `grace_ticks` (client/alloc.rs) | `a_block_is_not_reused_within_its_grace_period` | reader saw `None` (another key's block) |
//! | `get` skips its `fresh` deadline check (client/mod.rs) | `a_reader_never_uses_a_block_reused_after_its_grace_period` | reader saw `None` |
//!
//! The DCCache protocol (kmod/src/dccache.rs), temporary edits, each caught
//! by `ci/loom.sh`:
//!
//! | mutation (temporary edit) | model that failed | what it reported |
//! |---------------------------|-------------------|------------------|
//! | `lookup_in` skips the second `seq` load | `lookup_racing_replace_is_never_torn` | torn entry |
//! | `lookup_in` ignores the WRITER bit | `lookup_racing_replace_is_never_torn` | torn entry |
//! | `lookup` never reads the second bucket | `concurrent_inserts_into_one_bucket_both_land`, `second_bucket_entry_racing_reader_and_invalidate` | the entry in its second bucket is not found (assertions at tests/dccache.rs) |
//! | `lock_pair` takes the buckets in key order, not index order | `inserts_with_crossed_bucket_pairs_both_land` | loom: branch limit (the two writers deadlock) |
//! | `insert` ignores the epoch floor | `epoch_sweep_is_final_against_racing_old_insert` | its sweep-finality assertion fails |
//! | `remove` does not publish the bucket (`changed = false`) | `invalidate_racing_lookup` | entry still cached after invalidate |
//!
//! Each model states the invariant it protects. Writing a model: put the side
//! that *checks* (a reader, a sweeper) in the spawned thread and the side that
//! mutates in the main thread as well as in spawned ones; loom explores far
//! fewer interleavings when the only writer is the spawned thread.
#![forbid(unsafe_code)]

/// Helpers shared by the models: values derived from a key, so that any torn
/// or mixed read is detectable.
pub mod derive {
    use krcore_nic::{DcTarget, Gid};

    /// A GID for model key `k`.
    pub fn gid(k: u8) -> Gid {
        let mut g = [0u8; 16];
        g[0] = k;
        g[15] = k.wrapping_mul(31);
        Gid(g)
    }

    /// The target stored for `(k, version)`: every field is derived from both,
    /// so a reader seeing fields of two different writes notices.
    pub fn target(k: u8, version: u32) -> DcTarget {
        DcTarget {
            gid: gid(k),
            dct_num: (k as u32) << 16 | version,
            dc_key: ((k as u64) << 32 | version as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        }
    }

    /// Whether `t` is exactly `target(k, v)` for some version `v`; returns it.
    pub fn version_of(k: u8, t: &DcTarget) -> Option<u32> {
        let v = t.dct_num & 0xffff;
        (*t == target(k, v)).then_some(v)
    }
}
