//! Virtual chunks: manifest entries that point at a byte range of a file or object outside the
//! repository (a NetCDF or HDF5 file, say). zcrop reads them only under the URL prefixes the
//! caller allowed ([`VirtualContainer`]), as Icechunk reads only containers its user
//! authorized, and checks each target against the version the reference recorded (its
//! last-modified time or ETag) before reading it, so a changed file is an error, never stale
//! data.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use zcrop_io::sync::Mutex;
use zcrop_io::{IoEngine, ObjectConfig, ObjectEngine, is_object_url};

use super::config::DeclaredContainer;
use crate::store::{Reader, Store};

/// A URL prefix of virtual chunks the caller allows zcrop to read, and the storage options to
/// read them with (endpoint, region, credentials; empty for `file://` prefixes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualContainer {
    /// `file:///data/netcdf/`, `s3://bucket/prefix/`, ...
    pub url_prefix: String,
    /// Options for an object-store prefix, as [`crate::OpenOptions::storage_options`].
    pub storage_options: Vec<(String, String)>,
}

/// The version a virtual reference recorded of its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VirtualChecksum {
    /// The target was last written at or before this time (seconds since the Unix epoch).
    LastModified(u32),
    /// The target's entity tag.
    ETag(String),
}

/// What a target is now: its length, last-modified time and ETag (objects only).
#[derive(Debug, Clone)]
pub(crate) struct TargetVersion {
    pub(crate) size: u64,
    pub(crate) modified_secs: i64,
    pub(crate) e_tag: Option<String>,
}

impl VirtualChecksum {
    /// Why `now` is not the version this checksum recorded; `None` when it is.
    pub(crate) fn mismatch(&self, now: &TargetVersion) -> Option<String> {
        match self {
            VirtualChecksum::LastModified(secs) if now.modified_secs > i64::from(*secs) => {
                Some(format!(
                    "the target was modified after the reference was written (last modified \
                     at {} s since the epoch, the reference allows up to {secs})",
                    now.modified_secs
                ))
            }
            VirtualChecksum::ETag(want) => match &now.e_tag {
                Some(got) if got.trim_matches('"') == want.trim_matches('"') => None,
                Some(got) => Some(format!(
                    "the target changed since the reference was written (ETag {got}, the \
                     reference recorded {want})"
                )),
                None => Some(format!(
                    "the reference records ETag {want}, and the target has no ETag to compare"
                )),
            },
            VirtualChecksum::LastModified(_) => None,
        }
    }
}

/// Where an Icechunk snapshot's virtual chunks are read from: the containers the caller
/// allowed, those the repository declares, and the reader and path of each target, opened on
/// first use.
pub(crate) struct VirtualTargets {
    containers: Vec<VirtualContainer>,
    declared: Result<Vec<DeclaredContainer>, String>,
    local: Option<IoEngine>,
    opened: Mutex<HashMap<String, (Reader, PathBuf)>>,
}

impl VirtualTargets {
    pub(crate) fn new(
        containers: Vec<VirtualContainer>,
        declared: Result<Vec<DeclaredContainer>, String>,
        local: Option<IoEngine>,
    ) -> Self {
        VirtualTargets {
            containers,
            declared,
            local,
            opened: Mutex::new(HashMap::new()),
        }
    }

