//! What the FFT is asked ([`ChunkedFftOptions`]), what it reports ([`FftReport`]) and how it
//! fails ([`FftError`]).

use std::path::PathBuf;
use std::time::Duration;

use zcrop_zarr::ZarrError;

use crate::spectral::FftNorm;

/// The output's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComplexType {
    /// Two f32 per element.
    #[default]
    Complex64,
    /// Two f64 per element.
    Complex128,
}

impl ComplexType {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ComplexType::Complex64 => "complex64",
            ComplexType::Complex128 => "complex128",
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            ComplexType::Complex64 => 8,
            ComplexType::Complex128 => 16,
        }
    }
}

/// How to run [`fft_along_axis`](crate::fft_along_axis).
#[derive(Debug, Clone)]
pub struct ChunkedFftOptions {
    /// The axis to transform.
    pub axis: usize,
    /// Bytes the transform may hold at once (blocks, chunk buffers, IO in flight), at least
    /// `MIN_BUDGET`.
    pub memory_budget: usize,
    /// The output element type.
    pub output: ComplexType,
    /// Scaling, as numpy's `norm=`.
    pub norm: FftNorm,
    /// Where the temporary store goes (a directory removed at the end); `None`: the system's
    /// temporary directory.
    pub temp_dir: Option<PathBuf>,
    /// The output's name for the transformed dimension (e.g. `freq_time`); `None` keeps the
    /// input's.
    pub axis_name: Option<String>,
    /// Replace an existing output (only a Zarr array is ever removed); without it an existing
    /// output is an error.
    pub overwrite: bool,
    /// Options of the object stores that URLs name (the input, the output, a job's work
    /// directory). Not used for local paths.
    pub storage: StorageOptions,
}

/// Options of the object stores a transform's URLs name: `endpoint`, `region`, `anon`,
/// credentials, ... as [`zcrop_io::ObjectEngine::open`] takes them. The input has its own, so
/// that a public dataset read anonymously can be transformed into a private bucket.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StorageOptions {
    /// For the input's URL.
    pub input: Vec<(String, String)>,
    /// For the output's and the work directory's URLs.
    pub output: Vec<(String, String)>,
}

impl StorageOptions {
    /// The same options for every URL.
    pub fn all(options: Vec<(String, String)>) -> StorageOptions {
        StorageOptions {
            input: options.clone(),
            output: options,
        }
    }
}

impl std::fmt::Debug for StorageOptions {
    // Values may be credentials: only the keys are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = |o: &[(String, String)]| o.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        f.debug_struct("StorageOptions")
            .field("input", &keys(&self.input))
            .field("output", &keys(&self.output))
            .finish()
    }
}

impl ChunkedFftOptions {
    /// Transform `axis` within `memory_budget` bytes, complex64 output, numpy's default scaling.
    pub fn new(axis: usize, memory_budget: usize) -> Self {
        ChunkedFftOptions {
            axis,
            memory_budget,
            output: ComplexType::Complex64,
            norm: FftNorm::Backward,
            temp_dir: None,
            axis_name: None,
            overwrite: false,
            storage: StorageOptions::default(),
        }
    }
}

/// Which algorithm ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FftStrategy {
    /// Whole lines in memory, one tile at a time.
    InMemory,
    /// Four-step through temporary arrays, `N = n1 * n2`.
    FourStep {
        /// Columns of the `(n2, n1)` view of the axis.
        n1: u64,
        /// Rows of the `(n2, n1)` view of the axis.
        n2: u64,
        /// Whether a third pass copied results into larger output chunks.
        transpose_pass: bool,
    },
}

/// What [`fft_along_axis`](crate::fft_along_axis) did.
#[derive(Debug, Clone, PartialEq)]
pub struct FftReport {
    /// The algorithm.
    pub strategy: FftStrategy,
    /// The tile over the input's dimensions (the axis entry is the axis length).
    pub tile: Vec<u64>,
    /// The output's chunk shape.
    pub output_chunks: Vec<u64>,
    /// The largest working block, in bytes.
    pub block_bytes: usize,
    /// The largest chunk written or read back from the temporary store, in bytes.
    pub chunk_bytes: usize,
    /// Passes over the data (1 in memory, 2 or 3 four-step).
    pub passes: u32,
    /// Bytes of array data read: input elements at their stored size, temporaries as
    /// complex128.
    pub read_bytes: u64,
    /// Bytes of output chunks written.
    pub output_bytes: u64,
    /// Bytes of temporary chunks written.
    pub temp_bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Why [`fft_along_axis`](crate::fft_along_axis) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FftError {
    /// A bad argument (axis, data type, existing output).
    #[error("{0}")]
    InvalidArgument(String),
    /// The budget cannot hold even the smallest working set.
    #[error("a memory budget of {budget} bytes is too small: {what} needs about {needed} bytes")]
    BudgetTooSmall {
        /// The budget given.
        budget: usize,
        /// About how much is needed.
        needed: usize,
        /// For what.
        what: String,
    },
    /// The axis length has no factorisation `N1 * N2` whose parts fit the budget (a large prime
    /// length, for example), and whole lines do not fit either.
    #[error(
        "axis length {n} cannot be split into two factors of at most {max_factor} (what this budget allows), and whole lines do not fit: a budget of about {needed} bytes would hold whole lines (a Bluestein transform, which would lift this limit, is not implemented)"
    )]
    NoFactorization {
        /// The axis length.
        n: u64,
        /// The largest factor the budget allows.
        max_factor: u64,
        /// About the budget that holds one whole line.
        needed: usize,
    },
    /// Reading the input or a temporary array failed.
    #[error("reading {what}: {error}")]
    Read {
        /// The input or temporary array.
        what: String,
        /// What zarr-front said.
        #[source]
        error: ZarrError,
    },
    /// Creating or writing the output or a temporary array failed.
    #[error("writing {path}: {source}", path = .path.display())]
    Write {
        /// The array's directory.
        path: PathBuf,
        /// What zarrs or the filesystem said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request for the job's own files or objects (its description, markers, probes, a
    /// listing) failed; the message names the action and the path or URL.
    #[error("{0}")]
    Storage(#[source] std::io::Error),
    /// The cancellation flag was set.
    #[error("cancelled")]
    Cancelled,
    /// The IO engine could not start.
    #[error("cannot start the IO engine: {0}")]
    Engine(#[source] ZarrError),
}
