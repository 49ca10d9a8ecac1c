//! Where the repository of a serialized `icechunk` session is: the Python package's
//! `Session` pickles as MessagePack (the icechunk crate's `Session` through rmp-serde), whose
//! storage entry names the repository's directory or bucket and prefix, and, for S3, the
//! endpoint and credentials. zcrop reads that entry, so a user who holds a session need not
//! say again where the repository is.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::{Result, ZarrError};

/// Where a session's repository is, as [`super::IcechunkSnapshot::open`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRepository {
    /// A local directory or an `s3://bucket/prefix` URL.
    pub location: String,
    /// Storage options for the URL (endpoint, region, credentials); empty for a directory.
    pub storage_options: Vec<(String, String)>,
}

/// The repository of the session serialized as `bytes` (`Session.as_bytes()` of icechunk's
/// Python package, the version pinned with zcrop's `icechunk-format`). Storages zcrop cannot
/// reach from the description alone (in memory, credentials refreshed by a Python callback)
/// are errors saying to pass the repository's URL and options instead.
pub fn session_repository(bytes: &[u8]) -> Result<SessionRepository> {
    // A session nests a few levels; the bound keeps hostile input off the stack's edge.
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(32);
    let value = Mp::deserialize(&mut de).map_err(|e| {
        ZarrError::InvalidArgument(format!("not a serialized Icechunk session: {e}"))
    })?;
    let storage = value.find_storage().ok_or_else(|| {
        ZarrError::InvalidArgument(
            "the serialized Icechunk session names no storage zcrop knows; open the \
             repository by its path or URL with zcrop.open_icechunk(url, storage_options=...)"
                .into(),
        )
    })?;
    let unsupported = |what: &str| {
        ZarrError::InvalidArgument(format!(
            "the Icechunk session's repository is on {what}, which zcrop cannot open from \
             the session; open it by its path or URL with \
             zcrop.open_icechunk(url, storage_options=...)"
        ))
    };
    match storage.get("type").and_then(Mp::as_str) {
        Some("S3Storage") => s3_storage(storage).ok_or_else(|| unsupported("S3")),
        Some("ObjectStorage") => {
            let backend = storage.get("backend");
            let provider = backend
                .and_then(|b| b.get("object_store_provider_type"))
                .and_then(Mp::as_str)
                .unwrap_or("an unknown object store");
            match (
                provider,
                backend.and_then(|b| b.get("path")).and_then(Mp::as_str),
            ) {
                ("local_file_system_object_store_provider", Some(path)) => Ok(SessionRepository {
                    location: path.to_string(),
                    storage_options: Vec::new(),
                }),
                ("in_memory_object_store_provider", _) => Err(unsupported("memory")),
                _ => Err(unsupported(provider)),
            }
        }
        other => Err(unsupported(other.unwrap_or("an unknown storage"))),
    }
}

/// An `S3Storage` entry: `bucket`, `prefix`, `config` = `[region, endpoint_url, anonymous,
/// allow_http, force_path_style, ...]` and `credentials`.
fn s3_storage(storage: &Mp) -> Option<SessionRepository> {
    let bucket = storage.get("bucket")?.as_str()?;
    let prefix = storage.get("prefix").and_then(Mp::as_str).unwrap_or("");
    let mut options = Vec::new();
    let mut push = |k: &str, v: String| options.push((k.to_string(), v));
    if let Some(Mp::Array(config)) = storage.get("config") {
        if let Some(region) = config.first().and_then(Mp::as_str) {
            push("region", region.to_string());
        }
        if let Some(endpoint) = config.get(1).and_then(Mp::as_str) {
            push("endpoint_url", endpoint.to_string());
        }
        if config.get(2).and_then(Mp::as_bool) == Some(true) {
            push("anon", "true".into());
        }
        if config.get(3).and_then(Mp::as_bool) == Some(true) {
            push("allow_http", "true".into());
        }
        if config.get(4).and_then(Mp::as_bool) == Some(false) {
            push("virtual_hosted_style_request", "true".into());
        }
    }
    match storage.get("credentials") {
        None | Some(Mp::Nil) => {}
        Some(c) => match c.first_str() {
            Some("from_env") => {}
            Some("anonymous") => push("anon", "true".into()),
            Some("static") => {
                let Mp::Array(fields) = c else { return None };
                push("key", fields.get(1)?.as_str()?.to_string());
                push("secret", fields.get(2)?.as_str()?.to_string());
                if let Some(token) = fields.get(3).and_then(Mp::as_str) {
                    push("session_token", token.to_string());
                }
            }
            // Credentials a Python callback refreshes: zcrop cannot call it.
            _ => return None,
        },
    }
    let prefix = prefix.trim_matches('/');
    let location = if prefix.is_empty() {
        format!("s3://{bucket}")
    } else {
        format!("s3://{bucket}/{prefix}")
    };
    Some(SessionRepository {
        location,
        storage_options: options,
    })
}

