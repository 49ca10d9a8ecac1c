//! Transforms fused into the stitch: element conversion applied while a decoded chunk is copied
//! into the output (still in cache), and a per-block step run as soon as a block (a crop) is
//! complete.

/// Converts elements as they are stitched into the output, and finishes each output block.
///
/// The read calls [`StitchTransform::convert`] for every contiguous run of elements it copies
/// (and for fill values of missing chunks), from many threads at once; runs never span two
/// indices of [`StitchTransform::axis`], so a per-channel conversion knows its channel.
pub trait StitchTransform: Sync {
    /// Bytes per output element.
    fn output_element_size(&self) -> usize;

    /// The block axis the conversion depends on (for example the channel axis of a
    /// per-channel normalisation), if any.
    fn axis(&self) -> Option<usize> {
        None
    }

    /// Converts the elements in `src` (the array's data type, native endian) into `dst` (as
    /// many output elements); `axis_index` is their index along [`Self::axis`] in the output
    /// block (0 when there is no axis), and `at` the index of the first of them in the whole
    /// output (the blocks one after the other, each in C order), for a transform that records
    /// something about the elements by position instead of writing `dst`.
    fn convert(&self, src: &[u8], dst: &mut [u8], axis_index: u64, at: usize);

    /// Converts `n` copies of the element `fill` (a run of a chunk that is not stored, which
    /// holds the fill value) into `dst`, like [`Self::convert`], if the transform can do that
    /// without the copies being made; returns false to have them made and passed to `convert`
    /// (the default).
    fn convert_fill(
        &self,
        fill: &[u8],
        n: usize,
        dst: &mut [u8],
        axis_index: u64,
        at: usize,
    ) -> bool {
        let _ = (fill, n, dst, axis_index, at);
        false
    }

    /// Whether the runs of the decoded chunk `chunk` (C order, the chunk's shape; bytes that no
    /// run reads may be stale) can be left out: none of them is then converted and their output
    /// stays as it was. For a chunk that is not stored, `chunk` is one element, the fill value
    /// all of it holds. Only for a transform that writes no output, such as one that records
    /// where certain values are and finds none in the chunk. The default is false.
    fn skips_chunk(&self, chunk: &[u8]) -> bool {
        let _ = chunk;
        false
    }

    /// Called once per output block, by the thread that wrote its last element, while it is
    /// still warm in cache (for example to run an FFT over the crop). `block` is the request's
    /// whole block in the output. Errors fail the read.
    fn finish_block(&self, request: usize, block: &mut [u8]) -> Result<(), String> {
        let _ = (request, block);
        Ok(())
    }
}
