//! Every form of the grammar and every error.

use super::*;
use serde::de::value::{Error as DeError, StrDeserializer};
use serde::Deserialize;

fn p(s: &str) -> FabricSpec {
    match s.parse::<FabricSpec>() {
        Ok(spec) => spec,
        Err(e) => panic!("{s:?} did not parse: {e}"),
    }
}

fn err(s: &str) -> SpecError {
    match s.parse::<FabricSpec>() {
        Ok(spec) => panic!("{s:?} parsed as {spec:?}"),
        Err(e) => e,
    }
}

/// Canonical strings print back unchanged, and every parse round-trips.
#[test]
fn canonical_round_trip() {
    for s in [
        "sim:mem",
        "sim:krc",
        "sim:krc,dc=off",
        "sim:krc,latency=cx4",
        "sim:krc,dc=off,latency=cx4",
        "sim:/dev/shm/x",
        "sim:/tmp/a b/fab,dc=off",
        "sim:mem,latency=cx4",
        "sim:krc,host=mem-0",
        "sim:krc,dc=off,latency=cx4,host=a.b_C-9",
        "verbs:rxe0",
        "verbs:mlx5_0,port=1",
        "verbs:mlx5_0,gid=3",
        "verbs:mlx5_0,port=2,gid=3",
    ] {
        let spec = p(s);
        assert_eq!(spec.to_string(), s);
        assert_eq!(p(&spec.to_string()), spec);
    }
}

#[test]
fn non_canonical_forms_normalize() {
    assert_eq!(p("sim:krc,dc=on").to_string(), "sim:krc");
    assert_eq!(p("sim:krc,latency=none").to_string(), "sim:krc");
    assert_eq!(
        p("sim:krc,latency=cx4,dc=off").to_string(),
        "sim:krc,dc=off,latency=cx4"
    );
    assert_eq!(
        p("sim:krc,host=h,dc=off").to_string(),
        "sim:krc,dc=off,host=h"
    );
    assert_eq!(
        p("verbs:mlx5_0,gid=3,port=1").to_string(),
        "verbs:mlx5_0,port=1,gid=3"
    );
}

#[test]
fn sim_forms() {
    let mem = p("sim:mem");
    assert!(mem.is_sim() && !mem.is_verbs() && !mem.is_multi_process());
    assert_eq!(mem.provider(), "sim");
    assert_eq!(mem, FabricSpec::sim_mem());
    assert_eq!(mem.sim_dir(), None);
    assert_eq!(mem.device(), None);
    let s = mem.as_sim().unwrap();
    assert_eq!(s.location(), &SimLocation::Mem);
    assert!(s.dc());
    assert_eq!(s.latency(), None);

    let shm = p("sim:krc,dc=off,latency=cx4");
    assert!(shm.is_multi_process());
    assert_eq!(shm.sim_dir(), Some(PathBuf::from("/dev/shm/krc")));
    let s = shm.as_sim().unwrap();
    assert_eq!(s.location(), &SimLocation::Shm("krc".into()));
    assert!(!s.dc());
    assert_eq!(s.latency(), Some(LatencyModel::cx4()));
    let cfg = s.config();
    assert!(!cfg.dc);
    assert_eq!(cfg.latency, Some(LatencyModel::cx4()));
    assert_eq!(cfg.max_mr_size, SimConfig::default().max_mr_size);
    assert_eq!(cfg.host, None);
    let hosted = p("sim:krc,host=mem-0");
    assert_eq!(hosted.as_sim().unwrap().host(), Some("mem-0"));
    assert_eq!(
        hosted.as_sim().unwrap().config().host.as_deref(),
        Some("mem-0")
    );
    let long = format!("sim:krc,host={}", "h".repeat(65));
    assert!(matches!(err(&long), SpecError::BadValue { .. }));
    let built = SimSpec::shm("krc")
        .unwrap()
        .with_host(Some("mem-0"))
        .unwrap();
    assert_eq!(FabricSpec::Sim(built), hosted);
    assert!(SimSpec::mem().with_host(Some("no,comma")).is_err());

    let dir = p("sim:/var/tmp/fab");
    assert!(dir.is_multi_process());
    assert_eq!(dir.sim_dir(), Some(PathBuf::from("/var/tmp/fab")));
    assert_eq!(
        dir.as_sim().unwrap().location(),
        &SimLocation::Dir("/var/tmp/fab".into())
    );
    assert!(dir.as_verbs().is_none());
}

#[test]
fn verbs_forms() {
    let v = p("verbs:rxe0");
    assert!(v.is_verbs() && !v.is_sim() && v.is_multi_process());
    assert_eq!(v.provider(), "verbs");
    assert_eq!(v.device(), Some("rxe0"));
    assert_eq!(v.sim_dir(), None);
    assert!(v.as_sim().is_none());
    let vs = v.as_verbs().unwrap();
    assert_eq!((vs.port(), vs.gid_index()), (None, None));

    let v = p("verbs:mlx5_0,port=1,gid=3");
    let vs = v.as_verbs().unwrap();
    assert_eq!(vs.device(), "mlx5_0");
    assert_eq!((vs.port(), vs.gid_index()), (Some(1), Some(3)));
    assert_eq!(p("verbs:x,gid=0").as_verbs().unwrap().gid_index(), Some(0));
    assert_eq!(p("verbs:x,port=255").as_verbs().unwrap().port(), Some(255));
}

