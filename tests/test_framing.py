"""Framing (data/framing.py): a pretrained trunk's view equals timm's evaluation transform of the same
photo, the framings keep what they promise, and a run's framing reaches every path that decodes."""
import numpy as np
import pytest
from PIL import Image

from mtlc.data.framing import SQUASH, Framing
from mtlc.data.images import decode_bytes


def photo(w, h, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("size", [(400, 533), (533, 400), (260, 260), (32, 32), (1000, 90)])
@pytest.mark.parametrize("name", ["tf_efficientnet_lite0", "tf_efficientnet_lite2"])
def test_crop_is_timms_evaluation_transform(size, name):
    timm = pytest.importorskip("timm")
    cfg = timm.create_model(name, pretrained=False).pretrained_cfg
    side = cfg["input_size"][-1]
    transform = timm.data.create_transform(input_size=cfg["input_size"], crop_pct=cfg["crop_pct"],
                                           interpolation=cfg["interpolation"], crop_mode="center")
    resize_and_crop = transform.transforms[:2]  # then ToTensor and Normalize
    img = photo(*size)
    theirs = img
    for t in resize_and_crop:
        theirs = t(theirs)
    ours = Framing("crop", cfg["crop_pct"], cfg["interpolation"])(img, side)
    assert ours.size == (side, side)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_framings_keep_what_they_promise():
    img = Image.new("RGB", (300, 100), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 100, 100))  # a blue left third
    centre = np.asarray(Framing("crop", 1.0, "bicubic")(img, 30))
    assert (centre[:, :, 0] > 200).all()  # the centre square: only red
    squashed = np.asarray(SQUASH(img, 30))
    assert (squashed[:, :5, 2] > 200).all() and (squashed[:, -5:, 0] > 200).all()  # all of it, squeezed
    padded = np.asarray(Framing("pad", 1.0, "bilinear")(img, 30))
    assert (padded[0, :, :] == 127).all() and (padded[15, -3:, 0] > 200).all()  # grey above, the photo across


def test_decode_frames_the_file(tmp_path):
    path = tmp_path / "wide.png"
    img = Image.new("RGB", (300, 100), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 100, 100))
    img.save(path)
    data = path.read_bytes()
    centre = decode_bytes(data, 20, Framing("crop", 1.0, "bicubic"))
    assert centre.shape == (3, 20, 20) and int(centre[2].max()) < 60  # no blue in the centre square
    assert int(decode_bytes(data, 20)[2, :, 0].min()) > 200  # squashed: the blue third is there


TRUNK = Framing("crop", 0.89, "bicubic")


def hostile(kind, path):
    """An image file of the photo path's hostile kinds, and the upright RGB picture a viewer shows of it."""
    rng = np.random.default_rng(0)
    rgb = (rng.random((90, 120, 3)) * 8 + np.linspace(0, 200, 120)[None, :, None]).astype(np.uint8)
    rgb[:20, :30] = 255  # a bright corner: which way is up
    upright = Image.fromarray(rgb, "RGB")
    if kind == "exif-rotated":
        exif = Image.Exif()
        exif[0x0112] = 8  # stored turned right: a viewer turns it back
        upright.transpose(Image.Transpose.ROTATE_270).save(path, "JPEG", quality=95, exif=exif.tobytes())
        return upright
    if kind == "cmyk":
        upright.convert("CMYK").save(path, "JPEG", quality=95)
    elif kind == "16-bit":
        Image.fromarray(rgb[..., 0].astype(np.uint16) * 257).save(path, "PNG")
        return Image.fromarray(rgb[..., 0], "L").convert("RGB")
    elif kind == "rgba":
        upright.convert("RGBA").save(path, "PNG")
    elif kind == "gif":
        frames = [upright.convert("P"), Image.new("RGB", (120, 90), (0, 0, 0)).convert("P")]
        frames[0].save(path, "GIF", save_all=True, append_images=frames[1:], duration=100)
        return frames[0].convert("RGB")
    return upright


@pytest.mark.parametrize("kind", ["exif-rotated", "cmyk", "16-bit", "rgba", "gif"])
def test_the_trunk_sees_what_a_viewer_shows(tmp_path, kind):
    """On the photo path (timm's crop at 260): an EXIF-rotated JPEG is seen upright, CMYK, 16-bit, RGBA
    and an animated GIF (its first frame) as their 8-bit RGB pictures, within JPEG's error."""
    path = tmp_path / f"{kind}.img"
    want = np.asarray(TRUNK(hostile(kind, path), 260), dtype=np.float64)
    got = decode_bytes(path.read_bytes(), 260, TRUNK).permute(1, 2, 0).numpy().astype(np.float64)
    assert np.abs(got - want).mean() < 4, kind
    turned = np.asarray(TRUNK(hostile(kind, path).transpose(Image.Transpose.ROTATE_90), 260), dtype=np.float64)
    assert np.abs(got - turned).mean() > 20  # the check can tell a picture turned


