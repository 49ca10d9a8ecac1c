//! Zarr hierarchies: opening arrays and groups from a local directory or an object store (a
//! URL), their metadata documents, and groups' members.

pub(crate) mod metadata;
pub(crate) mod node;
pub(crate) mod open;

pub use self::metadata::NodeKind;
pub use self::node::{Group, Node};
pub use self::open::{open, open_with};
