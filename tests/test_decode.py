"""Decoding images the way a viewer shows them (images.decode, shared by training, the cache and
--predict): EXIF orientation, 16/32-bit and float images, transparency, palette, CMYK, animations
and multi-page files. Each case is checked against a plain 8-bit RGB copy of the same picture."""
import numpy as np
import pytest
import torch
from PIL import Image

from mtlc.data.images import BACKGROUND, decode

SIZE = 32


def picture(height=48, width=64, seed=0):
    """A smooth colour picture (JPEG-friendly) with a bright corner that shows which way is up."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 / width, y * 255 / height, 128 + 60 * np.sin(x / 7.0 + rng.uniform())], axis=-1)
    rgb[:height // 4, :width // 4] = 255
    return rgb.round().astype(np.uint8)


def decoded(image, path, **save):
    image.save(path, **save)
    return decode(path, SIZE).float()


def reference(rgb, tmp_path):
    """The decode of a lossless 8-bit RGB PNG of the same pixels."""
    return decoded(Image.fromarray(rgb, "RGB"), tmp_path / "reference.png")


def test_exif_orientation_is_applied(tmp_path):
    """A phone photo stored sideways with EXIF orientation 6 (rotate 90 degrees clockwise to view)
    decodes like the upright photo, within JPEG error; without the tag it would not."""
    upright = picture()
    sideways = Image.fromarray(np.rot90(upright, 1).copy(), "RGB")  # stored turned left
    exif = Image.Exif()
    exif[0x0112] = 6
    got = decoded(sideways, tmp_path / "phone.jpg", quality=95, exif=exif.tobytes())
    want = decoded(Image.fromarray(upright, "RGB"), tmp_path / "upright.jpg", quality=95)
    assert (got - want).abs().mean() < 3
    untagged = decoded(sideways, tmp_path / "untagged.jpg", quality=95)
    assert (untagged - want).abs().mean() > 20


def test_16_bit_png_decodes_as_its_8_bit_copy(tmp_path):
    gray = picture()[..., 0]
    want = decoded(Image.fromarray(gray, "L"), tmp_path / "8.png")
    got = decoded(Image.fromarray(gray.astype(np.uint16) * 257), tmp_path / "16.png")  # PIL: mode I;16
    assert torch.equal(got, want)
    assert abs(got.mean().item() - want.mean().item()) < 0.5  # not the near-white of a clipped decode


GRAY = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (64, 1))  # 0 .. 252
STRETCHED = (GRAY.astype(np.float64) * 255 / 252).round().astype(np.uint8)  # its own minimum to maximum


@pytest.mark.parametrize("stored, shown", [
    (GRAY.astype(np.int32) * 257, GRAY),                 # 16-bit data in a 32-bit integer file: as its 8-bit copy
    (GRAY.astype(np.int32) * 1000 - 50_000, STRETCHED),  # any other integer range: from its minimum to its maximum
    (GRAY.astype(np.float32) / 255, GRAY),               # floats within [0, 1]
    (GRAY.astype(np.float32) * 3.5 - 100, STRETCHED),    # floats in other units
], ids=["int32-16bit", "int32-other", "float-unit", "float-other"])
def test_32_bit_and_float_images_by_their_range(tmp_path, stored, shown):
    got = decoded(Image.fromarray(stored), tmp_path / "wide.tif")
    want = decoded(Image.fromarray(shown, "L"), tmp_path / "8.png")
    assert (got - want).abs().max() <= 1


def test_transparency_is_composited_on_white(tmp_path):
    rgba = np.zeros((40, 40, 4), dtype=np.uint8)
    rgba[..., :3] = (200, 30, 60)
    rgba[:, 20:, 3] = 255  # right half opaque, left half transparent (its colour must not show)
    got = decoded(Image.fromarray(rgba, "RGBA"), tmp_path / "a.png")
    assert got[:, :, :SIZE // 2 - 2].flatten(1).mean(1).tolist() == list(map(float, BACKGROUND))
    assert got[:, :, SIZE // 2 + 2:].flatten(1).mean(1).tolist() == [200.0, 30.0, 60.0]


def test_palette_images_with_and_without_transparency(tmp_path):
    rgb = picture()
    palette = Image.fromarray(rgb, "RGB").quantize(64)
    assert (decoded(palette, tmp_path / "p.png") - reference(np.asarray(palette.convert("RGB")), tmp_path)).abs().max() <= 1
    palette.info["transparency"] = 0  # colour 0 transparent
    got = decoded(palette, tmp_path / "pt.png", transparency=0)
    hidden = np.asarray(palette) == 0
    assert hidden.any() and got.max() <= 255


def test_cmyk_jpeg_decodes_to_its_rgb(tmp_path):
    rgb = picture()
    got = decoded(Image.fromarray(rgb, "RGB").convert("CMYK"), tmp_path / "c.jpg", quality=95)
    assert (got - reference(rgb, tmp_path)).abs().mean() < 4


@pytest.mark.parametrize("suffix, save", [(".gif", dict(save_all=True, duration=100, loop=0)),
                                          (".webp", dict(save_all=True, duration=100, lossless=True)),
                                          (".tif", dict(save_all=True))])
def test_animations_and_multi_page_files_give_their_first_frame(tmp_path, suffix, save):
    first, second = picture(seed=1), 255 - picture(seed=2)
    frames = [Image.fromarray(first, "RGB"), Image.fromarray(second, "RGB")]
    if suffix == ".gif":
        frames = [f.quantize(256) for f in frames]
        first = np.asarray(frames[0].convert("RGB"))
    got = decoded(frames[0], tmp_path / f"anim{suffix}", append_images=frames[1:], **save)
    assert (got - reference(first, tmp_path)).abs().mean() < 2


def test_large_jpeg_keeps_the_reduced_size_decode(tmp_path, monkeypatch):
    """A big JPEG, progressive or not, reaches the conversion already decoded at a reduced scale (PIL's
    draft): 1/8 of 2560 x 1920 is still over 32 pixels."""
    from mtlc.data import images
    big = Image.fromarray(np.tile(picture(), (40, 40, 1)), "RGB")  # 2560 x 1920
    sizes = []
    as_seen = images.as_seen
    monkeypatch.setattr(images, "as_seen", lambda img: sizes.append(img.size) or as_seen(img))
    for name, options in (("big.jpg", {}), ("progressive.jpg", dict(progressive=True))):
        big.save(tmp_path / name, quality=90, **options)
        assert decode(tmp_path / name, SIZE).shape == (3, SIZE, SIZE)
    assert sizes == [(2560 // 8, 1920 // 8)] * 2


def test_same_decode_for_training_and_predictions(tmp_path):
    """--predict reads a file exactly as training does: one decode."""
    from mtlc.data import images
    rgb = picture()
    Image.fromarray(rgb, "RGB").save(tmp_path / "x.png")
    ((_, batch, failed, _),) = images.decode_batches([tmp_path / "x.png"], SIZE, 4)
    assert not failed and torch.equal(batch[0], decode(tmp_path / "x.png", SIZE))


def test_a_damaged_exif_block_decodes_without_pils_warning():
    """PIL warns once per tag and decode thread of a photo whose EXIF block claims more bytes than the file
    holds (Food-101's photos: six lines of "Tag data larger than file" in a first run); the pixels are
    read as stored, and the warning is not the user's to act on."""
    import io
    import warnings
    from mtlc.data.images import decode_bytes
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    with warnings.catch_warnings(record=True) as seen:
        decode_bytes(buffer.getvalue(), 8)
        warnings.warn_explicit("Tag data larger than file. Skipping tag 271", UserWarning, "TiffImagePlugin.py", 946,
                               module="PIL.TiffImagePlugin")
        warnings.warn_explicit("another library's", UserWarning, "other.py", 1, module="other")
    assert [str(w.message) for w in seen] == ["another library's"]