@pytest.mark.parametrize("width, height", [(1, 1), (10000, 20), (1, 100000), (100000, 1)])
def test_a_strip_or_a_dot_is_framed_without_a_resize_of_gigabytes(tmp_path, width, height):
    """A 1 x 100,000 PNG is a few hundred bytes, and resizing its shorter side to 292 first would make a
    29-million-pixel-long image (25 GB) for the 260-px square kept: only that square is resized. Its
    pixels are those of the full resize where both can be made (a strip of 2,000 x 20)."""
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), "RGB").save(tmp_path / "s.png")
    assert decode_bytes((tmp_path / "s.png").read_bytes(), 260, TRUNK).shape == (3, 260, 260)
    strip = Image.fromarray(rng.integers(0, 255, (20, 2000, 3), dtype=np.uint8), "RGB")
    full = np.asarray(strip.resize((29200, 292), Image.BICUBIC).crop((14470, 16, 14730, 276)), dtype=np.float64)
    assert np.abs(np.asarray(TRUNK(strip, 260), dtype=np.float64) - full).mean() < 3


def test_a_truncated_jpeg_is_a_bad_image_in_one_line():
    import io
    from mtlc.data.images import BadImage
    buffer = io.BytesIO()
    Image.new("RGB", (400, 300), (200, 30, 30)).save(buffer, "JPEG")
    with pytest.raises(BadImage):
        decode_bytes(buffer.getvalue()[:200], 260, TRUNK)


def test_checkpoint_framing_round_trip_and_refusals():
    f = Framing("crop", 0.89, "bicubic")
    assert Framing.of(f.as_dict()) == f and Framing.of(None) == SQUASH
    assert SQUASH.tag == "" and f.tag == "crop89bicubic"
    for bad in (dict(mode="zoom", crop=1.0, interpolation="bilinear"), dict(mode="crop", crop=0.1, interpolation="bicubic"),
                dict(mode="crop", crop=True, interpolation="bicubic"), dict(mode="crop", crop=float("nan"), interpolation="bicubic"),
                dict(mode="crop", crop=1.0, interpolation="lanczos"), dict(mode="crop"), "crop", [1]):
        with pytest.raises((ValueError, TypeError)):
            Framing.of(bad)


@pytest.mark.parametrize("framing", [SQUASH, Framing("crop", 0.89, "bicubic"), Framing("crop", 1.0, "bicubic"),
                                     Framing("pad", 1.0, "bicubic")])
@pytest.mark.parametrize("size", [(400, 533), (90, 300)])
def test_the_onnx_example_frames_a_photo_as_the_project_does(tmp_path, framing, size):
    """examples/onnx_predict.py (PIL and numpy alone) prepares a file as decode_bytes does with the
    framing the model's metadata names: an exported model given the same photo gives the same class."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("onnx_predict", Path(__file__).parents[1] / "examples" / "onnx_predict.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    path = tmp_path / "photo.jpg"
    photo(*size, seed=3).save(path, quality=90)
    ours = decode_bytes(path.read_bytes(), 64, framing).numpy()
    theirs = example.prepared(path, 64, framing.as_dict())
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("size, mode", [((32, 32), "squash"), ((120, 90), "squash"), ((300, 200), "crop"),
                                        ((200, 150), "crop")])
def test_auto_crops_photos_and_squashes_small_images_whole(tmp_path, size, mode):
    """--framing auto on a pretrained trunk: the trunk's own crop for photos, the whole image squashed
    where their median shorter side is under half the trunk's (Lite0's 224: 112 px), and it says why."""
    pytest.importorskip("timm")
    from fakedata import write_own_folder
    from mtlc.train.pretrained import framing_of, trunk_view
    write_own_folder(tmp_path / "d", n_labeled=3, n_unlabeled=6, n_test=0, size=size)
    said = []
    framing = framing_of("auto", "efficientnet-lite0", tmp_path / "d", said.append)
    assert framing.mode == mode and len(said) == 1 and f"median shorter side is {min(size)} px" in said[0]
    assert framing == (SQUASH if mode == "squash" else trunk_view("efficientnet-lite0")[0])
    from mtlc.train.pretrained import default_image_size
    assert default_image_size("efficientnet-lite0", framing) == (128 if mode == "squash" else 224)  # the side of before
    assert framing_of("pad", "efficientnet-lite0", tmp_path / "d", said.append).mode == "pad" and len(said) == 1
