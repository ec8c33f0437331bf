//! `FabricSpec`: the one parser of `--fabric` strings.
//!
//! A fabric string names a provider, where its nodes meet, and a few device
//! options, so that a binary picks its provider at run time:
//!
//! ```text
//! sim:mem                     a private in-process sim fabric
//! sim:NAME                    the directory fabric /dev/shm/NAME (NAME without '/')
//! sim:/abs/path               a directory fabric shared by processes
//! verbs:DEVICE                a real RDMA device (rxe0, mlx5_0, ...)
//!
//! options, after commas:      sim:   dc=on|off (default on), latency=none|cx4 (default none),
//!                                    host=H (the node takes host H's GID, as a
//!                                            restarted process takes its machine's;
//!                                            H in [A-Za-z0-9._-], 1-64 bytes)
//!                             verbs: port=N (1-based; default: the first ACTIVE port)
//!                                    gid=N  (GID index; default: the first RoCE v2
//!                                            IPv4-mapped GID, index 0 on InfiniBand)
//! ```
//!
//! e.g. `sim:krc,dc=off`, `verbs:mlx5_0,port=1,gid=3`.
//!
//! [`FabricSpec::open`] (in [`crate::any`]) turns a spec into a working
//! [`crate::AnyNic`].
//!
//! # Invariants
//! - Every value of these types is one a fabric string can express: names
//!   and paths are checked by the constructors (no ',' anywhere, no '/' in a
//!   `sim:NAME` or a device name, nothing empty, no NUL), so [`Display`]
//!   round-trips: `s.to_string().parse() == Ok(s)`.
//! - [`Display`] is canonical: options appear only when they differ from the
//!   default, in the order `dc`, `latency`, `host` / `port`, `gid`.
//! - Serde (de)serializes a spec as its string.
//!
//! [`Display`]: std::fmt::Display

use crate::sim::{LatencyModel, SimConfig};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What a fabric string looks like, for error messages.
pub const GRAMMAR: &str = "sim:mem, sim:NAME, sim:/abs/path (options dc=on|off, \
     latency=none|cx4, host=NAME) or verbs:DEVICE[,port=N][,gid=N]";

/// Why a fabric string was refused. Every variant names the whole string.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The string is not of any known form (unknown provider, empty or
    /// malformed location).
    #[error("bad fabric {spec:?}: {reason}; expected {GRAMMAR}")]
    Malformed {
        /// The string.
        spec: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An option nobody knows.
    #[error(
        "bad fabric {spec:?}: unknown option {key:?} (sim takes dc=on|off, \
         latency=none|cx4 and host=NAME; verbs takes port=N and gid=N)"
    )]
    UnknownOption {
        /// The string.
        spec: String,
        /// The option's key.
        key: String,
    },
    /// An option of the other provider (`port=` on a sim fabric, ...).
    #[error("bad fabric {spec:?}: option {key:?} applies to {provider}: fabrics only")]
    WrongProvider {
        /// The string.
        spec: String,
        /// The option's key.
        key: String,
        /// The provider the option belongs to.
        provider: &'static str,
    },
    /// A known option with a value it cannot take (or no value).
    #[error("bad fabric {spec:?}: bad value {value:?} for option {key}: expected {expected}")]
    BadValue {
        /// The string.
        spec: String,
        /// The option's key.
        key: String,
        /// The value given.
        value: String,
        /// What it may be.
        expected: &'static str,
    },
    /// An option given twice.
    #[error("bad fabric {spec:?}: option {key} given twice")]
    DuplicateOption {
        /// The string.
        spec: String,
        /// The option's key.
        key: String,
    },
    /// A verbs spec where only a sim fabric will do
    /// ([`crate::sim::SimFabric::from_spec`]).
    #[error("fabric {spec:?} is not a sim fabric (expected sim:mem, sim:NAME or sim:/abs/path)")]
    NotSim {
        /// The string.
        spec: String,
    },
}

/// A parsed fabric string: which provider, where, with which device options.
#[derive(Clone, Debug, PartialEq)]
pub enum FabricSpec {
    /// The `sim` software RNIC.
    Sim(SimSpec),
    /// A real RDMA device through libibverbs (feature `verbs`).
    Verbs(VerbsSpec),
}

/// Where a sim fabric lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SimLocation {
    /// `sim:mem`: private to the process.
    Mem,
    /// `sim:NAME`: the directory `/dev/shm/NAME`.
    Shm(String),
    /// `sim:/abs/path`: a directory shared by processes.
    Dir(PathBuf),
}

