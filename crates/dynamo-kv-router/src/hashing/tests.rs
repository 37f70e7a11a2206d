use super::*;

fn plain(tokens: &[u32], bs: usize) -> Vec<u64> {
    compute_block_hash_for_seq(tokens, bs, &BlockHashOptions::default())
        .expect("non-zero block size")
        .into_iter()
        .map(|h| h.0)
        .collect()
}

#[test]
fn xxh3_vector_from_reference_tests() {
    assert_eq!(
        xxh3_64_with_seed(b"test data", XXH3_SEED),
        13_226_331_709_069_118_873
    );
}

#[test]
fn plain_blocks_match_known_vectors() {
    let tokens: Vec<u32> = (0..8).collect();
    assert_eq!(
        plain(&tokens, 4),
        [9_143_094_415_614_847_814, 12_124_091_508_212_882_195]
    );
}

#[test]
fn partial_tail_is_dropped() {
    let tokens: Vec<u32> = (0..11).collect();
    assert_eq!(plain(&tokens, 4), plain(&tokens[..8], 4));
    assert!(plain(&tokens[..3], 4).is_empty());
}

#[test]
fn zero_block_size_is_an_error() {
    let err = compute_block_hash_for_seq(&[1, 2, 3], 0, &BlockHashOptions::default());
    assert_eq!(err, Err(Error::ZeroBlockSize));
    assert_eq!(
        Error::ZeroBlockSize.to_string(),
        "kv_block_size cannot be 0"
    );
}

#[test]
fn salt_seeds_match_known_vectors() {
    assert_eq!(salt_seed(None, None), 1337);
    assert_eq!(salt_seed(Some(""), Some("")), 1337);
    assert_eq!(
        salt_seed(Some("adapter-a"), None),
        8_842_669_519_798_868_182
    );
    assert_eq!(salt_seed(None, Some("tenant-a")), 1_948_188_790_972_764_086);
    assert_eq!(
        salt_seed(Some("adapter-a"), Some("tenant-a")),
        10_790_858_310_771_630_931
    );
    let block: Vec<u32> = (0..4).collect();
    let lora = BlockHashOptions {
        lora_name: Some("adapter-a"),
        ..Default::default()
    };
    let ns = BlockHashOptions {
        cache_namespace: Some("tenant-a"),
        ..Default::default()
    };
    assert_eq!(
        compute_block_hash_for_seq(&block, 4, &lora).expect("bs>0")[0].0,
        6_665_157_333_201_000_639
    );
    assert_eq!(
        compute_block_hash_for_seq(&block, 4, &ns).expect("bs>0")[0].0,
        17_009_624_042_690_211_646
    );
}

#[test]
fn multimodal_hash_matches_known_vector() {
    let tokens = vec![100u32; 32];
    let infos = [Some(BlockExtraInfo {
        mm_objects: vec![BlockMmObjectInfo {
            mm_hash: 0xDEAD_BEEF,
            offsets: vec![(0, 32)],
        }],
    })];
    let opts = BlockHashOptions {
        block_mm_infos: Some(&infos),
        ..Default::default()
    };
    assert_eq!(
        compute_block_hash_for_seq(&tokens, 32, &opts).expect("bs>0")[0].0,
        231_838_601_075_267_525
    );
    assert_eq!(plain(&tokens, 32), [869_096_747_401_009_017]);
}

#[test]
fn multimodal_offsets_are_not_hashed_and_order_does_not_matter() {
    let tokens = vec![7u32; 8];
    let obj = |h, o| BlockMmObjectInfo {
        mm_hash: h,
        offsets: vec![(o, o + 1)],
    };
    let a = [Some(BlockExtraInfo {
        mm_objects: vec![obj(1, 0), obj(2, 3)],
    })];
    let b = [Some(BlockExtraInfo {
        mm_objects: vec![obj(2, 5), obj(1, 6)],
    })];
    let hash = |infos: &[Option<BlockExtraInfo>]| {
        let opts = BlockHashOptions {
            block_mm_infos: Some(infos),
            ..Default::default()
        };
        compute_block_hash_for_seq(&tokens, 8, &opts).expect("bs>0")
    };
    assert_eq!(hash(&a), hash(&b));
    // Empty objects and `None` entries hash as plain blocks.
    let empty = [Some(BlockExtraInfo::default())];
    assert_eq!(hash(&empty)[0].0, plain(&tokens, 8)[0]);
    assert_eq!(hash(&[None])[0].0, plain(&tokens, 8)[0]);
}

