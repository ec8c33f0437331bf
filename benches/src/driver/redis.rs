//! A Redis server the driver starts on loopback, and a client per thread.
//!
//! The server runs with persistence off (`--save "" --appendonly no`), bound
//! to 127.0.0.1 on a free port, and is killed when the backend drops.

use super::{Backend, BackendError, BatchOp, Found, KvClient};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why the Redis server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// `redis-server` is not installed.
    #[error("redis-server not found on PATH (install it, e.g. `apt-get install redis-server`)")]
    NotInstalled,
    /// It did not answer PING in time.
    #[error("redis-server on port {port} did not become ready within {waited:?}")]
    NotReady { port: u16, waited: Duration },
    /// An OS error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A `redis-server` child process on loopback.
pub struct RedisBackend {
    child: Child,
    url: String,
    port: u16,
}

impl RedisBackend {
    /// Starts `redis-server` on a free loopback port and waits until it
    /// answers.
    ///
    /// # Errors
    /// [`RedisError::NotInstalled`], [`RedisError::NotReady`] or an OS error.
    pub fn start() -> Result<RedisBackend, RedisError> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => RedisError::NotInstalled,
                _ => RedisError::Io(e),
            })?;
        let mut me = RedisBackend {
            child,
            url: format!("redis://127.0.0.1:{port}/"),
            port,
        };
        let waited = Duration::from_secs(10);
        let start = Instant::now();
        loop {
            if let Ok(mut c) = redis::Client::open(me.url.as_str()).and_then(|c| c.get_connection())
            {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(me);
                }
            }
            if let Ok(Some(_)) = me.child.try_wait() {
                return Err(RedisError::NotReady {
                    port,
                    waited: start.elapsed(),
                });
            }
            if start.elapsed() > waited {
                let _ = me.child.kill();
                return Err(RedisError::NotReady { port, waited });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RedisBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn store(e: redis::RedisError) -> BackendError {
    BackendError::Store {
        backend: "redis",
        message: e.to_string(),
    }
}

struct RedisClient {
    conn: redis::Connection,
}

impl KvClient for RedisClient {
    fn read(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Found, BackendError> {
        out.clear();
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query(&mut self.conn)
            .map_err(store)?;
        Ok(match v {
            Some(v) => {
                out.extend_from_slice(&v);
                Found::Yes
            }
            None => Found::No,
        })
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query::<()>(&mut self.conn)
            .map_err(store)
    }

    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Found, BackendError> {
        // SET ... XX: only when the key exists (nil reply when absent).
        let r: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("XX")
            .query(&mut self.conn)
            .map_err(store)?;
        Ok(if r.is_some() { Found::Yes } else { Found::No })
    }

    /// One pipeline (redis-benchmark's `-P`): every command written, then
    /// every reply read, in order; redis runs them in that order.
    fn batch(&mut self, ops: &[BatchOp<'_>], out: &mut Vec<Result<Found, BackendError>>) {
        out.clear();
        let mut pipe = redis::pipe();
        for op in ops {
            match *op {
                BatchOp::Read(k) => pipe.cmd("GET").arg(k),
                BatchOp::Insert(k, v) => pipe.cmd("SET").arg(k).arg(v),
                BatchOp::Update(k, v) => pipe.cmd("SET").arg(k).arg(v).arg("XX"),
            };
        }
        match pipe.query::<Vec<redis::Value>>(&mut self.conn) {
            Ok(replies) if replies.len() == ops.len() => {
                out.extend(replies.iter().map(|r| match r {
                    redis::Value::Nil => Ok(Found::No),
                    redis::Value::ServerError(e) => Err(BackendError::Store {
                        backend: "redis",
                        message: format!("{e:?}"),
                    }),
                    _ => Ok(Found::Yes),
                }));
            }
            Ok(replies) => out.extend(ops.iter().map(|_| {
                Err(BackendError::Store {
                    backend: "redis",
                    message: format!("{} replies to {} commands", replies.len(), ops.len()),
                })
            })),
            Err(e) => out.extend(ops.iter().map(|_| Err(store(e.clone())))),
        }
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn client(&self) -> Result<Box<dyn KvClient>, BackendError> {
        let conn = redis::Client::open(self.url.as_str())
            .and_then(|c| c.get_connection())
            .map_err(|e| BackendError::Setup {
                backend: "redis",
                message: e.to_string(),
            })?;
        Ok(Box::new(RedisClient { conn }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The redis backend against a real `redis-server` (ci/extra.sh installs
    /// one; without it the test says so and checks nothing else): a
    /// pipelined batch answers as the single calls do, in submission order.
    #[test]
    fn a_pipelined_batch_answers_as_the_single_calls() {
        let backend = match RedisBackend::start() {
            Ok(b) => b,
            Err(RedisError::NotInstalled) if std::env::var_os("KRCORE_NEED_REDIS").is_none() => {
                eprintln!("redis-server not installed: skipped");
                return;
            }
            Err(e) => panic!("redis backend: {e}"),
        };
        let mut c = backend.client().expect("client");
        c.insert(b"k1", b"v1").expect("insert");
        let ops = [
            BatchOp::Read(b"k1"),
            BatchOp::Read(b"absent"),
            BatchOp::Update(b"absent", b"x"),
            BatchOp::Update(b"k1", b"v2"),
            BatchOp::Insert(b"k2", b"w"),
            BatchOp::Read(b"k2"),
        ];
        let mut out = Vec::new();
        c.batch(&ops, &mut out);
        let found: Vec<Found> = out.into_iter().map(|r| r.expect("reply")).collect();
        use Found::{No, Yes};
        assert_eq!(found, [Yes, No, No, Yes, Yes, Yes]);
        let mut v = Vec::new();
        assert_eq!(c.read(b"k1", &mut v).expect("read"), Yes);
        assert_eq!(v, b"v2");
        assert_eq!(c.read(b"absent", &mut v).expect("read"), No);
        // The server dies under an open connection: every operation of the
        // next batch fails, typed.
        let mut before = backend.client().expect("client");
        drop(backend);
        let mut out = Vec::new();
        before.batch(&ops, &mut out);
        assert_eq!(out.len(), ops.len());
        assert!(out.iter().all(|r| r.is_err()), "{out:?}");
    }
}
