//! The quantizers' search structures, built once on first use: ggml's `iq2xs_init_impl` and
//! `iq3xs_init_impl` (src/ggml-quants.c).
//!
//! A grid point is `N` elements, each a level `0..2^bits` stored as the odd position `2*level + 1`.
//! The map has one entry per packed key of levels: the grid index of a key that is on the grid,
//! otherwise the list of grid points nearest to it, ordered by (squared distance, index) and cut
//! after `nwant` distinct distances, exactly as ggml's `qsort` over (distance, index) pairs.
//!
//! ggml builds these grids from `kgrid_*` tables in ggml-quants.c; they equal the level of every
//! byte of the dequantization grids in ggml-common.h (checked by the tests below against values of
//! the `kgrid_*` tables), so the levels are derived here instead of carrying a second copy.

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use std::sync::OnceLock;

/// Grid, key map and neighbour lists of one grid.
pub(crate) struct Search<const N: usize> {
    /// Positions `2*level + 1` of every grid point.
    pub grid: Vec<[i8; N]>,
    /// ggml's `kmap`: `>= 0` a grid index, `< 0` the neighbour list at `neighbours[-(v+1)..]`.
    map: Vec<i32>,
    /// Concatenated lists, each a count followed by that many grid indices.
    neighbours: Vec<u16>,
}

/// Where a key of levels lies.
pub(crate) enum Lookup<'a> {
    /// On the grid, at this index.
    OnGrid(usize),
    /// Off the grid; these grid points are its nearest.
    Near(&'a [u16]),
}

impl<const N: usize> Search<N> {
    /// Looks up a packed key; `None` for a key outside ggml's map (ggml would read out of bounds).
    #[inline]
    pub fn lookup(&self, key: usize) -> Option<Lookup<'_>> {
        let v = *self.map.get(key)?;
        if v >= 0 {
            return Some(Lookup::OnGrid(v as usize));
        }
        let start = (-(v as i64) - 1) as usize;
        let count = *self.neighbours.get(start)? as usize;
        self.neighbours.get(start + 1..start + 1 + count).map(Lookup::Near)
    }

    /// The levels `(pos - 1) / 2` of grid point `index`.
    #[inline]
    pub fn levels(&self, index: usize, out: &mut [i8]) {
        for (o, &p) in out.iter_mut().zip(&self.grid[index]) {
            *o = (p - 1) / 2;
        }
    }

    /// ggml's `iq2_find_best_neighbour` / `iq3_find_best_neighbour`: the neighbour minimising the
    /// weighted distance `sum w * (scale * pos - x)^2`, its levels written to `l`. `None` when no
    /// distance compares below `f32::MAX` (NaN or overflowing data, where ggml asserts).
    pub fn best_neighbour(
        &self,
        neighbours: &[u16],
        xval: &[f32],
        weight: &[f32],
        scale: f32,
        l: &mut [i8],
    ) -> Option<usize> {
        let mut best_d2 = f32::MAX;
        let mut grid_index = None;
        for &j in neighbours {
            let pg = &self.grid[j as usize];
            let mut d2 = 0.0f32;
            for i in 0..N {
                let q = pg[i] as f32;
                let diff = scale * q - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                grid_index = Some(j as usize);
            }
        }
        let g = grid_index?;
        self.levels(g, &mut l[..N]);
        Some(g)
    }

    fn build(levels: &[[u8; N]], bits: u32, map_size: usize, nwant: usize) -> Self {
        let grid: Vec<[i8; N]> =
            levels.iter().map(|lv| std::array::from_fn(|i| 2 * lv[i] as i8 + 1)).collect();
        let mut map = vec![-1i32; map_size];
        for (i, lv) in levels.iter().enumerate() {
            let mut key = 0usize;
            for (k, &l) in lv.iter().enumerate() {
                key |= (l as usize) << (bits as usize * k);
            }
            map[key] = i as i32;
        }
        let mask = (1usize << bits) - 1;
        let mut neighbours = Vec::new();
        let mut d2 = vec![0i32; grid.len()];
        for key in 0..map_size {
            if map[key] >= 0 {
                continue;
            }
            let pos: [i32; N] =
                std::array::from_fn(|k| 2 * ((key >> (bits as usize * k)) & mask) as i32 + 1);
            for (d, g) in d2.iter_mut().zip(&grid) {
                *d = g.iter().zip(&pos).map(|(&a, &b)| (a as i32 - b) * (a as i32 - b)).sum();
            }
            // The `nwant` smallest distinct distances, ascending.
            let mut levels_d: Vec<i32> = Vec::with_capacity(nwant + 1);
            for &d in &d2 {
                if let Err(at) = levels_d.binary_search(&d)
                    && at < nwant
                {
                    levels_d.insert(at, d);
                    levels_d.truncate(nwant);
                }
            }
            map[key] = -(neighbours.len() as i32 + 1);
            let start = neighbours.len();
            neighbours.push(0);
            for &lvl in &levels_d {
                neighbours.extend((0..grid.len()).filter(|&j| d2[j] == lvl).map(|j| j as u16));
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
        }
        Search { grid, map, neighbours }
    }
}

