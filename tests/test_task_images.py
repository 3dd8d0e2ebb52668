"""A Label Studio task's image, read only from inside the served folder (label/task_images.py), and
the labels the backend keeps (label/kept_labels.py)."""
import os
import threading

import pytest

from mtlc.errors import UserError
from mtlc.label.kept_labels import KeptLabels, read_rows
from mtlc.label.task_images import MAX_IMAGE_BYTES, Refused, task_image
from mtlc.use.label_studio import local_files_url


@pytest.fixture
def served(tmp_path):
    """A served folder with an image, a secret beside it, and links of every kind inside."""
    folder = tmp_path / "mydata"
    (folder / "unlabeled" / "a b#ü").mkdir(parents=True)
    (folder / "unlabeled" / "a b#ü" / "x 1+2.png").write_bytes(b"image bytes")
    (tmp_path / "secret.png").write_bytes(b"not yours")
    (folder / "unlabeled" / "out.png").symlink_to(tmp_path / "secret.png")
    (folder / "unlabeled" / "in.png").symlink_to(folder / "unlabeled" / "a b#ü" / "x 1+2.png")
    (folder / "unlabeled" / "outdir").symlink_to(tmp_path)
    os.mkfifo(folder / "unlabeled" / "pipe.png")
    return folder


def test_the_urls_and_paths_evaluate_writes_name_the_image(served):
    image = served / "unlabeled" / "a b#ü" / "x 1+2.png"
    url = local_files_url(image, served)
    for data in ({"image": url}, {"path": str(image)}, {"image": url, "path": str(image)},
                 {"path": "unlabeled/a b#ü/x 1+2.png"}):
        assert task_image(data, served, served) == ("unlabeled/a b#ü/x 1+2.png", b"image bytes")
    # a document root above the folder, as --label-studio-root gives it
    assert task_image({"image": local_files_url(image, served.parent)}, served, served.parent)[1] == b"image bytes"
    assert task_image({"picture": url}, served, served, image_key="picture")[1] == b"image bytes"


@pytest.mark.parametrize("data, why", [
    ({"image": "http://evil.example/x.png"}, "another host's URL"),
    ({"image": "//evil.example/data/local-files/?d=x.png"}, "another host's URL"),
    ({"image": "http://localhost:8080/data/local-files/?d=unlabeled/a.png"}, "another host's URL"),
    ({"image": "file:///etc/passwd"}, "not a local-files URL"),
    ({"image": "/data/local-files/?d=../secret.png"}, "'..'"),
    ({"image": "/data/local-files/?d=%2Fetc%2Fpasswd"}, "absolute path"),
    ({"image": "/data/local-files/?d=unlabeled/x.png&d=y"}, "not Label Studio's local-files URL"),
    ({"image": "/data/upload/1/x.png"}, "not a local-files URL"),
    ({"path": "/etc/passwd"}, "outside the folder"),
    ({"path": "../secret.png"}, "'..'"),
    ({"path": "unlabeled/out.png"}, "is a link"),
    ({"path": "unlabeled/in.png"}, "is a link"),  # even a link that stays inside
    ({"path": "unlabeled/outdir/secret.png"}, "is a link"),
    ({"path": "unlabeled/pipe.png"}, "not a regular file"),
    ({"path": "unlabeled/none.png"}, "cannot be opened"),
    ({"path": "a\0b"}, "NUL"),
    ({"image": 3}, "not a URL"),
    ({}, "names no image"),
    ("text", "no data"),
    ({"image": "/data/local-files/?d=unlabeled/in.png", "path": "unlabeled/a b#ü/x 1+2.png"}, "two files"),
])
def test_a_task_naming_anything_outside_the_folder_is_refused_and_nothing_outside_is_read(served, data, why):
    with pytest.raises(Refused, match=why.replace("+", r"\+").replace("?", r"\?")):
        task_image(data, served, served)


def test_a_file_too_large_is_refused_unread(served, monkeypatch):
    from mtlc.label import task_images
    monkeypatch.setattr(task_images, "MAX_IMAGE_BYTES", 4)
    with pytest.raises(Refused, match="over the"):
        task_image({"path": "unlabeled/a b#ü/x 1+2.png"}, served, served)
    assert MAX_IMAGE_BYTES >= 64 * 2 ** 20


def test_labels_are_kept_whole_and_two_servers_keep_each_others(tmp_path):
    path = tmp_path / "labels.csv"
    one, other = KeptLabels(path, print), KeptLabels(path, print)
    aa, bb = "a" * 32, "b" * 32  # as files.file_digest writes them
    one.keep({"unlabeled/a.png": ("cat", aa)})
    other.keep({"unlabeled/b,\"c\".png": ("dog", bb)})
    assert one.keep({"unlabeled/a.png": ("owl", aa)}) == {"unlabeled/a.png": ("owl", aa),
                                                          "unlabeled/b,\"c\".png": ("dog", bb)}
    assert path.read_text().splitlines()[0] == "path,label,blake2b"
    threads = [threading.Thread(target=KeptLabels(path, print).keep,
                                args=({f"unlabeled/{i}.png": ("cat", f"{i:032x}")},)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(read_rows(path)) == 22
    (tmp_path / "mine.csv").write_text("my own notes\n")
    with pytest.raises(UserError, match="not a labels file this backend kept"):
        KeptLabels(tmp_path / "mine.csv", print)
    assert (tmp_path / "mine.csv").read_text() == "my own notes\n"


def test_a_relative_path_as_evaluate_writes_it_from_elsewhere_is_read_as_label_py_reads_it(served, monkeypatch):
    """evaluate.py --predict mydata/unlabeled writes paths relative to where it ran: the server, run
    from there or from elsewhere, finds the image by the URL, the path only checking it where it names
    a file of the folder."""
    url = local_files_url(served / "unlabeled" / "a b#ü" / "x 1+2.png", served)
    monkeypatch.chdir(served.parent)
    data = {"image": url, "path": "mydata/unlabeled/a b#ü/x 1+2.png"}
    assert task_image(data, served, served)[1] == b"image bytes"
    assert task_image({"path": data["path"]}, served, served)[1] == b"image bytes"
    monkeypatch.chdir(served / "unlabeled")  # the relative path names no file from here: the URL decides
    assert task_image(data, served, served)[1] == b"image bytes"
    # Label Studio reads d= as Django does: a '+' is a space
    (served / "unlabeled" / "p q.png").write_bytes(b"spaced")
    assert task_image({"image": "/data/local-files/?d=unlabeled/p+q.png"}, served, served)[1] == b"spaced"


def test_a_pipe_or_a_folder_at_the_labels_path_is_refused_in_a_line_never_waited_on(tmp_path):
    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "folder.csv").mkdir()
    for name in ("pipe.csv", "folder.csv"):
        with pytest.raises(UserError, match="cannot read the labels file"):
            KeptLabels(tmp_path / name, print)
