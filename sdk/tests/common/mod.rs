//! Shared by the fork test binaries: a directory fabric and the lock that
//! keeps forks one at a time.

/// Forking while other test threads of this binary run could copy a lock
/// they hold into the child: every test that forks holds this.
pub static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// The exit code every forked worker of these tests returns on success;
/// any other code names the step that failed.
pub const OK: i32 = 0;

/// Waits (30 s at most) for `worker` and asserts it exited with [`OK`].
pub fn expect_ok(mut worker: krcore::Worker) {
    let code = worker
        .wait_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    assert_eq!(
        code,
        Some(OK),
        "the worker's exit code names the failed step"
    );
}

/// A fresh directory fabric (under `/dev/shm` when present), removed on
/// drop.
pub struct Dir(std::path::PathBuf);

impl Dir {
    /// `krcore-{prefix}-{tag}-{pid}-{nanos}`.
    pub fn new(prefix: &str, tag: &str) -> Dir {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Dir(base.join(format!(
            "krcore-{prefix}-{tag}-{}-{nanos}",
            std::process::id()
        )))
    }

    /// The fabric spec naming this directory.
    pub fn spec(&self) -> String {
        format!("sim:{}", self.0.display())
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