/// A MessagePack value.
#[derive(Debug)]
enum Mp {
    Nil,
    Bool(bool),
    Num,
    Str(String),
    Bin,
    Array(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
}

impl Mp {
    fn as_str(&self) -> Option<&str> {
        match self {
            Mp::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_bool(&self) -> Option<bool> {
        match self {
            Mp::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value of `key` in a map.
    fn get(&self, key: &str) -> Option<&Mp> {
        match self {
            Mp::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// A string, the first element of an array if it is one, or a map's only key (the ways
    /// serde writes an enum's variant name).
    fn first_str(&self) -> Option<&str> {
        match self {
            Mp::Str(s) => Some(s),
            Mp::Array(items) => items.first().and_then(Mp::as_str),
            Mp::Map(entries) if entries.len() == 1 => entries[0].0.as_str(),
            _ => None,
        }
    }

    /// The first map (depth first) with a `type` key naming a storage.
    fn find_storage(&self) -> Option<&Mp> {
        match self {
            Mp::Map(entries) => {
                if matches!(
                    self.get("type").and_then(Mp::as_str),
                    Some(t) if t.ends_with("Storage")
                ) {
                    return Some(self);
                }
                entries.iter().find_map(|(_, v)| v.find_storage())
            }
            Mp::Array(items) => items.iter().find_map(Mp::find_storage),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Mp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Mp, D::Error> {
        d.deserialize_any(MpVisitor)
    }
}

struct MpVisitor;

impl<'de> Visitor<'de> for MpVisitor {
    type Value = Mp;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a MessagePack value")
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Mp, E> {
        Ok(Mp::Nil)
    }
    fn visit_none<E: de::Error>(self) -> std::result::Result<Mp, E> {
        Ok(Mp::Nil)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Mp, D::Error> {
        Mp::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Mp, E> {
        Ok(Mp::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Mp, E> {
        Ok(Mp::Num)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Mp, E> {
        Ok(Mp::Num)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Mp, E> {
        Ok(Mp::Num)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Mp, E> {
        Ok(Mp::Str(v.to_string()))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> std::result::Result<Mp, E> {
        Ok(Mp::Bin)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Mp, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Mp::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Mp, A::Error> {
        let mut entries = Vec::new();
        while let Some(kv) = map.next_entry()? {
            entries.push(kv);
        }
        Ok(Mp::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A MessagePack encoder for the few shapes the tests write.
    enum W<'a> {
        Nil,
        B(bool),
        S(&'a str),
        A(Vec<W<'a>>),
        M(Vec<(&'a str, W<'a>)>),
    }

    fn enc(w: &W<'_>, out: &mut Vec<u8>) {
        match w {
            W::Nil => out.push(0xc0),
            W::B(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
            W::S(s) => {
                out.push(0xd9);
                out.push(u8::try_from(s.len()).unwrap());
                out.extend_from_slice(s.as_bytes());
            }
            W::A(items) => {
                out.push(0xdc);
                out.extend_from_slice(&u16::try_from(items.len()).unwrap().to_be_bytes());
                for i in items {
                    enc(i, out);
                }
            }
            W::M(entries) => {
                out.push(0xde);
                out.extend_from_slice(&u16::try_from(entries.len()).unwrap().to_be_bytes());
                for (k, v) in entries {
                    enc(&W::S(k), out);
                    enc(v, out);
                }
            }
        }
    }

    fn session(storage: W<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        enc(
            &W::A(vec![W::A(vec![W::Nil, W::Nil]), storage, W::Nil]),
            &mut out,
        );
        out
    }

    fn s3(credentials: W<'_>) -> W<'_> {
        W::M(vec![
            ("type", W::S("S3Storage")),
            ("bucket", W::S("bkt")),
            ("prefix", W::S("some/repo")),
            (
                "config",
                W::A(vec![
                    W::S("us-east-1"),
                    W::S("http://127.0.0.1:5000"),
                    W::B(false),
                    W::B(true),
                    W::B(true),
                ]),
            ),
            ("credentials", credentials),
        ])
    }

    #[test]
    fn s3_and_local_sessions_name_their_repository() {
        let got = session_repository(&session(s3(W::A(vec![
            W::S("static"),
            W::S("K"),
            W::S("S"),
            W::Nil,
        ]))))
        .unwrap();
        assert_eq!(got.location, "s3://bkt/some/repo");
        let opts: Vec<(&str, &str)> = got
            .storage_options
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            opts,
            [
                ("region", "us-east-1"),
                ("endpoint_url", "http://127.0.0.1:5000"),
                ("allow_http", "true"),
                ("key", "K"),
                ("secret", "S"),
            ]
        );
        let anon = session_repository(&session(s3(W::S("anonymous")))).unwrap();
        assert!(
            anon.storage_options
                .contains(&("anon".into(), "true".into()))
        );

        let local = session_repository(&session(W::M(vec![
            ("type", W::S("ObjectStorage")),
            (
                "backend",
                W::M(vec![
                    (
                        "object_store_provider_type",
                        W::S("local_file_system_object_store_provider"),
                    ),
                    ("path", W::S("/data/repo")),
                ]),
            ),
        ])))
        .unwrap();
        assert_eq!(local.location, "/data/repo");
        assert!(local.storage_options.is_empty());
    }

    #[test]
    fn storages_zcrop_cannot_reach_are_errors() {
        let refreshable = session(s3(W::A(vec![W::S("refreshable"), W::Nil])));
        let memory = session(W::M(vec![
            ("type", W::S("ObjectStorage")),
            (
                "backend",
                W::M(vec![(
                    "object_store_provider_type",
                    W::S("in_memory_object_store_provider"),
                )]),
            ),
        ]));
        for (bytes, what) in [
            (refreshable, "on S3"),
            (memory, "on memory"),
            (session(W::Nil), "names no storage"),
            (vec![0xc1], "not a serialized"),
            (vec![0xdc, 0xff], "not a serialized"),
            // Nesting deep enough to overflow a recursive reader's stack.
            (vec![0x91; 1 << 20], "not a serialized"),
        ] {
            let e = session_repository(&bytes).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }

    proptest::proptest! {
        /// Any bytes give a repository or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = session_repository(&bytes);
        }
    }
}
