//! The plan of a batch, before any round trip: which writes combine
//! ([`combine`]) and the wave of each operation ([`waves_of`]). Pure
//! functions of the operations and their key hashes.

use crate::hash::KeyHash;

use super::Op;

/// How [`combine`] treats one operation of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Combined {
    /// Runs as given.
    Alone,
    /// Not sent; it answers as operation `j` does: a write overwritten by
    /// `j`, the next operation on its key, before anyone can read it; or a
    /// get that `j`, the first get of a run of gets on its key, reads for.
    Into(usize),
    /// An update that follows combined puts of its key: the key exists
    /// once they apply, so it runs as a put.
    AsPut,
    /// A get right after write `j` of its key, with nothing but gets after
    /// it on the key: not sent; it answers from `j`'s outcome once the
    /// waves are done (the value `j` wrote, or none after a delete or a
    /// `NotFound`), or, when that outcome does not tell (an error), as a
    /// single get then.
    Reads(usize),
}

/// Local combining of same-key writes inside a batch (write-conflict
/// avoidance: a hot key written twice in a batch costs one CAS). A put or
/// an update directly followed, among the batch's operations on its key,
/// by a put or an update is linearized just before that one, its value
/// overwritten at once: it sends nothing and answers as that one does
/// (two updates: both find the key or neither; an update after puts: the
/// key exists, so it runs as a put and succeeds). An update followed by a
/// put is not combined (its answer depends on whether the key existed);
/// inserts and deletes are never combined.
///
/// Same-key gets are combined too (a hot key read twice in a batch costs
/// one read, and no second wave): a get directly preceded, among the
/// batch's operations on its key, by a get answers as the first get of
/// that run, linearized just after it with nothing between them.
///
/// A get right after a write of its key, with only gets after it on that
/// key, reads what the write did ([`Combined::Reads`]): linearized just
/// after the write, it needs no wave of its own.
///
/// Writes one entry per operation into `out` (cleared first).
pub(super) fn combine(ops: &[Op<'_>], hashes: &[KeyHash], out: &mut Vec<Combined>) {
    out.clear();
    out.resize(ops.len(), Combined::Alone);
    combine_gets(ops, hashes, out);
    if !ops
        .iter()
        .any(|op| matches!(op, Op::Put(..) | Op::Update(..)))
    {
        reads_of_writes(ops, hashes, out);
        return;
    }
    // Whether operation i is a put, or an update that runs as one.
    let mut put_like: Vec<bool> = ops.iter().map(|op| matches!(op, Op::Put(..))).collect();
    for (i, op) in ops.iter().enumerate() {
        if !matches!(op, Op::Put(..) | Op::Update(..)) || op.check().is_err() {
            continue;
        }
        let Some(h) = hashes.get(i) else { continue };
        let next = (i + 1..ops.len())
            .find(|&j| hashes.get(j) == Some(h) && ops.get(j).map(Op::key) == Some(op.key()));
        let Some(j) = next.filter(|&j| ops.get(j).is_some_and(|o| o.check().is_ok())) else {
            continue;
        };
        let me_put = put_like.get(i).copied().unwrap_or(false);
        match ops.get(j) {
            Some(Op::Put(..)) if me_put => {}
            Some(Op::Update(..)) => {
                if me_put {
                    if let Some(p) = put_like.get_mut(j) {
                        *p = true;
                    }
                    if let Some(c) = out.get_mut(j) {
                        *c = Combined::AsPut;
                    }
                }
            }
            _ => continue,
        }
        if let Some(c) = out.get_mut(i) {
            *c = Combined::Into(j);
        }
    }
    reads_of_writes(ops, hashes, out);
}

/// The read-your-write part of [`combine`] (after the others): each
/// valid get not combined yet, right after a valid write of its key that
/// is sent, with only gets after it on the key, becomes `Reads` of it.
fn reads_of_writes(ops: &[Op<'_>], hashes: &[KeyHash], out: &mut [Combined]) {
    let n = ops.len();
    // Pairwise: past a few hundred operations, not worth its cost.
    let gets = ops.iter().filter(|o| matches!(o, Op::Get(_))).count();
    // Nothing to do without a get, or without a write (a batch of gets).
    if !(2..=256).contains(&n) || gets == 0 || gets == n {
        return;
    }
    let same_key = |i: usize, j: usize| {
        hashes.get(i) == hashes.get(j) && ops.get(i).map(Op::key) == ops.get(j).map(Op::key)
    };
    let valid = |i: usize| ops.get(i).is_some_and(|o| o.check().is_ok());
    let is_get = |i: usize| matches!(ops.get(i), Some(Op::Get(_)));
    for i in 0..n {
        if !is_get(i) || !valid(i) || out.get(i) != Some(&Combined::Alone) {
            continue;
        }
        let Some(j) = (0..i).rev().find(|&j| same_key(i, j)) else {
            continue;
        };
        let sent = matches!(out.get(j), Some(Combined::Alone | Combined::AsPut));
        if is_get(j) || !valid(j) || !sent {
            continue;
        }
        if (i + 1..n).any(|k| same_key(i, k) && !is_get(k)) {
            continue;
        }
        if let Some(c) = out.get_mut(i) {
            *c = Combined::Reads(j);
        }
    }
}

/// The get-combining part of [`combine`]: each valid get whose previous
/// operation on its key is a valid get becomes `Into` the first get of
/// that run.
fn combine_gets(ops: &[Op<'_>], hashes: &[KeyHash], out: &mut [Combined]) {
    let is_get = |i: usize| matches!(ops.get(i), Some(Op::Get(_)));
    if ops.len() < 2 || (0..ops.len()).filter(|&i| is_get(i)).count() < 2 {
        return;
    }
    let same_key = |i: usize, j: usize| {
        hashes.get(i) == hashes.get(j) && ops.get(i).map(Op::key) == ops.get(j).map(Op::key)
    };
    let valid = |i: usize| ops.get(i).is_some_and(|o| o.check().is_ok());
    // The previous operation on each operation's key: pairwise for a
    // small batch, through a map for a large one.
    let mut prev: Vec<Option<usize>> = vec![None; ops.len()];
    if ops.len() <= 64 {
        for (i, p) in prev.iter_mut().enumerate() {
            *p = (0..i).rev().find(|&j| same_key(i, j));
        }
    } else {
        let mut last: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            if let Some(p) = prev.get_mut(i) {
                *p = last.insert(op.key(), i);
            }
        }
    }
    for i in 0..ops.len() {
        if !is_get(i) || !valid(i) {
            continue;
        }
        let Some(j) = prev.get(i).copied().flatten() else {
            continue;
        };
        if !is_get(j) || !valid(j) {
            continue;
        }
        // The run's first get (j is one, or answers as one).
        let head = match out.get(j) {
            Some(Combined::Into(h)) => *h,
            _ => j,
        };
        if let Some(c) = out.get_mut(i) {
            *c = Combined::Into(head);
        }
    }
}

/// The wave of each operation: its position among the earlier operations
/// on the same key (0 for a key's first), so that a key appears at most
/// once per wave and a key's operations run in submission order.
/// Into `out` (cleared first); `kept` is storage.
pub(super) fn waves_of(
    hashes: &[KeyHash],
    combined: &[Combined],
    kept: &mut Vec<usize>,
    out: &mut Vec<usize>,
) {
    let not_sent = |c: Option<&Combined>| matches!(c, Some(Combined::Into(_) | Combined::Reads(_)));
    if !combined.iter().any(|c| not_sent(Some(c))) {
        waves_into(hashes, out);
        return;
    }
    kept.clear();
    kept.extend((0..hashes.len()).filter(|&i| !not_sent(combined.get(i))));
    let kept_hashes: Vec<KeyHash> = kept
        .iter()
        .filter_map(|&i| hashes.get(i).copied())
        .collect();
    // Combined operations get a wave no kept operation has (never run).
    out.clear();
    out.resize(hashes.len(), usize::MAX);
    for (&i, w) in kept.iter().zip(waves(&kept_hashes)) {
        if let Some(o) = out.get_mut(i) {
            *o = w;
        }
    }
}

fn waves(hashes: &[KeyHash]) -> Vec<usize> {
    let mut out = Vec::with_capacity(hashes.len());
    waves_into(hashes, &mut out);
    out
}

/// [`waves`] into `out` (cleared first).
fn waves_into(hashes: &[KeyHash], out: &mut Vec<usize>) {
    out.clear();
    if hashes.len() <= 32 {
        // Few operations: comparing pairs costs less than sorting.
        out.extend(hashes.iter().enumerate().map(|(i, h)| {
            let earlier = hashes.get(..i).unwrap_or_default();
            earlier.iter().filter(|e| *e == h).count()
        }));
        return;
    }
    let mut order: Vec<usize> = (0..hashes.len()).collect();
    let h = |i: usize| hashes.get(i).map(|h| (h.h1(), h.h2()));
    order.sort_unstable_by_key(|&i| (h(i), i));
    out.resize(hashes.len(), 0);
    let mut run = 0;
    for k in 1..order.len() {
        let (Some(&prev), Some(&cur)) = (order.get(k - 1), order.get(k)) else {
            continue;
        };
        run = if h(prev) == h(cur) { run + 1 } else { 0 };
        if let Some(w) = out.get_mut(cur) {
            *w = run;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_put_each_key_once_per_wave_in_submission_order() {
        let (a, b, c) = (KeyHash::of(b"a"), KeyHash::of(b"b"), KeyHash::of(b"c"));
        assert_eq!(waves(&[]), Vec::<usize>::new());
        assert_eq!(waves(&[a, b, c]), vec![0, 0, 0]);
        assert_eq!(waves(&[a, b, a, a, c, b]), vec![0, 0, 1, 2, 0, 1]);
        // The sorting path (past 32 operations) agrees.
        let many: Vec<KeyHash> = (0..40u32)
            .map(|i| KeyHash::of(&(i % 7).to_le_bytes()))
            .collect();
        let want: Vec<usize> = (0..40).map(|i| i / 7).collect();
        assert_eq!(waves(&many), want);
    }

    #[test]
    fn same_key_writes_combine_into_the_next_write_of_their_key() {
        use Combined::*;
        let ops = [
            Op::Put(b"a", b"1"),
            Op::Put(b"a", b"2"),
            Op::Update(b"a", b"3"),
            Op::Update(b"b", b"1"),
            Op::Get(b"b"),
            Op::Update(b"b", b"2"),
            Op::Update(b"b", b"3"),
            Op::Put(b"b", b"4"),
            Op::Delete(b"a"),
            Op::Put(b"c", b"1"),
            Op::Put(b"c", b""),
            Op::Update(b"", b"1"),
            Op::Update(b"", b"2"),
        ];
        let hashes: Vec<KeyHash> = ops.iter().map(|o| KeyHash::of(o.key())).collect();
        let mut combined = vec![Alone; 3];
        combine(&ops, &hashes, &mut combined);
        assert_eq!(
            combined,
            vec![
                Into(1),
                Into(2),
                // After puts: a put; the delete ends the chain.
                AsPut,
                // A get in between.
                Alone,
                Alone,
                Into(6),
                // An update before a put: its answer depends on the key.
                Alone,
                Alone,
                Alone,
                Into(10),
                Alone,
                // Bad input is never combined.
                Alone,
                Alone,
            ]
        );
    }

    #[test]
    fn same_key_gets_combine_into_the_first_of_their_run() {
        use Combined::*;
        let ops = [
            Op::Get(b"a"),
            Op::Get(b"b"),
            Op::Get(b"a"),
            Op::Get(b"a"),
            Op::Put(b"a", b"1"),
            Op::Get(b"a"),
            Op::Get(b"a"),
            Op::Delete(b"b"),
            Op::Get(b"b"),
            Op::Get(b""),
            Op::Get(b""),
        ];
        let hashes: Vec<KeyHash> = ops.iter().map(|o| KeyHash::of(o.key())).collect();
        let mut combined = Vec::new();
        combine(&ops, &hashes, &mut combined);
        assert_eq!(
            combined,
            vec![
                Alone,
                Alone,
                Into(0),
                Into(0),
                // A write ends the run; the gets after it make a new one,
                // which reads what the write did (nothing but gets follow).
                Alone,
                Reads(4),
                Into(5),
                Alone,
                Reads(7),
                // Bad input is never combined.
                Alone,
                Alone,
            ]
        );
        let mut waves = Vec::new();
        waves_of(&hashes, &combined, &mut Vec::new(), &mut waves);
        let x = usize::MAX;
        assert_eq!(waves, vec![0, 0, x, x, 1, x, x, 1, x, 0, 1]);
        // The map path of a large batch agrees.
        let keys: Vec<Vec<u8>> = (0..100u8).map(|i| vec![b'k', i % 3]).collect();
        let many: Vec<Op<'_>> = keys.iter().map(|k| Op::Get(k)).collect();
        let hashes: Vec<KeyHash> = many.iter().map(|o| KeyHash::of(o.key())).collect();
        combine(&many, &hashes, &mut combined);
        for (i, c) in combined.iter().enumerate() {
            let want = if i < 3 { Alone } else { Into(i % 3) };
            assert_eq!(*c, want, "op {i}");
        }
    }

    #[test]
    fn a_get_reads_the_write_before_it_only_when_nothing_but_gets_follow() {
        use Combined::*;
        let ops = [
            Op::Put(b"a", b"1"),
            Op::Get(b"a"),
            Op::Update(b"b", b"1"),
            Op::Get(b"b"),
            Op::Delete(b"b"),
            Op::Insert(b"c", b"1"),
            Op::Get(b"c"),
            Op::Get(b"c"),
            Op::Get(b"d"),
            Op::Put(b"e", b"1"),
            Op::Put(b"e", b"2"),
            Op::Get(b"e"),
        ];
        let hashes: Vec<KeyHash> = ops.iter().map(|o| KeyHash::of(o.key())).collect();
        let mut combined = Vec::new();
        combine(&ops, &hashes, &mut combined);
        assert_eq!(
            combined,
            vec![
                Alone,
                Reads(0),
                Alone,
                // A write follows: read in its wave.
                Alone,
                Alone,
                Alone,
                Reads(5),
                Into(6),
                Alone,
                // The combined put's successor is the one read.
                Into(10),
                Alone,
                Reads(10),
            ]
        );
    }
}
