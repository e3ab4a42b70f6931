//! Size limits shared by change detection, apply and review, and fitting a set of changes to
//! a size limit without failing the whole set: the largest are left out, one by one, until
//! the rest fits. One huge change then costs only itself, never the step's unrelated small
//! edits (each change left out is named by the caller).
//!
//! The limits live here, below every module that reads them, so that none of those modules
//! reaches them through the crate root or through another module that uses it back.

/// A regular file larger than this is never held whole: it is read in place and its hunks
/// are hashed, deflated and encoded as it is read, so the host's memory does not grow with its
/// size. When the other side is a regular file too, each direction is a `delta` against the
/// other side (read in place, indexed in at most 32 MiB) when that deflates smaller, else a
/// `literal`, as git chooses: a one-byte edit of a gigabyte is a patch of a few kilobytes.
/// Such a file is carried as a binary patch even if it is text (no text diff), as git treats
/// files over `core.bigFileThreshold`. Below it a change holds both sides (at most 64 MiB).
pub const STREAM_THRESHOLD_BYTES: u64 = 32 << 20;

/// The default of [`DetectOptions::max_streamed_hunk_bytes`]: SANDBOX_MAX_BUNDLE_BYTES.
///
/// [`DetectOptions::max_streamed_hunk_bytes`]: crate::DetectOptions::max_streamed_hunk_bytes
pub const DEFAULT_MAX_STREAMED_HUNK_BYTES: u64 = 100 << 20;

/// The indices of `sizes` to leave out so that the sum of the rest is at most `limit`:
/// largest first (ties: the lower index first, so that the choice is deterministic), and no
/// more than needed. Empty when everything fits.
pub fn leave_out_largest(sizes: &[u64], limit: u64) -> Vec<usize> {
    // u128: a sum of u64 sizes cannot overflow it (a saturated u64 sum would forget bytes).
    let mut total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
    let limit = u128::from(limit);
    if total <= limit {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut out = Vec::new();
    for i in order {
        if total <= limit {
            break;
        }
        total -= u128::from(sizes[i]);
        out.push(i);
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::leave_out_largest;

    #[test]
    fn leaves_out_the_largest_until_the_rest_fits() {
        // Fits: nothing is left out, even at exactly the limit.
        assert!(leave_out_largest(&[3, 4, 3], 10).is_empty());
        assert!(leave_out_largest(&[], 0).is_empty());
        // One huge change: only it goes, the small ones stay.
        assert_eq!(leave_out_largest(&[5, 1000, 7], 100), [1]);
        // Largest first, and no more than needed: 50 and 40 go, 30 stays (30+5+5 <= 40).
        assert_eq!(leave_out_largest(&[5, 50, 30, 40, 5], 40), [1, 3]);
        // Ties are broken by index, deterministically.
        assert_eq!(leave_out_largest(&[9, 9, 9], 18), [0]);
        // Nothing fits: everything over the limit goes, a zero-size change stays.
        assert_eq!(leave_out_largest(&[200, 0, 300], 100), [0, 2]);
        // Sums that would overflow do not wrap into "fits".
        assert_eq!(leave_out_largest(&[u64::MAX, u64::MAX, 1], 10), [0, 1]);
    }
}