/// A `sim:` spec: the fabric's location and the node's device options.
#[derive(Clone, Debug, PartialEq)]
pub struct SimSpec {
    location: SimLocation,
    dc: bool,
    latency: Option<LatencyModel>,
    host: Option<String>,
}

/// A `verbs:` spec: the device name and the port and GID index to use
/// (`None`: chosen at open, see the `verbs` module, feature `verbs`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VerbsSpec {
    device: String,
    port: Option<u8>,
    gid_index: Option<u8>,
}

fn malformed(spec: &str, reason: &'static str) -> SpecError {
    SpecError::Malformed {
        spec: spec.to_string(),
        reason,
    }
}

/// Checks a `sim:NAME` or a device name: non-empty, no '/', ',', '=', NUL
/// or whitespace.
fn check_name(spec: &str, name: &str, what: &'static str) -> Result<(), SpecError> {
    let bad = |c: char| matches!(c, '/' | ',' | '=' | '\0') || c.is_whitespace();
    if name.is_empty() || name.contains(bad) {
        return Err(malformed(spec, what));
    }
    Ok(())
}

/// Checks a `host=` value: 1-64 bytes of `[A-Za-z0-9._-]`.
fn check_host(spec: &str, host: &str) -> Result<(), SpecError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if host.is_empty() || host.len() > 64 || !host.chars().all(ok) {
        return Err(SpecError::BadValue {
            spec: spec.into(),
            key: "host".into(),
            value: host.into(),
            expected: "a host name of 1-64 bytes of [A-Za-z0-9._-]",
        });
    }
    Ok(())
}

impl SimSpec {
    /// `sim:mem` with default options.
    pub fn mem() -> SimSpec {
        SimSpec::at(SimLocation::Mem)
    }

    /// `sim:NAME` (`/dev/shm/NAME`) with default options.
    ///
    /// # Errors
    /// `Malformed` for an empty name or one with '/', ',', '=', NUL or
    /// whitespace, and for `mem` (which names the in-process fabric).
    pub fn shm(name: &str) -> Result<SimSpec, SpecError> {
        let spec = format!("sim:{name}");
        if name == "mem" {
            return Err(malformed(&spec, "\"mem\" names the in-process fabric"));
        }
        check_name(
            &spec,
            name,
            "a sim NAME must be non-empty without '/', ',', '=' or spaces",
        )?;
        Ok(SimSpec::at(SimLocation::Shm(name.to_string())))
    }

    /// `sim:/abs/path` with default options.
    ///
    /// # Errors
    /// `Malformed` for a relative path, or one that is not UTF-8 or holds a
    /// ',' or NUL (which a fabric string cannot carry).
    pub fn dir(path: impl AsRef<Path>) -> Result<SimSpec, SpecError> {
        let path = path.as_ref();
        let Some(s) = path.to_str() else {
            return Err(malformed(
                &format!("sim:{}", path.display()),
                "the path is not UTF-8",
            ));
        };
        let spec = format!("sim:{s}");
        if !path.is_absolute() {
            return Err(malformed(&spec, "a sim path must be absolute"));
        }
        if s.contains([',', '\0']) {
            return Err(malformed(&spec, "a sim path cannot contain ',' or NUL"));
        }
        Ok(SimSpec::at(SimLocation::Dir(path.to_path_buf())))
    }

    fn at(location: SimLocation) -> SimSpec {
        SimSpec {
            location,
            dc: true,
            latency: None,
            host: None,
        }
    }

    /// The same spec with DC on or off.
    pub fn with_dc(mut self, dc: bool) -> SimSpec {
        self.dc = dc;
        self
    }

    /// The same spec with a latency model (`None`: off).
    pub fn with_latency(mut self, latency: Option<LatencyModel>) -> SimSpec {
        self.latency = latency;
        self
    }

    /// Where the fabric lives.
    pub fn location(&self) -> &SimLocation {
        &self.location
    }

    /// The fabric directory (`None` for `sim:mem`).
    pub fn dir_path(&self) -> Option<PathBuf> {
        match &self.location {
            SimLocation::Mem => None,
            SimLocation::Shm(n) => Some(Path::new("/dev/shm").join(n)),
            SimLocation::Dir(p) => Some(p.clone()),
        }
    }

    /// Whether nodes offer DC (`dc=`).
    pub fn dc(&self) -> bool {
        self.dc
    }