    /// The reader and path (a file path, or a key under the reader's engine) of the target
    /// `url`; an error saying why it cannot be read. The URL must be under a prefix the caller
    /// allowed and, where the repository declares containers, under one of those; it is read
    /// with the declared container's storage options, overridden by the caller's.
    pub(crate) fn resolve(&self, url: &str) -> Result<(Reader, PathBuf), String> {
        let original = url;
        if let Some(hit) = self.opened.lock().get(url) {
            return Ok(hit.clone());
        }
        let declared = self.declared.as_ref().map_err(|e| {
            format!(
                "the repository's configuration, which declares its virtual chunk \
                 containers, does not read: {e}"
            )
        })?;
        let absolute;
        let url = match url.strip_prefix("vcc://") {
            // A location relative to a container the repository names (icechunk 2).
            Some(rest) => {
                let (name, rel) = rest
                    .split_once('/')
                    .ok_or_else(|| "a vcc:// location with no path".to_string())?;
                let c = declared
                    .iter()
                    .find(|d| d.names.iter().any(|n| n == name))
                    .ok_or_else(|| {
                        format!("the repository declares no virtual chunk container named {name:?}")
                    })?;
                absolute = format!("{}/{rel}", c.url_prefix.trim_end_matches('/'));
                absolute.as_str()
            }
            None => url,
        };
        let container = self
            .containers
            .iter()
            .filter(|c| url.starts_with(&c.url_prefix))
            .max_by_key(|c| c.url_prefix.len())
            .ok_or_else(|| {
                "its URL is under no virtual chunk container zcrop was allowed to read (give \
                 its prefix in virtual_chunk_containers)"
                    .to_string()
            })?;
        let mut options = Vec::new();
        if !declared.is_empty() {
            let d = declared
                .iter()
                .find(|d| url.starts_with(&d.url_prefix))
                .ok_or_else(|| {
                    "the repository declares no virtual chunk container for its URL".to_string()
                })?;
            options = d
                .storage_options
                .iter()
                .filter(|(k, _)| !container.storage_options.iter().any(|(u, _)| u == k))
                .cloned()
                .collect();
        }
        options.extend(container.storage_options.iter().cloned());
        let opened = if let Some(path) = url.strip_prefix("file://") {
            let reader = Store::Local
                .reader(self.local.as_ref())
                .map_err(|e| e.to_string())?;
            (reader, PathBuf::from(path))
        } else if is_object_url(url) {
            let config = ObjectConfig::from_env().map_err(|e| e.to_string())?;
            let (engine, key) = ObjectEngine::open_container_shared(url, &options, config)
                .map_err(|e| e.to_string())?;
            (Reader::Object(engine), PathBuf::from(key))
        } else {
            return Err(
                "zcrop reads virtual chunks from file:// and object-store URLs \
                        (s3://, gs://, az://, https://) only"
                    .into(),
            );
        };
        self.opened
            .lock()
            .insert(original.to_string(), opened.clone());
        Ok(opened)
    }
}

