//! Whether CUDA can be used, answered with or without the `cuda` feature. A file of its
//! own, re-exported by the crate root: storage asks it before picking pinned memory, and
//! storage should not import the root that declares it.

/// Whether CUDA device 0 is usable: the driver library loads, initialises and reports a
/// device. Always false without the `cuda` feature. Never panics.
pub fn cuda_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Number of usable CUDA devices (0 without CUDA).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}
