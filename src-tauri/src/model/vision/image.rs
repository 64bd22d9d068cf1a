//! An image from a request: its bytes decoded to RGB (PNG, JPEG, WebP, GIF's first frame) under
//! limits read from the header before any pixel is decoded (a decompression bomb or a 100,000 x
//! 100,000 header is refused, not allocated), named by the hash of its bytes.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, Limits};
use sha2::{Digest, Sha256};

/// The most pixels an image may have (50 megapixels: more than an 8K screenshot; the families'
/// processors shrink every image to a few megapixels at most anyway).
pub const MAX_PIXELS: u64 = 50_000_000;
/// The longest side an image may have.
pub const MAX_SIDE: u32 = 20_000;
/// The most bytes a decoder may allocate for one image (50 MP of RGBA, with room).
const MAX_ALLOC: u64 = 256 << 20;

/// The formats taken, as the dialects name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaType {
    Png,
    Jpeg,
    Webp,
    Gif,
}

impl MediaType {
    /// `image/png` and the others; `None` for a type not taken.
    pub fn parse(mime: &str) -> Option<MediaType> {
        match mime.trim().to_ascii_lowercase().as_str() {
            "image/png" => Some(MediaType::Png),
            "image/jpeg" | "image/jpg" => Some(MediaType::Jpeg),
            "image/webp" => Some(MediaType::Webp),
            "image/gif" => Some(MediaType::Gif),
            _ => None,
        }
    }

    pub fn mime(self) -> &'static str {
        match self {
            MediaType::Png => "image/png",
            MediaType::Jpeg => "image/jpeg",
            MediaType::Webp => "image/webp",
            MediaType::Gif => "image/gif",
        }
    }

    fn format(self) -> ImageFormat {
        match self {
            MediaType::Png => ImageFormat::Png,
            MediaType::Jpeg => ImageFormat::Jpeg,
            MediaType::Webp => ImageFormat::WebP,
            MediaType::Gif => ImageFormat::Gif,
        }
    }

    fn of(format: ImageFormat) -> Option<MediaType> {
        [MediaType::Png, MediaType::Jpeg, MediaType::Webp, MediaType::Gif].into_iter().find(|m| m.format() == format)
    }
}

/// Why an image was refused: each a client's mistake (a 400), never the server's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("the image is empty")]
    Empty,
    #[error("the image is not PNG, JPEG, WebP or GIF")]
    UnknownFormat,
    #[error("the image is {found}, not {declared} as declared")]
    WrongMediaType { declared: &'static str, found: &'static str },
    #[error("the image is {width} x {height} pixels: at most {MAX_SIDE} per side and {MAX_PIXELS} in all are taken")]
    TooLarge { width: u32, height: u32 },
    #[error("the image cannot be decoded: {0}")]
    Corrupt(String),
}

/// An image decoded to 8-bit RGB, row-major, 3 bytes per pixel.
#[derive(Clone, PartialEq, Eq)]
pub struct DecodedImage {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
    pub media_type: MediaType,
    /// SHA-256 of the bytes as sent: the same picture sent again is known by it (the prefix
    /// cache's key for its tokens, the encoded image's cache).
    pub hash: [u8; 32],
}

impl std::fmt::Debug for DecodedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DecodedImage({} x {} {}, {:02x?}..)",
            self.width,
            self.height,
            self.media_type.mime(),
            &self.hash[..4]
        )
    }
}

/// What an image's header says, checked: its format (as declared, when it is) and a size within
/// the limits. Cheap: no pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    pub width: u32,
    pub height: u32,
    pub media_type: MediaType,
}

/// Reads and checks the header of `bytes`, which the request says are `declared` (None: the
/// request does not say, as Ollama's bare base64 images do).
pub fn inspect(bytes: &[u8], declared: Option<MediaType>) -> Result<ImageHeader, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let reader =
        ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|e| ImageError::Corrupt(e.to_string()))?;
    let found = reader.format().and_then(MediaType::of).ok_or(ImageError::UnknownFormat)?;
    if let Some(declared) = declared.filter(|d| *d != found) {
        return Err(ImageError::WrongMediaType { declared: declared.mime(), found: found.mime() });
    }
    let (width, height) = reader.into_dimensions().map_err(|e| ImageError::Corrupt(e.to_string()))?;
    if width > MAX_SIDE || height > MAX_SIDE || u64::from(width) * u64::from(height) > MAX_PIXELS {
        return Err(ImageError::TooLarge { width, height });
    }
    Ok(ImageHeader { width, height, media_type: found })
}