#[test]
fn constructors_match_parse() {
    assert_eq!(FabricSpec::Sim(SimSpec::mem()), p("sim:mem"));
    assert_eq!(
        FabricSpec::Sim(SimSpec::shm("a").unwrap().with_dc(false)),
        p("sim:a,dc=off")
    );
    assert_eq!(
        FabricSpec::Sim(
            SimSpec::dir("/x/y")
                .unwrap()
                .with_latency(Some(LatencyModel::cx4()))
        ),
        p("sim:/x/y,latency=cx4")
    );
    let v = VerbsSpec::new("mlx5_0")
        .unwrap()
        .with_port(Some(1))
        .unwrap()
        .with_gid_index(Some(3));
    assert_eq!(FabricSpec::Verbs(v), p("verbs:mlx5_0,port=1,gid=3"));
    assert!(SimSpec::shm("mem").is_err());
    assert!(SimSpec::shm("a/b").is_err());
    assert!(SimSpec::shm("a,b").is_err());
    assert!(SimSpec::dir("rel/path").is_err());
    assert!(SimSpec::dir("/a,b").is_err());
    assert!(VerbsSpec::new("").is_err());
    assert!(VerbsSpec::new("rxe0").unwrap().with_port(Some(0)).is_err());
}

#[test]
fn malformed_strings() {
    for s in [
        "",
        "tcp:1",
        "mem",
        "sim",
        "sim:",
        "verbs:",
        "sim:a/b",
        "sim:a b",
        "sim:x\0y",
        "sim:/x\0y",
        "verbs:a/b",
        "verbs:a b",
        "sim:mem,",
        "sim:mem,,dc=on",
        "SIM:mem",
    ] {
        match err(s) {
            SpecError::Malformed { spec, .. } => assert_eq!(spec, s),
            e => panic!("{s:?}: expected Malformed, got {e:?}"),
        }
    }
    let msg = err("tcp:1").to_string();
    assert!(
        msg.starts_with(
            "bad fabric \"tcp:1\": unknown provider; expected sim:mem, sim:NAME, sim:/abs/path"
        ),
        "{msg}"
    );
    assert!(msg.contains("verbs:DEVICE[,port=N][,gid=N]"), "{msg}");
}

#[test]
fn unknown_options() {
    for (s, k) in [("sim:mem,foo=1", "foo"), ("verbs:rxe0,mtu=4096", "mtu")] {
        match err(s) {
            SpecError::UnknownOption { spec, key } => {
                assert_eq!((spec.as_str(), key.as_str()), (s, k))
            }
            e => panic!("{s:?}: {e:?}"),
        }
    }
    assert!(err("sim:mem,foo=1")
        .to_string()
        .contains("unknown option \"foo\""));
    // A known key without a value is a bad value, not an unknown key.
    assert!(matches!(err("sim:x,dc"), SpecError::BadValue { .. }));
}

#[test]
fn bad_values() {
    for (s, k, v) in [
        ("sim:mem,dc=yes", "dc", "yes"),
        ("sim:mem,dc=", "dc", ""),
        ("sim:mem,latency=cx5", "latency", "cx5"),
        ("verbs:rxe0,port=0", "port", "0"),
        ("verbs:rxe0,port=256", "port", "256"),
        ("verbs:rxe0,port=-1", "port", "-1"),
        ("verbs:rxe0,port", "port", ""),
        ("verbs:rxe0,gid=x", "gid", "x"),
        ("verbs:rxe0,gid=300", "gid", "300"),
        ("sim:krc,host=", "host", ""),
        ("sim:krc,host=a b", "host", "a b"),
        ("sim:krc,host=a/b", "host", "a/b"),
    ] {
        match err(s) {
            SpecError::BadValue {
                spec, key, value, ..
            } => assert_eq!((spec.as_str(), key.as_str(), value.as_str()), (s, k, v)),
            e => panic!("{s:?}: {e:?}"),
        }
    }
    let msg = err("sim:mem,dc=yes").to_string();
    assert!(msg.contains("expected on or off"), "{msg}");
}

#[test]
fn options_of_the_wrong_provider() {
    for (s, k, prov) in [
        ("sim:mem,port=1", "port", "verbs"),
        ("sim:krc,gid=1", "gid", "verbs"),
        ("verbs:rxe0,dc=off", "dc", "sim"),
        ("verbs:rxe0,latency=cx4", "latency", "sim"),
        ("verbs:rxe0,host=h", "host", "sim"),
    ] {
        match err(s) {
            SpecError::WrongProvider {
                spec,
                key,
                provider,
            } => {
                assert_eq!((spec.as_str(), key.as_str(), provider), (s, k, prov))
            }
            e => panic!("{s:?}: {e:?}"),
        }
    }
}

#[test]
fn duplicate_options() {
    for (s, k) in [
        ("sim:mem,dc=on,dc=off", "dc"),
        ("verbs:rxe0,gid=1,gid=1", "gid"),
    ] {
        match err(s) {
            SpecError::DuplicateOption { spec, key } => {
                assert_eq!((spec.as_str(), key.as_str()), (s, k))
            }
            e => panic!("{s:?}: {e:?}"),
        }
    }
}

#[test]
fn serde_as_a_string() {
    let d = StrDeserializer::<DeError>::new("verbs:mlx5_0,port=1,gid=3");
    assert_eq!(
        FabricSpec::deserialize(d).unwrap(),
        p("verbs:mlx5_0,port=1,gid=3")
    );
    let d = StrDeserializer::<DeError>::new("tcp:1");
    let e = FabricSpec::deserialize(d).unwrap_err().to_string();
    assert!(e.contains("bad fabric \"tcp:1\""), "{e}");
    let json = serde_json::to_string(&p("sim:krc,dc=off")).unwrap();
    assert_eq!(json, "\"sim:krc,dc=off\"");
    let back: FabricSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p("sim:krc,dc=off"));
    assert!(serde_json::from_str::<FabricSpec>("\"sim:a/b\"").is_err());
}
