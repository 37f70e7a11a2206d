//! A fast path for decoding the common shapes of a JSON `KvCacheEvent`.
//!
//! `serde_json` with derived visitors spends most of a 64-block event's decoding time on
//! generic field dispatch; this hand-written recursive-descent parser accepts exactly the
//! canonical grammar (any key order, JSON whitespace, plain integers, `null`) and gives up
//! (`None`) on anything else: escapes in keys, unknown or duplicate keys, floats, signs,
//! leading zeros, out-of-range integers, `mm_extra_info` objects, trailing bytes. The caller
//! then decodes with `serde_json`, which stays the single authority for what is valid and
//! for every error message.
//!
//! Invariant (tested against `serde_json` by a property test and the fuzz target): when
//! this parser returns `Some(event)`, `serde_json` returns `Ok(event)` for the same bytes.

use super::events::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent, StorageTier,
};
use crate::hashing::LocalBlockHash;

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

/// Decode `bytes` if they are a canonical event; `None` means "use the full decoder".
pub(super) fn decode_event(bytes: &[u8]) -> Option<KvCacheEvent> {
    let mut p = Parser { b: bytes, i: 0 };
    let ev = p.event()?;
    p.ws();
    (p.i == p.b.len()).then_some(ev)
}

/// Decode `bytes` if they are a canonical `RouterEvent` (`worker_id`, optional
/// `storage_tier`, `event`); `None` means "use the full decoder".
pub(super) fn decode_router_event(bytes: &[u8]) -> Option<RouterEvent> {
    let mut p = Parser { b: bytes, i: 0 };
    let ev = p.router_event()?;
    p.ws();
    (p.i == p.b.len()).then_some(ev)
}

/// The value of 8 ASCII digits, or `None` if any byte is not a digit (SWAR: one 64-bit
/// load, a range check on all lanes, then three multiply-shift steps that combine digit
/// pairs, quads and octets).
#[inline]
fn parse_eight_digits(chunk: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = chunk.try_into().ok()?;
    let x = u64::from_le_bytes(bytes);
    let v = x.wrapping_sub(0x3030_3030_3030_3030);
    // Every lane must be 0..=9: no borrow out of a lane (x >= '0') and v + 6 < 16.
    let not_digits = (v | v.wrapping_add(0x0606_0606_0606_0606)) & 0xF0F0_F0F0_F0F0_F0F0;
    if not_digits != 0 || x & 0x8080_8080_8080_8080 != 0 {
        return None;
    }
    // Lanes hold d0..d7 (d0 first, most significant).
    let v = (v.wrapping_mul(10) + (v >> 8)) & 0x00FF_00FF_00FF_00FF; // pairs: 10*d0+d1, ...
    let v = (v.wrapping_mul(100) + (v >> 16)) & 0x0000_FFFF_0000_FFFF; // quads
    let v = (v.wrapping_mul(10_000) + (v >> 32)) & 0x0000_0000_FFFF_FFFF; // octet
    Some(v)
}

