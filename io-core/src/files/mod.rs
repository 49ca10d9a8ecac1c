//! Local files: the cache of open files (checked against their paths once per batch), their
//! mappings, what is known of which of their pages are in memory, and the `SIGBUS` guard that
//! keeps a file truncated under its mapping from killing the process.

pub(crate) mod cache;
pub(crate) mod mapguard;
pub(crate) mod mapping;
pub(crate) mod residency;
