//! Which layers each rank holds: consecutive ranges, each rank's share of the layers' bytes in
//! proportion to the room it has (its memory budget less what else it holds), so a Mac with
//! twice the memory holds about twice the layers.

use std::ops::Range;

/// Consecutive, non-empty layer ranges covering `layer_bytes`, one per entry of `room` (rank
/// order), or why the layers do not fit.
pub fn split_layers(layer_bytes: &[u64], room: &[u64]) -> Result<Vec<Range<usize>>, String> {
    let (layers, ranks) = (layer_bytes.len(), room.len());
    if ranks == 0 {
        return Err("no ranks to hold the layers".into());
    }
    if layers < ranks {
        return Err(format!("a model of {layers} layers cannot be split across {ranks} machines"));
    }
    let total: u64 = layer_bytes.iter().sum();
    let room_total: u128 = room.iter().map(|&r| r as u128).sum();
    if room_total < total as u128 {
        return Err(format!(
            "the layers take {:.2} GB; the machines have room for {:.2} GB together",
            gb(total),
            room_total as f64 / 1e9
        ));
    }
    // Each rank ends its range where the running total of bytes comes closest to its running
    // share of the room, leaving at least one layer for each rank after it.
    let mut ranges = Vec::with_capacity(ranks);
    let (mut start, mut room_so_far, mut bytes_so_far) = (0usize, 0u128, 0u64);
    for (rank, &r) in room.iter().enumerate() {
        room_so_far += r as u128;
        let target = (total as u128 * room_so_far / room_total.max(1)) as u64;
        let last_allowed = layers - (ranks - rank - 1);
        let mut end = start + 1;
        let mut bytes = bytes_so_far + layer_bytes[start];
        while end < last_allowed && (bytes + layer_bytes[end]).abs_diff(target) <= bytes.abs_diff(target) {
            bytes += layer_bytes[end];
            end += 1;
        }
        if rank + 1 == ranks {
            end = layers;
            bytes = total;
        }
        ranges.push(start..end);
        bytes_so_far = bytes;
        start = end;
    }
    for (rank, range) in ranges.iter().enumerate() {
        let held: u64 = layer_bytes[range.clone()].iter().sum();
        if held > room[rank] {
            return Err(format!(
                "rank {rank} would hold layers {}..{} ({:.2} GB) with room for {:.2} GB",
                range.start,
                range.end,
                gb(held),
                gb(room[rank])
            ));
        }
    }
    Ok(ranges)
}

fn gb(bytes: u64) -> f64 {
    bytes as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_room_splits_evenly_and_more_room_holds_more() {
        assert_eq!(split_layers(&[10; 30], &[1000, 1000]).unwrap(), vec![0..15, 15..30]);
        assert_eq!(split_layers(&[10; 30], &[1000, 1000, 1000]).unwrap(), vec![0..10, 10..20, 20..30]);
        assert_eq!(split_layers(&[10; 30], &[2000, 1000]).unwrap(), vec![0..20, 20..30]);
        // Uneven layers: bytes, not counts, are shared.
        assert_eq!(split_layers(&[40, 10, 10, 10, 10], &[100, 100]).unwrap(), vec![0..1, 1..5]);
    }

    #[test]
    fn every_rank_holds_a_layer_and_what_does_not_fit_is_refused() {
        // Nearly all the room on rank 0 still leaves rank 1 a layer.
        assert_eq!(split_layers(&[10; 4], &[1_000_000, 40]).unwrap(), vec![0..3, 3..4]);
        let e = split_layers(&[10; 2], &[100, 100, 100]).unwrap_err();
        assert!(e.contains("2 layers") && e.contains("3 machines"), "{e}");
        let e = split_layers(&[10; 4], &[15, 15]).unwrap_err();
        assert!(e.contains("room for"), "{e}");
        // Enough in total, but the split would overfill a rank.
        let e = split_layers(&[30, 10], &[25, 25]).unwrap_err();
        assert!(e.contains("rank 0 would hold layers 0..1"), "{e}");
    }
}
