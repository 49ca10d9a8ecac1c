//! Where a node (array or group) is in its store: a leaf module both kinds of node share.

use std::path::PathBuf;

/// Where a node is: its `/`-rooted path in the store, its key prefix and its directory. Arrays
/// and groups hold one and answer `name`, `path` and `dir` from it.
#[derive(Debug, Clone)]
pub(crate) struct NodePlace {
    /// Path inside the store, `/`-rooted (`/` for the root).
    pub(crate) name: String,
    /// Key prefix relative to the store root (`""` or `a/b/`).
    pub(crate) key_prefix: String,
    /// The node's directory, or its key prefix in an object store.
    pub(crate) dir: PathBuf,
}

impl NodePlace {
    /// The root of what was opened, at `dir`.
    pub(crate) fn root(dir: PathBuf) -> NodePlace {
        NodePlace {
            name: "/".into(),
            key_prefix: String::new(),
            dir,
        }
    }

    /// The path relative to the store root, e.g. `` or `group/temperature`.
    pub(crate) fn path(&self) -> &str {
        self.key_prefix.trim_end_matches('/')
    }

    /// The key of `rel` (a path below this node) relative to the store root.
    pub(crate) fn key(&self, rel: &str) -> String {
        format!("{}{rel}", self.key_prefix)
    }

    /// The place of the member at `rel` (a `/`-separated path below this node).
    pub(crate) fn child(&self, rel: &str) -> NodePlace {
        let rel = rel.trim_matches('/');
        let name = if self.name == "/" {
            format!("/{rel}")
        } else {
            format!("{}/{rel}", self.name)
        };
        NodePlace {
            name,
            key_prefix: format!("{}/", self.key(rel)),
            dir: self.dir.join(rel),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_extend_name_key_and_dir() {
        let root = NodePlace::root(PathBuf::from("/data/x.zarr"));
        assert_eq!(root.path(), "");
        let a = root.child("/a/");
        assert_eq!((a.name.as_str(), a.path()), ("/a", "a"));
        let b = a.child("b/c");
        assert_eq!((b.name.as_str(), b.path()), ("/a/b/c", "a/b/c"));
        assert_eq!(b.key("zarr.json"), "a/b/c/zarr.json");
        assert_eq!(b.dir, PathBuf::from("/data/x.zarr/a/b/c"));
    }
}
