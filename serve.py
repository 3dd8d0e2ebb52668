"""Serve a checkpoint and its folder to Label Studio as an ML backend that learns while people label:
`python serve.py --help` says what it does and how to start it, docs/label-studio.md every step and
what was measured."""
import os
from pathlib import Path

import click

from mtlc.disk.command_line import Command
from mtlc.disk.console import robust_streams
from mtlc.errors import UserError
from mtlc.label.kept_labels import KeptLabels
from mtlc.train.devices import pick_device

LABELS_NAME = "label-studio-labels.csv"
ACCEPTED_NAME = "label-studio-accepted.csv"


def say(line):
    click.echo(line, err=True)


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--ckpt", type=click.Path(dir_okay=False), required=True,
              help="The checkpoint that answers (train_mt.py's mt.pt or finetune_lc.py's lc.pt).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="The folder whose images Label Studio's tasks show. [default: the checkpoint's]")
@click.option("--label-studio-root", type=click.Path(file_okay=False), default=None,
              help="Label Studio's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT, which its local-files URLs are "
                   "relative to. [default: --data-dir, as evaluate.py --label-studio chooses for DATA/unlabeled]")
@click.option("--labels", "labels_path", type=click.Path(dir_okay=False), default=None,
              help=f"The labels file each label given is kept in (label.py --apply reads it). [default: DATA/{LABELS_NAME}]")
@click.option("--accepted", "accepted_path", type=click.Path(dir_okay=False), default=None,
              help=f"The images still unlabeled, each version's class for each and `accepted` where --max-error takes "
                   f"it, as evaluate.py --predict writes them (label.py --apply FILE --accepted takes them): with the "
                   f"labels file, a finished folder. [default: DATA/{ACCEPTED_NAME}]")
@click.option("--max-error", type=click.FloatRange(0, 100, min_open=True), default=5.0,
              help="The error (%) the accepted images may have at most, with 95% confidence (evaluate.py --max-error).")
@click.option("--host", default="127.0.0.1",
              help="The address to listen on; 0.0.0.0 lets other machines call it (give a basic-auth user then).")
@click.option("--port", type=click.IntRange(0, 65535), default=9090, help="The port (0: any free one).")
@click.option("--basic-auth-user", default=None, envvar="MTLC_BASIC_AUTH_USER",
              help="With --basic-auth-pass: every request must carry these (Label Studio: Settings > Model, Use "
                   "basic auth). Also from $MTLC_BASIC_AUTH_USER.")
