//! Qwen-VL's 3D rotary positions (M-RoPE): each token has a time, a row and a column position.
//! Text advances all three together; an image's tokens (one per merge group) sit at the
//! position after the text before it plus their time, row and column in the merged grid; text
//! after an image carries on from one past the largest position so far. A prompt with images thus
//! ends below its length, and every later token's positions are its index plus that `delta`.

/// The positions of `tokens` whose images (runs of `image_token`, one per grid, in order) are on
/// `grids` (time, height, width in patches, merged `merge` x `merge` into tokens).
pub fn mrope_positions(
    tokens: &[u32],
    image_token: u32,
    grids: &[[usize; 3]],
    merge: usize,
) -> Result<(Vec<[i32; 3]>, i32), String> {
    let mut positions: Vec<[i32; 3]> = Vec::with_capacity(tokens.len());
    let (mut at, mut next) = (0usize, 0i32);
    for (i, &[t, h, w]) in grids.iter().enumerate() {
        let (gh, gw) = (h / merge, w / merge);
        let count = t * gh * gw;
        let start = tokens[at..]
            .iter()
            .position(|&id| id == image_token)
            .map(|k| at + k)
            .ok_or_else(|| format!("image {i} has no tokens in the prompt"))?;
        if tokens.len() < start + count || tokens[start..start + count].iter().any(|&id| id != image_token) {
            return Err(format!("image {i} needs {count} image tokens in a row"));
        }
        for k in 0..(start - at) as i32 {
            positions.push([next + k; 3]);
        }
        let base = next + (start - at) as i32;
        for ti in 0..t {
            for hi in 0..gh {
                for wi in 0..gw {
                    positions.push([base + ti as i32, base + hi as i32, base + wi as i32]);
                }
            }
        }
        next = base + t.max(gh).max(gw) as i32;
        at = start + count;
    }
    if tokens[at..].contains(&image_token) {
        return Err(format!("more image tokens than the {} images' grids hold", grids.len()));
    }
    for k in 0..(tokens.len() - at) as i32 {
        positions.push([next + k; 3]);
    }
    let end = positions.iter().flat_map(|p| p.iter().copied()).max().map_or(0, |m| m + 1);
    Ok((positions, end - tokens.len() as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_only_is_the_token_index_and_a_miscount_is_an_error() {
        let (p, delta) = mrope_positions(&[1, 2, 3], 9, &[], 2).unwrap();
        assert_eq!((p, delta), (vec![[0; 3], [1; 3], [2; 3]], 0));
        assert!(mrope_positions(&[1, 9, 9, 2], 9, &[[1, 4, 4]], 2).is_err(), "4 tokens needed, 2 there");
        assert!(mrope_positions(&[9, 9, 9, 9, 2, 9], 9, &[[1, 4, 4]], 2).is_err(), "one image token too many");
    }
}
