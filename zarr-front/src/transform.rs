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
    /// block (0 when there is no axis).
    fn convert(&self, src: &[u8], dst: &mut [u8], axis_index: u64);

    /// Called once per output block, by the thread that wrote its last element, while it is
    /// still warm in cache (for example to run an FFT over the crop). `block` is the request's
    /// whole block in the output. Errors fail the read.
    fn finish_block(&self, request: usize, block: &mut [u8]) -> Result<(), String> {
        let _ = (request, block);
        Ok(())
    }
}