@click.option("--basic-auth-pass", default=None, envvar="MTLC_BASIC_AUTH_PASS",
              help="Its password; better given as $MTLC_BASIC_AUTH_PASS than on the command line.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
def main(ckpt, data_dir, label_studio_root, labels_path, accepted_path, max_error, host, port, basic_auth_user,
         basic_auth_pass, device):
    """Serve a checkpoint and its folder to Label Studio as an ML backend.

    Each task opened (or Actions > Retrieve Predictions) gets the model's class, preselected, with its
    calibrated confidence as the score: sorted by it (Prediction score, ascending), the least confident
    come first, the images a finished folder needs a person for. Each annotation submitted or updated is
    kept at once in the labels file, which label.py --apply reads; on a frozen pretrained trunk the heads
    that never saw an image then train a round on the labels in the background, and the next
    predictions come from them under a new model version. Each version writes the images still
    unlabeled, those --max-error accepts marked, to the --accepted file (label.py --apply FILE
    --accepted). A label given to a held-out test/ image is kept, never trained on. No file of the
    folder is moved.

    \b
    python evaluate.py --ckpt runs/mine/lc.pt --predict mydata/unlabeled --label-studio tasks.json
    LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT=$PWD/mydata \\
      ML_BLOCK_LOCAL_IP=false SSRF_PROTECTION_ENABLED=false \\
      ff_front_dev_1682_model_version_dropdown_070622_short=true label-studio start
    python serve.py --ckpt runs/mine/lc.pt --data-dir mydata

    Then in Label Studio: a project with tasks.label-config.xml, a local-files storage of
    mydata/unlabeled, tasks.json imported, and Settings > Model > Connect Model: http://127.0.0.1:9090.
    docs/label-studio.md has every step."""
    robust_streams()
    if (basic_auth_user is None) != (basic_auth_pass is None):
        raise UserError("--basic-auth-user and --basic-auth-pass go together")
    if basic_auth_user is not None and not (basic_auth_user and basic_auth_pass) or ":" in (basic_auth_user or ""):
        raise UserError("--basic-auth-user and --basic-auth-pass must not be empty, nor the user hold a ':'")
    server, backend = started(ckpt, data_dir, label_studio_root, labels_path, host, port,
                               None if basic_auth_user is None else (basic_auth_user, basic_auth_pass),
                               pick_device(device), accepted=(accepted_path, max_error))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        say("stopped")
    finally:
        server.server_close()
        if backend.training is not None:
            backend.training.close()


def started(ckpt, data_dir, label_studio_root, labels_path, host, port, auth, device, echo=say, accepted=(None, 5.0)):
    """(the server, bound and described, not serving yet; its StudioBackend). accepted: (the --accepted
    file or None for its default, --max-error)."""
    from mtlc.label.live_model import LiveModel
    from mtlc.label.live_training import LiveTraining
    from mtlc.label.studio_backend import StudioBackend
    from mtlc.label.studio_server import make_server
    if not Path(ckpt).is_file():
        raise UserError(f"--ckpt {ckpt} does not exist")
    model = LiveModel(ckpt, data_dir, device, echo)
    folder = Path(os.path.abspath(data_dir or model.config.data_dir))
    root = Path(os.path.abspath(label_studio_root)) if label_studio_root else folder
    if root != folder and root not in folder.parents:
        raise UserError(f"--label-studio-root {root}: the folder {folder} must lie under it")
    labels = KeptLabels(labels_path or folder / LABELS_NAME, echo)
    rest = Rest(model, folder, Path(accepted[0] or folder / ACCEPTED_NAME), accepted[1], echo)
    training = None
    if model.why_not_live is None:
        training = LiveTraining(ckpt, folder, model.device,
                                lambda given, rows, seconds: trained(model, given, rows, seconds, rest, echo), echo)
        rest.write(model.training_labels(labels.rows))
    backend = StudioBackend(model, labels, training, folder, root, echo)
    try:
        server = make_server(backend, host, port, auth, echo)
    except OSError as exc:
        if training is not None:
            training.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror} (another server there? --port another)") from None
    describe(model, labels, f"http://{host}:{server.server_address[1]}", backend, echo)
    if labels.rows:
        echo(f"{backend.retrain()['learning']} (labels kept before)")
    return server, backend


def trained(model, given, rows, seconds, rest, echo):
    version = model.trained(given, rows)
    cal = version.calibration
    echo(f"model version {version.name}: the heads trained a round on {len(given)} labels given here in "
         f"{seconds:.0f} s; their error on the {cal.n} held-out {cal.source} images "
         f"{100 * (1 - cal.correct.mean()):.2f}%")
    rest.write(given)


class Rest:
    """The --accepted file of each version (accepted_rest.py), and the line it ends with."""

    def __init__(self, model, folder, path, max_error, echo):
        self.model, self.folder, self.path, self.max_error, self.echo = model, folder, path, max_error, echo

    def write(self, given):
        from mtlc.errors import WriteFailed
        from mtlc.label.accepted_rest import write_accepted_rest
        try:
            accepted, n, found = write_accepted_rest(self.model, given, self.folder, self.max_error, self.path)
        except (UserError, WriteFailed) as exc:
            self.echo(f"the accepted images could not be written to {self.path}: {exc}")
            return
        self.echo(f"{accepted:,} of the {n:,} images still unlabeled accepted at --max-error {self.max_error:g}"
                  + (f" (threshold {found.confidence:.4f})" if found else "") + f": {self.path} (label.py --data-dir "
                  f"{self.folder} --apply {self.path} --accepted; the labels given: --apply the labels file)")


def describe(model, labels, url, backend, echo):
    cal = model.current.calibration
    echo(f"serving {model.base_name} ({len(model.classes)} classes) to Label Studio at {url}: Settings > Model > "
         f"Connect Model, that URL")
    echo(f"confidences calibrated on the checkpoint's {cal.n} held-out {cal.source} images" if cal else
         f"confidences uncalibrated: {model.classifier.uncalibrated}")
    echo(f"labels given are kept in {labels.path} ({len(labels.rows)} so far; label.py --apply reads it); "
          + ("the heads train a round on them in the background, a new model version each time" if backend.training
            else f"the model {model.why_not_live}"))


if __name__ == "__main__":
    main()