/// The current version of each target (`None` for one that does not exist): a `stat` per
/// local file, HEAD requests sent together per object engine.
pub(crate) fn versions(targets: &[(&Reader, &Path)]) -> Vec<Result<Option<TargetVersion>, String>> {
    let mut out: Vec<Option<Result<Option<TargetVersion>, String>>> = vec![None; targets.len()];
    let mut by_engine: Vec<(ObjectEngine, Vec<usize>)> = Vec::new();
    for (i, (reader, path)) in targets.iter().enumerate() {
        match reader {
            Reader::Local(_) => {
                out[i] = Some(match std::fs::metadata(path) {
                    Ok(m) => {
                        use std::os::unix::fs::MetadataExt;
                        Ok(Some(TargetVersion {
                            size: m.len(),
                            modified_secs: m.mtime(),
                            e_tag: None,
                        }))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(format!("cannot stat it: {e}")),
                });
            }
            Reader::Object(engine) => {
                match by_engine.iter_mut().find(|(e, _)| e.same_engine(engine)) {
                    Some((_, members)) => members.push(i),
                    None => by_engine.push((engine.clone(), vec![i])),
                }
            }
        }
    }
    for (engine, members) in by_engine {
        let keys: Vec<&Path> = members.iter().map(|&i| targets[i].1).collect();
        for (i, got) in members.into_iter().zip(engine.head_many(&keys)) {
            out[i] = Some(
                got.map(|v| {
                    v.map(|v| TargetVersion {
                        size: v.size,
                        modified_secs: v.last_modified_secs,
                        e_tag: v.e_tag,
                    })
                })
                .map_err(|e| e.to_string()),
            );
        }
    }
    out.into_iter()
        .map(|v| v.expect("every target was asked for"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(modified_secs: i64, e_tag: Option<&str>) -> TargetVersion {
        TargetVersion {
            size: 10,
            modified_secs,
            e_tag: e_tag.map(str::to_string),
        }
    }

    #[test]
    fn checksums_compare_as_icechunk_conditions_do() {
        let lm = VirtualChecksum::LastModified(100);
        assert!(lm.mismatch(&version(100, None)).is_none());
        assert!(lm.mismatch(&version(99, None)).is_none());
        assert!(
            lm.mismatch(&version(101, None))
                .unwrap()
                .contains("modified after")
        );
        let tag = VirtualChecksum::ETag("\"abc\"".into());
        assert!(tag.mismatch(&version(0, Some("abc"))).is_none());
        assert!(
            tag.mismatch(&version(0, Some("\"abd\"")))
                .unwrap()
                .contains("changed")
        );
        assert!(tag.mismatch(&version(0, None)).unwrap().contains("no ETag"));
    }

    /// `vcc://` locations resolve through the containers the repository names; the result
    /// must still be under a prefix the caller allowed and one the repository declares.
    #[test]
    fn relative_locations_resolve_by_container_name() {
        let declared = vec![DeclaredContainer {
            names: vec!["file:///data/".into(), "archive".into()],
            url_prefix: "file:///data/".into(),
            storage_options: Vec::new(),
        }];
        let allow = |prefix: &str| {
            VirtualTargets::new(
                vec![VirtualContainer {
                    url_prefix: prefix.into(),
                    storage_options: Vec::new(),
                }],
                Ok(declared.clone()),
                None,
            )
        };
        let (_, path) = allow("file:///data/")
            .resolve("vcc://archive/2020/a.nc")
            .unwrap();
        assert_eq!(path, PathBuf::from("/data/2020/a.nc"));
        let e = allow("file:///data/")
            .resolve("vcc://other/a.nc")
            .unwrap_err();
        assert!(e.contains("named \"other\""), "{e}");
        let e = allow("file:///elsewhere/")
            .resolve("vcc://archive/a.nc")
            .unwrap_err();
        assert!(
            e.contains("no virtual chunk container zcrop was allowed"),
            "{e}"
        );
        let e = allow("file:///").resolve("file:///tmp/a.nc").unwrap_err();
        assert!(e.contains("declares no virtual chunk container"), "{e}");
        let broken = VirtualTargets::new(Vec::new(), Err("bad yaml".into()), None);
        assert!(
            broken
                .resolve("file:///a")
                .unwrap_err()
                .contains("bad yaml")
        );
    }

    #[test]
    fn only_allowed_prefixes_resolve() {
        let targets = VirtualTargets::new(
            vec![VirtualContainer {
                url_prefix: "file:///data/".into(),
                storage_options: Vec::new(),
            }],
            Ok(Vec::new()),
            None,
        );
        let (reader, path) = targets.resolve("file:///data/a.nc").unwrap();
        assert!(matches!(reader, Reader::Local(_)));
        assert_eq!(path, PathBuf::from("/data/a.nc"));
        let e = targets.resolve("file:///etc/passwd").unwrap_err();
        assert!(e.contains("no virtual chunk container"), "{e}");
        let open = VirtualTargets::new(
            vec![VirtualContainer {
                url_prefix: String::new(),
                storage_options: Vec::new(),
            }],
            Ok(Vec::new()),
            None,
        );
        let e = open.resolve("vcc://name/a.nc").unwrap_err();
        assert!(e.contains("no virtual chunk container named"), "{e}");
        let e = open.resolve("ftp://host/a.nc").unwrap_err();
        assert!(e.contains("cannot open") || e.contains("only"), "{e}");
    }
}
