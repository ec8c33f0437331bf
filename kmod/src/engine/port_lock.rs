//! One engine per port on a machine: the lock file an engine holds for its
//! life.
//!
//! A GID is a port's, so every process of a machine that opens one port
//! with an engine of its own has the same GID, and the two collide: the
//! meta table holds one address per GID, peers' DCCaches one, and
//! messaging answers a GID's one address (`docs/design.md` 3.3, 3.5).
//! Processes that share a port share one engine (`krcored`). The engine
//! takes an exclusive `flock` on the provider's
//! [`Nic::port_lock_path`](krcore_nic::Nic::port_lock_path) at start, so a
//! second engine on the port is refused, typed
//! ([`EngineError::PortInUse`]), instead of colliding.
//!
//! # Invariants
//! - The lock is held while the engine's state lives (dropped with it),
//!   and the kernel drops it with the process: a process that crashed
//!   (SIGKILL) never blocks its successor.
//! - A forked child that adopts its parent's engine shares the lock (one
//!   open file description).
//! - The file is never removed (removing a lock file another process is
//!   opening races); it holds the holder's pid, for the refusal's message.
//! - A lock that cannot be taken for another reason than a holder (a
//!   read-only directory) is logged and skipped: the engine runs unguarded
//!   rather than not at all.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use krcore_nic::Gid;
use rustix::fs::{flock, FlockOperation};

use super::error::EngineError;

/// The port's lock, held (see the module docs).
#[derive(Debug)]
pub(crate) struct PortLock {
    _file: File,
}

impl PortLock {
    /// Takes the lock at `path` for the engine of the port `gid`.
    ///
    /// `Ok(None)`: the lock could not be taken for another reason than a
    /// holder (logged).
    ///
    /// # Errors
    /// [`EngineError::PortInUse`] when another open file description (another
    /// process, or another engine of this one) holds it.
    pub(crate) fn acquire(path: &Path, gid: Gid) -> Result<Option<PortLock>, EngineError> {
        let skip = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(path = %path.display(), %gid, reason = %e, "cannot {what} the port's lock file: a second engine on this port would not be refused");
            Ok(None)
        };
        if let Some(dir) = path.parent() {
            if let Err(e) = std::fs::create_dir_all(dir) {
                return skip("create the directory of", &e);
            }
        }
        let opened = open_rw(path).or_else(|_| OpenOptions::new().read(true).open(path));
        let mut file = match opened {
            Ok(f) => f,
            Err(e) => return skip("open", &e),
        };
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(EngineError::PortInUse {
                    gid,
                    path: path.to_path_buf(),
                    holder: text.trim().parse().ok(),
                });
            }
            Err(e) => return skip("lock", &e),
        }
        // The holder's pid, for a refused process's message (best effort:
        // a read-only file still locks). Written in place at a fixed width,
        // so the file never shrinks: a truncation costs a journal commit on
        // a disk file system (180 us on ext4, 10 times the rest).
        let _ = file.write_all_at(format!("{:>10}\n", std::process::id()).as_bytes(), 0);
        tracing::debug!(path = %path.display(), %gid, "took the port's lock");
        Ok(Some(PortLock { _file: file }))
    }
}

/// Opens `path` for writing, created readable by every user (whose engines
/// on the port must see the lock too).
fn open_rw(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid() -> Gid {
        Gid([7; 16])
    }

    #[test]
    fn a_second_holder_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("port.lock");
        let first = PortLock::acquire(&path, gid()).unwrap().expect("taken");
        match PortLock::acquire(&path, gid()) {
            Err(EngineError::PortInUse {
                gid: g,
                path: p,
                holder,
            }) => {
                assert_eq!((g, p), (gid(), path.clone()));
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("{other:?}"),
        }
        let e = PortLock::acquire(&path, gid()).unwrap_err().to_string();
        assert!(
            e.contains("krcored") && e.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        drop(first);
        assert!(PortLock::acquire(&path, gid()).unwrap().is_some());
    }

    #[test]
    fn a_lock_that_cannot_be_taken_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        // A path under a regular file: no directory can be made there.
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(PortLock::acquire(&file.join("port.lock"), gid())
            .unwrap()
            .is_none());
    }
}