#[test]
fn eagle_windows_overlap_by_one_token() {
    let tokens: Vec<u32> = (0..6).collect();
    let opts = BlockHashOptions {
        is_eagle: true,
        ..Default::default()
    };
    let got = compute_block_hash_for_seq(&tokens, 2, &opts).expect("bs>0");
    let want = [
        hash_token_block(&[0, 1, 2], XXH3_SEED),
        hash_token_block(&[2, 3, 4], XXH3_SEED),
    ];
    assert_eq!(got, want);
    // Values observed from the reference wheel.
    assert_eq!(
        got.iter().map(|h| h.0).collect::<Vec<_>>(),
        [11_646_242_937_812_223_497, 9_948_816_348_502_404_300]
    );
    assert!(
        compute_block_hash_for_seq(&[1], 2, &opts)
            .expect("bs>0")
            .is_empty()
    );
    assert!(
        compute_block_hash_for_seq(&[], 2, &opts)
            .expect("bs>0")
            .is_empty()
    );
}

#[test]
fn sequence_hashes_chain_with_seed_1337() {
    let tokens: Vec<u32> = (0..8).collect();
    let local = compute_block_hash_for_seq(&tokens, 4, &BlockHashOptions::default()).expect("bs>0");
    let seq = compute_seq_hash_for_block(&local);
    assert_eq!(
        seq.iter().map(|h| h.0).collect::<Vec<_>>(),
        [9_143_094_415_614_847_814, 9_510_318_385_840_434_533]
    );
    assert!(compute_seq_hash_for_block(&[]).is_empty());
    // The chain is the fold of `chain_seq_hash`.
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&seq[0].0.to_le_bytes());
    bytes[8..].copy_from_slice(&local[1].0.to_le_bytes());
    assert_eq!(seq[1].0, xxh3_64_with_seed(&bytes, 1337));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn length_is_floor_of_tokens_over_block_size(
            tokens in proptest::collection::vec(any::<u32>(), 0..300),
            bs in 1usize..40,
            eagle in any::<bool>(),
        ) {
            let opts = BlockHashOptions { is_eagle: eagle, ..Default::default() };
            let got = compute_block_hash_for_seq(&tokens, bs, &opts).expect("bs>0");
            prop_assert_eq!(got.len(), num_complete_blocks(tokens.len(), bs, eagle));
        }

        #[test]
        fn hashes_of_a_prefix_are_a_prefix(
            tokens in proptest::collection::vec(any::<u32>(), 0..300),
            cut in 0usize..300,
            bs in 1usize..40,
        ) {
            let cut = cut.min(tokens.len());
            let full = plain(&tokens, bs);
            let pre = plain(&tokens[..cut], bs);
            prop_assert_eq!(&full[..pre.len()], &pre[..]);
            let seq_full = compute_seq_hash_for_block(
                &full.iter().map(|&h| LocalBlockHash(h)).collect::<Vec<_>>());
            let seq_pre = compute_seq_hash_for_block(
                &pre.iter().map(|&h| LocalBlockHash(h)).collect::<Vec<_>>());
            prop_assert_eq!(&seq_full[..seq_pre.len()], &seq_pre[..]);
        }

        #[test]
        fn fast_path_equals_per_block_hashing(
            tokens in proptest::collection::vec(any::<u32>(), 0..300),
            bs in 1usize..40,
        ) {
            let want: Vec<u64> = tokens
                .chunks(bs)
                .filter(|c| c.len() == bs)
                .map(|c| {
                    let bytes: Vec<u8> = c.iter().flat_map(|t| t.to_le_bytes()).collect();
                    xxh3_64_with_seed(&bytes, XXH3_SEED)
                })
                .collect();
            prop_assert_eq!(plain(&tokens, bs), want);
        }
    }
}
