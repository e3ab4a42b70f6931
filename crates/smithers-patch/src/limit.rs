//! Fitting a set of changes to a size limit without failing the whole set: the largest are
//! left out, one by one, until the rest fits. One huge change then costs only itself, never
//! the step's unrelated small edits (each change left out is named by the caller).

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
