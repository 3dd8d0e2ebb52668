"""The Python API checks its arguments as the scripts check their options: a str or a pathlib.Path
is one path, choices are checked, and a wrong argument is a ValueError or TypeError that says what
was expected (never another model's answers, an empty list, or a walk of the wrong folder)."""
from pathlib import Path

import pytest
import torch

import mtlc


def test_a_path_is_one_path_as_a_str_or_a_pathlib_path(trained):
    data, ckpt = trained
    classifier = mtlc.load(Path(ckpt))
    image = sorted((data / "unlabeled").rglob("*.png"))[0]
    by_str, by_path = classifier.predict(str(image)), classifier.predict(image)
    assert [p.label for p in by_str] == [p.label for p in by_path] and len(by_str) == 1
    assert len(classifier.predict(data / "unlabeled")) == len(list((data / "unlabeled").rglob("*.png")))
    assert len(list(classifier.predict_files(image))) == 1


@pytest.mark.parametrize("model", ["Teacher", "ema", "", None, 1])
def test_an_unknown_model_is_refused_not_answered_by_the_student(trained, model):
    with pytest.raises(ValueError, match="model must be one of 'teacher', 'student'"):
        mtlc.load(trained[1], model=model)


def test_the_student_and_the_teacher_are_the_ones_asked_for(trained):
    student, teacher = mtlc.load(trained[1], model="student"), mtlc.load(trained[1])
    assert student.model_name == "student" and teacher.model_name == "teacher"
    assert student.model is not teacher.model


@pytest.mark.parametrize("batch_size, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                               (True, TypeError), ("8", TypeError)])
def test_a_batch_size_is_a_positive_int(trained, batch_size, error):
    data, ckpt = trained
    classifier = mtlc.load(ckpt)
    with pytest.raises(error, match="batch_size"):
        classifier.predict([data / "unlabeled"], batch_size=batch_size)
    with pytest.raises(error, match="batch_size"):
        list(classifier.predict_files([data / "unlabeled"], batch_size=batch_size))


@pytest.mark.parametrize("targets", [3, b"photos", [Path("a.png"), 7], None])
def test_targets_that_are_not_paths_are_a_type_error(trained, targets):
    classifier = mtlc.load(trained[1])
    with pytest.raises(TypeError, match="a str or a pathlib.Path"):
        classifier.predict(targets)


def test_the_other_arguments_of_load_are_checked(trained):
    ckpt = trained[1]
    with pytest.raises(TypeError, match="path must be a path"):
        mtlc.load(7)
    with pytest.raises(ValueError, match="device must be"):
        mtlc.load(ckpt, device="gpu")
    with pytest.raises(TypeError, match="calibrate must be True or False"):
        mtlc.load(ckpt, calibrate="no")
    with pytest.raises(TypeError, match="data_dir must be a path"):
        mtlc.load(ckpt, data_dir=5)
    assert mtlc.load(ckpt, device=torch.device("cpu"), calibrate=False).calibration is None


def test_classify_takes_uint8_images_at_the_checkpoint_size(trained):
    classifier = mtlc.load(trained[1])
    size = classifier.image_size
    labels, probabilities = classifier.classify(torch.zeros(2, 3, size, size, dtype=torch.uint8))
    assert labels.shape == (2,) and probabilities.shape == (2, len(classifier.classes))
    for wrong in (torch.zeros(2, 3, size, size), torch.zeros(2, 3, size + 1, size, dtype=torch.uint8),
                  torch.zeros(3, size, size, dtype=torch.uint8), [[0]]):
        with pytest.raises(ValueError, match="images must be a uint8 tensor of shape"):
            classifier.classify(wrong)