/// Levels of a u64 grid whose bytes take the values `byte_values[level]`.
fn levels8(grid: &[u64], byte_values: &[u8]) -> Vec<[u8; 8]> {
    grid.iter()
        .map(|&g| {
            std::array::from_fn(|i| {
                let b = (g >> (8 * i)) as u8;
                byte_values.iter().position(|&v| v == b).unwrap_or(0) as u8
            })
        })
        .collect()
}

fn levels4(grid: &[u32], byte_values: &[u8]) -> Vec<[u8; 4]> {
    grid.iter()
        .map(|&g| {
            std::array::from_fn(|i| {
                let b = (g >> (8 * i)) as u8;
                byte_values.iter().position(|&v| v == b).unwrap_or(0) as u8
            })
        })
        .collect()
}

const IQ2_BYTES: [u8; 3] = [0x08, 0x19, 0x2b];
const IQ1_BYTES: [u8; 3] = [0xff, 0x00, 0x01];
const IQ3XXS_BYTES: [u8; 8] = [0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e];
const IQ3S_BYTES: [u8; 8] = [0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f];
/// ggml's `kmap_size` for the 8-element grids (every key of levels 0..=2 fits).
const KMAP_SIZE_IQ2: usize = 43692;
const KMAP_SIZE_IQ3: usize = 4096;

