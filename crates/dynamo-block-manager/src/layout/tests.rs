use super::*;
use crate::storage::PAGE_SIZE;

fn cfg(num_blocks: usize) -> LayoutConfig {
    // The upstream test shape: 5 layers, K and V, 4 tokens, 13 elements, fp32.
    LayoutConfig::new(num_blocks, 5, 2, 4, 13, DType::Fp32)
}

#[test]
fn block_size_counts_every_dimension() {
    let c = cfg(3);
    assert_eq!(c.region_bytes(), 4 * 13 * 4);
    assert_eq!(c.layer_bytes(), 2 * 4 * 13 * 4);
    // L × O × P × I × elem; upstream's whole-block size leaves out O (1040).
    assert_eq!(c.block_bytes(), 2080);
    let mla = LayoutConfig::new(1, 3, 1, 16, 576, DType::Bf16);
    assert_eq!(mla.block_bytes(), 3 * 16 * 576 * 2);
}

#[test]
fn validation_rejects_zero_and_bad_values() {
    for (field, c) in [
        ("num_blocks", LayoutConfig::new(0, 1, 1, 1, 1, DType::Fp16)),
        ("num_layers", LayoutConfig::new(1, 0, 1, 1, 1, DType::Fp16)),
        ("outer_dim", LayoutConfig::new(1, 1, 0, 1, 1, DType::Fp16)),
        ("page_size", LayoutConfig::new(1, 1, 1, 0, 1, DType::Fp16)),
        ("inner_dim", LayoutConfig::new(1, 1, 1, 1, 0, DType::Fp16)),
    ] {
        assert!(matches!(c.validate(), Err(Error::ZeroDimension(f)) if f == field));
    }
    assert!(matches!(
        LayoutConfig::new(1, 1, 3, 1, 1, DType::Fp16).validate(),
        Err(Error::InvalidConfig(_))
    ));
    let mut c = cfg(1);
    c.alignment = 3;
    assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
    let huge = LayoutConfig::new(usize::MAX / 2, 4, 2, 16, 1024, DType::Fp16);
    assert!(matches!(huge.validate(), Err(Error::SizeOverflow)));
}

#[test]
fn fully_contiguous_address_arithmetic() {
    let c = cfg(4);
    let l = BlockLayout::allocate(c, LayoutKind::FullyContiguous, StorageRequest::System).unwrap();
    assert_eq!(l.storages().len(), 1);
    assert_eq!(l.block_stride(), 2080);
    let base = l.storages()[0].addr();
    assert_eq!(base % PAGE_SIZE as u64, 0);
    for b in 0..4 {
        for layer in 0..5 {
            for o in 0..2 {
                let r = l.memory_region(b, layer, o).unwrap();
                assert_eq!(r.len, 208);
                assert_eq!(r.offset, b * 2080 + layer * 416 + o * 208);
                assert_eq!(l.addr(r), base + r.offset as u64);
            }
            let lr = l.layer_region(b, layer).unwrap();
            assert_eq!((lr.offset, lr.len), (b * 2080 + layer * 416, 416));
        }
        let br = l.block_region(b).unwrap();
        assert_eq!((br.offset, br.len), (b * 2080, 2080));
    }
    // Blocks tile the storage exactly: the last block ends at the required size.
    let last = l.block_region(3).unwrap();
    assert_eq!(
        last.offset + last.len,
        c.required_bytes(LayoutKind::FullyContiguous).unwrap()
    );
    assert!(matches!(
        l.memory_region(4, 0, 0),
        Err(Error::IndexOutOfRange {
            what: "block",
            index: 4,
            len: 4
        })
    ));
    assert!(matches!(
        l.memory_region(0, 5, 0),
        Err(Error::IndexOutOfRange { what: "layer", .. })
    ));
    assert!(matches!(
        l.memory_region(0, 0, 2),
        Err(Error::IndexOutOfRange { what: "outer", .. })
    ));
    assert!(l.is_fully_contiguous());
}

#[test]
fn alignment_pads_block_stride_and_aligns_every_block() {
    let mut c = cfg(3);
    c.alignment = 256;
    let l = BlockLayout::allocate(c, LayoutKind::FullyContiguous, StorageRequest::System).unwrap();
    assert_eq!(l.block_stride(), 2304); // 2080 rounded up to 256
    for b in 0..3 {
        let r = l.block_region(b).unwrap();
        assert_eq!(l.addr(r) % 256, 0);
        assert_eq!(r.len, 2080);
    }
    assert_eq!(
        c.required_bytes(LayoutKind::FullyContiguous).unwrap(),
        3 * 2304 + 255
    );
}

