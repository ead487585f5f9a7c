//! `bench p2p`: copies between every ordered pair of GPUs with peer access,
//! timed with CUDA events after a warm-up, one direction and both at once, and
//! checked on the destination.

use super::{Budget, gbps};
use crate::facts::FactError;
use crate::vendor::cuda::{Driver, Gpu};
use serde::{Deserialize, Serialize};

/// Each chunk of the source holds its own 32-bit value, so a copy that lands
/// at the wrong offset, or not at all, is caught.
pub const CHUNK: usize = 1 << 20;
/// Bytes read back from the start of every chunk to verify it.
const SAMPLE: usize = 64 << 10;
const WARMUP: u32 = 2;

/// What one ordered pair measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PairResult {
    /// CUDA ordinals: the copy goes from `src` to `dst`.
    pub src: u32,
    pub dst: u32,
    pub peer_access: bool,
    /// GB/s (10^9 bytes/s) from `src` to `dst` alone.
    pub unidirectional_gbps: Option<f64>,
    /// GB/s both ways at once, the two directions summed.
    pub bidirectional_gbps: Option<f64>,
    /// Every sampled chunk held the value the source chunk was filled with.
    pub verified: Option<bool>,
    /// The first chunk that did not, with what it held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<FactError>,
}

/// The value chunk `i` of the copy `src -> dst` is filled with.
pub fn pattern(src: u32, dst: u32, chunk: usize) -> u32 {
    (chunk as u32).wrapping_add(1).wrapping_mul(0x9E37_79B9) ^ (src << 24) ^ (dst << 16) ^ 0x5A5A
}

/// Finds the first sampled word that differs; `samples` holds `SAMPLE` bytes per chunk.
fn first_mismatch(src: u32, dst: u32, chunk: usize, sample: &[u8]) -> Option<String> {
    let want = pattern(src, dst, chunk);
    sample.chunks_exact(4).enumerate().find_map(|(w, b)| {
        let got = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        (got != want).then(|| {
            format!(
                "byte {}: 0x{got:08x}, expected 0x{want:08x}",
                chunk * CHUNK + w * 4
            )
        })
    })
}

struct Buffers<'d, 'w> {
    src: crate::vendor::cuda::DeviceBuffer<'d, 'w>,
    dst: crate::vendor::cuda::DeviceBuffer<'d, 'w>,
}

fn prepare<'d, 'w>(
    driver: &'d Driver<'w>,
    from: &Gpu,
    to: &Gpu,
    bytes: usize,
) -> Result<Buffers<'d, 'w>, FactError> {
    let src = driver.alloc(from, bytes)?;
    for chunk in 0..bytes / CHUNK {
        driver.fill(
            from,
            src.slice(chunk * CHUNK, CHUNK)?,
            pattern(from.ordinal, to.ordinal, chunk),
        )?;
    }
    let dst = driver.alloc(to, bytes)?;
    driver.fill(to, dst.words(), 0)?;
    driver.sync(from)?;
    driver.sync(to)?;
    Ok(Buffers { src, dst })
}

/// Times `iterations` copies of `b.src` into `b.dst` on `from`'s stream; returns GB/s.
fn one_way(
    driver: &Driver<'_>,
    from: &Gpu,
    b: &Buffers<'_, '_>,
    iterations: u32,
) -> Result<f64, FactError> {
    let bytes = b.src.len();
    driver.make_current(from)?;
    for _ in 0..WARMUP {
        driver.copy_peer(from, b.dst.all(), b.src.all())?;
    }
    let (start, end) = (driver.event(from)?, driver.event(from)?);
    driver.make_current(from)?;
    driver.record(start, from)?;
    for _ in 0..iterations {
        driver.copy_peer(from, b.dst.all(), b.src.all())?;
    }
    driver.record(end, from)?;
    let ms = driver.elapsed_ms(from, start, end)?;
    Ok(gbps(bytes as f64 * f64::from(iterations), ms))
}

