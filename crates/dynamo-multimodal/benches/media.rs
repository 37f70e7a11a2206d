//! Image decode throughput of the frontend's multimodal path: a 1024×1024 JPEG and PNG
//! decoded to RGB8 by [`ImageDecoder`] (header checks included), and the `mm_hash` of the
//! decoded pixels. Criterion's `elem/s` is pixels per second (`Melem/s` = megapixels/s).
//!
//! `cargo bench -p dynamo-multimodal --bench media`

use std::hint::black_box;
use std::io::Cursor;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_multimodal::{ImageDecoder, mm_hash_of};
use image::{ImageFormat, RgbImage};

const SIDE: u32 = 1024;

/// A photo-like test picture: smooth gradients plus deterministic noise, so neither codec
/// sees an unrealistically easy image.
fn picture() -> RgbImage {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    RgbImage::from_fn(SIDE, SIDE, |x, y| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let n = (state & 0x1f) as u32;
        image::Rgb([
            ((x / 4 + n) & 0xff) as u8,
            ((y / 4 + n) & 0xff) as u8,
            (((x + y) / 8 + n) & 0xff) as u8,
        ])
    })
}

fn encode(img: &RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).expect("encode");
    out.into_inner()
}

fn bench(c: &mut Criterion) {
    let img = picture();
    let decoder = ImageDecoder::default();
    let mut group = c.benchmark_group("media_decode_1024x1024");
    group.throughput(Throughput::Elements(u64::from(SIDE * SIDE)));
    for (name, format) in [("jpeg", ImageFormat::Jpeg), ("png", ImageFormat::Png)] {
        let bytes = encode(&img, format);
        group.bench_function(name, |b| {
            b.iter(|| black_box(decoder.decode(black_box(&bytes)).expect("decodes")));
        });
    }
    let decoded = decoder
        .decode(&encode(&img, ImageFormat::Png))
        .expect("decodes");
    group.bench_function("mm_hash", |b| {
        b.iter(|| black_box(mm_hash_of(black_box(&decoded))))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