#[test]
fn misaligned_storage_gets_a_base_offset() {
    // Alignment larger than a page: the storage is page-aligned, possibly not 8 KiB-aligned,
    // and the layout must skip to the next 8 KiB boundary.
    let mut c = cfg(2);
    c.alignment = 8192;
    let l = BlockLayout::allocate(c, LayoutKind::FullyContiguous, StorageRequest::System).unwrap();
    for b in 0..2 {
        let r = l.block_region(b).unwrap();
        assert_eq!(l.addr(r) % 8192, 0);
        assert!(r.offset + r.len <= l.storages()[0].size());
    }
}

#[test]
fn layer_separate_block_contiguous() {
    let c = cfg(3);
    let kind = LayoutKind::LayerSeparate {
        outer_contiguous: false,
    };
    let l = BlockLayout::allocate(c, kind, StorageRequest::System).unwrap();
    assert_eq!(l.storages().len(), 5);
    for b in 0..3 {
        for layer in 0..5 {
            for o in 0..2 {
                let r = l.memory_region(b, layer, o).unwrap();
                assert_eq!((r.storage, r.offset), (layer, b * 416 + o * 208));
            }
            let lr = l.layer_region(b, layer).unwrap();
            assert_eq!((lr.storage, lr.offset, lr.len), (layer, b * 416, 416));
        }
        assert!(matches!(l.block_region(b), Err(Error::NotContiguous)));
    }
    assert!(!l.is_fully_contiguous());
}

#[test]
fn layer_separate_outer_contiguous() {
    let c = cfg(3);
    let kind = LayoutKind::LayerSeparate {
        outer_contiguous: true,
    };
    let l = BlockLayout::allocate(c, kind, StorageRequest::System).unwrap();
    for b in 0..3 {
        for layer in 0..5 {
            for o in 0..2 {
                let r = l.memory_region(b, layer, o).unwrap();
                assert_eq!((r.storage, r.offset), (layer, o * 3 * 208 + b * 208));
            }
            assert!(matches!(
                l.layer_region(b, layer),
                Err(Error::NotContiguous)
            ));
        }
    }
    // With one outer page a layer is contiguous again.
    let mla = LayoutConfig::new(3, 1, 1, 4, 13, DType::Fp32);
    let l = BlockLayout::allocate(mla, kind, StorageRequest::System).unwrap();
    assert_eq!(l.layer_region(2, 0).unwrap().offset, 2 * 208);
    assert_eq!(l.block_region(2).unwrap().len, 208);
    assert!(l.is_fully_contiguous());
}

#[test]
fn from_storage_checks_count_and_size() {
    let c = cfg(2);
    let need = c.required_bytes(LayoutKind::FullyContiguous).unwrap();
    let small = Storage::system(need - 1).unwrap();
    assert!(matches!(
        BlockLayout::from_storage(c, LayoutKind::FullyContiguous, vec![small]),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        BlockLayout::from_storage(c, LayoutKind::FullyContiguous, vec![]),
        Err(Error::InvalidConfig(_))
    ));
    let ok = Storage::system(need).unwrap();
    assert!(BlockLayout::from_storage(c, LayoutKind::FullyContiguous, vec![ok]).is_ok());
}

#[test]
fn regions_never_overlap_and_stay_in_bounds() {
    for kind in [
        LayoutKind::FullyContiguous,
        LayoutKind::LayerSeparate {
            outer_contiguous: false,
        },
        LayoutKind::LayerSeparate {
            outer_contiguous: true,
        },
    ] {
        let mut c = LayoutConfig::new(4, 3, 2, 3, 5, DType::Fp16);
        c.alignment = 64;
        let l = BlockLayout::allocate(c, kind, StorageRequest::System).unwrap();
        let mut seen: Vec<(usize, usize, usize)> = Vec::new();
        for b in 0..4 {
            for layer in 0..3 {
                for o in 0..2 {
                    let r = l.memory_region(b, layer, o).unwrap();
                    assert!(r.offset + r.len <= l.storages()[r.storage].size());
                    for &(s, off, len) in &seen {
                        let disjoint =
                            s != r.storage || off + len <= r.offset || r.offset + r.len <= off;
                        assert!(disjoint, "{kind:?}: regions overlap");
                    }
                    seen.push((r.storage, r.offset, r.len));
                }
            }
        }
    }
}