/// Times both directions at once: each GPU's stream copies its buffer to the
/// other, started together by an event and joined by another; returns GB/s summed.
fn both_ways(
    driver: &Driver<'_>,
    (a, b): (&Gpu, &Gpu),
    (ab, ba): (&Buffers<'_, '_>, &Buffers<'_, '_>),
    iterations: u32,
) -> Result<f64, FactError> {
    let bytes = ab.src.len();
    let (start, end) = (driver.event(a)?, driver.event(a)?);
    let joined = driver.event(b)?;
    driver.make_current(a)?;
    driver.record(start, a)?;
    driver.make_current(b)?;
    driver.wait(b, start)?;
    for _ in 0..iterations {
        driver.copy_peer(b, ba.dst.all(), ba.src.all())?;
    }
    driver.record(joined, b)?;
    driver.make_current(a)?;
    for _ in 0..iterations {
        driver.copy_peer(a, ab.dst.all(), ab.src.all())?;
    }
    driver.wait(a, joined)?;
    driver.record(end, a)?;
    let ms = driver.elapsed_ms(a, start, end)?;
    Ok(gbps(2.0 * bytes as f64 * f64::from(iterations), ms))
}

/// Reads back the start of every chunk of `to`'s buffer and compares.
fn verify(
    driver: &Driver<'_>,
    (from, to): (&Gpu, &Gpu),
    b: &Buffers<'_, '_>,
) -> Result<Option<String>, FactError> {
    driver.sync(from)?;
    driver.sync(to)?;
    let mut sample = vec![0u8; SAMPLE];
    for chunk in 0..b.dst.len() / CHUNK {
        driver.read_back(b.dst.slice(chunk * CHUNK, CHUNK)?, &mut sample)?;
        if let Some(m) = first_mismatch(from.ordinal, to.ordinal, chunk, &sample) {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

fn measure_pair(
    driver: &Driver<'_>,
    (a, b): (&Gpu, &Gpu),
    bytes: usize,
    iterations: u32,
    result_ab: &mut PairResult,
    result_ba: &mut PairResult,
) -> Result<(), FactError> {
    driver.enable_peer(a, b)?;
    driver.enable_peer(b, a)?;
    let ab = prepare(driver, a, b, bytes)?;
    let ba = prepare(driver, b, a, bytes)?;
    result_ab.unidirectional_gbps = Some(one_way(driver, a, &ab, iterations)?);
    result_ba.unidirectional_gbps = Some(one_way(driver, b, &ba, iterations)?);
    let both = both_ways(driver, (a, b), (&ab, &ba), iterations)?;
    result_ab.bidirectional_gbps = Some(both);
    result_ba.bidirectional_gbps = Some(both);
    for (r, (from, to), buffers) in [
        (&mut *result_ab, (a, b), &ab),
        (&mut *result_ba, (b, a), &ba),
    ] {
        let mismatch = verify(driver, (from, to), buffers)?;
        r.verified = Some(mismatch.is_none());
        r.mismatch = mismatch;
    }
    Ok(())
}

/// Measures every pair of `gpus` while the budget lasts; pairs left over are
/// reported with the budget as their error.
pub fn run(
    driver: &Driver<'_>,
    gpus: &[Gpu],
    bytes: usize,
    iterations: u32,
    budget: &Budget,
) -> Vec<PairResult> {
    let mut results = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            let blank = |src: &Gpu, dst: &Gpu| PairResult {
                src: src.ordinal,
                dst: dst.ordinal,
                peer_access: false,
                unidirectional_gbps: None,
                bidirectional_gbps: None,
                verified: None,
                mismatch: None,
                error: None,
            };
            let (mut ab, mut ba) = (blank(a, b), blank(b, a));
            let outcome = (|| -> Result<(), FactError> {
                budget.check()?;
                ab.peer_access = driver.can_access_peer(a, b)?;
                ba.peer_access = driver.can_access_peer(b, a)?;
                if ab.peer_access && ba.peer_access {
                    measure_pair(driver, (a, b), bytes, iterations, &mut ab, &mut ba)?;
                }
                Ok(())
            })();
            if let Err(e) = outcome {
                ab.error = Some(e.clone());
                ba.error = Some(e);
            }
            results.push(ab);
            results.push(ba);
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_chunk_and_direction_and_mismatches_are_located() {
        assert_ne!(pattern(0, 1, 0), pattern(0, 1, 1));
        assert_ne!(pattern(0, 1, 3), pattern(1, 0, 3));
        let good: Vec<u8> = std::iter::repeat_n(pattern(0, 1, 2).to_ne_bytes(), 8)
            .flatten()
            .collect();
        assert_eq!(first_mismatch(0, 1, 2, &good), None);
        let mut bad = good.clone();
        bad[13] ^= 0xff;
        let m = first_mismatch(0, 1, 2, &bad).unwrap();
        assert!(m.starts_with(&format!("byte {}:", 2 * CHUNK + 12)), "{m}");
    }
}