    /// The latency model (`latency=`).
    pub fn latency(&self) -> Option<LatencyModel> {
        self.latency
    }

    /// The same spec on host `host` (`host=`; `None`: a GID of the node's
    /// own).
    ///
    /// # Errors
    /// `BadValue` for a name outside `[A-Za-z0-9._-]{1,64}`.
    pub fn with_host(mut self, host: Option<&str>) -> Result<SimSpec, SpecError> {
        if let Some(h) = host {
            check_host(&self.to_string(), h)?;
        }
        self.host = host.map(str::to_string);
        Ok(self)
    }

    /// The host nodes take the GID of (`host=`).
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The node configuration these options give: [`SimConfig::default`]
    /// with `dc`, `latency` and `host` set.
    pub fn config(&self) -> SimConfig {
        SimConfig {
            dc: self.dc,
            latency: self.latency,
            host: self.host.clone(),
            ..SimConfig::default()
        }
    }
}

impl VerbsSpec {
    /// `verbs:DEVICE` with the port and GID index chosen at open.
    ///
    /// # Errors
    /// `Malformed` for an empty name or one with '/', ',', '=', NUL or
    /// whitespace.
    pub fn new(device: &str) -> Result<VerbsSpec, SpecError> {
        check_name(
            &format!("verbs:{device}"),
            device,
            "a device name must be non-empty without '/', ',', '=' or spaces",
        )?;
        Ok(VerbsSpec {
            device: device.to_string(),
            port: None,
            gid_index: None,
        })
    }

    /// The same spec with an explicit port (1-based; `None`: the first
    /// active port).
    ///
    /// # Errors
    /// `BadValue` for port 0.
    pub fn with_port(mut self, port: Option<u8>) -> Result<VerbsSpec, SpecError> {
        if port == Some(0) {
            return Err(SpecError::BadValue {
                spec: self.to_string(),
                key: "port".into(),
                value: "0".into(),
                expected: "a port number from 1 to 255",
            });
        }
        self.port = port;
        Ok(self)
    }

    /// The same spec with an explicit GID index (`None`: chosen at open).
    pub fn with_gid_index(mut self, gid_index: Option<u8>) -> VerbsSpec {
        self.gid_index = gid_index;
        self
    }

    /// The device name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The explicit port, if any.
    pub fn port(&self) -> Option<u8> {
        self.port
    }

    /// The explicit GID index, if any.
    pub fn gid_index(&self) -> Option<u8> {
        self.gid_index
    }
}

impl FabricSpec {
    /// `sim:mem` with default options.
    pub fn sim_mem() -> FabricSpec {
        FabricSpec::Sim(SimSpec::mem())
    }

    /// Parses a fabric string (see the module docs for the grammar).
    ///
    /// # Errors
    /// A [`SpecError`] naming the string and what was expected.
    pub fn parse(s: &str) -> Result<FabricSpec, SpecError> {
        let mut parts = s.split(',');
        let head = parts.next().unwrap_or("");
        let Some((provider, rest)) = head.split_once(':') else {
            return Err(malformed(s, "no provider prefix"));
        };
        let relabel = |e: SpecError| match e {
            SpecError::Malformed { reason, .. } => malformed(s, reason),
            other => other,
        };
        let mut spec = match provider {
            "sim" => FabricSpec::Sim(match rest {
                "mem" => SimSpec::mem(),
                "" => return Err(malformed(s, "missing sim location")),
                r if r.starts_with('/') => SimSpec::dir(r).map_err(relabel)?,
                r => SimSpec::shm(r).map_err(relabel)?,
            }),
            "verbs" => FabricSpec::Verbs(VerbsSpec::new(rest).map_err(relabel)?),
            _ => return Err(malformed(s, "unknown provider")),
        };
        let mut seen: Vec<&str> = Vec::new();
        for opt in parts {
            let (key, value) = opt.split_once('=').unwrap_or((opt, ""));
            if key.is_empty() {
                return Err(malformed(s, "empty option"));
            }
            if seen.contains(&key) {
                return Err(SpecError::DuplicateOption {
                    spec: s.into(),
                    key: key.into(),
                });
            }
            seen.push(key);
            spec.apply(s, key, value)?;
        }
        Ok(spec)
    }

