//! Shared by the fork test binaries: a directory fabric and the lock that
//! keeps forks one at a time.

/// Forking while other test threads of this binary run could copy a lock
/// they hold into the child: every test that forks holds this.
pub static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

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
