//! The virtual chunk containers a repository declares in its configuration (`config.yaml`
//! for spec v1, the config inside the `repo` file for spec v2): each container's URL prefix
//! and the storage options its store description gives (endpoint, region, anonymous access),
//! which zcrop reads its virtual chunks with unless the caller says otherwise.

use serde::Deserialize;
use std::collections::HashMap;

/// A container the repository declares: its URL prefix and storage options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeclaredContainer {
    /// The names `vcc://<name>/...` locations may use: its key in the configuration, and its
    /// `name` field where it has one.
    pub(crate) names: Vec<String>,
    pub(crate) url_prefix: String,
    pub(crate) storage_options: Vec<(String, String)>,
}

/// The part of icechunk's `RepositoryConfig` zcrop reads (other fields are ignored).
#[derive(Deserialize, Default)]
pub(crate) struct RepoConfig {
    #[serde(default)]
    virtual_chunk_containers: Option<HashMap<String, Container>>,
}

#[derive(Deserialize)]
struct Container {
    #[serde(default)]
    name: Option<String>,
    url_prefix: String,
    store: StoreConfig,
}

/// icechunk's `ObjectStoreConfig`.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoreConfig {
    InMemory,
    LocalFileSystem(serde::de::IgnoredAny),
    Http(HashMap<String, String>),
    S3Compatible(S3Options),
    S3(S3Options),
    Gcs(HashMap<String, String>),
    Azure(HashMap<String, String>),
    Tigris(S3Options),
}

/// icechunk's `S3Options`.
#[derive(Deserialize, Default)]
struct S3Options {
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    endpoint_url: Option<String>,
    #[serde(default)]
    anonymous: bool,
    #[serde(default)]
    allow_http: bool,
    #[serde(default)]
    force_path_style: bool,
}

impl RepoConfig {
    /// A spec-v1 `config.yaml`.
    pub(crate) fn from_yaml(bytes: &[u8]) -> Result<RepoConfig, String> {
        serde_yaml_ng::from_slice(bytes).map_err(|e| e.to_string())
    }

    /// The declared containers, longest prefix first.
    pub(crate) fn containers(self) -> Vec<DeclaredContainer> {
        let mut out: Vec<DeclaredContainer> = self
            .virtual_chunk_containers
            .unwrap_or_default()
            .into_iter()
            .map(|(key, c)| DeclaredContainer {
                names: std::iter::once(key).chain(c.name).collect(),
                url_prefix: c.url_prefix,
                storage_options: c.store.storage_options(),
            })
            .collect();
        out.sort_by_key(|c| std::cmp::Reverse(c.url_prefix.len()));
        out
    }
}

impl StoreConfig {
    /// zcrop storage options for the store this describes.
    fn storage_options(self) -> Vec<(String, String)> {
        match self {
            StoreConfig::InMemory | StoreConfig::LocalFileSystem(_) => Vec::new(),
            StoreConfig::Http(o) | StoreConfig::Gcs(o) | StoreConfig::Azure(o) => {
                let mut o: Vec<_> = o.into_iter().collect();
                o.sort();
                o
            }
            StoreConfig::S3Compatible(s) | StoreConfig::S3(s) | StoreConfig::Tigris(s) => {
                let mut o = Vec::new();
                if let Some(r) = s.region {
                    o.push(("region".into(), r));
                }
                if let Some(e) = s.endpoint_url {
                    o.push(("endpoint_url".into(), e));
                }
                if s.anonymous {
                    o.push(("anon".into(), "true".into()));
                }
                if s.allow_http {
                    o.push(("allow_http".into(), "true".into()));
                }
                if !s.force_path_style {
                    o.push(("virtual_hosted_style_request".into(), "true".into()));
                }
                o
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As icechunk 1.1.21 writes it.
    const V1_YAML: &str = "inline_chunk_threshold_bytes: null
virtual_chunk_containers:
  file:///data/:
    name: null
    url_prefix: file:///data/
    store: !local_file_system /data/
  s3://bucket/nc/:
    name: null
    url_prefix: s3://bucket/nc/
    store: !s3_compatible
      region: us-east-1
      endpoint_url: http://127.0.0.1:5000
      anonymous: false
      allow_http: true
      force_path_style: true
      network_stream_timeout_seconds: 60
      requester_pays: false
manifest: null
";

    #[test]
    fn v1_configs_declare_their_containers() {
        let got = RepoConfig::from_yaml(V1_YAML.as_bytes())
            .unwrap()
            .containers();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].url_prefix, "s3://bucket/nc/");
        assert_eq!(
            got[0].storage_options,
            [
                ("region".to_string(), "us-east-1".to_string()),
                ("endpoint_url".into(), "http://127.0.0.1:5000".into()),
                ("allow_http".into(), "true".into()),
            ]
        );
        assert_eq!(got[1].url_prefix, "file:///data/");
        assert!(got[1].storage_options.is_empty());
        let none = RepoConfig::from_yaml(b"virtual_chunk_containers: null\n").unwrap();
        assert!(none.containers().is_empty());
        assert!(RepoConfig::from_yaml(b"virtual_chunk_containers: [1, 2").is_err());
    }
}
