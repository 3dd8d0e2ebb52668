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
@click.option("--host", default="127.0.0.1",
              help="The address to listen on; 0.0.0.0 lets other machines call it (give a basic-auth user then).")
@click.option("--port", type=click.IntRange(0, 65535), default=9090, help="The port (0: any free one).")
@click.option("--basic-auth-user", default=None, envvar="MTLC_BASIC_AUTH_USER",
              help="With --basic-auth-pass: every request must carry these (Label Studio: Settings > Model, Use "
                   "basic auth). Also from $MTLC_BASIC_AUTH_USER.")
@click.option("--basic-auth-pass", default=None, envvar="MTLC_BASIC_AUTH_PASS",
              help="Its password; better given as $MTLC_BASIC_AUTH_PASS than on the command line.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
def main(ckpt, data_dir, label_studio_root, labels_path, host, port, basic_auth_user, basic_auth_pass, device):
    """Serve a checkpoint and its folder to Label Studio as an ML backend.

    Each task opened (or Actions > Retrieve Predictions) gets the checkpoint's class, preselected, with
    its calibrated confidence as the score to sort by. Each annotation submitted or updated is kept at
    once in the labels file, which label.py --apply reads; on a frozen pretrained trunk a head then
    trains again on the kept features in the background, and the next predictions come from it under a
    new model version. A label given to a held-out test/ image is kept, never trained on. No file of the
    folder is moved.

    \b
    python evaluate.py --ckpt runs/mine/lc.pt --predict mydata/unlabeled --label-studio tasks.json
    LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT=$PWD/mydata \\
      ML_BLOCK_LOCAL_IP=false SSRF_PROTECTION_ENABLED=false label-studio start
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
                               pick_device(device))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        say("stopped")
    finally:
        server.server_close()
        if backend.training is not None:
            backend.training.close()


def started(ckpt, data_dir, label_studio_root, labels_path, host, port, auth, device, echo=say):
    """(the server, bound and described, not serving yet; its StudioBackend)."""
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
    training = None
    if model.why_not_live is None:
        training = LiveTraining(ckpt, folder, model.device,
                                lambda given, weights, seconds: trained(model, given, weights, seconds, echo), echo)
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


def trained(model, given, weights, seconds, echo):
    version = model.trained(given, weights)
    cal = version.calibration
    echo(f"model version {version.name}: a head on {len(given)} labels given here trained in {seconds:.0f} s; its "
         f"error on the {cal.n} held-out {cal.source} images {100 * (1 - cal.correct.mean()):.2f}%")


def describe(model, labels, url, backend, echo):
    cal = model.current.calibration
    echo(f"serving {model.base_name} ({len(model.classes)} classes) to Label Studio at {url}: Settings > Model > "
         f"Connect Model, that URL")
    echo(f"confidences calibrated on the checkpoint's {cal.n} held-out {cal.source} images" if cal else
         f"confidences uncalibrated: {model.classifier.uncalibrated}")
    echo(f"labels given are kept in {labels.path} ({len(labels.rows)} so far; label.py --apply reads it); "
          + ("the head trains again on them in the background, a new model version each time" if backend.training
            else f"the model {model.why_not_live}"))


if __name__ == "__main__":
    main()
