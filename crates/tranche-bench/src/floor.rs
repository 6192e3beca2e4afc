//! The I/O floor: the least any pipeline over these bytes could cost here — read the input
//! once, write as many bytes once (synced), and SHA-256 them once, in 1 MiB blocks.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Seconds spent in each part of the floor.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Floor {
    pub bytes: u64,
    pub read_seconds: f64,
    pub write_seconds: f64,
    pub sha256_seconds: f64,
}

impl Floor {
    pub fn seconds(&self) -> f64 {
        self.read_seconds + self.write_seconds + self.sha256_seconds
    }
}

/// Reads `input`, hashes every block and writes it to `scratch` (synced, then removed).
pub fn measure(input: &Path, scratch: &Path) -> std::io::Result<Floor> {
    let mut reader = std::fs::File::open(input)?;
    let mut writer = std::fs::File::create(scratch)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut floor = Floor::default();
    loop {
        let t = Instant::now();
        let n = reader.read(&mut buf)?;
        floor.read_seconds += t.elapsed().as_secs_f64();
        if n == 0 {
            break;
        }
        let block = buf.get(..n).unwrap_or_default();
        let t = Instant::now();
        hasher.update(block);
        floor.sha256_seconds += t.elapsed().as_secs_f64();
        let t = Instant::now();
        writer.write_all(block)?;
        floor.write_seconds += t.elapsed().as_secs_f64();
        floor.bytes += n as u64;
    }
    let t = Instant::now();
    writer.sync_all()?;
    floor.write_seconds += t.elapsed().as_secs_f64();
    // Keep the digest alive so the hashing cannot be optimised away.
    std::hint::black_box(hasher.finalize());
    drop(writer);
    std::fs::remove_file(scratch)?;
    Ok(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_every_byte_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        std::fs::write(&input, vec![7u8; 3 << 20]).unwrap();
        let scratch = dir.path().join("scratch");
        let floor = measure(&input, &scratch).unwrap();
        assert_eq!(floor.bytes, 3 << 20);
        assert!(floor.seconds() > 0.0);
        assert!(!scratch.exists());
    }
}