impl<'a> Parser<'a> {
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    /// A key without escapes, and the colon after it.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'"' => break,
                b'\\' => return None,
                _ => self.i += 1,
            }
        }
        let key = &self.b[start..self.i];
        self.i += 1;
        self.eat(b':')?;
        Some(key)
    }

    /// An unsigned integer in canonical form that fits in a u64.
    fn u64(&mut self) -> Option<u64> {
        self.ws();
        let start = self.i;
        let mut v: u64 = 0;
        // Eight digits at a time while they last (hashes have ~20 digits), then one by one.
        // 16 digits cannot overflow; later digits are checked.
        while self.i - start < 16
            && let Some(chunk) = self.b.get(self.i..self.i + 8)
            && let Some(eight) = parse_eight_digits(chunk)
        {
            v = v * 100_000_000 + eight;
            self.i += 8;
        }
        while let Some(&d @ b'0'..=b'9') = self.b.get(self.i) {
            v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let n = self.i - start;
        if n == 0 || (n > 1 && self.b[start] == b'0') {
            return None;
        }
        // A fraction or exponent makes it a float: not ours to judge.
        if let Some(b'.' | b'e' | b'E') = self.b.get(self.i) {
            return None;
        }
        Some(v)
    }

    fn null(&mut self) -> Option<()> {
        self.ws();
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            Some(())
        } else {
            None
        }
    }

    fn opt_u64(&mut self) -> Option<Option<u64>> {
        if self.peek()? == b'n' {
            self.null()?;
            Some(None)
        } else {
            self.u64().map(Some)
        }
    }

    /// Iterate `{ "key": value, ... }`, calling `field` for each key (it parses the value).
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.key()?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Iterate `[ item, ... ]`.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn router_event(&mut self) -> Option<RouterEvent> {
        let (mut worker_id, mut tier, mut event) = (None, None, None);
        self.object(|p, key| match key {
            b"worker_id" if worker_id.is_none() => {
                worker_id = Some(p.u64()?);
                Some(())
            }
            b"storage_tier" if tier.is_none() => {
                tier = Some(p.tier()?);
                Some(())
            }
            b"event" if event.is_none() => {
                event = Some(p.event()?);
                Some(())
            }
            _ => None,
        })?;
        Some(RouterEvent {
            worker_id: worker_id?,
            storage_tier: tier.unwrap_or_default(),
            event: event?,
        })
    }

    /// A storage tier spelled exactly as serde writes it.
    fn tier(&mut self) -> Option<StorageTier> {
        self.eat(b'"')?;
        let rest = &self.b[self.i..];
        let (tier, n) = if rest.starts_with(b"device\"") {
            (StorageTier::Device, 7)
        } else if rest.starts_with(b"host_pinned\"") {
            (StorageTier::HostPinned, 12)
        } else if rest.starts_with(b"disk\"") {
            (StorageTier::Disk, 5)
        } else if rest.starts_with(b"external\"") {
            (StorageTier::External, 9)
        } else {
            return None;
        };
        self.i += n;
        Some(tier)
    }

    fn event(&mut self) -> Option<KvCacheEvent> {
        let (mut event_id, mut data, mut dp_rank) = (None, None, None);
        self.object(|p, key| match key {
            b"event_id" if event_id.is_none() => {
                event_id = Some(p.u64()?);
                Some(())
            }
            b"dp_rank" if dp_rank.is_none() => {
                dp_rank = Some(u32::try_from(p.u64()?).ok()?);
                Some(())
            }
            b"data" if data.is_none() => {
                data = Some(p.data()?);
                Some(())
            }
            _ => None,
        })?;
        Some(KvCacheEvent {
            event_id: event_id?,
            data: data?,
            dp_rank: dp_rank.unwrap_or(0),
        })
    }

    fn data(&mut self) -> Option<KvCacheEventData> {
        if self.peek()? == b'"' {
            self.i += 1;
            if self.b[self.i..].starts_with(b"cleared\"") {
                self.i += 8;
                return Some(KvCacheEventData::Cleared);
            }
            return None;
        }
        let mut out = None;
        self.object(|p, key| {
            if out.is_some() {
                return None;
            }
            out = Some(match key {
                b"stored" => KvCacheEventData::Stored(p.stored()?),
                b"removed" => KvCacheEventData::Removed(p.removed()?),
                _ => return None,
            });
            Some(())
        })?;
        out
    }

    fn stored(&mut self) -> Option<KvCacheStoreData> {
        let (mut parent, mut start, mut blocks) = (None, None, None);
        self.object(|p, key| match key {
            b"parent_hash" if parent.is_none() => {
                parent = Some(p.opt_u64()?);
                Some(())
            }
            b"start_position" if start.is_none() => {
                start = Some(match p.opt_u64()? {
                    None => None,
                    Some(v) => Some(u32::try_from(v).ok()?),
                });
                Some(())
            }
            b"blocks" if blocks.is_none() => {
                let mut v = Vec::new();
                p.array(|p| {
                    v.push(p.block()?);
                    Some(())
                })?;
                blocks = Some(v);
                Some(())
            }
            _ => None,
        })?;
        Some(KvCacheStoreData {
            parent_hash: parent.flatten().map(ExternalSequenceBlockHash),
            start_position: start.flatten(),
            blocks: blocks?,
        })
    }

    fn block(&mut self) -> Option<KvCacheStoredBlockData> {
        let (mut block_hash, mut tokens_hash, mut mm) = (None, None, false);
        self.object(|p, key| match key {
            b"block_hash" if block_hash.is_none() => {
                block_hash = Some(p.u64()?);
                Some(())
            }
            b"tokens_hash" if tokens_hash.is_none() => {
                tokens_hash = Some(p.u64()?);
                Some(())
            }
            b"mm_extra_info" if !mm => {
                mm = true;
                p.null()
            }
            _ => None,
        })?;
        Some(KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(block_hash?),
            tokens_hash: LocalBlockHash(tokens_hash?),
            mm_extra_info: None,
        })
    }

    fn removed(&mut self) -> Option<KvCacheRemoveData> {
        let mut hashes = None;
        self.object(|p, key| match key {
            b"block_hashes" if hashes.is_none() => {
                let mut v = Vec::new();
                p.array(|p| {
                    v.push(ExternalSequenceBlockHash(p.u64()?));
                    Some(())
                })?;
                hashes = Some(v);
                Some(())
            }
            _ => None,
        })?;
        Some(KvCacheRemoveData {
            block_hashes: hashes?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_eight_digits;

    fn naive(chunk: &[u8]) -> Option<u64> {
        chunk.iter().try_fold(0u64, |v, &c| {
            c.is_ascii_digit().then(|| v * 10 + u64::from(c - b'0'))
        })
    }

    proptest::proptest! {
        #[test]
        fn swar_digits_match_naive_parsing(
            bytes in proptest::array::uniform8(proptest::prop_oneof![
                4 => b'0'..=b'9',
                1 => proptest::num::u8::ANY,
            ])
        ) {
            proptest::prop_assert_eq!(parse_eight_digits(&bytes), naive(&bytes));
        }
    }

    #[test]
    fn swar_digits_edge_cases() {
        assert_eq!(parse_eight_digits(b"00000000"), Some(0));
        assert_eq!(parse_eight_digits(b"99999999"), Some(99_999_999));
        assert_eq!(parse_eight_digits(b"12345678"), Some(12_345_678));
        for bad in [
            b"1234567/",
            b"1234567:",
            b"/2345678",
            b":2345678",
            b"123\xb05678",
        ] {
            assert_eq!(parse_eight_digits(&bad[..8]), None, "{bad:?}");
        }
    }
}