/// Declares `pub(crate) fn $name() -> &'static Search<N>`, built on first use from a grid
/// (`levels8`/`levels4` of its table and byte values), key bits, map size and neighbour levels.
macro_rules! grid_search {
    ($(#[$doc:meta])* $name:ident: Search<$n:literal> = $levels:ident($grid:expr, $bytes:expr),
     $bits:expr, $kmap:expr, $nwant:expr) => {
        $(#[$doc])*
        pub(crate) fn $name() -> &'static Search<$n> {
            static S: OnceLock<Search<$n>> = OnceLock::new();
            S.get_or_init(|| Search::build(&$levels(&$grid, &$bytes), $bits, $kmap, $nwant))
        }
    };
}

grid_search! {
    /// IQ2_XXS: 256 points, two distance levels of neighbours.
    iq2xxs: Search<8> = levels8(IQ2XXS_GRID, IQ2_BYTES), 2, KMAP_SIZE_IQ2, 2
}
grid_search! {
    /// IQ2_XS: 512 points, two distance levels.
    iq2xs: Search<8> = levels8(IQ2XS_GRID, IQ2_BYTES), 2, KMAP_SIZE_IQ2, 2
}
grid_search! {
    /// IQ2_S: 1024 points, one distance level.
    iq2s: Search<8> = levels8(IQ2S_GRID, IQ2_BYTES), 2, KMAP_SIZE_IQ2, 1
}
grid_search! {
    /// IQ1_S and IQ1_M (shared, as in ggml): 2048 points, three distance levels.
    iq1s: Search<8> = levels8(IQ1S_GRID, IQ1_BYTES), 2, KMAP_SIZE_IQ2, 3
}
grid_search! {
    /// IQ3_XXS: 256 points, two distance levels.
    iq3xxs: Search<4> = levels4(IQ3XXS_GRID, IQ3XXS_BYTES), 3, KMAP_SIZE_IQ3, 2
}
grid_search! {
    /// IQ3_S: 512 points, three distance levels.
    iq3s: Search<4> = levels4(IQ3S_GRID, IQ3S_BYTES), 3, KMAP_SIZE_IQ3, 3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key8(lv: &[u8; 8]) -> u64 {
        lv.iter().enumerate().map(|(i, &l)| (l as u64) << (2 * i)).sum()
    }
    fn key4(lv: &[u8; 4]) -> u64 {
        lv.iter().enumerate().map(|(i, &l)| (l as u64) << (3 * i)).sum()
    }

    /// (first six keys, last two, sum, sum of index*key) of ggml-quants.c's kgrid_* tables.
    fn check(keys: &[u64], first: [u64; 6], last: [u64; 2], sum: u64, wsum: u64) {
        assert_eq!(keys[..6], first);
        assert_eq!(keys[keys.len() - 2..], last);
        assert_eq!(keys.iter().sum::<u64>(), sum);
        assert_eq!(keys.iter().enumerate().map(|(i, &k)| i as u64 * k).sum::<u64>(), wsum);
    }

    #[test]
    fn derived_levels_equal_ggml_kgrid_tables() {
        let k = |g: &[u64], b: &[u8]| levels8(g, b).iter().map(key8).collect::<Vec<_>>();
        check(
            &k(&IQ2XXS_GRID, &IQ2_BYTES),
            [0, 2, 5, 8, 10, 17],
            [43088, 43268],
            3697703,
            707533115,
        );
        check(
            &k(&IQ2XS_GRID, &IQ2_BYTES),
            [0, 2, 5, 8, 10, 17],
            [43665, 43690],
            8004683,
            3055307193,
        );
        check(
            &k(&IQ2S_GRID, &IQ2_BYTES),
            [0, 2, 5, 8, 10, 17],
            [43656, 43690],
            16519059,
            12258848790,
        );
        check(
            &k(&IQ1S_GRID, &IQ1_BYTES),
            [0, 2, 5, 8, 10, 17],
            [43688, 43690],
            44428132,
            61339684535,
        );
        let k4 = |g: &[u32], b: &[u8]| levels4(g, b).iter().map(key4).collect::<Vec<_>>();
        check(
            &k4(&IQ3XXS_GRID, &IQ3XXS_BYTES),
            [0, 2, 4, 9, 11, 15],
            [3924, 3992],
            391138,
            71393250,
        );
        check(&k4(&IQ3S_GRID, &IQ3S_BYTES), [0, 1, 2, 5, 7, 8], [3993, 4032], 777331, 281345005);
    }

    #[test]
    fn every_grid_byte_has_a_level() {
        for g in [&IQ2XXS_GRID[..], &IQ2XS_GRID[..], &IQ2S_GRID[..]] {
            assert!(g.iter().all(|v| v.to_le_bytes().iter().all(|b| IQ2_BYTES.contains(b))));
        }
        assert!(IQ1S_GRID.iter().all(|v| v.to_le_bytes().iter().all(|b| IQ1_BYTES.contains(b))));
        assert!(
            IQ3XXS_GRID.iter().all(|v| v.to_le_bytes().iter().all(|b| IQ3XXS_BYTES.contains(b)))
        );
        assert!(IQ3S_GRID.iter().all(|v| v.to_le_bytes().iter().all(|b| IQ3S_BYTES.contains(b))));
    }

    #[test]
    fn off_grid_keys_have_sorted_neighbours() {
        let s = iq3xxs();
        let mut n_off = 0;
        for key in 0..KMAP_SIZE_IQ3 {
            match s.lookup(key).expect("every key is mapped") {
                Lookup::OnGrid(i) => assert!(i < 256),
                Lookup::Near(nb) => {
                    n_off += 1;
                    assert!(!nb.is_empty());
                    assert!(nb.iter().all(|&j| (j as usize) < 256));
                }
            }
        }
        assert_eq!(n_off, 4096 - 256);
        assert!(s.lookup(KMAP_SIZE_IQ3).is_none());
    }
}
