"""Decoding huge images holds bounded memory whatever their size and the number of threads: an image
over images.REDUCE_ABOVE pixels is reduced as soon as it is decoded, and the threads in flight hold
at most images.PIXELS_IN_FLIGHT pixels (docs/decode-memory.md has the full-size measurement)."""
import pytest
import torch
from PIL import Image

from mtlc.data import images
from tools.bench_decode_memory import measure, write_images


@pytest.mark.slow
def test_three_huge_pngs_on_three_threads_decode_in_bounded_memory(tmp_path):
    write_images(tmp_path, 3, 5000)  # 25 million RGBA pixels each: 100 MB decoded, 3 at once would be 300
    result = measure(images.__file__.rsplit("/mtlc/", 1)[0], tmp_path, 3)
    assert result["decoding_mb"] < 250, result  # was about 1,400 (each image copied 3-4 times, 3 at once)


def test_a_reduced_image_is_the_image_reduced(tmp_path):
    """The reduction changes an image only as a resize would: a huge image's colours and its EXIF
    orientation (turned upright after the reduction) are kept."""
    side = 4200  # 17.6 million pixels: reduced
    img = Image.new("RGB", (side * 2, side // 2 * 2 // 2), (10, 200, 30))
    img.paste((250, 0, 0), (0, 0, side, side // 2))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned: shown rotated a quarter turn
    img.save(tmp_path / "turned.png", exif=exif)  # a PNG: no draft, the reduction itself
    img.save(tmp_path / "plain.png")
    upright = images.decode(tmp_path / "turned.png", 32)
    plain = images.decode(tmp_path / "plain.png", 32)
    assert plain.shape == (3, 32, 32) and torch.allclose(plain[:, 0, 0].float(), torch.tensor([250., 0, 0]), atol=3)
    assert torch.allclose(plain[:, 0, -1].float(), torch.tensor([10., 200, 30]), atol=3)
    # orientation 6: the left half (red) is shown at the top after a quarter turn clockwise
    assert torch.allclose(upright[:, 0, 24].float(), torch.tensor([250., 0, 0]), atol=12), upright[:, :, 24]
    assert torch.allclose(upright[:, -1, 24].float(), torch.tensor([10., 200, 30]), atol=12)


def test_the_pixel_budget_lets_an_image_over_it_decode_alone():
    budget = images.PixelBudget(100)
    with budget.holding(10 ** 9):  # over the budget: takes all of it, never waits forever
        assert budget.held == 100
    with budget.holding(60):
        assert budget.held == 60
    assert budget.held == 0
