//! Worker processes for elastic starts (after Swift): [`Node::fork`].

use std::time::{Duration, Instant};

use krcore_kmod::{EngineMode, ForkKit};
use krcore_nic::sim::{fork_process, ForkedChild};
use krcore_nic::{AnyNic, Nic};

use crate::error::{Error, Result};
use crate::node::Node;

/// DCIs the parent prepares for each worker.
const WORKER_DCIS: usize = 1;

/// A worker process started by [`Node::fork`].
///
/// # What the worker may do, and what it must not
///
/// The worker is a copy of the parent at the fork with one thread (the
/// forking one): the node's background threads (messaging progress, RC
/// handshake, the renewal of its meta lease: the parent keeps renewing)
/// do not run in it. The fabric's shared memory (QPs, CQs, MRs
/// of a `/dev/shm` fabric) is the same in both processes.
///
/// - **May**: create VQPs on the inherited [`Node`] (they are bound to a DCI
///   the parent made for this worker before the fork, which the parent
///   never posts on), `connect` to nodes in the inherited DCCache (a hit:
///   no network), post and poll on those VQPs (READ/WRITE/atomics,
///   requests), use regions the parent allocated before the fork (both
///   processes map them: agree on who writes what), use tokens it holds.
/// - **Refused, typed**: a DCCache miss (the meta client's VQP is the
///   parent's), allocating regions (the sim's allocator state is per
///   process), messaging (the SRQ is the parent's), forking again, and
///   creating what the parent's engine creates on first need but had not
///   created before the fork: the DCT ([`Node::local_target`]) and the
///   upgrade's handshake endpoint (a DC -> RC upgrade then fails and the
///   VQP stays on its DCI). A parent that wants them fixed creates them
///   before forking (e.g. by registering, or `EngineConfig::eager_start`).
/// - **Must not**: use VQPs created before the fork (they post on the
///   parent's DCIs), or objects that were locked by another thread of the
///   parent at the fork: fork from a quiescent point.
/// - The worker's closure returns its exit code; the worker then ends with
///   `_exit` (no destructors run: it releases nothing it inherited). The
///   parent keeps the worker's DCI until [`Worker::wait`] (or drop, which
///   kills the worker) and then destroys it.
#[derive(Debug)]
pub struct Worker<N: Nic = AnyNic> {
    child: Option<ForkedChild>,
    _kit: ForkKit<N>,
}

impl<N: Nic> Worker<N> {
    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, ForkedChild::pid)
    }

    /// Waits for the worker: its exit code (128 + signal if killed).
    ///
    /// # Errors
    /// [`Error::Nic`] when `waitpid` fails.
    pub fn wait(mut self) -> Result<i32> {
        match self.child.take() {
            Some(c) => Ok(c.wait()?),
            None => Err(Error::Unsupported("the worker was already reaped")),
        }
    }

    /// Waits at most `timeout`: `Ok(None)` while the worker runs.
    ///
    /// # Errors
    /// [`Error::Nic`] when `waitpid` fails.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let start = Instant::now();
        let Some(c) = self.child.as_mut() else {
            return Err(Error::Unsupported("the worker was already reaped"));
        };
        loop {
            if let Some(code) = c.try_wait()? {
                self.child = None;
                return Ok(Some(code));
            }
            if start.elapsed() >= timeout {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl<N: Nic> Node<N> {
    /// Forks a worker process that runs `work` on this node, inherited and
    /// ready to post (see [`Worker`] for the rules). Returns in the parent.
    ///
    /// ```no_run
    /// use krcore::{Access, Node};
    ///
    /// let server = Node::builder().fabric("sim:/dev/shm/krcore-doc").host_meta().build()?;
    /// let client = Node::builder().join(&server).build()?;
    /// let region = server.alloc(64, Access::ALL)?;
    /// let token = region.token();
    /// client.connect(server.gid())?; // warms the DCCache
    /// let buf = client.alloc(64, Access::LOCAL_WRITE)?; // before the fork
    /// let worker = client.fork(|node| {
    ///     let ok = node
    ///         .connect(token.gid) // a DCCache hit
    ///         .and_then(|v| v.read(&buf, 0, &token, 0, 8)?.wait());
    ///     if ok.is_ok() { 0 } else { 1 }
    /// })?;
    /// assert_eq!(worker.wait()?, 0);
    /// # Ok::<(), krcore::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] on `sim:mem` (private to this process: a
    /// worker could not share it), on a node whose fabric is unknown, in RC
    /// fallback mode, or in a worker; [`Error::Engine`] when the worker's
    /// DCI cannot be made; [`Error::Nic`] when `fork` fails.
    pub fn fork(&self, work: impl FnOnce(&Node<N>) -> i32) -> Result<Worker<N>> {
        let Some(fabric) = self.fabric() else {
            return Err(Error::Unsupported(
                "fork needs the node's fabric (build the node with a fabric spec)",
            ));
        };
        if fabric.dir().is_none() {
            return Err(Error::Unsupported(
                "sim:mem is private to its process: fork needs a directory fabric \
                 (sim:/dev/shm/NAME, SimFabric::open_dir)",
            ));
        }
        if self.mode() != EngineMode::Dc {
            return Err(Error::Unsupported(
                "fork needs DC mode (RC pairs are bound to the parent's QPs)",
            ));
        }
        if self.engine()?.is_forked_child() {
            return Err(Error::Unsupported("a worker cannot fork again"));
        }
        let kit = self.engine()?.prepare_fork(WORKER_DCIS)?;
        let child = fork_process(|| match kit.adopt() {
            Ok(_) => work(self),
            Err(_) => 120,
        })?;
        Ok(Worker {
            child: Some(child),
            _kit: kit,
        })
    }
}
