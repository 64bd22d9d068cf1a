// Images a person attaches to a chat message (picked, pasted or dropped): read as data URLs, the
// form every dialect of the API takes inline, and checked here first so a wrong file is named at
// once rather than refused by the server after the upload.

/** What the server reads (PNG, JPEG, WebP, GIF's first frame). */
export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
/** Per image; larger ones are screenshots of huge displays or photos better resized first. */
export const MAX_IMAGE_BYTES = 20 * 1024 * 1024;
/** As the server: past this a message is a mistake. */
export const MAX_IMAGES = 32;

export interface Attached {
  images: string[];
  /** Files that were not taken, with why. */
  refused: string[];
}

function readAsDataUrl(file: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error ?? new Error("unreadable"));
    reader.readAsDataURL(file);
  });
}

/** The image files among `files` as data URLs, after `already` attached ones. */
export async function readImages(files: Iterable<File>, already: number): Promise<Attached> {
  const images: string[] = [];
  const refused: string[] = [];
  for (const file of files) {
    const name = file.name || "pasted image";
    if (!IMAGE_TYPES.includes(file.type)) refused.push(`${name}: not a PNG, JPEG, WebP or GIF image`);
    else if (file.size > MAX_IMAGE_BYTES) refused.push(`${name}: larger than 20 MB`);
    else if (already + images.length >= MAX_IMAGES) refused.push(`${name}: at most ${MAX_IMAGES} images in a message`);
    else images.push(await readAsDataUrl(file));
  }
  return { images, refused };
}

/** The image files a paste or drop carries. */
export function imageFiles(data: DataTransfer | null): File[] {
  return Array.from(data?.files ?? []).filter((f) => f.type.startsWith("image/"));
}
