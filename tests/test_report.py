"""The lines evaluate.py writes for people (mtlc/use/report.py)."""
from mtlc.use.report import describe_lc, setting_of, write_table

LC_DIAGNOSTICS = dict(eps=2.0, eps_auto=True, eps_scale="relative", max_neighbour_fraction_after_ramp=0.1,
                      d2_ratio_start=0.5, d2_ratio_end=0.4)


def test_the_space_is_said_to_shrink_or_grow_as_it_did():
    """LC's control often ends with a larger space than it started with: '0.6x smaller' would mislead."""
    shrunk = describe_lc(dict(LC_DIAGNOSTICS, d2_mean_start=5.0, d2_mean_end=2.0))
    grown = describe_lc(dict(LC_DIAGNOSTICS, d2_mean_start=0.293, d2_mean_end=0.476))
    assert "mean d2 5 -> 2 (2.5x smaller)" in shrunk
    assert "mean d2 0.293 -> 0.476 (1.6x larger)" in grown and "smaller" not in grown


def result(dataset, labels, n_train, n_test, error, image_files=False, method="MT"):
    return dict(dataset=dataset, labels=labels, n_train=n_train, n_test=n_test, image_files=image_files,
                method=method, stage="mt", student_error=error, teacher_error=error)


def test_a_run_on_other_images_than_the_published_dataset_is_marked(tmp_path):
    """A CIFAR-10 subset, or CIFAR-10 from image files (the JPEG copy), is never shown as the paper's
    setting; the published data and old results (no sizes) keep the plain name; one run shows no spread."""
    assert setting_of(result("cifar10", 4000, 50000, 10000, 20.0)) == "cifar10, 4000 labels"
    assert setting_of(result("cifar10", 4000, 50000, 10000, 20.0, image_files=True)) == (
        "cifar10, 4000 labels (from image files)")
    assert setting_of(result("cifar10", 1000, 3000, 1000, 87.1)) == (
        "cifar10, 1000 labels (3,000 training and 1,000 test images)")
    assert setting_of(dict(dataset="svhn", labels=1000)) == "svhn, 1000 labels"
    assert setting_of(result("digits", 100, 1437, 360, 3.0)) == "digits, 100 labels"
    table = write_table(tmp_path / "t.md", [result("cifar10", 1000, 3000, 1000, 87.1),
                                            result("cifar10", 4000, 50000, 10000, 20.0),
                                            result("cifar10", 4000, 50000, 10000, 22.0)])
    assert "| method | cifar10, 1000 labels (3,000 training and 1,000 test images) | cifar10, 4000 labels |" in table
    assert "| MT | 87.10 (1) | 21.00 +- 1.41 (2) |" in table
