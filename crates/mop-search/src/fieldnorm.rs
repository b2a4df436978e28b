//! A card's length as BM25 sees it: its token count kept in one byte, exact up to 40 and
//! then with four significant bits (Lucene's `SmallFloat.intToByte4`, which tantivy
//! uses too, so scores are the same as those of indexes built with it).

/// Lengths below this are kept exactly (Lucene's `NUM_FREE_VALUES`).
const FREE: u32 = 24;

/// The length each of the 256 ids stands for, increasing.
pub(crate) const LENGTHS: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut id = 0;
    while id < 256 {
        t[id] = decode(id as u32);
        id += 1;
    }
    t
};

/// Lucene's `byte4ToInt`.
const fn decode(id: u32) -> u32 {
    if id < FREE {
        return id;
    }
    let i = id - FREE;
    let bits = i & 0x07;
    let shift = (i >> 3) as i32 - 1;
    let long = if shift == -1 {
        bits as u64
    } else {
        ((bits | 0x08) as u64) << shift
    };
    let v = FREE as u64 + long;
    if v > u32::MAX as u64 {
        u32::MAX
    } else {
        v as u32
    }
}

/// The id of the largest length in the table that is at most `tokens`.
pub(crate) fn id_of(tokens: u32) -> u8 {
    match LENGTHS.binary_search(&tokens) {
        Ok(id) => id as u8,
        Err(next) => (next - 1) as u8,
    }
}

/// The length an id stands for.
pub(crate) fn length(id: u8) -> u32 {
    LENGTHS[id as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spot checks against tantivy's table (FIELD_NORMS_TABLE), which earlier index
    /// formats stored.
    #[test]
    fn the_table_is_lucenes() {
        assert_eq!(&LENGTHS[..41], &(0..=40).collect::<Vec<u32>>()[..]);
        assert_eq!(&LENGTHS[41..48], &[42, 44, 46, 48, 50, 52, 54]);
        assert_eq!((LENGTHS[56], LENGTHS[57]), (88, 96));
        assert_eq!(LENGTHS[88], 1048);
        assert_eq!(LENGTHS[100], 3096);
        assert_eq!(LENGTHS[200], 16_777_240);
        assert_eq!(LENGTHS[255], 2_013_265_944);
        assert!(LENGTHS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(id_of(0), 0);
        assert_eq!(id_of(41), 40);
        assert_eq!(id_of(42), 41);
        assert_eq!(id_of(1047), 87);
        assert_eq!(id_of(u32::MAX), 255);
        assert_eq!(length(id_of(100)), 96);
    }
}
