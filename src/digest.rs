//! SHA-256 digests as lowercase hex: what a saved plan records of the files and table shapes it
//! was made from, and of its own content.

use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes`, 64 lowercase hex digits.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    Sha256::digest(bytes.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_digest_of_nothing_is_the_known_one() {
        assert_eq!(
            super::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