/// Decodes `bytes` (checked by [`inspect`] first: nothing is inflated past the limits).
pub fn decode(bytes: &[u8], declared: Option<MediaType>) -> Result<DecodedImage, ImageError> {
    let ImageHeader { width, height, media_type: found } = inspect(bytes, declared)?;
    let mut reader = ImageReader::with_format(Cursor::new(bytes), found.format());
    // And the decoder held to it (a GIF's frames or a WebP's chunks may say more than the header).
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let image = reader.decode().map_err(|e| match e {
        image::ImageError::Limits(_) => ImageError::TooLarge { width, height },
        other => ImageError::Corrupt(other.to_string()),
    })?;
    let (width, height) = (image.width(), image.height());
    // As Pillow's convert("RGB"): grey repeated, alpha dropped (not composited), palettes expanded.
    let rgb = image.to_rgb8().into_raw();
    Ok(DecodedImage { width, height, rgb, media_type: found, hash: Sha256::digest(bytes).into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32, pixel: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
        let mut out = Vec::new();
        let img = image::RgbImage::from_fn(width, height, |x, y| image::Rgb(pixel(x, y)));
        img.write_to(&mut Cursor::new(&mut out), ImageFormat::Png).unwrap();
        out
    }

    /// PNG's CRC-32 (IEEE, reflected), bit by bit.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }

    #[test]
    fn decodes_each_format_to_rgb() {
        let bytes = png(5, 3, |x, y| [x as u8 * 40, y as u8 * 80, 7]);
        let image = decode(&bytes, Some(MediaType::Png)).unwrap();
        assert_eq!((image.width, image.height, image.media_type), (5, 3, MediaType::Png));
        assert_eq!(&image.rgb[..6], &[0, 0, 7, 40, 0, 7]);
        assert_eq!(image.rgb.len(), 5 * 3 * 3);
        // Without a declared type, as Ollama sends them.
        assert_eq!(decode(&bytes, None).unwrap().rgb, image.rgb);
        for format in [ImageFormat::Jpeg, ImageFormat::Gif, ImageFormat::WebP] {
            let mut out = Vec::new();
            image::DynamicImage::ImageRgb8(image::RgbImage::from_pixel(8, 4, image::Rgb([200, 100, 50])))
                .write_to(&mut Cursor::new(&mut out), format)
                .unwrap();
            let decoded = decode(&out, None).unwrap();
            assert_eq!((decoded.width, decoded.height), (8, 4), "{format:?}");
            assert!(decoded.rgb.chunks(3).all(|p| p[0].abs_diff(200) <= 8), "{format:?}: {:?}", &decoded.rgb[..3]);
        }
    }

    #[test]
    fn refuses_hostile_and_broken_images_with_the_reason() {
        assert_eq!(decode(b"", None), Err(ImageError::Empty));
        assert_eq!(decode(b"hello, not an image", None), Err(ImageError::UnknownFormat));
        let good = png(4, 4, |_, _| [1, 2, 3]);
        assert_eq!(
            decode(&good, Some(MediaType::Jpeg)),
            Err(ImageError::WrongMediaType { declared: "image/jpeg", found: "image/png" })
        );
        // Truncated: the header survives, the pixels do not.
        assert!(matches!(decode(&good[..good.len() / 2], None), Err(ImageError::Corrupt(_))));
        // A header claiming 100,000 x 100,000 pixels: refused before anything is allocated.
        let mut huge = good.clone();
        huge[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        huge[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        // The header chunk's checksum made right again (over its type and data, bytes 12..29).
        let crc = crc32(&huge[12..29]);
        huge[29..33].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(decode(&huge, None), Err(ImageError::TooLarge { width: 100_000, height: 100_000 }));
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_it_is_inflated() {
        // 7,200 x 7,200 of black: 52 megapixels (155 MB of RGB) in a file of about 50 KB.
        let mut bomb = Vec::new();
        let black = image::GrayImage::new(7_200, 7_200);
        let encoder = image::codecs::png::PngEncoder::new_with_quality(
            &mut bomb,
            image::codecs::png::CompressionType::Fast,
            Default::default(),
        );
        black.write_with_encoder(encoder).unwrap();
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        assert_eq!(decode(&bomb, None), Err(ImageError::TooLarge { width: 7_200, height: 7_200 }));
    }

    #[test]
    fn the_hash_is_of_the_bytes() {
        let a = decode(&png(2, 2, |_, _| [9, 9, 9]), None).unwrap();
        let b = decode(&png(2, 2, |_, _| [9, 9, 9]), None).unwrap();
        let c = decode(&png(2, 2, |_, _| [9, 9, 8]), None).unwrap();
        assert_eq!(a.hash, b.hash);
        assert_ne!(a.hash, c.hash);
    }
}
