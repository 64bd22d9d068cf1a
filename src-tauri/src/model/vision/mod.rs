//! Images in, for the families that see: decoding what a request carries (with limits, since an
//! image is untrusted input), and each family's preprocessing into the pixel values its vision
//! tower takes, equal to the reference processor's.

pub mod image;
pub mod mrope;
pub mod qwen;
pub mod qwen_tower;
pub mod qwen_vl;
pub mod resample;

pub use image::{decode, inspect, DecodedImage, ImageError, ImageHeader, MediaType, MAX_PIXELS};
pub use qwen_vl::{ImageProcessor, PromptImage, PromptImages, VisionModel};
