//! An in-process concurrent map: the upper bound a remote store is compared
//! against (no network, no serialization).

use super::{Backend, BackendError, Found, KvClient};
use dashmap::DashMap;
use std::sync::Arc;

/// A `DashMap<Vec<u8>, Vec<u8>>` shared by every client thread.
#[derive(Default)]
pub struct MapBackend {
    map: Arc<DashMap<Vec<u8>, Vec<u8>>>,
}

impl MapBackend {
    /// An empty map.
    pub fn new() -> MapBackend {
        MapBackend::default()
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

struct MapClient {
    map: Arc<DashMap<Vec<u8>, Vec<u8>>>,
}

impl KvClient for MapClient {
    fn read(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Found, BackendError> {
        out.clear();
        Ok(match self.map.get(key) {
            Some(v) => {
                out.extend_from_slice(&v);
                Found::Yes
            }
            None => Found::No,
        })
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Found, BackendError> {
        Ok(match self.map.get_mut(key) {
            Some(mut v) => {
                v.clear();
                v.extend_from_slice(value);
                Found::Yes
            }
            None => Found::No,
        })
    }
}

impl Backend for MapBackend {
    fn name(&self) -> &'static str {
        "dashmap"
    }

    fn client(&self) -> Result<Box<dyn KvClient>, BackendError> {
        Ok(Box::new(MapClient {
            map: self.map.clone(),
        }))
    }
}