    /// Applies one `key=value` option of the string `s`.
    fn apply(&mut self, s: &str, key: &str, value: &str) -> Result<(), SpecError> {
        let bad = |expected: &'static str| SpecError::BadValue {
            spec: s.into(),
            key: key.into(),
            value: value.into(),
            expected,
        };
        let wrong = |provider: &'static str| SpecError::WrongProvider {
            spec: s.into(),
            key: key.into(),
            provider,
        };
        match (self, key) {
            (FabricSpec::Sim(sim), "dc") => {
                sim.dc = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad("on or off")),
                }
            }
            (FabricSpec::Sim(sim), "latency") => {
                sim.latency = LatencyModel::from_name(value).map_err(|_| bad("none or cx4"))?;
            }
            (FabricSpec::Sim(sim), "host") => {
                check_host(s, value)?;
                sim.host = Some(value.to_string());
            }
            (FabricSpec::Verbs(v), "port") => match value.parse::<u8>() {
                Ok(p) if p >= 1 => v.port = Some(p),
                _ => return Err(bad("a port number from 1 to 255")),
            },
            (FabricSpec::Verbs(v), "gid") => match value.parse::<u8>() {
                Ok(g) => v.gid_index = Some(g),
                _ => return Err(bad("a GID index from 0 to 255")),
            },
            (FabricSpec::Sim(_), "port" | "gid") => return Err(wrong("verbs")),
            (FabricSpec::Verbs(_), "dc" | "latency" | "host") => return Err(wrong("sim")),
            _ => {
                return Err(SpecError::UnknownOption {
                    spec: s.into(),
                    key: key.into(),
                })
            }
        }
        Ok(())
    }

    /// `"sim"` or `"verbs"`.
    pub fn provider(&self) -> &'static str {
        match self {
            FabricSpec::Sim(_) => "sim",
            FabricSpec::Verbs(_) => "verbs",
        }
    }

    /// Whether this is a `sim:` spec.
    pub fn is_sim(&self) -> bool {
        matches!(self, FabricSpec::Sim(_))
    }

    /// Whether this is a `verbs:` spec.
    pub fn is_verbs(&self) -> bool {
        matches!(self, FabricSpec::Verbs(_))
    }

    /// Whether several processes can be nodes of this fabric: a directory
    /// sim fabric, or a real device. `sim:mem` is one process.
    pub fn is_multi_process(&self) -> bool {
        !matches!(
            self,
            FabricSpec::Sim(SimSpec {
                location: SimLocation::Mem,
                ..
            })
        )
    }

    /// The sim part, for a `sim:` spec.
    pub fn as_sim(&self) -> Option<&SimSpec> {
        match self {
            FabricSpec::Sim(s) => Some(s),
            FabricSpec::Verbs(_) => None,
        }
    }

    /// The verbs part, for a `verbs:` spec.
    pub fn as_verbs(&self) -> Option<&VerbsSpec> {
        match self {
            FabricSpec::Verbs(v) => Some(v),
            FabricSpec::Sim(_) => None,
        }
    }

    /// The verbs device name (`None` for sim).
    pub fn device(&self) -> Option<&str> {
        self.as_verbs().map(VerbsSpec::device)
    }

    /// The sim fabric directory (`None` for `sim:mem` and verbs).
    pub fn sim_dir(&self) -> Option<PathBuf> {
        self.as_sim().and_then(SimSpec::dir_path)
    }
}

impl FromStr for FabricSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<FabricSpec, SpecError> {
        FabricSpec::parse(s)
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            SimLocation::Mem => f.write_str("sim:mem")?,
            SimLocation::Shm(n) => write!(f, "sim:{n}")?,
            SimLocation::Dir(p) => write!(f, "sim:{}", p.display())?,
        }
        if !self.dc {
            f.write_str(",dc=off")?;
        }
        if let Some(m) = &self.latency {
            write!(f, ",latency={}", m.name)?;
        }
        if let Some(h) = &self.host {
            write!(f, ",host={h}")?;
        }
        Ok(())
    }
}

impl fmt::Display for VerbsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "verbs:{}", self.device)?;
        if let Some(p) = self.port {
            write!(f, ",port={p}")?;
        }
        if let Some(g) = self.gid_index {
            write!(f, ",gid={g}")?;
        }
        Ok(())
    }
}

impl fmt::Display for FabricSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricSpec::Sim(s) => s.fmt(f),
            FabricSpec::Verbs(v) => v.fmt(f),
        }
    }
}

impl serde::Serialize for FabricSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FabricSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FabricSpec, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        FabricSpec::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
